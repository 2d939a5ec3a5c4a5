"""The operating-system boundary around an agent: bubblewrap, the file system read-only, private folders hidden.

A CLI's own permission rules are not enough alone: an implementer's shell tool runs any
command, as the worker's user (root on many machines), and could write the control records
or another run's worktree, or read them. ``wrap`` puts the agent in a mount namespace where:

* ``/`` is read-only and only the folders its role may write are writable: the worktree
  (implementer and documenter; never the reviewer), its own HOME, its TMPDIR and data folder.
  Root cannot write through a read-only bind mount either, having no capabilities to remount
  it (below; checked with the bubblewrap shipped inside @openai/codex 0.171.0). Agents cannot
  commit in the worktree: its git metadata lives in the original repository, which is
  read-only to them; the engine commits checkpoints;
* private folders are hidden (``hide``: an empty read-only tmpfs over a folder, ``/dev/null``
  over a file): the Control Panel's var directory (the SQLite database, every run's control
  records, the other runs' worktrees and scratch folders, the broker's messages), the worker
  user's own HOME (``~/.claude``, ``~/.codex/auth.json``, ``~/.ssh``... see ``worker_homes``)
  and the project's ``.env``. Inside them only what the attempt needs is bound back: the
  writable folders above, and read-only the ``visible`` paths (the reviewer's worktree, the
  original repository's ``.git``, the agent's executable, the Python install and PATH folders
  that lie under a hidden folder: ``tool_paths``). The logins a real CLI needs are copied into
  the attempt's own HOME by its adapter;
* the agent has its own PID and IPC namespaces: it sees and can signal only its own processes;
* it has no capabilities (``--cap-drop ALL``; bubblewrap also sets no_new_privs, so an exec
  does not bring them back). Without that, bubblewrap started by root leaves root its
  capabilities inside, and root could ``umount`` a hiding tmpfs or ``mount -o remount,rw`` a
  read-only bind (both checked on the bundled bubblewrap: they worked, and no longer do).

For an agent that runs its own bubblewrap inside (codex), ``wrap(..., user_namespace=True,
private_tmp=True)`` adds a user namespace where the agent is SANDBOX_UID (its own bubblewrap
can then map that uid without capabilities; root cannot map uid 0) and a private writable
``/tmp``; ``user_namespace_available()`` checks that a bubblewrap nested in it works.

Known limits: the network is shared (the CLI must reach its model, and the scripted endpoint
listens on 127.0.0.1), so an agent can connect to services on loopback such as Redis or
PostgreSQL; their credentials are not in its environment (engine/steps.py ``run_env`` drops
``CP_*``, ``DJANGO_*``, ``CELERY_*`` and ``DATABASE_URL``). Everything else the worker's user
can read outside the hidden folders stays readable (the shared ``/tmp`` included, read-only).

Which bubblewrap: ``bwrap`` on PATH (Debian package ``bubblewrap``), else the one the pinned
codex package ships in tools/agents. ``available()`` runs it once to be sure the kernel lets it.
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
_BUNDLED = "tools/agents/node_modules/@openai/codex-linux-x64/vendor/*/codex-resources/bwrap"
#: Names of PATH folders whose parent is the install they belong to (``~/.pyenv/shims`` needs
#: ``~/.pyenv``; ``~/.local/bin/claude`` links into ``~/.local/share``).
_PREFIX_CHILDREN = ("bin", "sbin", "shims")
#: Credentials that may sit inside an install kept visible under the worker's HOME; hidden again.
HOME_SECRETS = (".cargo/credentials", ".cargo/credentials.toml", ".local/share/keyrings")
#: The user and group an agent runs as in the user-namespace mode (``wrap(..., user_namespace=True)``):
#: not 0, so a bubblewrap inside (codex's) can map it without capabilities. Outside the sandbox its
#: files belong to the worker's user.
SANDBOX_UID = SANDBOX_GID = 1000


@lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    """The bubblewrap executable, or None."""
    found = shutil.which("bwrap")
    if found:
        return found
    bundled = sorted(glob.glob(str(BASE_DIR / _BUNDLED)))
    return bundled[0] if bundled and os.access(bundled[0], os.X_OK) else None


@lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """``(True, path)`` when bubblewrap runs here with a read-only root; ``(False, why)`` otherwise."""
    path = bwrap_path()
    if path is None:
        return False, "no bubblewrap (install the Debian package bubblewrap, or run `make agents`)"
    try:
        probe = subprocess.run([path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-ipc",
                                "--proc", "/proc", "--cap-drop", "ALL", "--tmpfs", "/mnt", "--remount-ro", "/mnt",
                                "--", "true"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bubblewrap ({path}) could not run: {exc}"
    if probe.returncode != 0:
        return False, f"bubblewrap ({path}) could not make a sandbox here: {probe.stderr.strip()[:300]}"
    return True, path


@lru_cache(maxsize=1)
def user_namespace_available() -> tuple[bool, str]:
    """``(True, path)`` when the user-namespace sandbox (``wrap(..., user_namespace=True,
    private_tmp=True)``) runs here and a bubblewrap inside it can make its own sandbox, as codex's
    does for every command; ``(False, why)`` otherwise."""
    ok, path = available()
    if not ok:
        return False, path
    inner = [os.path.realpath(path), "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-user", "--unshare-pid",
             "--unshare-net", "--", "true"]
    try:
        probe = subprocess.run([path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-ipc",
                                "--proc", "/proc", "--cap-drop", "ALL", *_user_args(), "--tmpfs", "/tmp",
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
    if os.path.basename(real) in _PREFIX_CHILDREN and parent not in ("/", *worker_homes()):
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


def wrap(argv: list[str], *, writable: list[str], read_only: list[str] = (), hide: list[str] = (),
         visible: list[str] = (), user_namespace: bool = False, private_tmp: bool = False) -> list[str]:
    """``argv`` run inside bubblewrap: ``/`` read-only, ``hide`` hidden, only ``writable`` writable.

    ``writable`` folders (created when missing) are bound read-write, also inside a hidden one.
    ``read_only`` paths inside a writable folder stay read-only (the worktree's ``.git`` file, so
    an agent cannot point the engine's git at a repository of its own). ``hide`` folders get an
    empty tmpfs, made read-only once everything is in place, and ``hide`` files ``/dev/null``;
    ``visible`` paths that lie under a hidden folder are bound back read-only. Mounts go deepest
    last, so the more specific one wins whatever the order of the lists. Missing paths in
    ``read_only``, ``hide`` and ``visible`` are skipped. The agent gets its own PID and IPC
    namespaces and no capabilities (it cannot unmount or remount any of this). The network is
    shared (the CLI must reach its model; see the module docstring).

    ``user_namespace``: the agent also gets its own user namespace and runs as SANDBOX_UID (files
    of the worker's user look like its own; other users' files belong to "nobody"), so that a
    bubblewrap it starts itself (codex's sandbox for its commands) can set up its own user
    namespace: without capabilities, root cannot map uid 0 into a new one ("setting up uid map:
    Operation not permitted"). ``private_tmp``: ``/tmp`` is a writable tmpfs of the sandbox's own
    (codex writes ``/tmp/codex-daemon-<uid>`` whatever TMPDIR says), gone with it; ``writable`` and
    ``visible`` paths under ``/tmp`` are bound back into it like under a hidden folder.

    Raises RuntimeError when bubblewrap is not available (callers check ``available()``, and
    ``user_namespace_available()`` for that mode).
    """
    ok, path = user_namespace_available() if user_namespace else available()
    if not ok:
        raise RuntimeError(path)
    sandbox = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-ipc", "--proc", "/proc",
               "--die-with-parent", "--cap-drop", "ALL"]
    if user_namespace:
        sandbox += _user_args()
    own_tmp = os.path.realpath("/tmp") if private_tmp else None
    mounts: dict[str, list[str]] = {}  # real path -> its bwrap arguments (one mount per path)
    bound = []  # what is bound read-write or read-only back: a hidden path inside one of them still hides
    for folder in writable:
        os.makedirs(folder, exist_ok=True)
        real = os.path.realpath(folder)
        mounts[real] = ["--bind", real, real]
        bound.append(real)
    hidden = [os.path.realpath(item) for item in hide if item and os.path.exists(item)]
    hidden += [own_tmp] if own_tmp else []  # hidden like a private folder, but writable (not remounted)
    hidden = [real for real in dict.fromkeys(hidden)
              if real != "/" and not any(_inside(real, folder) for folder in bound)]  # never what it writes
    hidden_dirs = [real for real in hidden if os.path.isdir(real)]
    shown = [real for real in dict.fromkeys(os.path.realpath(item) for item in visible if item and os.path.exists(item))
             if real not in mounts and any(_inside(real, folder) and real != folder for folder in hidden_dirs)]
    for real in shown:
        cover = max((folder for folder in hidden_dirs if _inside(real, folder)), key=len)
        if not any(_inside(real, other) and other != real and _inside(other, cover) for other in shown):
            mounts[real] = ["--ro-bind", real, real]  # not already shown through an enclosing visible path
            bound.append(real)
    for real in hidden:
        # the private /tmp covers nothing: it is writable, a hidden folder in it stays read-only and empty
        outer = [folder for folder in hidden_dirs if _inside(real, folder) and real != folder and folder != own_tmp]
        if real in mounts or (outer and not any(_inside(real, folder) for folder in bound)):
            continue  # already covered by a hidden folder and not inside anything bound back
        mounts[real] = ["--tmpfs", real] if os.path.isdir(real) else ["--ro-bind", "/dev/null", real]
    for item in read_only:
        if os.path.exists(item):
            real = os.path.realpath(item)
            mounts[real] = ["--ro-bind", real, real]
    for real in sorted(mounts, key=_depth):  # an enclosing mount first: the deeper one covers it
        sandbox += mounts[real]
    sandbox += [arg for real in mounts if mounts[real][0] == "--tmpfs" and real != own_tmp
                for arg in ("--remount-ro", real)]
    return sandbox + ["--"] + list(argv)
