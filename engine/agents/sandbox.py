"""The operating-system boundary around an agent and a gate: bubblewrap, an allow-listed view, no network.

A CLI's own permission rules are not enough alone: an implementer's shell tool runs any
command, as the worker's user (root on many machines), and a gate runs code an agent wrote.
Every agent (each CLI's, the scripted test adapter's) and every gate runs under ``wrap``:

* **Filesystem, by allow-list**: an empty root with only the system folders read-only
  (SYSTEM_PATHS, less SYSTEM_SECRETS), a private ``/dev``, ``/proc`` and ``/tmp``, and what the
  caller binds: the CLI install and the Python install (``tool_paths``), the original
  repository's git metadata (read-only), the worktree (read-write for implementer and
  documenter, read-only for reviewers) and the attempt's own HOME, TMPDIR and data folder.
  Nothing else of the host: not the Control Panel's var directory (database, every run's control
  records and worktrees, the broker's messages), other installations, the rest of ``/tmp``,
  ``/root``, ``/home``, ``/var`` or ``/run``. Where a bound install encloses a private path
  (``private_paths``: the var directory, the worker's HOME with the CLIs' login folders,
  ``~/.ssh``, the project's ``.env``) it is covered again. Agents cannot commit in the worktree:
  its git metadata is read-only to them; the engine commits checkpoints.
* **Network**: a namespace of its own, loopback only (``--unshare-net``): the host's
  127.0.0.1, where PostgreSQL, Redis and the Control Panel listen, is not reachable whatever
  their authentication, and two runs may bind the same port. When the profile needs its model,
  the only way out is the attempt's egress proxy (engine/agents/netproxy.py) on a Unix socket bound at
  NETWORK_DIR, made an HTTP proxy on the sandbox's own loopback by engine/agents/netbridge.py
  (``NetworkPolicy``): the provider's hosts, the gateway and the scripted endpoint; everything
  else is refused and recorded. The design is that of Anthropic's sandbox-runtime, on this layer.
* **Processes**: own PID and IPC namespaces (it sees and signals only its own processes), no
  capabilities (``--cap-drop ALL``; bubblewrap also sets no_new_privs, so an exec does not bring
  them back). Without that, bubblewrap started by root leaves root its capabilities inside, and
  root could ``umount`` a hiding tmpfs or ``mount -o remount,rw`` a read-only bind (both checked
  on the bundled bubblewrap: they worked, and no longer do).

For an agent that runs its own bubblewrap inside, ``wrap(..., user_namespace=True)`` adds
a user namespace where the agent is SANDBOX_UID (its own bubblewrap can then map that uid
without capabilities; root cannot map uid 0); ``user_namespace_available()`` checks that a
bubblewrap nested in it works.

The environment is allow-listed by the engine (engine/boundary.py ``agent_env``), and the
engine's own git never runs on what an agent made before checking it (engine/workspace.py
``find_nested_repositories``). What remains is listed in docs/agents.md, "Known limits".

Which bubblewrap: the one a pinned agent CLI's package ships in tools/agents (``make agents``; its
policy's ``BUNDLED_BWRAP``, engine/agents/registry.py ``bundled``), so every machine runs the same
version, whatever it has installed; only without it a ``bwrap`` on PATH (Debian package
``bubblewrap``). ``available()`` runs it once to be sure the kernel lets it.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent.parent
#: Names of PATH folders whose parent is the install they belong to (``~/.pyenv/shims`` needs
#: ``~/.pyenv``; a CLI's ``~/.local/bin/<name>`` links into ``~/.local/share``).
_PREFIX_CHILDREN = ("bin", "sbin", "shims")
#: Credentials that may sit inside an install kept visible under the worker's HOME; hidden again.
HOME_SECRETS = (".cargo/credentials", ".cargo/credentials.toml", ".local/share/keyrings")
#: The user and group an agent runs as in the user-namespace mode (``wrap(..., user_namespace=True)``):
#: not 0, so a bubblewrap inside (an agent CLI's own) can map it without capabilities. Outside the sandbox its
#: files belong to the worker's user.
SANDBOX_UID = SANDBOX_GID = 1000


@lru_cache(maxsize=1)
def bundled_bwrap() -> str | None:
    """The bubblewrap a pinned agent CLI's package ships under tools/agents (engine/agents/registry.py
    ``bundled``), or None when it is not installed."""
    from . import registry  # noqa: PLC0415 - the registry's policies are read when asked

    bundled = sorted(found for pattern in registry.bundled("BUNDLED_BWRAP")
                     for found in glob.glob(str(BASE_DIR / pattern)))
    return bundled[0] if bundled and os.access(bundled[0], os.X_OK) else None


@lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    """The bubblewrap executable (the pinned one first, see above), or None."""
    return bundled_bwrap() or shutil.which("bwrap")


@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """``(True, path)`` when bubblewrap runs here with a read-only root; ``(False, why)`` otherwise."""
    path = bwrap_path()
    if path is None:
        return False, "no bubblewrap: run `make agents` (a pinned agent CLI's package ships it)"
    try:
        probe = subprocess.run([path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-ipc",
                                "--unshare-net", "--proc", "/proc", "--cap-drop", "ALL", "--tmpfs", "/mnt",
                                "--remount-ro", "/mnt", "--", "true"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bubblewrap ({path}) could not run: {exc}"
    if probe.returncode != 0:
        return False, f"bubblewrap ({path}) could not make a sandbox here: {probe.stderr.strip()[:300]}"
    return True, path


@lru_cache(maxsize=1)
def user_namespace_available() -> tuple[bool, str]:
    """``(True, path)`` when the user-namespace sandbox (``wrap(..., user_namespace=True,
    private_tmp=True)``) runs here and a bubblewrap inside it can make its own sandbox, as an agent CLI's own
    does for every command; ``(False, why)`` otherwise."""
    ok, path = available()
    if not ok:
        return False, path
    inner = [os.path.realpath(path), "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-user", "--unshare-pid",
             "--unshare-net", "--", "true"]
    try:
        probe = subprocess.run([path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-ipc",
                                "--unshare-net", "--proc", "/proc", "--cap-drop", "ALL", *_user_args(),
                                "--tmpfs", "/tmp",
                                # the bubblewrap itself may live under /tmp (a project checked out there):
                                # bound back, as wrap() binds back the folders an attempt needs
                                "--ro-bind", os.path.dirname(os.path.realpath(path)),
                                os.path.dirname(os.path.realpath(path)),
                                "--", *inner],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bubblewrap ({path}) could not run: {exc}"
    if probe.returncode != 0:
        return False, (f"bubblewrap ({path}) could not nest a sandbox in a user namespace here (the agent's own "
                       f"sandbox would refuse every command): {probe.stderr.strip()[:300]}")
    return True, path


def _user_args() -> list[str]:
    """The arguments of the user-namespace mode: a new user namespace, as SANDBOX_UID/SANDBOX_GID."""
    return ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (both real, absolute)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _depth(path: str) -> int:
    return len([part for part in path.split("/") if part])


def worker_homes() -> list[str]:
    """The worker user's own HOME folders: ``$HOME`` and the password database's (when they differ)."""
    homes = [os.path.expanduser("~")]
    try:
        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    found = []
    for home in homes:
        real = os.path.realpath(home) if home else ""
        if real and real != "/" and os.path.isdir(real) and real not in found:
            found.append(real)
    return found


#: The Control Panel's own test-runner configuration. Hidden (seen as empty files) from agents and
#: gates: with the default var directory the worktrees lie inside this project, and pytest, looking
#: upwards from a repository that has no configuration of its own, would take ours (with its
#: DJANGO_SETTINGS_MODULE) and fail the repository's tests.
PROJECT_RUNNER_CONFIG = ("pyproject.toml", "setup.cfg", "pytest.ini", "tox.ini", "conftest.py")


def var_dir() -> str | None:
    """The Control Panel's var directory (settings.VAR_DIR: database, control records, worktrees,
    broker), hidden from agents; None outside a configured Django."""
    try:
        from django.conf import settings  # noqa: PLC0415 - this module imports no Django at import time

        var = getattr(settings, "VAR_DIR", None)
        return str(var) if var else None
    except Exception:  # noqa: BLE001 - no Django here, or settings that do not load: nothing to hide
        return None


def private_paths(var_dir: str | None) -> list[str]:
    """What an agent must not read: the Control Panel's var directory, the worker's HOME
    folders with the credentials they hold, and the project's ``.env``; plus, not secret but not
    the repository's, the project's own test-runner configuration (``PROJECT_RUNNER_CONFIG``)."""
    paths = [var_dir] if var_dir else []
    paths += worker_homes()
    paths += [os.path.join(home, secret) for home in worker_homes() for secret in HOME_SECRETS]
    paths.append(str(BASE_DIR / ".env"))
    paths += [str(BASE_DIR / name) for name in PROJECT_RUNNER_CONFIG]
    return paths


def _install_of(path: str) -> str:
    """The install a PATH folder or an executable's folder belongs to (``X/bin`` -> ``X``)."""
    real = os.path.realpath(path)
    parent = os.path.dirname(real)
    if os.path.basename(real) in _PREFIX_CHILDREN and parent not in ("/", "/tmp", *worker_homes()):
        return parent
    return real


def tool_paths(search_path: str | None, executables: tuple[str, ...] = ()) -> list[str]:
    """Folders an agent's programs need to stay readable even under a hidden folder: the Python
    install running the engine (a venv and the interpreter it was made from), the ``search_path``
    folders (with their install: ``~/.pyenv/shims`` -> ``~/.pyenv``) and the folders of
    ``executables`` (a ``bin`` folder with its install)."""
    paths = []
    for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                   os.path.dirname(os.path.realpath(sys.executable))):
        paths.append(os.path.realpath(prefix))
    for entry in (search_path or "").split(os.pathsep):
        if entry and os.path.isabs(entry) and os.path.isdir(entry):
            paths.append(_install_of(entry))
    for exe in executables:
        if exe and os.path.isabs(exe):
            paths.append(_install_of(os.path.dirname(os.path.realpath(exe))))
    return list(dict.fromkeys(paths))


def git_dirs(workspace: str) -> list[str]:
    """The git metadata a worktree's ``.git`` file points to: ``<repo>/.git/worktrees/<id>`` and the
    repository's common ``.git`` (via its ``commondir``). Empty when ``.git`` is not such a file."""
    dotgit = os.path.join(workspace, ".git")
    try:
        with open(dotgit, encoding="utf-8") as fh:
            text = fh.read(4096).strip()
    except (OSError, UnicodeDecodeError):
        return []
    if not text.startswith("gitdir:"):
        return []
    gitdir = os.path.join(workspace, text[len("gitdir:"):].strip())
    found = [os.path.realpath(gitdir)]
    try:
        with open(os.path.join(gitdir, "commondir"), encoding="utf-8") as fh:
            found.append(os.path.realpath(os.path.join(gitdir, fh.read().strip())))
    except OSError:
        pass
    return list(dict.fromkeys(path for path in found if os.path.isdir(path)))


#: What of the host every sandbox sees, read-only: the system folders (a symlink such as
#: Debian's ``/bin -> usr/bin`` is made as the same symlink). Nothing else of the host is there
#: unless a caller binds it: not ``/tmp`` (a private tmpfs instead), ``/root``, ``/home``,
#: ``/var``, ``/run`` (PostgreSQL's socket folder), ``/srv``, ``/mnt`` or ``/media``.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
#: Secrets inside the system folders, hidden again (a glob each): password hashes, the host's
#: ssh keys, TLS private keys, sudo rules and the configuration of local database and broker
#: servers (which may hold their passwords).
SYSTEM_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssh/ssh_host_*",
                  "/etc/ssl/private", "/etc/sudoers", "/etc/sudoers.d", "/etc/redis", "/etc/postgresql",
                  "/etc/postgresql-common", "/etc/mysql", "/etc/rabbitmq", "/etc/mosquitto", "/etc/nats-server.conf")
#: Where the egress proxy's folder is bound inside the sandbox, and the bridge's proxy port there.
NETWORK_DIR = "/run/cp-net"
PROXY_PORT = 3128
BRIDGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netbridge.py")
#: The sandbox's ``/etc/profile`` (bound over the host's): a login shell keeps the engine's PATH.
PROFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_profile.sh")


class NetworkPolicy:
    """The way out of an attempt's network namespace: an ``engine.agents.netproxy.EgressProxy`` started
    by the caller (its ``socket_dir`` is bound at NETWORK_DIR), and the loopback endpoints
    (``"127.0.0.1:PORT"``) the bridge forwards so that a CLI's base URL on the worker's loopback
    keeps working. ``env()`` gives the proxy variables the programs inside need."""

    def __init__(self, socket_dir: str, forwards: list[str] | tuple[str, ...] = ()):
        self.socket_dir = socket_dir
        self.forwards = list(dict.fromkeys(forwards))

    def env(self) -> dict[str, str]:
        """``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` (and lower-case) = the bridge; loopback direct
        (``NO_PROXY``), where the bridge's forwards listen. The agent CLIs honour ``HTTPS_PROXY`` and
        these names (their documentation on proxies; a Rust CLI's reqwest reads the same)."""
        url = f"http://127.0.0.1:{PROXY_PORT}"
        env = {}
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
            env[name] = env[name.lower()] = url
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
        return env


def system_secrets() -> list[str]:
    """The SYSTEM_SECRETS present on this host (globs expanded)."""
    found = []
    for pattern in SYSTEM_SECRETS:
        found += glob.glob(pattern) if any(ch in pattern for ch in "*?[") else [pattern]
    return [path for path in found if os.path.lexists(path)]


def _shown_by(path: str, mounts: dict[str, list[str]]) -> bool:
    """Whether a bind of the host (not a tmpfs) makes ``path`` appear in the sandbox as on the host."""
    covering = [real for real in mounts if _inside(path, real)]
    return bool(covering) and mounts[max(covering, key=len)][0] in ("--ro-bind", "--bind")


def _symlinks_to_make(paths: list[str], mounts: dict[str, list[str]]) -> list[tuple[str, str]]:
    """``(link, target)`` for the symlinks on the way to ``paths`` that the sandbox would lack: the
    binds are of real paths, so a path given through a symlink (a project's ``.venv`` linked from
    elsewhere, a symlinked home) must find the same links inside, every link of a chain. Outermost
    first; a link already shown by a bind of the host is left alone."""
    found: list[tuple[str, str]] = []
    pending = [os.path.normpath(path) for path in paths if path and os.path.isabs(path)]
    hops = 0
    while pending and hops < 400:
        hops += 1
        path = pending.pop(0)
        prefix = "/"
        parts = path.split("/")[1:]
        for index, part in enumerate(parts):
            prefix = os.path.join(prefix, part)
            if os.path.islink(prefix):
                target = os.readlink(prefix)
                if not _shown_by(prefix, mounts) and prefix not in (link for link, _ in found):
                    found.append((prefix, target))
                # follow the link one step: its target and the rest of the path, as the host does
                rest = parts[index + 1:]
                pending.append(os.path.normpath(os.path.join(os.path.dirname(prefix), target, *rest)))
                break
            if not os.path.lexists(prefix):
                break
    return found


def wrap(argv: list[str], *, writable: list[str], read_only: list[str] = (), hide: list[str] = (),
         visible: list[str] = (), user_namespace: bool = False, private_tmp: bool = True,
         network: NetworkPolicy | None = None, replace: dict[str, str] | None = None,
         binds: list[tuple[str, str, bool]] | tuple = ()) -> list[str]:
    """``argv`` run inside bubblewrap, with an allow-listed view of the host and no network of its own.

    The view (deny by default): an empty root, then read-only SYSTEM_PATHS (less
    ``system_secrets()``), a private ``/dev``, ``/proc`` and writable ``/tmp`` (a tmpfs of the
    sandbox's own, gone with it), the ``visible`` paths read-only, the ``writable`` folders
    (created when missing) read-write, and ``read_only`` paths inside a writable folder read-only
    again (the worktree's ``.git`` file, so an agent cannot point the engine's git at a
    repository of its own). ``hide`` paths that lie inside something bound are covered again (an
    empty read-only tmpfs over a folder, ``/dev/null`` over a file): the var directory, the
    worker's HOME, the project's ``.env``, when a bound install lies around them. A visible path
    inside a hidden folder is bound back. Mounts go deepest last, so the more specific one wins.
    Missing ``read_only``, ``hide`` and ``visible`` paths are skipped; so are visible paths inside
    a writable folder.

    Namespaces: PID and IPC (it sees and signals only its own processes), network (loopback
    only: nothing of the host's 127.0.0.1, where the database, the broker and the Control Panel
    listen; two sandboxes may bind the same port). No capabilities (``--cap-drop ALL``; bubblewrap
    sets no_new_privs): root inside cannot unmount or remount any of this.

    ``network``: the attempt's NetworkPolicy. Its proxy folder is bound at NETWORK_DIR and the
    command runs under the bridge (engine/agents/netbridge.py, with the engine's Python), which
    serves the proxy on 127.0.0.1:PROXY_PORT and the policy's loopback forwards inside; the
    caller adds ``network.env()`` to the environment. None: no way out at all.

    ``replace``: ``{path in the view: host file}``, each host file bound read-only in the place of
    a file the view already shows (a CLI that finds the host's bubblewrap on PATH first: its
    adapter's ``sandboxed``, engine/agents/<cli>/adapter.py). A path outside the read-only view is skipped.

    ``binds``: ``(host folder, path in the view, writable)`` each: a host folder shown at another place
    (the run's setup environment at ``/cp/env`` and its kept worktree folders such as
    ``node_modules``: engine/environments.py), read-only unless ``writable``; the deepest mounts of
    all, so a kept folder inside the writable worktree stays read-only. The host folder may lie in a
    hidden one (the var directory): only the bound folder is shown. The place must exist already
    when it lies in a bound folder (the caller makes it).

    ``/etc/profile`` is always the sandbox's own (PROFILE): a login shell keeps the PATH given.

    ``user_namespace``: its own user namespace too, as SANDBOX_UID, so that a bubblewrap it starts
    itself (an agent CLI's sandbox for its commands) can make its own user namespace: without
    capabilities, root cannot map uid 0 into a new one. ``private_tmp`` is kept for callers; /tmp
    is always the sandbox's own.

    Raises RuntimeError when bubblewrap is not available (callers check ``available()``, and
    ``user_namespace_available()`` for that mode).
    """
    ok, path = user_namespace_available() if user_namespace else available()
    if not ok:
        raise RuntimeError(path)
    sandbox = [path, "--unshare-pid", "--unshare-ipc", "--unshare-net", "--die-with-parent", "--cap-drop", "ALL"]
    if user_namespace:
        sandbox += _user_args()
    visible = list(visible)
    if network is not None:
        visible += [BRIDGE, *tool_paths(None)]
    # real path -> its bwrap arguments; assigned in order of precedence (a later kind wins)
    mounts, links = _system_mounts()
    rw = []
    for folder in writable:
        os.makedirs(folder, exist_ok=True)
        rw.append(os.path.realpath(folder))
    _visible_mounts(mounts, visible, rw)
    ro_bound = [real for real in mounts]
    mounts["/tmp"] = ["--tmpfs", "/tmp"]
    tmpfs_ro = _hidden_mounts(mounts, [*hide, *system_secrets()], rw, ro_bound)
    for real in rw:
        mounts[real] = ["--bind", real, real]
    _protected_mounts(mounts, read_only, replace or {}, rw, ro_bound)
    if os.path.isfile("/etc/profile") and "/etc" in ro_bound:
        mounts["/etc/profile"] = ["--ro-bind", PROFILE, "/etc/profile"]
    if network is not None:
        mounts[NETWORK_DIR] = ["--ro-bind", os.path.realpath(network.socket_dir), NETWORK_DIR]
    for source, place, writable_bind in binds:
        mounts[os.path.normpath(place)] = ["--bind" if writable_bind else "--ro-bind", os.path.realpath(source),
                                           os.path.normpath(place)]
    sandbox += ["--dev", "/dev", "--proc", "/proc"]
    for link in links:
        sandbox += link
    for real in sorted(mounts, key=_depth):  # an enclosing mount first: the deeper one covers it
        sandbox += mounts[real]
    made = {link[2] for link in links}
    wanted = [*visible, *writable, *read_only, argv[0] if argv else "", *os.environ.get("PATH", "").split(os.pathsep)]
    for link, target in _symlinks_to_make(wanted, mounts):
        if link not in made:
            sandbox += ["--symlink", target, link]
    sandbox += [arg for real in tmpfs_ro if mounts.get(real, [""])[0] == "--tmpfs" for arg in ("--remount-ro", real)]
    sandbox += ["--remount-ro", "/"]  # the empty root itself: nothing to write there
    command = list(argv)
    if network is not None:
        bridge = [os.path.realpath(sys.executable), "-I", "-S", BRIDGE, "--socket", f"{NETWORK_DIR}/proxy.sock",
                  "--proxy-port", str(PROXY_PORT)]
        for target in network.forwards:
            bridge += ["--forward", target]
        command = [*bridge, "--", *command]
    return sandbox + ["--"] + command


def _system_mounts() -> tuple[dict[str, list[str]], list[list[str]]]:
    """SYSTEM_PATHS read-only: ``({real path: its bwrap arguments}, [the links among them, as --symlink])``."""
    mounts: dict[str, list[str]] = {}
    links: list[list[str]] = []
    for item in SYSTEM_PATHS:
        if os.path.islink(item):
            links.append(["--symlink", os.readlink(item), item])
        elif os.path.isdir(item):
            mounts[item] = ["--ro-bind", item, item]
    return mounts, links


def _visible_mounts(mounts: dict, visible: list[str], rw: list[str]) -> None:
    """The ``visible`` paths read-only, but never the whole host, its /tmp, or what lies in a writable folder."""
    for item in visible:
        if item and os.path.exists(item):
            real = os.path.realpath(item)
            if real in ("/", "/tmp") or any(_inside(real, folder) for folder in rw):
                continue  # never the whole host, nor its /tmp (a PATH entry such as /tmp/bin would name it)
            mounts[real] = ["--ro-bind", real, real]


def _hidden_mounts(mounts: dict, hidden: list[str], rw: list[str], ro_bound: list[str]) -> list[str]:
    """Cover each ``hidden`` path that the view would show (an empty tmpfs over a folder, /dev/null over a
    file); returns the folders covered by a tmpfs (remounted read-only at the end)."""
    tmpfs_ro = []
    for item in hidden:
        if not item or not os.path.lexists(item):
            continue
        real = os.path.realpath(item)
        if real == "/" or any(_inside(real, folder) for folder in rw):
            continue  # never what it writes
        if not any(_inside(real, folder) for folder in [*ro_bound, "/tmp"]) or real in rw:
            continue  # not in the view anyway (under /tmp it is: the folders leading to a bound path
            # are made in the sandbox's own writable /tmp, and a hidden one must stay read-only there)
        if os.path.isdir(real):
            mounts[real] = ["--tmpfs", real]
            tmpfs_ro.append(real)
        else:
            mounts[real] = ["--ro-bind", "/dev/null", real]
    return tmpfs_ro


def _protected_mounts(mounts: dict, read_only: list[str], replace: dict[str, str], rw: list[str],
                      ro_bound: list[str]) -> None:
    """``read_only`` paths inside a writable folder bound read-only again, and the ``replace`` files bound over
    the read-only view's (wrap's docstring)."""
    for item in read_only:
        if os.path.exists(item):
            real = os.path.realpath(item)
            if any(_inside(real, folder) for folder in rw):  # only to protect what lies in a writable folder
                mounts[real] = ["--ro-bind", real, real]
    for target, source in replace.items():
        real = os.path.realpath(target)
        if os.path.isfile(real) and any(_inside(real, folder) for folder in ro_bound) \
                and not any(_inside(real, folder) for folder in rw):
            mounts[real] = ["--ro-bind", os.path.realpath(source), real]
