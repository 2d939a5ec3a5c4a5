"""Git plumbing for the Run Engine: worktree and branch, status, manifest, patch, checkpoint.

A mechanism module: it takes and returns plain values (strings, lists, dicts) and does not
import Django. Every git invocation goes through :func:`git` with an argument array (never a
shell), ``-c core.quotepath=false``, ``-z`` output wherever paths are parsed, no terminal
prompts and the C locale, so git's messages are stable and paths with spaces, non-ASCII
characters or newlines survive.

The original checkout is never modified: read-only questions are asked with
``--no-optional-locks`` (so ``git status`` does not even refresh its index), and the shared
repository state written is limited to run branches, the ``.git/worktrees/<id>`` entries this
module creates or proves stale, and the submodule initialisation git records for a worktree.

Facts about git used here were checked against git 2.39.5:

* ``git worktree list --porcelain -z`` (2.36+), ``git rev-parse --end-of-options`` (2.30+).
* ``git read-tree -m <tree>`` with a single tree keeps the stat information of index entries
  whose content matches the tree, so ``git add -A`` re-hashes only files that changed.
* ``git ls-files -c -i --exclude-from=<file>`` applies gitignore semantics (directory patterns,
  ``!`` negation) to tracked paths.
* ``git worktree remove --force`` removes a worktree with initialised submodules.
* ``%(trailers:key=<k>,valueonly)`` in ``git log --format`` (2.22+).

Errors are raised as :class:`WorkspaceError` with a stable ``code`` and a sentence a person
understands in ``message``.
"""
from __future__ import annotations

import bisect
import collections
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from typing import Callable, Iterator, Sequence

import psutil

__all__ = [
    "CHECKPOINT_IDENTITY",
    "DEFAULT_EXCLUDES",
    "WorkspaceError",
    "add_detached_worktree",
    "remove_tree",
    "branch_tip",
    "clear_stale_index_lock",
    "commit_checkpoint",
    "ensure_worktree",
    "find_commit_with_trailer",
    "git",
    "git_index_op",
    "index_lock_holders",
    "index_lock_path",
    "manifest",
    "manifest_digest",
    "outward_symlinks",
    "remove_worktree",
    "repo_lock",
    "repo_root",
    "reset_index_to",
    "resolve_commit",
    "uncommitted_changes",
    "write_patch",
]

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


# ---------------------------------------------------------------------------------------------
# Running git
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Repository and revisions
# ---------------------------------------------------------------------------------------------


def repo_root(path: str) -> str:
    """Absolute top-level directory of the git work tree that contains ``path``.

    Args:
        path: a file or directory inside a work tree (the original checkout or a worktree).

    Returns:
        The absolute, symlink-resolved top-level directory (str).

    Raises:
        WorkspaceError: ``path_not_found`` if ``path`` does not exist; ``not_a_repository``
            if it is not inside a git work tree (a bare repository, or a ``.git`` directory
            itself, is refused the same way).
    """
    if not os.path.exists(path):
        raise WorkspaceError("path_not_found", f"The path {path} does not exist.")
    start = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    proc = git(["rev-parse", "--is-bare-repository", "--is-inside-work-tree"], start,
               check=False)
    lines = proc.stdout.decode().split()
    if proc.returncode != 0 or lines != ["false", "true"]:
        raise WorkspaceError(
            "not_a_repository",
            f"The path {path} is not inside a git work tree"
            + (" (it is a bare repository)." if lines[:1] == ["true"] else "."),
            detail=_decode(proc.stderr),
        )
    top = _out(["rev-parse", "--show-toplevel"], start)
    return os.path.realpath(top)


def _check_rev_text(rev: str) -> None:
    if not isinstance(rev, str) or not rev or rev.startswith("-") or any(
        c in rev for c in "\0\n\r"
    ):
        raise WorkspaceError(
            "unknown_revision",
            f"The revision {rev!r} is not a valid revision name.",
        )


def _ambiguous(stderr: str) -> bool:
    return "is ambiguous" in stderr


def resolve_commit(repo: str, rev: str) -> str:
    """Resolve a revision name to the full id of the commit it names.

    A branch, a tag (annotated tags are peeled, through nested tags too), a full or short
    commit id, or any rev-parse expression naming a commit (``HEAD~2``, ``main@{1}``) is
    accepted.

    Args:
        repo: a directory inside the repository.
        rev: the revision name as a person typed it.

    Returns:
        The commit id, 40 lowercase hex characters.

    Raises:
        WorkspaceError: ``unknown_revision`` if nothing by that name exists, or ``rev`` is
            empty or starts with ``-`` (refused so it is never read as an option);
            ``ambiguous_revision`` for a short id matching several objects or a name
            matching several refs (e.g. a tag and a branch both called ``v1``);
            ``not_a_commit`` if it names a tree or a blob (e.g. ``HEAD:README``) or a tag of
            one; ``git_failed`` for other git failures.
    """
    _check_rev_text(rev)
    proc = git(["rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}"], repo,
               check=False)
    stderr = _decode(proc.stderr)
    if _ambiguous(stderr):
        raise WorkspaceError(
            "ambiguous_revision",
            f"The revision {rev!r} is ambiguous in {repo}: use a longer commit id or a full "
            f"ref name such as refs/heads/{rev} or refs/tags/{rev}.",
            detail=stderr,
        )
    if proc.returncode == 0:
        oid = proc.stdout.decode().strip()
        if _HEX40.fullmatch(oid):
            return oid
    # Tell the kinds apart: resolve without the peel (``HEAD:path^{commit}`` would otherwise
    # be read as a path) and look at the object's type.
    proc = git(["rev-parse", "--verify", "--end-of-options", rev], repo, check=False)
    stderr = _decode(proc.stderr)
    if _ambiguous(stderr):
        raise WorkspaceError(
            "ambiguous_revision",
            f"The revision {rev!r} is ambiguous in {repo}: use a longer commit id or a full "
            f"ref name.",
            detail=stderr,
        )
    if proc.returncode != 0:
        raise WorkspaceError(
            "unknown_revision",
            f"The revision {rev!r} does not exist in {repo}.",
            detail=stderr,
        )
    oid = proc.stdout.decode().strip()
    peeled = git(["rev-parse", "--verify", "--end-of-options", f"{oid}^{{}}"], repo,
                 check=False)
    target = peeled.stdout.decode().strip() if peeled.returncode == 0 else oid
    kind = git(["cat-file", "-t", target], repo, check=False)
    if kind.returncode != 0:
        raise WorkspaceError(
            "unknown_revision",
            f"The revision {rev!r} names object {oid} which is not in {repo}.",
            detail=_decode(kind.stderr),
        )
    kind_name = kind.stdout.decode().strip()
    raise WorkspaceError(
        "not_a_commit",
        f"The revision {rev!r} in {repo} names a {kind_name}, not a commit.",
    )


def _rev_or_none(repo: str, name: str) -> str | None:
    proc = git(["rev-parse", "--verify", "--quiet", "--end-of-options", name], repo,
               check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().strip() or None


def _check_branch_name(branch: str) -> None:
    if not isinstance(branch, str) or not branch or branch.startswith("-") or any(
        c in branch for c in "\0\n\r"
    ):
        raise ValueError(f"Invalid branch name {branch!r}.")
    proc = git(["check-ref-format", f"refs/heads/{branch}"], "/", check=False)
    if proc.returncode != 0 or branch == "HEAD":
        raise ValueError(f"Invalid branch name {branch!r}.")


def branch_tip(repo: str, branch: str) -> str | None:
    """The commit id at the tip of local branch ``branch``, or None if it does not exist.

    Args:
        repo: a directory inside the repository (any of its worktrees).
        branch: short branch name, e.g. ``cp/run-7`` (looked up as ``refs/heads/<branch>``).

    Returns:
        40-hex commit id, or None.

    Raises:
        ValueError: ``branch`` is not a valid branch name.
    """
    _check_branch_name(branch)
    return _rev_or_none(repo, f"refs/heads/{branch}^{{commit}}")


# ---------------------------------------------------------------------------------------------
# Status of the original checkout
# ---------------------------------------------------------------------------------------------

_UNMERGED = {"DD", "AU", "UD", "UA", "DU", "AA", "UU"}


def _status_word(xy: str) -> str:
    if xy == "??":
        return "untracked"
    if xy in _UNMERGED:
        return "conflicted"
    if "R" in xy:
        return "renamed"
    if "C" in xy:
        return "copied"
    if xy[0] == "A":
        return "added"
    if "D" in xy:
        return "deleted"
    if "T" in xy:
        return "type_changed"
    return "modified"


def uncommitted_changes(repo: str) -> list[dict]:
    """What in the original checkout will NOT be included in a run (it starts from a commit).

    Read-only: runs ``git --no-optional-locks status --porcelain=v1 -z
    --untracked-files=all``, so git does not refresh or rewrite the index (its bytes and
    mtime stay the same). Ignored files are not listed; submodules with changes are listed
    as ``modified``.

    Args:
        repo: the original checkout (any directory inside it).

    Returns:
        A list in git's order of ``{"path": str, "status": str, "xy": str}`` where ``xy`` is
        the two-letter porcelain code and ``status`` one of ``modified``, ``added``,
        ``deleted``, ``renamed``, ``copied``, ``type_changed``, ``untracked``,
        ``conflicted``. Renames and copies also carry ``"orig_path"``.

    Raises:
        WorkspaceError: ``git_failed`` if git status fails.
    """
    proc = git(
        ["--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all",
         "--ignore-submodules=none"],
        repo,
        env={"GIT_OPTIONAL_LOCKS": "0"},
    )
    items = _split_z(proc.stdout)
    result: list[dict] = []
    i = 0
    while i < len(items):
        raw = items[i]
        xy = raw[:2].decode("ascii", "replace")
        entry = {"path": _fs(raw[3:]), "status": _status_word(xy), "xy": xy}
        i += 1
        if "R" in xy or "C" in xy:
            if i < len(items):
                entry["orig_path"] = _fs(items[i])
            i += 1
        result.append(entry)
    return result


# ---------------------------------------------------------------------------------------------
# Worktrees
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def repo_lock(lock_dir: str, repo: str) -> Iterator[str]:
    """Hold an exclusive lock for worktree add/remove/prune on one source repository.

    The lock is ``fcntl.flock(LOCK_EX)`` on ``<lock_dir>/<sha256 of realpath(repo)>.lock``;
    it blocks until granted and is released when the block exits (or the process dies). It
    is shared by all processes (and threads: each acquisition opens its own descriptor)
    using the same ``lock_dir``. It is not re-entrant: do not nest two locks on one repo.
    Pass the repository's top-level directory so all callers agree on the key.

    Args:
        lock_dir: directory for lock files (created if missing), outside any worktree.
        repo: the source repository's top-level directory.

    Yields:
        The lock file path.
    """
    os.makedirs(lock_dir, exist_ok=True)
    key = hashlib.sha256(os.fsencode(os.path.realpath(repo))).hexdigest()
    lock_path = os.path.join(lock_dir, f"{key}.lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield lock_path
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _common_dir(repo: str) -> str:
    common = _out(["rev-parse", "--git-common-dir"], repo)
    return os.path.realpath(os.path.join(repo, common))


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _worktree_list(repo: str) -> list[dict]:
    """Parse ``git worktree list --porcelain -z`` into dicts (path, head, branch, flags)."""
    data = git(["worktree", "list", "--porcelain", "-z"], repo).stdout
    records: list[dict] = []
    current: dict | None = None
    for field in data.split(b"\0"):
        if field == b"":
            if current is not None:
                records.append(current)
                current = None
            continue
        key, _, value = field.partition(b" ")
        if key == b"worktree":
            if current is not None:
                records.append(current)
            current = {"path": _fs(value), "head": None, "branch": None, "detached": False,
                       "bare": False, "locked": None, "prunable": None}
        elif current is None:
            continue
        elif key == b"HEAD":
            current["head"] = value.decode()
        elif key == b"branch":
            current["branch"] = _fs(value)
        elif key in (b"detached", b"bare"):
            current[key.decode()] = True
        elif key in (b"locked", b"prunable"):
            current[key.decode()] = value.decode("utf-8", "replace")
    if current is not None:
        records.append(current)
    return records


def _admin_dirs(common: str) -> set[str]:
    base = os.path.join(common, "worktrees")
    try:
        return {os.path.join(base, name) for name in os.listdir(base)}
    except FileNotFoundError:
        return set()


def _admin_dir_for(common: str, path: str) -> str | None:
    """The ``.git/worktrees/<id>`` directory whose ``gitdir`` file points at ``path``/.git."""
    for admin in sorted(_admin_dirs(common)):
        try:
            with open(os.path.join(admin, "gitdir"), "rb") as fh:
                gitdir = os.fsdecode(fh.read().rstrip(b"\n"))
        except OSError:
            continue
        if not os.path.isabs(gitdir):
            gitdir = os.path.join(admin, gitdir)
        if os.path.basename(gitdir) == ".git" and _same_path(os.path.dirname(gitdir), path):
            return admin
    return None


def _gitlinks(directory: str) -> list[tuple[str, str]]:
    """(path, pinned commit) of the gitlinks in the index of the repository at directory."""
    out = git(["ls-files", "--stage", "-z"], directory).stdout
    links = []
    for item in _split_z(out):
        meta, _, path = item.partition(b"\t")
        mode, oid, _stage = meta.split(b" ")
        if mode == b"160000":
            links.append((_fs(path), oid.decode()))
    return links


def _submodule_report(directory: str, prefix: str = "") -> list[dict]:
    """Each (recursive) submodule's path, pinned commit and checked-out commit (or None)."""
    report = []
    for path, pinned in _gitlinks(directory):
        sub = os.path.join(directory, path)
        head = None
        if os.path.exists(os.path.join(sub, ".git")):
            head = _rev_or_none(sub, "HEAD^{commit}")
        report.append({"path": prefix + path, "commit": head, "pinned": pinned})
        if head is not None:
            report.extend(_submodule_report(sub, prefix + path + "/"))
    return report


def _summary(stderr: str) -> str:
    """git's first fatal/error line, and its last line when that differs."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return ""
    first = next((line for line in lines if line.startswith(("fatal:", "error:"))), lines[-1])
    return first if first == lines[-1] else f"{first} ({lines[-1]})"


#: The protocols a fetch of the base commit's submodules may use (``protocol.allow`` is ``never``
#: otherwise). ``file`` is among them for the URLs of the base commit's ``.gitmodules`` only: the
#: repository a person chose (a local path is the common case), read before any agent ran; an
#: agent's ``.gitmodules`` is never fetched from (engine/steps/final.py, final verification).
SUBMODULE_PROTOCOLS = ("https", "http", "ssh", "git", "file")


def init_submodules(worktree: str) -> None:
    """Populate the submodules of a fresh worktree (its files are the base commit's: nothing an
    agent wrote yet) with the protocols of SUBMODULE_PROTOCOLS; ssh in batch mode."""
    env = {"GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND") or "ssh -o BatchMode=yes"}  # no passphrase wait
    allowed = [arg for name in SUBMODULE_PROTOCOLS for arg in ("-c", f"protocol.{name}.allow=always")]
    try:
        proc = git(
            [*allowed, "submodule", "update", "--init", "--recursive"],
            worktree, env=env, check=False, timeout=SUBMODULE_TIMEOUT_SECONDS,
        )
    except WorkspaceError as exc:  # timeout or git missing
        raise WorkspaceError("submodule_init_failed", exc.message, detail=exc.detail) from None
    if proc.returncode != 0:
        stderr = _decode(proc.stderr)
        raise WorkspaceError(
            "submodule_init_failed",
            f"The submodules of worktree {worktree} could not be populated: "
            f"{_summary(stderr) or 'git submodule update failed'}",
            detail=stderr,
        )


def ensure_worktree(
    repo: str,
    path: str,
    branch: str,
    commit: str,
    *,
    branch_owned: bool,
    lock_dir: str,
) -> dict:
    """Make sure ``path`` is a worktree of ``repo`` with ``branch`` checked out.

    Every refusal is decided before anything is written (docs/field-cases.md C01): a refused call
    leaves no directory at ``path``, no new ``.git/worktrees/<id>`` entry, and ``git worktree
    list`` unchanged. The whole operation holds :func:`repo_lock` for ``repo``.

    Decisions, in order:

    1. ``path`` is a live registered worktree of ``repo`` on ``branch``: reuse it (submodules
       are reported, not updated, so work inside them is not reset).
    2. ``path`` is registered but its directory is gone (docs/field-cases.md C02): that one registration (the
       ``.git/worktrees/<id>`` whose ``gitdir`` points at ``path``) is removed and creation
       proceeds; other registrations are untouched. A *locked* stale registration is
       respected and refused as ``workspace_path_exists``.
    3. ``branch`` is checked out in another worktree (including the main checkout):
       ``workspace_branch_in_use``.
    4. ``path`` exists on disk: ``workspace_path_exists``.
    5. ``branch`` exists: with ``branch_owned`` it is checked out as it is (``commit`` is
       ignored: its tip holds the run's checkpoints); without, ``workspace_branch_exists``.
       Otherwise ``branch`` is created at ``commit``.

    Repository hooks are not run (``core.hooksPath=/dev/null``). If the checked-out tree has
    ``.gitmodules``, ``git -c protocol.file.allow=always submodule update --init
    --recursive`` runs in the new worktree (docs/field-cases.md C04). Its clones live under the worktree's own
    admin directory (``.git/worktrees/<id>/modules``); like ``git submodule init`` anywhere,
    it records ``submodule.<name>.url``/``.active`` in the repository's shared config when
    they are not there yet (git has no per-worktree place for them unless
    ``extensions.worktreeConfig`` is enabled); existing values are not changed, and the
    original checkout's files, index and submodule directories are not touched.

    Args:
        repo: the source repository (its top-level directory).
        path: where the worktree lives (made absolute; parents are created).
        branch: short branch name, e.g. ``cp/run-7``.
        commit: revision the new branch starts at (resolved with :func:`resolve_commit`).
        branch_owned: the branch belongs to this run (it was created by it earlier).
        lock_dir: directory of the per-repository lock files.

    Returns:
        ``{"created": bool, "pruned_stale": bool, "head": str (40-hex HEAD of the worktree),
        "path": str (absolute), "submodules": [{"path": str, "commit": str | None,
        "pinned": str}]}``; submodule paths are relative to the worktree, nested ones joined
        with ``/``; ``commit`` is the checked-out commit (None if not populated).

    Raises:
        WorkspaceError: ``path_not_found``/``not_a_repository`` for ``repo``;
            ``workspace_branch_in_use``, ``workspace_path_exists``,
            ``workspace_branch_exists``, ``head_moved`` (the path is our live worktree but no
            longer on ``branch``); ``unknown_revision``/``ambiguous_revision``/
            ``not_a_commit`` for ``commit``; ``submodule_init_failed`` (the worktree is left
            in place for inspection); ``git_failed``.
        ValueError: ``branch`` is not a valid branch name.
    """
    _check_branch_name(branch)
    top = repo_root(repo)
    path = os.path.abspath(path)
    ref = f"refs/heads/{branch}"
    with repo_lock(lock_dir, repo):
        common = _common_dir(top)
        entries = _worktree_list(top)
        mine = [e for e in entries if _same_path(e["path"], path)]
        live = [e for e in mine if os.path.isdir(e["path"])]
        stale = [e for e in mine if not os.path.isdir(e["path"])]

        # 1. Reuse our own live worktree.
        for entry in live:
            if entry["branch"] == ref and os.path.exists(os.path.join(path, ".git")):
                head = _out(["rev-parse", "HEAD"], path)
                return {"created": False, "pruned_stale": False, "head": head, "path": path,
                        "submodules": _submodule_report(path)}

        # 1b. Our own live worktree, but on another branch or none: someone moved its HEAD
        # (an agent's `git branch -m` or checkout, docs/field-cases.md C31). Never re-created over the work in it.
        for entry in live:
            if entry["branch"] != ref and os.path.exists(os.path.join(path, ".git")):
                where = entry["branch"] or "a detached HEAD"
                raise WorkspaceError(
                    "head_moved",
                    f"The run's worktree {path} is no longer on branch {branch} but on {where}; "
                    f"its files are kept as they are for a person to look at.",
                )

        # 2. A stale registration of our path will be removed (decided now, done later).
        stale_admin: list[str] = []
        for entry in stale:
            if entry["locked"] is not None:
                raise WorkspaceError(
                    "workspace_path_exists",
                    f"The worktree path {path} is registered in {top} as a locked worktree "
                    f"whose directory is missing; unlock or prune it by hand.",
                )
            admin = _admin_dir_for(common, path)
            if admin is None:
                raise WorkspaceError(
                    "git_failed",
                    f"The stale worktree registration for {path} in {top} could not be "
                    f"located under {common}/worktrees.",
                )
            stale_admin.append(admin)

        # 3. Branch checked out in some other worktree.
        for entry in entries:
            if entry["branch"] == ref and entry not in stale:
                where = entry["path"]
                missing = "" if os.path.isdir(where) else (
                    " (its directory is missing; run git worktree prune)")
                raise WorkspaceError(
                    "workspace_branch_in_use",
                    f"The branch {branch} is already checked out in the worktree at "
                    f"{where}{missing}.",
                )

        # 4. Something else at the path.
        if os.path.lexists(path):
            raise WorkspaceError(
                "workspace_path_exists",
                f"The worktree path {path} already exists and is not a worktree of {top} on "
                f"branch {branch}.",
            )

        # 5. Branch ownership.
        branch_exists = _rev_or_none(top, ref) is not None
        if branch_exists and not branch_owned:
            raise WorkspaceError(
                "workspace_branch_exists",
                f"The branch {branch} already exists in {top} and does not belong to this "
                f"run; it is never taken over.",
            )
        start = None if branch_exists else resolve_commit(top, commit)

        # --- Writes start here. ---
        for admin in stale_admin:
            shutil.rmtree(admin)
        pruned = bool(stale_admin)

        first_missing = path
        while not os.path.exists(os.path.dirname(first_missing)):
            first_missing = os.path.dirname(first_missing)
        admins_before = _admin_dirs(common)
        hooks_off = ["-c", "core.hooksPath=/dev/null"]
        if branch_exists:
            args = [*hooks_off, "worktree", "add", "--quiet", path, branch]
        else:
            args = [*hooks_off, "worktree", "add", "--quiet", "--no-track", "-b", branch,
                    path, start]
        proc = git(args, top, check=False)
        if proc.returncode != 0:
            if not branch_exists and _rev_or_none(top, ref) == start:
                git(["update-ref", "-d", ref, start], top, check=False)
            for admin in _admin_dirs(common) - admins_before:
                shutil.rmtree(admin, ignore_errors=True)
            if os.path.lexists(first_missing):
                shutil.rmtree(first_missing, ignore_errors=True)
            stderr = _decode(proc.stderr)
            raise WorkspaceError(
                "git_failed",
                f"Creating the worktree {path} on branch {branch} failed: {stderr}",
                detail=stderr,
            )

        if os.path.exists(os.path.join(path, ".gitmodules")):
            init_submodules(path)
        head = _out(["rev-parse", "HEAD"], path)
        return {"created": True, "pruned_stale": pruned, "head": head, "path": path,
                "submodules": _submodule_report(path)}


def remove_worktree(
    repo: str,
    path: str,
    *,
    lock_dir: str,
    delete_branch: str | None = None,
) -> None:
    """Remove the worktree at ``path`` (and optionally a branch), holding :func:`repo_lock`.

    Uses ``git worktree remove --force`` (uncommitted work in it is discarded). A registered
    worktree whose directory is already gone has just its registration removed; a path that
    is neither registered nor present is fine. A branch to delete that does not exist is
    fine too.

    Args:
        repo: the source repository (its top-level directory).
        path: the worktree directory.
        lock_dir: directory of the per-repository lock files.
        delete_branch: short name of a branch to delete afterwards (``git branch -D``).

    Raises:
        WorkspaceError: ``workspace_path_exists`` if ``path`` exists but is not a worktree of
            ``repo`` (it is never deleted); ``workspace_branch_in_use`` if ``delete_branch``
            is checked out in another worktree; ``git_failed``.
        ValueError: ``delete_branch`` is not a valid branch name.
    """
    if delete_branch is not None:
        _check_branch_name(delete_branch)
    top = repo_root(repo)
    path = os.path.abspath(path)
    with repo_lock(lock_dir, repo):
        common = _common_dir(top)
        entries = [e for e in _worktree_list(top) if _same_path(e["path"], path)]
        if entries and _same_path(entries[0]["path"], top):
            raise WorkspaceError(
                "workspace_path_exists",
                f"The path {path} is the main checkout of {top}; it is never removed.",
            )
        if not entries:
            if os.path.lexists(path):
                raise WorkspaceError(
                    "workspace_path_exists",
                    f"The path {path} is not a worktree of {top}; it was not removed.",
                )
        else:
            # the files first, without git (agents wrote them: a repository they planted there must
            # never be read by git), then git's record of the worktree
            admin = _admin_dir_for(common, path)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            if admin is not None:
                shutil.rmtree(admin)

        if delete_branch is not None:
            ref = f"refs/heads/{delete_branch}"
            if _rev_or_none(top, ref) is not None:
                for entry in _worktree_list(top):
                    if entry["branch"] == ref:
                        raise WorkspaceError(
                            "workspace_branch_in_use",
                            f"The branch {delete_branch} is checked out in the worktree at "
                            f"{entry['path']}; it was not deleted.",
                        )
                git(["branch", "-D", delete_branch], top)


def worktree_tree(worktree: str) -> str:
    """The tree id of every file in ``worktree`` as it is on disk, ignored ones included: ``git add
    -A -f`` into a temporary index (a copy of the worktree's, so unchanged files keep their stat data
    and are not hashed again, as :func:`manifest` does) and ``git write-tree``. The worktree's own
    index is not touched. Raises WorkspaceError (``git_failed``)."""
    top, own_index = _top_and_index(worktree)
    with tempfile.TemporaryDirectory(prefix="cp-tree-") as tmp:
        index = os.path.join(tmp, "index")
        if os.path.exists(own_index):
            shutil.copy2(own_index, index)
        env = {"GIT_INDEX_FILE": index, "GIT_OPTIONAL_LOCKS": "0"}
        git([*_TEMP_INDEX_CONFIG, "add", "-A", "-f"], top, env=env)
        return _out([*_TEMP_INDEX_CONFIG, "write-tree"], top, env=env)


def remove_tree(path: str) -> None:
    """``shutil.rmtree(path)`` that also empties folders a command made read-only (each made
    writable again by its owner, following no symlink) and ignores what still cannot be removed."""
    def again(func, failed, _exc):
        parent = os.path.dirname(failed)
        with contextlib.suppress(OSError):
            if not os.path.islink(parent):
                os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IMODE(os.lstat(failed).st_mode) | stat.S_IRWXU)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                func(failed)
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path):
            with contextlib.suppress(OSError):
                os.remove(path)
            return
        shutil.rmtree(path, onerror=again)


def _unclutter(top: str) -> None:
    """What ``git clean`` would leave or fail on below ``top``, handled with the os module (no
    symlink followed, the top's ``.git`` not entered): FIFOs, sockets and device files removed
    (git sees none of them), folders made readable, writable and searchable by their owner again
    (before they are listed: one ``scandir`` a folder)."""
    folders = [top]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError:  # gone meanwhile, or not a folder we may list even now: git clean says what is left
            continue
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
                    if mode & stat.S_IRWXU != stat.S_IRWXU:
                        os.chmod(entry.path, mode | stat.S_IRWXU)
                if not (folder == top and entry.name == ".git"):
                    folders.append(entry.path)
            elif not entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.remove(entry.path)


def reset_to_commit(worktree: str, commit: str, *, repo: str | None = None, lock_wait: float = 0.0) -> bool:
    """Make the files of ``worktree`` exactly ``commit``'s, nothing beside them: ``git clean -ffdxq``
    (every untracked file, ignored ones and nested repositories included; FIFOs, sockets and device
files, which git does not see, removed and read-only folders made writable first), ``git read-tree --reset -u
    <commit>`` (index and files; HEAD and the branch are not moved; a file whose stat data changed,
    its change time included, is written again), ``git clean -ffdxq`` once more. Then the files
    on disk are hashed (:func:`worktree_tree`) and compared with ``commit``'s tree.

    This is how the final verification gets a clean checkout of the final checkpoint without a
    second one (engine/steps/final.py): the run's own worktree, reset before each check.

    Args:
        worktree: the run's worktree.
        commit: 40-hex commit whose tree the files must be.
        repo, lock_wait: how git's ``index.lock`` is lived with, as for :func:`git_index_op`.

    Returns:
        True when the files are exactly the commit's tree; False when something could not be put
        back (git failed to clean or write a file): the caller must not test there.

    Every ``.git`` below the top that an agent or a command may have made
    (:func:`find_nested_repositories`) is removed first with the os module, following no symlink,
    before any git reads the files (git entering such a repository would run what its configuration
    names); the worktree's own ``.git`` and submodules checked out from the repository stay.

    Raises:
        WorkspaceError: ``git_failed``, ``index_locked``.
    """
    top = os.path.realpath(worktree)
    planted = _nested_dotgits(top, commit, keep=False)
    for path in planted:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
    if planted and _nested_dotgits(top, commit, keep=False):
        return False
    _unclutter(top)
    # untracked files first (a .gitattributes a check left must not shape the files git writes), then
    # the commit's files, then whatever the reset left untracked
    try:
        git(["clean", "-ffdxq"], worktree)
        git_index_op(["read-tree", "--reset", "-u", "--no-recurse-submodules", commit], worktree, repo=repo,
                     wait_seconds=lock_wait)
        git(["clean", "-ffdxq"], worktree)
    except WorkspaceError as exc:
        if exc.code != "git_failed":
            raise
        return False  # the caller says so and tests in a fresh checkout
    want = _out(["rev-parse", "--verify", "--end-of-options", f"{commit}^{{tree}}"], worktree)
    return worktree_tree(worktree) == want


def tree_commit(worktree: str, tree: str, parent: str) -> str:
    """A commit of ``tree`` (a manifest's, already in the repository's objects) on ``parent``, reached by
    no ref: what :func:`add_detached_worktree` checks out to look at files an agent left without
    touching its worktree (git's garbage collection removes it in time)."""
    return _out(["commit-tree", "--no-gpg-sign", tree, "-p", parent, "-m", "files left by an agent, looked at"],
                worktree, env=_checkpoint_env())


def add_detached_worktree(repo: str, path: str, commit: str, *, lock_dir: str) -> None:
    """``git worktree add --detach -q <path> <commit>`` in ``repo``, holding :func:`repo_lock`.

    Only this registration is made; nothing else of the repository's worktree list is read or
    pruned. Remove it with :func:`remove_worktree` (its own path only).

    Args:
        repo: the source repository (the path its other worktree operations lock with).
        path: absolute directory of the new checkout; it must not exist.
        commit: 40-hex commit to check out, detached.
        lock_dir: directory of the per-repository lock files.

    Raises:
        WorkspaceError: ``git_failed`` (also when ``path`` exists or is registered).
    """
    with repo_lock(lock_dir, repo):
        git(["worktree", "add", "--detach", "-q", os.path.abspath(path), commit], repo)


# ---------------------------------------------------------------------------------------------
# git's index lock in a run's worktree
# ---------------------------------------------------------------------------------------------

#: git's own message when a lock file it needs exists (another git holds it, or a git that was
#: killed left it): ``fatal: Unable to create '<path>.lock': File exists.``
_LOCK_EXISTS = re.compile(r"Unable to create '(.+?\.lock)': File exists")
#: Backoff between two tries of an index operation whose lock a live process holds (seconds).
_LOCK_BACKOFF_FIRST, _LOCK_BACKOFF_MAX = 0.1, 2.0


def index_lock_path(worktree: str, repo: str | None = None) -> str | None:
    """Absolute path of git's ``index.lock`` for ``worktree``, or None when it cannot be known.

    For a linked worktree it is ``<common git dir>/worktrees/<id>/index.lock``, where ``<id>``
    is the administrative folder whose ``gitdir`` file points back at ``worktree/.git``: the
    worktree's own ``.git`` file (which an agent's files sit next to) is not trusted for it. For a
    main checkout it is ``<top>/.git/index.lock``. Never raises: a missing repository or worktree,
    or a worktree ``repo`` does not register, gives None.

    Args:
        worktree: the worktree's top-level directory.
        repo: a directory of its repository (default: ``worktree`` itself).
    """
    try:
        common = _common_dir(repo or worktree)
    except WorkspaceError:
        return None
    path = os.path.abspath(worktree)
    admin = _admin_dir_for(common, path)
    if admin is not None:
        return os.path.join(admin, "index.lock")
    dotgit = os.path.join(path, ".git")
    if os.path.isdir(dotgit) and not os.path.islink(dotgit) and _same_path(dotgit, common):
        return os.path.join(common, "index.lock")
    return None


def _is_git(name: str, cmdline: list[str]) -> bool:
    names = [name or ""]
    if cmdline:
        names.append(os.path.basename(cmdline[0]))
    return any(n == "git" or n.startswith("git-") for n in names)


def _inside(path: str | None, folders: list[str]) -> bool:
    if not path:
        return False
    real = os.path.realpath(path)
    return any(real == f or real.startswith(f + os.sep) for f in folders)


def index_lock_holders(lock_path: str, worktree: str) -> list[dict]:
    """The live processes that hold, or may hold, ``lock_path`` (git's index lock of ``worktree``).

    Conservative: every live process on this host (psutil; zombies are not live) is looked at,
    and counts as a holder when

    1. it has ``lock_path`` open (git keeps its lock file open while it writes the new index), or
    2. it is a git (its name, or its argv[0]'s basename, is ``git`` or ``git-*``) whose working
       directory is inside ``worktree`` or the lock's folder, or whose arguments name either
       (a git that closed the lock file but has not yet renamed or removed it), or
    3. its open files or working directory cannot be read (no permission) and it is a git, or
       its arguments name the worktree or the lock's folder.

    A process that cannot be read and is neither a git nor names these paths is not counted (on
    a shared host, other users' unrelated processes would otherwise keep every lock forever).

    Returns:
        ``[{"pid": int, "name": str, "why": "open" | "git_in_worktree" | "unreadable"}]``,
        empty when nothing live holds the lock.
    """
    lock_real = os.path.realpath(lock_path)
    folders = [os.path.realpath(worktree), os.path.dirname(lock_real)]
    holders = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        info = proc.info
        if info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        name, cmdline = info.get("name") or "", info.get("cmdline") or []
        names_paths = any(_inside(arg, folders) for arg in cmdline if arg.startswith(os.sep))
        try:
            if any(os.path.realpath(f.path) == lock_real for f in proc.open_files()):
                holders.append({"pid": proc.pid, "name": name, "why": "open"})
                continue
            if _is_git(name, cmdline) and (names_paths or _inside(proc.cwd(), folders)):
                holders.append({"pid": proc.pid, "name": name, "why": "git_in_worktree"})
        except psutil.NoSuchProcess:
            continue
        except (psutil.AccessDenied, OSError):
            if _is_git(name, cmdline) or names_paths:
                holders.append({"pid": proc.pid, "name": name, "why": "unreadable"})
    return holders


def clear_stale_index_lock(worktree: str, repo: str | None = None) -> dict:
    """Remove git's ``index.lock`` of ``worktree`` when a killed git left it: only after
    :func:`index_lock_holders` finds no live process that holds or may hold it, and only when
    it is still the same file (device, inode, modification time) after that look.

    Never raises (a missing repository or worktree gives ``"absent"``).

    Returns:
        ``{"path": str | None, "state": "absent" | "removed" | "live", "holders": [...],
        "age_seconds": float | None}`` (the age of a removed or live lock, from its mtime).
    """
    path = index_lock_path(worktree, repo)
    result = {"path": path, "state": "absent", "holders": [], "age_seconds": None}
    if path is None:
        return result
    try:
        before = os.lstat(path)
    except OSError:
        return result
    result["age_seconds"] = max(0.0, time.time() - before.st_mtime)
    try:
        holders = index_lock_holders(path, worktree)
    except Exception as exc:  # psutil could not list the processes: nothing is removed
        holders = [{"pid": 0, "name": f"unknown ({type(exc).__name__})", "why": "unreadable"}]
    if holders:
        result.update({"state": "live", "holders": holders})
        return result
    try:
        after = os.lstat(path)
    except OSError:
        return result  # its owner finished meanwhile
    if (after.st_dev, after.st_ino, after.st_mtime_ns) != (before.st_dev, before.st_ino, before.st_mtime_ns):
        result["state"] = "live"  # written while we looked: in use
        return result
    try:
        os.unlink(path)
    except FileNotFoundError:
        return result
    except OSError:
        result["state"] = "live"
        return result
    result["state"] = "removed"
    return result


def _holders_text(holders: list[dict]) -> str:
    return ", ".join(f"pid {h['pid']} ({h['name'] or '?'})" for h in holders[:5]) or "a process that could not be named"


def git_index_op(
    args: list[str],
    worktree: str,
    *,
    repo: str | None = None,
    wait_seconds: float = 0.0,
    on_wait: Callable[[dict], None] | None = None,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run a git command that writes ``worktree``'s index (``reset``, ``restore``), living with
    git's ``index.lock``.

    When git refuses because the worktree's ``index.lock`` exists: a stale lock (no live
    holder, :func:`clear_stale_index_lock`) is removed and the command runs again at once; a live
    one is waited for, with a backoff from 0.1 s doubling up to 2 s, until ``wait_seconds`` have
    passed since the call; then the command gives up. Another lock git names (a ref's) is a
    plain failure.

    Args:
        args: git arguments, as for :func:`git`.
        worktree: the worktree (the command's working directory).
        repo: a directory of its repository, for :func:`index_lock_path`.
        wait_seconds: the most seconds to wait for a live holder (0: no wait).
        on_wait: called once, when the first wait begins, with ``{"path", "holders",
            "wait_seconds"}``; an exception it raises is ignored.
        input, env: as for :func:`git`.

    Returns:
        git's ``CompletedProcess`` (exit status 0).

    Raises:
        WorkspaceError: ``index_locked`` when a live process still holds the lock after
            ``wait_seconds`` (the message names the lock and the processes; nothing was
            removed); ``git_failed`` for any other failure.
    """
    end = time.monotonic() + max(0.0, wait_seconds)
    delay, told, retries = _LOCK_BACKOFF_FIRST, False, 0
    expected = None
    while True:
        proc = git(args, worktree, check=False, input=input, env=env)
        if proc.returncode == 0:
            return proc
        stderr = _decode(proc.stderr)
        found = _LOCK_EXISTS.search(stderr)
        if expected is None and found:
            expected = index_lock_path(worktree, repo)
        if not (found and expected and _same_path(found.group(1), expected)):
            raise WorkspaceError(
                "git_failed", f"git {' '.join(args[:2])} failed in {worktree} (exit {proc.returncode}): "
                              f"{stderr or 'no message'}", detail=stderr)
        state = clear_stale_index_lock(worktree, repo)
        if state["state"] in ("removed", "absent"):
            retries += 1
            if retries <= 3:  # at once; a lock that keeps coming back is then waited for like a live one
                continue
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise WorkspaceError(
                "index_locked",
                f"git's index lock {expected} of the worktree {worktree} is held by {_holders_text(state['holders'])}, "
                f"still after {wait_seconds:.0f} s of waiting; it was not removed (a live process holds it). "
                f"git {' '.join(args[:2])} did not run.", detail=stderr)
        if not told and on_wait is not None:
            told = True
            try:
                on_wait({"path": expected, "holders": state["holders"], "wait_seconds": wait_seconds})
            except Exception:
                pass
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _LOCK_BACKOFF_MAX)


def reset_index_to(
    worktree: str,
    branch: str,
    commit: str,
    *,
    repo: str | None = None,
    wait_seconds: float = 0.0,
    on_wait: Callable[[dict], None] | None = None,
) -> None:
    """Make ``worktree``'s index equal to ``commit``'s tree (``git reset -q`` mixed: working files
    are not touched), when the worktree is on ``branch`` and ``branch`` is at ``commit``: what a
    checkpoint whose ``git reset`` did not run (a crash, a lock) still owes.

    Args:
        worktree, branch: the run's worktree and branch (short name).
        commit: the checkpoint commit (40-hex).
        repo, wait_seconds, on_wait: as for :func:`git_index_op`.

    Raises:
        WorkspaceError: ``head_moved`` when HEAD is not ``refs/heads/<branch>`` or the branch is
            not at ``commit`` (nothing is reset); ``index_locked``; ``git_failed``.
    """
    _check_branch_name(branch)
    ref = f"refs/heads/{branch}"
    head = git(["symbolic-ref", "-q", "HEAD"], worktree, check=False)
    tip = _rev_or_none(worktree, ref)
    if head.returncode != 0 or _decode(head.stdout) != ref or tip != commit:
        raise WorkspaceError(
            "head_moved",
            f"The worktree {worktree} is not on branch {branch} at {commit[:12]} (HEAD "
            f"{_decode(head.stdout) or 'detached'}, branch at {tip or 'nothing'}); its index was not reset.")
    git_index_op(["reset", "-q", "--no-recurse-submodules"], worktree, repo=repo, wait_seconds=wait_seconds,
                 on_wait=on_wait)


# ---------------------------------------------------------------------------------------------
# Manifest and patch
# ---------------------------------------------------------------------------------------------


# One record of ``git ls-tree -r -z``: ``<mode> <type> <object>\t<path>\0``.
_LS_TREE_ROW = re.compile(rb"([^ \0]+) [^ \0]+ ([^\t\0]+)\t([^\0]*)\0")
# One record of ``git ls-files --stage -z``: ``<mode> <object> <stage>\t<path>\0``.
_LS_FILES_ROW = re.compile(rb"([^ \0]+) ([^ \0]+) ([0-3])\t([^\0]*)\0")


def _rows(pattern: re.Pattern, out: bytes, what: str) -> list[tuple[bytes, ...]]:
    """Parse NUL-terminated git output in one pass; every record must match ``pattern``."""
    rows = pattern.findall(out)
    if len(rows) != out.count(b"\0"):
        raise WorkspaceError("git_failed", f"git {what} printed output that could not be parsed.")
    return rows


class _TreeFiles:
    """The files of a tree as ``git ls-tree -r`` lists them, sorted by path bytes.

    ``keys[i]`` is the path of ``rows[i]`` as bytes (the sort key); ``rows[i]`` is
    ``(path, mode, object)`` as str.
    """

    __slots__ = ("keys", "rows")

    def __init__(self, cwd: str, tree: str) -> None:
        out = git(["ls-tree", "-r", "-z", "--full-tree", tree], cwd).stdout
        records = _rows(_LS_TREE_ROW, out, "ls-tree")
        # ``ls-tree -r`` walks the trees in their stored order, which for a well-formed tree
        # is the byte order of the full paths (a directory sorts as its name plus "/", and
        # every path below it starts with exactly that); only a malformed tree is re-sorted.
        if any(records[i][2] >= records[i + 1][2] for i in range(len(records) - 1)):
            records.sort(key=lambda record: record[2])
        modes: dict[bytes, str] = {}  # a handful of distinct values: one str each
        self.keys = [path for _mode, _oid, path in records]
        self.rows = [(_fs(path), modes.get(mode) or modes.setdefault(mode, mode.decode()),
                      oid.decode()) for mode, oid, path in records]

    def entries(self, changes: Sequence[dict] = ()) -> list[dict]:
        """``[{"path", "mode", "blob"}]`` of this tree with ``changes`` (sorted by path bytes,
        as :func:`_parse_raw_diff` returns them) applied: a changed path takes its new mode
        and blob, or is left out when deleted; an added path is inserted in order. The dicts
        are new on every call."""
        keys, rows = self.keys, self.rows
        entries: list[dict] = []
        start = 0
        for change in changes:
            key = os.fsencode(change["path"])
            stop = bisect.bisect_left(keys, key, start)
            entries += [{"path": p, "mode": m, "blob": b} for p, m, b in rows[start:stop]]
            if stop < len(keys) and keys[stop] == key:
                stop += 1  # the base entry is replaced or deleted
            if change["new_mode"] is not None:
                entries.append({"path": change["path"], "mode": change["new_mode"],
                                "blob": change["new_blob"]})
            start = stop
        entries += [{"path": p, "mode": m, "blob": b} for p, m, b in rows[start:]]
        return entries


def _tree_entries(cwd: str, tree: str) -> list[dict]:
    """``[{"path", "mode", "blob"}]`` of every file of ``tree`` (any tree-ish), sorted by path
    bytes; gitlinks are listed with mode 160000."""
    return _TreeFiles(cwd, tree).entries()


# The files of recently used base commits, keyed by commit id. A commit id names its content,
# so an entry never goes stale; the few kept bound the memory (about 7 MB per 20,000 files).
_BASE_FILES: collections.OrderedDict[str, _TreeFiles] = collections.OrderedDict()
_BASE_FILES_LOCK = threading.Lock()
_BASE_FILES_KEPT = 4


def _base_files(cwd: str, commit: str) -> _TreeFiles:
    """:class:`_TreeFiles` of a commit (a full id), read once and then kept in memory."""
    with _BASE_FILES_LOCK:
        files = _BASE_FILES.get(commit)
        if files is not None:
            _BASE_FILES.move_to_end(commit)
            return files
    files = _TreeFiles(cwd, commit)
    with _BASE_FILES_LOCK:
        _BASE_FILES[commit] = files
        while len(_BASE_FILES) > _BASE_FILES_KEPT:
            _BASE_FILES.popitem(last=False)
    return files


def _files_of(cwd: str, commit: str, keep: bool) -> _TreeFiles:
    """:func:`_base_files` when ``keep``; otherwise the kept list if there is one, else a list read
    for this call only. A commit that is no stage's base (a run's final checkpoint, read once by the
    final verification) must not push the bases out: each run's would stay kept in the worker,
    about 7 MB per 20,000 files, up to ``_BASE_FILES_KEPT`` of them (bench/worker_memory.py)."""
    if keep:
        return _base_files(cwd, commit)
    with _BASE_FILES_LOCK:
        files = _BASE_FILES.get(commit)
    return files if files is not None else _TreeFiles(cwd, commit)


_DIFF_STATUS = {"A": "added", "D": "deleted", "T": "type_changed"}


def _parse_raw_diff(out: bytes) -> list[dict]:
    """Changes from ``git diff-tree``/``diff-index`` ``-z`` raw output, sorted by path bytes."""
    items = _split_z(out)
    changes = []
    for i in range(0, len(items) - 1, 2):
        old_mode, new_mode, old_blob, new_blob, status = items[i].lstrip(b":").decode().split()
        letter = status[0]
        if letter == "M":
            word = "mode_changed" if old_blob == new_blob else "modified"
        else:
            word = _DIFF_STATUS.get(letter, "modified")
        changes.append({
            "path": _fs(items[i + 1]),
            "status": word,
            "old_mode": None if old_mode == "000000" else old_mode,
            "new_mode": None if new_mode == "000000" else new_mode,
            "old_blob": None if old_blob == _NULL_OID else old_blob,
            "new_blob": None if new_blob == _NULL_OID else new_blob,
        })
    changes.sort(key=lambda c: os.fsencode(c["path"]))
    return changes


def _index_changes(cwd: str, base: str, env: dict) -> list[dict]:
    """Changes from ``base`` to the index named in ``env``: ``git diff-index --cached``, which
    prints what ``git diff-tree -r`` prints between ``base`` and the tree that index writes
    (without writing it, and without reading the unchanged subtrees twice)."""
    out = git([*_TEMP_INDEX_CONFIG, "diff-index", "--cached", "-z", "--no-renames",
               "--no-ext-diff", "--ignore-submodules=none", base], cwd, env=env).stdout
    return _parse_raw_diff(out)


def _index_info(mode: str, oid: str, path: str, stage: int | None = None) -> bytes:
    """One ``git update-index -z --index-info`` record."""
    meta = f"{mode} {oid}" if stage is None else f"{mode} {oid} {stage}"
    return meta.encode() + b"\t" + os.fsencode(path) + b"\0"


def _to_restore(cwd: str, changes: list[dict], exclude_file: str,
                tmp: str) -> tuple[list[bytes], list[str]]:
    """Which changed paths the exclude patterns send back to their base state.

    The patterns are asked of git's own matcher, ``git ls-files --cached --ignored
    --exclude-from``, as the first version of :func:`manifest` asked it about every entry of
    the index before and after ``add -A``. Whether it takes an entry depends on the entry's
    path, its mode and, for a directory-only pattern such as ``build/``, on what is at that
    path in the working tree (git 2.39 looks there with ``lstat``), never on its blob, its
    stage or the other entries. So an entry the worktree left as it was at base matches now
    exactly as it did then, and would be restored to itself: only the changed paths need
    asking. Each is asked about both of its sides at once, in a small scratch index holding
    its base entry as stage 1 and its current entry as stage 2.

    Returns ``(records, changed_tracked)``: ``git update-index --index-info`` records putting
    back the base entry of a path that matched at base (its path is also in
    ``changed_tracked``) and removing a path that matches only now (an untracked file let in
    by a repository ``!`` rule, for example); empty lists when nothing is to be restored.
    """
    if not changes:
        return [], []
    records = []
    for change in changes:
        path = change["path"]
        if change["old_mode"] is not None:
            records.append(_index_info(change["old_mode"], change["old_blob"], path, 1))
        if change["new_mode"] is not None:
            records.append(_index_info(change["new_mode"], change["new_blob"], path, 2))
    env = {"GIT_INDEX_FILE": os.path.join(tmp, "check-index"), "GIT_OPTIONAL_LOCKS": "0"}
    git([*_TEMP_INDEX_CONFIG, "update-index", "-z", "--index-info"], cwd, env=env,
        input=b"".join(records))
    out = git([*_TEMP_INDEX_CONFIG, "ls-files", "--stage", "-z", "--cached", "--ignored",
               f"--exclude-from={exclude_file}"], cwd, env=env).stdout
    matched = {(_fs(path), stage)
               for _mode, _oid, stage, path in _rows(_LS_FILES_ROW, out, "ls-files")}
    restore: list[bytes] = []
    changed_tracked: list[str] = []
    for change in changes:  # sorted by path bytes
        path = change["path"]
        if (path, b"1") in matched:
            changed_tracked.append(path)
            restore.append(_index_info(change["old_mode"], change["old_blob"], path))
        elif (path, b"2") in matched:
            restore.append(_index_info("0", _NULL_OID, path))
    return restore, changed_tracked


def _ls_files_paths(cwd: str, args: list[str], env: dict, config: list[str]) -> list[str]:
    """The paths ``git ls-files -z <args>`` prints (``config``: extra ``-c`` settings)."""
    out = git([*_TEMP_INDEX_CONFIG, *config, "ls-files", "-z", *args], cwd, env=env).stdout
    return [_fs(p) for p in _split_z(out)]


def _drop_listed_parents(paths: list[str]) -> list[str]:
    """``paths`` without the directories (``dir/``) that have a listed path below them."""
    listed = set(paths)
    parents = set()
    for path in paths:
        parts = path.rstrip("/").split("/")
        parents.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
    return [p for p in listed if p not in parents]


def _covered(path: str, prefixes: set[str]) -> bool:
    """Whether ``path`` or one of its parent directories (``dir/``) is in ``prefixes``."""
    if path in prefixes:
        return True
    parts = path.rstrip("/").split("/")
    return any("/".join(parts[:i]) + "/" in prefixes for i in range(1, len(parts)))


def _untracked_excluded(cwd: str, env: dict, exclude_file: str, empty_file: str) -> set[str]:
    """Untracked paths kept out by the patterns and not ignored by the repository itself.

    Two walks of the working files, both against the final temporary index: the untracked
    paths the patterns match, then (only when there are some) the untracked paths the
    repository's own rules ignore, limited by literal pathspecs to the top-level entries the
    first walk named (a walk with pathspecs lists, below each of them, what the full walk
    would). With ``--directory`` git lists an untracked directory whose content is all
    ignored as ``dir/`` and, below it, the entries that matched by themselves; the latter are
    kept (e.g. ``config/.env.local`` rather than ``config/``).
    """
    matching = _drop_listed_parents(_ls_files_paths(
        cwd, ["--others", "--ignored", "--directory", f"--exclude-from={exclude_file}"], env,
        []))
    if not matching:
        return set()
    tops = sorted({path.split("/", 1)[0] for path in matching}, key=os.fsencode)
    repo_ignored = set(_ls_files_paths(
        cwd, ["--others", "--ignored", "--directory", "--exclude-standard", "--", *tops],
        {**env, "GIT_LITERAL_PATHSPECS": "1"}, ["-c", f"core.excludesFile={empty_file}"]))
    return {path for path in matching if not _covered(path, repo_ignored)}


def _gitdir_of(dotgit: str) -> str | None:
    """The real path a ``.git`` file's ``gitdir:`` line names, or None when it is no such file."""
    try:
        with open(dotgit, "rb") as fh:
            text = fh.read(4097)
    except OSError:
        return None
    if len(text) > 4096 or not text.startswith(b"gitdir:"):
        return None
    target = os.fsdecode(text[len(b"gitdir:"):].strip())
    return os.path.realpath(os.path.join(os.path.dirname(dotgit), target))


def find_nested_repositories(worktree: str, base_commit: str) -> list[str]:
    """The ``.git`` entries of :func:`_nested_dotgits`, relative to ``worktree`` and as text (a byte
    that is not UTF-8 as ``\\xNN``), sorted."""
    top = os.path.realpath(worktree)
    # shown and stored as text: bytes that are not UTF-8 as \xNN escapes
    return sorted(os.fsencode(os.path.relpath(dotgit, top)).decode("utf-8", "backslashreplace")
                  for dotgit in _nested_dotgits(top, base_commit))


def _nested_dotgits(worktree: str, base_commit: str, keep: bool = True) -> list[str]:
    """Absolute paths of every ``.git`` below the top of ``worktree`` that an agent may have made.

    Read with the os module only, before any git looks at the files: git entering a repository
    an agent made would read that repository's configuration (``core.fsmonitor``,
    ``core.sshCommand`` with a promisor remote and a missing HEAD, filters...) and run what it
    names, as the worker's user, outside the sandbox. A ``.git`` of any kind (folder, file,
    symlink) counts, except the worktree's own ``.git`` and, at a gitlink of ``base_commit`` (a
    submodule of the repository a person gave) or below one, a regular ``.git`` file whose
    ``gitdir:`` lies in the repository's own git folder (which agents cannot write): how
    ``git submodule update`` leaves a populated submodule. Symlinked folders are not followed.

    ``keep`` False reads a commit seen once (a run's final checkpoint) without keeping its file
    list among the base commits' (:func:`_files_of`).

    Raises:
        WorkspaceError: the revision errors of :func:`resolve_commit`; ``git_failed``.
    """
    top = os.path.realpath(worktree)
    common = os.path.realpath(_common_dir(top))
    base = base_commit if _HEX40.fullmatch(base_commit) else resolve_commit(top, base_commit)
    links = [os.path.join(top, path) for path, mode, _oid in _files_of(top, base, keep).rows if mode == "160000"]
    found = []
    for folder, dirs, files in os.walk(top, followlinks=False):
        if ".git" in dirs or ".git" in files:
            dotgit = os.path.join(folder, ".git")
            if folder != top:
                target = None if os.path.islink(dotgit) or not os.path.isfile(dotgit) else _gitdir_of(dotgit)
                submodule = any(folder == link or folder.startswith(link + os.sep) for link in links)
                if not (submodule and target and (target == common or target.startswith(common + os.sep))):
                    found.append(dotgit)
            if ".git" in dirs:
                dirs.remove(".git")
    return found


def outward_symlinks(worktree: str, changes: list[dict]) -> list[dict]:
    """The symlinks among a manifest's ``changes`` (added or changed to mode 120000) that point
    out of ``worktree``: ``[{"path", "target", "resolves_to"}]``, sorted by path.

    Outward means: an absolute target (even one naming a file inside: the worktree is moved
    and checked out elsewhere), a target that leaves the worktree once ``..`` segments are
    resolved by name, one that leaves it once the links on its way are followed (``os.path
    .realpath``), or one that reaches the worktree's ``.git``. Read with the os module; what
    the link names is never opened.
    """
    top = os.path.realpath(worktree)
    git_dir = os.path.join(top, ".git")
    found = []
    for change in changes:
        if change.get("new_mode") != "120000":
            continue
        full = os.path.join(top, change["path"])
        try:
            target = os.readlink(full)
        except OSError:
            continue
        lexical = os.path.normpath(os.path.join(os.path.dirname(full), target))
        real = os.path.realpath(full)
        inside = [p == top or p.startswith(top + os.sep) for p in (lexical, real)]
        into_git = any(p == git_dir or p.startswith(git_dir + os.sep) for p in (lexical, real))
        if os.path.isabs(target) or not all(inside) or into_git:
            show = lambda text: os.fsencode(text).decode("utf-8", "backslashreplace")  # noqa: E731
            found.append({"path": change["path"], "target": show(target), "resolves_to": show(real)})
    return sorted(found, key=lambda item: os.fsencode(item["path"]))


def refuse_nested_repositories(worktree: str, base_commit: str) -> None:
    """Raise WorkspaceError ``nested_repository`` naming what :func:`find_nested_repositories` found."""
    found = find_nested_repositories(worktree, base_commit)
    if found:
        shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
        raise WorkspaceError(
            "nested_repository",
            f"The worktree {worktree} holds a git repository the run did not start with ({shown}). The "
            f"engine runs no git on it (git would read that repository's configuration and could run what "
            f"it names) and never checkpoints a gitlink an agent made.",
            detail="\n".join(found),
        )


def _top_and_index(worktree: str) -> tuple[str, str]:
    """The worktree's top-level directory and the absolute path of its own index file."""
    out = _out(["rev-parse", "--show-toplevel", "--path-format=absolute", "--git-path", "index"],
               worktree).split("\n")
    if len(out) == 2:
        return out[0], out[1]
    top = _out(["rev-parse", "--show-toplevel"], worktree)  # a path with a newline in it
    return top, _out(["rev-parse", "--path-format=absolute", "--git-path", "index"], top)


def _build_manifest(worktree: str, base_commit: str, excludes: list[str] | None,
                    details: bool) -> dict:
    """The work of :func:`manifest`; with ``details`` False only ``tree``, ``digest`` and
    ``base`` are computed (the same values)."""
    patterns = DEFAULT_EXCLUDES if excludes is None else list(excludes)
    base = resolve_commit(worktree, base_commit)
    refuse_nested_repositories(worktree, base)  # before git reads a file an agent wrote
    top, own_index = _top_and_index(worktree)
    with tempfile.TemporaryDirectory(prefix="cp-manifest-") as tmp:
        index = os.path.join(tmp, "index")
        exclude_file = os.path.join(tmp, "exclude")
        with open(exclude_file, "w", encoding="utf-8") as fh:
            fh.write("".join(p + "\n" for p in patterns))
        if os.path.exists(own_index):
            shutil.copy2(own_index, index)
        env = {"GIT_INDEX_FILE": index, "GIT_OPTIONAL_LOCKS": "0"}

        proc = git([*_TEMP_INDEX_CONFIG, "read-tree", "-m", base], top, env=env, check=False)
        if proc.returncode != 0:  # e.g. unmerged entries in the copied index
            with contextlib.suppress(FileNotFoundError):
                os.remove(index)
            git([*_TEMP_INDEX_CONFIG, "read-tree", base], top, env=env)

        # Untracked files matching the patterns are skipped by add through core.excludesFile
        # (this also replaces the user's global excludes file).
        git([*_TEMP_INDEX_CONFIG, "-c", f"core.excludesFile={exclude_file}", "add", "-A"],
            top, env=env)
        # The patterns are authoritative: whatever matches them now (a tracked file changed,
        # deleted, or an untracked one let in by a repository "!" rule) goes back to base.
        changes = _index_changes(top, base, env)
        restore, changed_tracked = _to_restore(top, changes, exclude_file, tmp)
        if restore:
            git([*_TEMP_INDEX_CONFIG, "update-index", "-z", "--index-info"], top, env=env,
                input=b"".join(restore))
            changes = _index_changes(top, base, env)
        tree = _out([*_TEMP_INDEX_CONFIG, "write-tree"], top, env=env)
        if not details:
            return {"tree": tree, "digest": tree, "base": base}

        empty_file = os.path.join(tmp, "empty")
        open(empty_file, "wb").close()
        excluded = _untracked_excluded(top, env, exclude_file, empty_file)
        excluded.update(changed_tracked)

    return {
        "tree": tree,
        "digest": tree,
        "base": base,
        "entries": _base_files(top, base).entries(changes),
        "changes": changes,
        "excluded": sorted(excluded, key=os.fsencode),
    }


def manifest(worktree: str, base_commit: str, excludes: list[str] | None = None) -> dict:
    """Content manifest of the deliverable files in ``worktree``, compared with ``base_commit``.

    Computed with git's machinery in a temporary index (``GIT_INDEX_FILE`` in a temporary
    directory): a copy of the worktree's own index, ``git read-tree -m base_commit`` (the
    index becomes the base tree, keeping stat data of unchanged files so they are not
    re-hashed), ``git add -A`` of the working files, ``git diff-index --cached`` against the
    base (the changes), then ``git write-tree``. The worktree's own index, HEAD and branch
    are not read for content and not changed, so the manifest is the same whatever the agent
    did with commits or branches (docs/field-cases.md C31). The copy keeps the index file's modification time:
    git compares the entries' times with it to tell a file edited in the second the index was
    written ("racily clean", its stat data unchanged at git's one-second resolution) from an
    unchanged one, so a copy dated later would let such an edit be missed.

    Deliverables are the working files except: files ignored by the repository's own rules
    (``.gitignore`` files and ``.git/info/exclude``; the engine user's global excludes file
    is not used, so the result does not depend on the host), and paths matching ``excludes``
    (gitignore syntax). An excluded path, tracked or not, keeps its state at ``base_commit``.
    A populated submodule at its pinned commit is unchanged; an initialised submodule at
    another commit shows as ``modified`` (mode 160000).

    Only the changed paths are matched against ``excludes`` (an unchanged path matches as it
    did at base, and then its state is the base state anyway). ``entries`` are the base
    commit's files (read with ``git ls-tree -r`` once per base commit and kept in memory)
    with the changes applied. Callers that need only the tree id use
    :func:`manifest_digest`, which skips the entries and the two walks behind ``excluded``.

    Args:
        worktree: top-level directory of the run's worktree.
        base_commit: the run's recorded base commit (any revision naming a commit).
        excludes: gitignore-style patterns; None means :data:`DEFAULT_EXCLUDES`.

    Returns:
        ``{"tree": str, "digest": str (same tree id: the artifact reference), "base": str
        (40-hex commit), "entries": [{"path", "mode", "blob"}] (every file of the tree, as
        ``git ls-tree -r -z --full-tree`` lists them, gitlinks with mode 160000, sorted by path
        bytes), "changes": [{"path", "status", "old_mode", "new_mode", "old_blob",
        "new_blob"}] (what ``git diff-tree -r --no-renames`` reports between base and tree: a
        rename is a delete plus an add; status one of added/deleted/modified/type_changed/
        mode_changed; modes and blobs are None on the missing side; sorted by path bytes),
        "excluded": [str] (paths present in the worktree, untracked, not ignored by the
        repository, kept out by ``excludes``, plus tracked excluded paths whose working state
        differs from base; a directory kept out entirely is listed once with a trailing
        ``/``; sorted)}``.

    A git repository an agent made anywhere below the top (``find_nested_repositories``) is
    refused before git reads anything: ``nested_repository``.

    Raises:
        WorkspaceError: ``unknown_revision``/``ambiguous_revision``/``not_a_commit`` for
            ``base_commit``; ``nested_repository``; ``git_failed``.
    """
    return _build_manifest(worktree, base_commit, excludes, details=True)


def manifest_digest(worktree: str, base_commit: str, excludes: list[str] | None = None) -> str:
    """``manifest(worktree, base_commit, excludes)["digest"]``, computed without the rest.

    The same steps up to ``git write-tree`` (so the same tree id, for the same files, in every
    case), without listing the entries or walking the working files for the ``excluded``
    list. For callers that only compare or record the digest.

    Args:
        worktree: top-level directory of the run's worktree.
        base_commit: the run's recorded base commit (any revision naming a commit).
        excludes: gitignore-style patterns; None means :data:`DEFAULT_EXCLUDES`.

    Returns:
        The tree id (hex) of the deliverable files.

    Raises:
        WorkspaceError: as :func:`manifest`.
    """
    return _build_manifest(worktree, base_commit, excludes, details=False)["digest"]


def tree_changes(cwd: str, old_tree: str, new_tree: str) -> list[dict]:
    """What differs between two tree ids of the repository at ``cwd`` (e.g. two manifests' digests).

    Returns ``[{"path": str, "status": "added"|"deleted"|"modified"|"type_changed"}]`` sorted
    by path (``git diff-tree -r --no-renames --name-status -z``; a rename is a delete plus an add).

    Raises:
        WorkspaceError: ``git_failed`` (e.g. a tree id the repository does not have).
    """
    out = git(["diff-tree", "-r", "--no-renames", "--name-status", "-z", old_tree, new_tree], cwd).stdout
    parts = _split_z(out)
    words = {"A": "added", "D": "deleted", "M": "modified", "T": "type_changed"}
    changes = [{"path": _fs(path), "status": words.get(code.decode()[:1], code.decode())}
               for code, path in zip(parts[0::2], parts[1::2])]
    return sorted(changes, key=lambda c: c["path"])


def restore_to(worktree: str, base_commit: str, excludes: list[str] | None = None, *,
               repo: str | None = None, lock_wait: float = 0.0,
               on_lock_wait: Callable[[dict], None] | None = None) -> list[dict]:
    """Put the deliverable files of ``worktree`` back as they are at ``base_commit``: files added
    since are removed (and directories they leave empty), deleted or changed ones are restored
    (``git restore --source=<base> --worktree``). What the manifest keeps out (ignored and
    excluded paths) is not touched, nor are the worktree's index, HEAD and branch.

    Args:
        worktree: top-level directory of the run's worktree.
        base_commit: the commit to go back to (the stage's starting checkpoint).
        excludes: gitignore-style patterns, as for :func:`manifest`.
        repo, lock_wait, on_lock_wait: how ``git restore`` (which takes the worktree's
            ``index.lock``) lives with that lock, as for :func:`git_index_op`.

    Returns:
        The changes that were undone, as ``manifest()["changes"]`` lists them.

    Raises:
        WorkspaceError: ``git_failed``, ``index_locked``, or the revision errors of
            :func:`manifest`; the files still differing are then those :func:`manifest` reports.
    """
    changes = manifest(worktree, base_commit, excludes)["changes"]
    top = os.path.realpath(worktree)
    restore = []
    for change in changes:
        path = os.path.join(top, change["path"])
        if change["status"] == "added":
            if os.path.islink(path) or os.path.isfile(path):
                os.remove(path)
            parent = os.path.dirname(path)
            while parent != top and os.path.isdir(parent) and not os.listdir(parent):
                os.rmdir(parent)
                parent = os.path.dirname(parent)
        else:
            if change["status"] == "type_changed" and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            restore.append(change["path"])
    if restore:
        spec = b"".join(os.fsencode(p) + b"\0" for p in restore)
        git_index_op(["restore", f"--source={resolve_commit(worktree, base_commit)}", "--worktree",
                      "--pathspec-from-file=-", "--pathspec-file-nul"], top, input=spec, repo=repo,
                     wait_seconds=lock_wait, on_wait=on_lock_wait)
    return changes


def write_patch(worktree: str, base_commit: str, tree: str, out_path: str) -> dict:
    """Write the binary-safe patch from ``base_commit`` to ``tree`` into ``out_path``.

    Runs ``git diff --binary --full-index --no-renames`` between the two trees, with options
    that make the output independent of user configuration (no colour, no external diff or
    textconv, ``a/`` and ``b/`` prefixes, submodules as plain gitlink changes). Output is
    streamed to ``<out_path>.tmp`` and renamed into place, so a reader never sees a partial
    patch. The result applies with ``git apply --binary`` at the base commit.

    Args:
        worktree: a directory of the repository holding both objects.
        base_commit: the base revision (a commit).
        tree: the tree id from :func:`manifest` (any tree-ish works).
        out_path: file to write (its directory must exist).

    Returns:
        ``{"bytes": int (size of the patch file), "sha256": str (hex digest of the file),
        "files": int (number of paths changed)}``. An empty patch has 0 bytes and 0 files.

    Raises:
        WorkspaceError: ``git_failed`` if git fails (no file is left at ``out_path``);
            revision errors as in :func:`resolve_commit` for ``base_commit``.
    """
    base = resolve_commit(worktree, base_commit)
    tmp_path = out_path + ".tmp"
    cmd = _git_argv(["diff", "--binary", "--full-index",
           "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv",
           "--src-prefix=a/", "--dst-prefix=b/", "--ignore-submodules=none",
           "--submodule=short", base, tree, "--"])
    with open(tmp_path, "wb") as fh:
        proc = subprocess.run(cmd, cwd=worktree, env=_git_env(), stdin=subprocess.DEVNULL,
                              stdout=fh, stderr=subprocess.PIPE, check=False)
    if proc.returncode != 0:
        os.remove(tmp_path)
        stderr = _decode(proc.stderr)
        raise WorkspaceError(
            "git_failed",
            f"Writing the patch from {base} to {tree} failed in {worktree}: {stderr}",
            detail=stderr,
        )
    digest = hashlib.sha256()
    size = 0
    with open(tmp_path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    os.replace(tmp_path, out_path)
    names = git(["diff-tree", "-r", "-z", "--no-renames", "--name-only",
                 "--ignore-submodules=none", base, tree], worktree).stdout
    return {"bytes": size, "sha256": digest.hexdigest(), "files": len(_split_z(names))}


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def _checkpoint_env() -> dict[str, str]:
    name, email = CHECKPOINT_IDENTITY["name"], CHECKPOINT_IDENTITY["email"]
    return {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email}


def _check_trailer(key: str, value: str) -> None:
    if not isinstance(key, str) or not _TRAILER_KEY.fullmatch(key):
        raise ValueError(f"Invalid trailer key {key!r}: use letters, digits and '-'.")
    if not isinstance(value, str) or not value.strip() or any(c in value for c in "\0\r\n"):
        raise ValueError(f"Invalid value for trailer {key!r}: one non-empty line is needed.")


def commit_checkpoint(
    worktree: str,
    branch: str,
    tree: str,
    parent: str,
    message: str,
    trailers: dict[str, str],
    keep_agent_commits: str | None = None,
    *,
    repo: str | None = None,
    lock_wait: float = 0.0,
    on_lock_wait: Callable[[dict], None] | None = None,
) -> dict:
    """Commit ``tree`` on ``branch`` as a checkpoint whose parent is ``parent``.

    With ``keep_agent_commits`` (a full ref name such as
    ``refs/controlpanel/run-7/stage-1-agent-commits``), a branch that moved *forward* from
    ``parent`` (an agent that committed its own work, docs/field-cases.md C31) is not refused: its tip
    is kept under that ref, so nothing is lost, and the checkpoint (whose tree already holds
    every deliverable change) replaces it on the branch, with ``parent`` as its parent. A
    branch that moved anywhere else is still ``head_moved``.

    If ``tree`` equals the parent's tree, nothing is written and the parent is returned
    (the current commit is reused when nothing changed). Otherwise:

    1. the worktree's HEAD must be ``refs/heads/<branch>`` (checked before any write);
    2. ``git commit-tree tree -p parent`` with the message, a blank line and one
       ``Key: value`` trailer line per item (author and committer ``Control Panel
       <engine@controlpanel.local>``, never signed);
    3. ``git update-ref refs/heads/<branch> <new> <parent>``, an atomic compare-and-swap;
    4. ``git reset -q`` (mixed) in the worktree, so its index agrees with the new commit;
       working files are not touched. git's ``index.lock`` is lived with as
       :func:`git_index_op` does (``repo``, ``lock_wait`` seconds, ``on_lock_wait``): a stale
       lock is removed, a live one waited for. When that fails the commit exists on the branch
       all the same (find it by its trailer) and its index is owed (:func:`reset_index_to`).

    Args:
        worktree: the run's worktree.
        branch: the run's branch (short name).
        tree: tree id from :func:`manifest`.
        parent: the commit the branch is expected to be at (40-hex).
        message: commit message (subject and optional body); an empty one becomes
            ``Checkpoint``.
        trailers: ``{"Key": "value"}``; keys are letters, digits and ``-``, values one line.

    Returns:
        ``{"commit": str (40-hex), "created": bool}``.

    Raises:
        WorkspaceError: ``head_moved`` if the branch tip is not ``parent`` or the worktree's
            HEAD is detached or on another branch; ``index_locked`` (after the commit);
            ``git_failed``.
        ValueError: invalid branch name, trailer key or value.
    """
    _check_branch_name(branch)
    for key, value in trailers.items():
        _check_trailer(key, value)
    parent_id = resolve_commit(worktree, parent)
    parent_tree = _out(["rev-parse", "--verify", "--end-of-options", f"{parent_id}^{{tree}}"],
                       worktree)
    tree_id = _out(["rev-parse", "--verify", "--end-of-options", f"{tree}^{{tree}}"],
                   worktree)
    if tree_id == parent_tree:
        return {"commit": parent_id, "created": False}

    ref = f"refs/heads/{branch}"
    head_ref = git(["symbolic-ref", "-q", "HEAD"], worktree, check=False)
    head_name = head_ref.stdout.decode("utf-8", "replace").strip()
    if head_ref.returncode != 0 or head_name != ref:
        raise WorkspaceError(
            "head_moved",
            f"The worktree {worktree} is not on branch {branch} "
            f"(HEAD is {head_name or 'detached'}); the checkpoint was not committed.",
        )
    tip = _rev_or_none(worktree, ref)
    expected_tip = parent_id
    if tip != parent_id:
        descends = tip is not None and git(["merge-base", "--is-ancestor", parent_id, tip], worktree,
                                           check=False).returncode == 0
        if not (keep_agent_commits and descends):
            raise WorkspaceError(
                "head_moved",
                f"The branch {branch} is at {tip or 'nothing'}, not at the expected parent "
                f"{parent_id}; the checkpoint was not committed.",
            )
        git(["update-ref", "-m", "agent commits kept by the checkpoint", keep_agent_commits, tip], worktree,
            env=_checkpoint_env())
        expected_tip = tip

    text = (message or "").strip("\n") or "Checkpoint"
    if trailers:
        text += "\n\n" + "".join(f"{k}: {v.strip()}\n" for k, v in trailers.items())
    else:
        text += "\n"
    new = _out(["commit-tree", "--no-gpg-sign", tree_id, "-p", parent_id, "-F", "-"],
               worktree, env=_checkpoint_env(), input=text.encode("utf-8"))

    proc = git(["update-ref", "-m", "checkpoint", ref, new, expected_tip], worktree,
               env=_checkpoint_env(), check=False)
    if proc.returncode != 0:
        tip = _rev_or_none(worktree, ref)
        if tip != expected_tip:
            raise WorkspaceError(
                "head_moved",
                f"The branch {branch} moved to {tip or 'nothing'} while the checkpoint was "
                f"being committed (expected {parent_id}).",
                detail=_decode(proc.stderr),
            )
        raise WorkspaceError(
            "git_failed",
            f"Updating branch {branch} to checkpoint {new} failed: {_decode(proc.stderr)}",
            detail=_decode(proc.stderr),
        )
    git_index_op(["reset", "-q", "--no-recurse-submodules"], worktree, repo=repo, wait_seconds=lock_wait,
                 on_wait=on_lock_wait)
    return {"commit": new, "created": True}


def find_commit_with_trailer(
    repo: str, branch: str, key: str, value: str, max_count: int = 200
) -> str | None:
    """The newest commit on ``branch`` whose message has the trailer ``key: value``.

    Used to recover a checkpoint journal entry left in ``intent``: if the commit carrying
    its id exists, the checkpoint happened. Trailers are read by git
    (``%(trailers:key=...,valueonly)``); the key matches case-insensitively, the value
    exactly (surrounding whitespace ignored).

    Args:
        repo: a directory of the repository.
        branch: short branch name.
        key: trailer key, e.g. ``Checkpoint-Id``.
        value: trailer value to look for.
        max_count: how many commits back from the tip to search.

    Returns:
        40-hex commit id, or None (also when the branch does not exist).

    Raises:
        ValueError: invalid branch name or trailer key.
        WorkspaceError: ``git_failed``.
    """
    _check_branch_name(branch)
    _check_trailer(key, value if value.strip() else "x")
    ref = f"refs/heads/{branch}"
    if _rev_or_none(repo, ref) is None:
        return None
    out = git(["log", "-z", f"--max-count={int(max_count)}", "--no-show-signature",
               f"--format=%H%n%(trailers:key={key},valueonly,unfold)", ref, "--"],
              repo).stdout
    wanted = value.strip()
    for record in _split_z(out):
        lines = record.decode("utf-8", "replace").split("\n")
        if any(line.strip() == wanted for line in lines[1:]):
            return lines[0].strip()
    return None
