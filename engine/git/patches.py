"""The changes between two trees, a worktree put back to a commit's files (``restore_to``) and the
patch of a change (``write_patch``).

Part of engine/git/ (its module docstring says what holds for all of it); no Django."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from typing import Callable

from .core import WorkspaceError, _decode, _fs, _git_argv, _git_env, _split_z, git
from .repos import resolve_commit
from .index import git_index_op
from .manifests import manifest


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
