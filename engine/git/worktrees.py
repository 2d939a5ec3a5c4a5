"""A run's worktree and branch: made (with submodules), reset to a commit, removed; the repository lock.

Part of engine/git/ (its module docstring says what holds for all of it); no Django."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
from typing import Iterator

from .core import (SUBMODULE_TIMEOUT_SECONDS, WorkspaceError, _TEMP_INDEX_CONFIG, _checkpoint_env, _decode, _fs, _out,
                   _split_z, git)
from .repos import (_admin_dir_for, _admin_dirs, _check_branch_name, _common_dir, _rev_or_none, _same_path,
                    _worktree_list, repo_root, resolve_commit)
from .index import git_index_op
from .manifests import _nested_dotgits, _top_and_index


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
