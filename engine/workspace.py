"""The git plumbing of the Run Engine, as the rest of the engine imports it: engine/git/ holds it in
parts (its package docstring); ``before_git`` is engine/git/core.py's."""
from __future__ import annotations

from .git.core import CHECKPOINT_IDENTITY, DEFAULT_EXCLUDES, WorkspaceError, git  # noqa: F401
from .git.repos import branch_tip, repo_root, resolve_commit, uncommitted_changes  # noqa: F401
from .git.index import (clear_stale_index_lock, git_index_op, index_lock_holders,  # noqa: F401
                        index_lock_path, reset_index_to)
from .git.manifests import (_BASE_FILES, _tree_entries, find_nested_repositories, manifest,  # noqa: F401
                            manifest_digest, outward_symlinks)
from .git.patches import restore_to, tree_changes, write_patch  # noqa: F401
from .git.checkpoints import commit_checkpoint, find_commit_with_trailer  # noqa: F401
from .git.worktrees import (add_detached_worktree, ensure_worktree, init_submodules, remove_tree,  # noqa: F401
                            remove_worktree, repo_lock, reset_to_commit, tree_commit, worktree_tree)

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
