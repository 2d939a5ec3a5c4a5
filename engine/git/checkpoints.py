"""A stage's checkpoint commit (with its journal trailer) and finding a commit by its trailer.

Part of engine/git/ (its module docstring says what holds for all of it); no Django."""
from __future__ import annotations

from typing import Callable

from .core import WorkspaceError, _TRAILER_KEY, _checkpoint_env, _decode, _out, _split_z, git
from .repos import _check_branch_name, _rev_or_none, resolve_commit
from .index import git_index_op


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
