"""The operating-system boundary around an agent: bubblewrap with the whole file system read-only.

A CLI's own permission rules are not enough alone: an implementer's shell tool runs any
command, as the worker's user (root on many machines), and could write the control records
or another run's worktree. ``wrap`` puts the agent in a mount namespace where ``/`` is
read-only and only the folders its role may write are writable: the worktree (implementer and
documenter; never the reviewer), its own HOME, its TMPDIR and data folder; the shared
``/tmp`` stays visible and read-only (TMPDIR points at the run's own). Root cannot write
through a read-only bind mount either (checked here with the bubblewrap shipped inside
@openai/codex 0.171.0). Agents cannot commit in the worktree either: its git metadata lives
in the original repository, which is read-only to them; the engine commits checkpoints.

Which bubblewrap: ``bwrap`` on PATH (Debian package ``bubblewrap``), else the one the pinned
codex package ships in tools/agents. ``available()`` runs it once to be sure the kernel lets it.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent.parent
_BUNDLED = "tools/agents/node_modules/@openai/codex-linux-x64/vendor/*/codex-resources/bwrap"


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
                                "--proc", "/proc", "--", "true"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bubblewrap ({path}) could not run: {exc}"
    if probe.returncode != 0:
        return False, f"bubblewrap ({path}) could not make a sandbox here: {probe.stderr.strip()[:300]}"
    return True, path


def wrap(argv: list[str], *, writable: list[str], read_only: list[str] = ()) -> list[str]:
    """``argv`` run inside bubblewrap with ``/`` read-only and only ``writable`` folders writable.

    ``read_only`` paths inside a writable folder stay read-only (the worktree's ``.git`` file,
    so an agent cannot point the engine's git at a repository of its own). The agent also gets
    its own PID and IPC namespaces: it sees and can signal only its own processes, not the
    worker, other runs' agents or the databases. The network is shared (the CLI must reach its
    model). Raises RuntimeError when bubblewrap is not available (callers check ``available()``).
    """
    ok, path = available()
    if not ok:
        raise RuntimeError(path)
    sandbox = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-ipc", "--proc", "/proc",
               "--die-with-parent"]
    for folder in writable:
        os.makedirs(folder, exist_ok=True)
        real = os.path.realpath(folder)
        sandbox += ["--bind", real, real]
    for item in read_only:
        if os.path.exists(item):
            real = os.path.realpath(item)
            sandbox += ["--ro-bind", real, real]
    return sandbox + ["--"] + list(argv)
