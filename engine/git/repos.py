"""A repository as the engine reads it: its root, a revision resolved to a commit, a branch's tip, the
uncommitted changes of a checkout, and the worktrees git knows of it.

Part of engine/git/ (its module docstring says what holds for all of it); no Django."""
from __future__ import annotations

import os

from .core import WorkspaceError, _HEX40, _decode, _fs, _out, _split_z, git


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
