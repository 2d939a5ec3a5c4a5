"""Fresh detached checkouts of one of the run's commits, beside its worktree: where the final
verification runs a check when the worktree cannot be reset exactly (engine/steps/final.py), and
where a stage's gates collect the agreed tests at its starting commit (engine/steps/agreed.py)."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings

from .. import workspace
from ..models import Run


def _lock_dir() -> str:
    """The folder of the per-repository lock files (engine/workspace.py ``repo_lock``)."""
    return str(Path(settings.VAR_DIR) / "locks")


def remove_final_checkout(run: Run, folder: Path, own: Path) -> None:
    """The files first (checks ran agent code there: git must not read what they left), then git's
    record of this checkout only (``workspace.remove_worktree``, holding the repository lock):
    other registrations of the user's repository, one whose folder is missing too, are never
    pruned. Raises workspace.WorkspaceError (the repository cannot be read)."""
    workspace.remove_tree(str(folder))
    workspace.remove_tree(str(own))
    workspace.remove_worktree(run.repo_path, str(folder), lock_dir=_lock_dir())


def final_checkout(run: Run, checkpoint: str, folder: Path, own: Path) -> None:
    """A fresh detached checkout of ``checkpoint`` at ``folder`` (whatever was there removed without
    git reading it), its submodules from the starting commit's ``.gitmodules``, and an empty
    ``own`` folder for its TMPDIR and data folder."""
    remove_final_checkout(run, folder, own)
    workspace.add_detached_worktree(run.repo_path, str(folder), checkpoint, lock_dir=_lock_dir())
    _final_submodules(run, checkpoint, folder)
    for sub in ("tmp", "data"):
        (own / sub).mkdir(parents=True, exist_ok=True)


def _final_submodules(run: Run, checkpoint: str, folder: Path) -> None:
    """Populate the final checkout's submodules from the run's starting commit's ``.gitmodules`` only.

    The checkpoint's ``.gitmodules`` may have been written by an agent: if it is not the
    starting commit's (same blob), nothing is fetched and the run stops ``nested_repository``
    (an agent's URL could name a repository the agent cannot read, whose content would reach a
    check log). Its gitlinks are those of the starting commit (a new one stops the run earlier).
    Raises workspace.WorkspaceError (``nested_repository``, ``submodule_init_failed``)."""
    def blob(commit: str) -> str:
        proc = workspace.git(["rev-parse", "-q", "--verify", f"{commit}:.gitmodules"], run.repo_path, check=False)
        return proc.stdout.decode().strip() if proc.returncode == 0 else ""

    final, start = blob(checkpoint), blob(run.commit)
    if final != start:
        raise workspace.WorkspaceError(
            "nested_repository",
            f"The final checkpoint {checkpoint[:12]} changes .gitmodules (where submodules are fetched from); the "
            f"final verification fetches only what the run's starting commit {run.commit[:12]} names, and fetched "
            f"nothing.")
    if final:
        workspace.init_submodules(str(folder))  # the starting commit's URLs
