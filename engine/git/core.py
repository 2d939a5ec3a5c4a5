"""The one way the engine runs git (``git``: an argument array, never a shell, a hardened environment;
``before_git`` is asked first, engine/apps.py), its errors (``WorkspaceError``) and what every part shares.

Part of engine/git/ (its module docstring says what holds for all of it); no Django."""
from __future__ import annotations

import os
import re
import subprocess
from typing import Callable



#: Gitignore-style patterns (same syntax and semantics as a ``.gitignore`` file, including
#: ``!`` negation) for transient data and secrets that are never taken into a manifest, a
#: patch or a checkpoint, tracked or not. An excluded path keeps its state at the base commit.
#:
#: * secrets: dotenv files (``.env``, ``.env.*`` except ``.env.example``), private keys
#:   (``*.pem``, ``id_rsa*``, ``id_ed25519*``, ``id_ecdsa*``, ``id_dsa*``);
#: * caches and virtual environments: ``__pycache__/``, ``*.pyc``, ``.pytest_cache/``,
#:   ``.mypy_cache/``, ``.ruff_cache/``, ``.tox/``, ``.nox/``, ``.venv/``, ``venv/``,
#:   ``node_modules/``;
#: * build and coverage output: ``build/``, ``dist/``, ``*.egg-info/``, ``.coverage``,
#:   ``htmlcov/``;
#: * desktop litter: ``.DS_Store``;
#: * ``.cp/``: the run's own scratch directory, should it ever be placed inside a worktree.
#:
#: Patterns without a slash match at any depth; a trailing ``/`` matches directories only.
DEFAULT_EXCLUDES: list[str] = [
    ".env",
    ".env.*",
    "!.env.example",
    "*.pem",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    "id_dsa*",
    "__pycache__/",
    "*.pyc",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".tox/",
    ".nox/",
    ".venv/",
    "venv/",
    "node_modules/",
    "build/",
    "dist/",
    "*.egg-info/",
    ".coverage",
    "htmlcov/",
    ".DS_Store",
    ".cp/",
]


#: Author and committer of checkpoint commits (set through the environment, so no user git
#: configuration is needed).
CHECKPOINT_IDENTITY = {"name": "Control Panel", "email": "engine@controlpanel.local"}


#: Seconds allowed for ``git submodule update --init --recursive`` in a new worktree.
SUBMODULE_TIMEOUT_SECONDS = 900


_NULL_OID = "0" * 40


_HEX40 = re.compile(r"[0-9a-f]{40}")


_TRAILER_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")


# Variables that would point git at another repository, index or configuration than the one
# we name; inherited values (for example when the engine runs under a git hook) are dropped.
_REDIRECTING_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_QUARANTINE_PATH",
)


# Settings for commands that work on a temporary index: never split it, never cache
# untracked directories in it, never ask an fsmonitor hook about it.
_TEMP_INDEX_CONFIG = [
    "-c", "core.splitIndex=false",
    "-c", "core.untrackedCache=false",
    "-c", "core.fsmonitor=false",
    "-c", "advice.addEmbeddedRepo=false",
]


class WorkspaceError(Exception):
    """A workspace operation failed or was refused.

    Attributes:
        code: stable machine code, one of ``path_not_found``, ``not_a_repository``,
            ``unknown_revision``, ``ambiguous_revision``, ``not_a_commit``,
            ``workspace_branch_in_use``, ``workspace_branch_exists``,
            ``workspace_path_exists``, ``submodule_init_failed``, ``head_moved``,
            ``nested_repository``, ``index_locked``, ``git_failed``.
        message: one sentence a person understands, naming the path or revision.
        detail: git's own stderr (decoded), when there is one; may be empty.
    """

    def __init__(self, code: str, message: str, *, detail: str = "") -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail


#: The one hardened invocation of every git the engine runs (``git()``, ``write_patch``): no hook,
#: no fsmonitor program, no transport at all (so no lazy fetch of a promisor remote, no
#: ``core.sshCommand``, no credential helper), no recursion into submodules, no pager. A fetch the
#: engine itself decides on (the base commit's submodules, ``_init_submodules``) names the
#: protocols it allows after these. Together with ``_HARDENED_ENV`` (no system or global
#: configuration) git reads configuration only from the repository the user gave, whose ``.git``
#: agents cannot write, and from this list; a nested repository an agent made is never entered
#: (``find_nested_repositories``).
_HARDENED_CONFIG = [
    "-c", "core.quotepath=false",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    # stat data counts only with the change time compared too: a file rewritten with its size and
    # modification time kept is read again, whatever the repository's configuration says
    "-c", "core.trustctime=true",
    "-c", "core.checkStat=default",
    "-c", "protocol.allow=never",
    "-c", "submodule.recurse=false",
    "-c", "credential.helper=",
    "-c", "core.askPass=",
    "-c", "core.pager=cat",
    "-c", "diff.external=",
]


#: Environment of every git the engine runs: no system or global (user) configuration, no lazy
#: fetch of missing objects (git 2.44+; older versions ignore it and ``protocol.allow=never``
#: refuses the transport), no terminal prompt, a fixed locale.
_HARDENED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
    "LC_ALL": "C",
}


def _git_argv(args: list[str]) -> list[str]:
    """The one hardened git invocation: ``git <_HARDENED_CONFIG> <args>`` (with ``_git_env``)."""
    return ["git", *_HARDENED_CONFIG, *args]


def _git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _REDIRECTING_ENV and not k.startswith("GIT_CONFIG")}
    env.update(_HARDENED_ENV)
    env.pop("LANGUAGE", None)
    env.pop("GIT_SSH_COMMAND", None)
    env.pop("GIT_SSH", None)
    env.pop("GIT_EXEC_PATH", None)
    if extra:
        env.update(extra)
    return env


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace").strip()


#: called with the arguments before every git command (engine/apps.py: git never runs inside a database
#: transaction or row lock, where it would hold them for as long as git takes)
before_git: Callable[[list[str]], None] | None = None


def git(
    args: list[str],
    cwd: str,
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    input: bytes | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """Run ``git <_HARDENED_CONFIG> <args>`` in ``cwd`` and capture its output as bytes.

    Args:
        args: git arguments after the program name, e.g. ``["rev-parse", "HEAD"]``.
        cwd: directory to run in.
        env: extra environment variables, applied on top of the process environment (from
            which variables that would redirect git, like ``GIT_DIR`` or ``GIT_INDEX_FILE``,
            are removed unless given here); ``_HARDENED_ENV`` is set (no system or global
            configuration, no lazy fetch, no prompt, ``LC_ALL=C``).
        check: raise on a non-zero exit status.
        input: bytes for stdin; stdin is ``/dev/null`` when None, so git never waits on it.
        timeout: seconds before the command is killed (None: no limit).

    Returns:
        ``subprocess.CompletedProcess`` with ``stdout``/``stderr`` as bytes.

    Raises:
        WorkspaceError: ``git_failed`` when ``check`` and git exits non-zero, when git cannot
            be started, or on timeout; the message names the command and quotes git's stderr.
    """
    if before_git is not None:
        before_git(args)
    cmd = _git_argv(args)
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=_git_env(env),
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise WorkspaceError(
            "git_failed",
            f"git {' '.join(args[:2])} in {cwd} did not finish within {timeout} seconds.",
            detail=_decode(exc.stderr),
        ) from None
    except OSError as exc:
        raise WorkspaceError(
            "git_failed", f"Could not run git {' '.join(args[:2])} in {cwd}: {exc}."
        ) from None
    if check and proc.returncode != 0:
        stderr = _decode(proc.stderr)
        raise WorkspaceError(
            "git_failed",
            f"git {' '.join(args[:2])} failed in {cwd} (exit {proc.returncode}): "
            f"{stderr or 'no message'}",
            detail=stderr,
        )
    return proc


def _out(args: list[str], cwd: str, **kwargs) -> str:
    """stdout of a successful git command, decoded, trailing newline removed."""
    return git(args, cwd, **kwargs).stdout.decode("utf-8", "surrogateescape").rstrip("\n")


def _fs(path: bytes) -> str:
    """A path from git's -z output as a str usable with the os module (lossless)."""
    return os.fsdecode(path)


def _split_z(data: bytes) -> list[bytes]:
    items = data.split(b"\0")
    if items and items[-1] == b"":
        items.pop()
    return items


def _checkpoint_env() -> dict[str, str]:
    name, email = CHECKPOINT_IDENTITY["name"], CHECKPOINT_IDENTITY["email"]
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email}
