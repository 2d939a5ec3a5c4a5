"""Where a run's files are and what its processes see: paths under CP_VAR_DIR (control records,
the run's scratch folders), digests of recorded files, the environment of the run's commands,
and the marker every process of the run carries."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from django.conf import settings

from .. import boundary
from ..models import Run


def var_path(rel: str) -> Path:
    """Absolute path of a file recorded relative to CP_VAR_DIR. Where ``CP_OTHER_VAR_DIRS`` names the
    var directories of other hosts, mounted here (the Control Panel of several hosts: README.md,
    "Several hosts"), a control record (``runs/...``) that is not under CP_VAR_DIR is looked for in
    them, in order; the path under CP_VAR_DIR is returned when none has it. Only control records: no
    agent or gate can write there, whereas the scratch folders (``scratch/``) are theirs, so a file an
    agent planted is never served as another run's record."""
    primary = Path(settings.VAR_DIR) / rel
    parts = Path(rel).parts
    if not parts or parts[0] != "runs" or ".." in parts:
        return primary
    for other in settings.CP_OTHER_VAR_DIRS:
        if primary.exists():
            break
        candidate = Path(other) / rel
        if candidate.exists():
            return candidate
    return primary


def control_path(run: Run, *parts: str) -> str:
    """Relative path (to CP_VAR_DIR) of a control record of ``run``; creates its folder."""
    rel = os.path.join(run.control_dir, *parts)
    var_path(rel).parent.mkdir(parents=True, exist_ok=True)
    return rel


def scratch_dirs(run_id: int) -> dict[str, str]:
    """The run's own temporary and data folders (outside the worktree and the control records)."""
    base = Path(settings.VAR_DIR) / "scratch" / f"run-{run_id}"
    dirs = {"tmp": str(base / "tmp"), "data": str(base / "data")}
    for path in dirs.values():
        os.makedirs(path, exist_ok=True)
    return dirs


def attempt_homes(run_id: int) -> Path:
    """The folder of the run's attempts' HOMEs (``attempt-NNN`` each), in its scratch folder: removed
    after each attempt, and whole by the reconciler after a worker died during one."""
    return Path(settings.VAR_DIR) / "scratch" / f"run-{run_id}" / "home"


def remove_scratch(run_id: int) -> None:
    """Remove the run's temporary folders (its worktree and control records stay)."""
    shutil.rmtree(Path(settings.VAR_DIR) / "scratch" / f"run-{run_id}", ignore_errors=True)


def run_env(run: Run, stage_key: str) -> dict[str, str]:
    """The environment of the run's commands (agents and gates), by allow-list: the worker's
    PATH, locale, TERM and TZ (engine/boundary.py ``base_env``; nothing else of the worker's
    environment), plus the run's folders and port range. An agent adds its CLI's credential
    variable and its profile's ``env``; each process gets its own HOME.

    Variables: CP_RUN_ID, CP_STAGE, CP_WORKTREE, TMPDIR and CP_TMP_DIR, CP_DATA_DIR,
    CP_PORT_BASE and CP_PORT_COUNT (ports CP_PORT_BASE .. CP_PORT_BASE + CP_PORT_COUNT - 1
    are this run's; inside the sandbox's own network namespace every port is), 
    PYTHONDONTWRITEBYTECODE=1, GIT_TERMINAL_PROMPT=0.
    """
    env = boundary.base_env()
    dirs = scratch_dirs(run.pk)
    env.update(
        {
            "CP_RUN_ID": str(run.pk),
            "CP_STAGE": stage_key,
            "CP_WORKTREE": run.worktree,
            "TMPDIR": dirs["tmp"],
            "CP_TMP_DIR": dirs["tmp"],
            "CP_DATA_DIR": dirs["data"],
            "CP_PORT_BASE": str(run.port_base or 0),
            "CP_PORT_COUNT": str(settings.CP_PORT_SPAN),
            "PYTHONDONTWRITEBYTECODE": "1",
            "GIT_TERMINAL_PROMPT": "0",
        }
    )
    return env


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def process_marker_prefix(run: Run) -> str:
    """``cp-run-<id>-<first 8 hex of uid>-``: every process the run starts (agents, gates) carries a
    ``CP_PROCESS_MARKER`` beginning so, which is how a reconciler or ``fail_run`` finds them all."""
    return f"cp-run-{run.pk}-{run.uid.hex[:8]}-"
