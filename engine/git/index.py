"""A worktree's git index: its lock (who holds it, a stale one cleared) and the operations that write it.

Part of engine/git/ (its module docstring says what holds for all of it); no Django."""
from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Callable

import psutil

from .core import WorkspaceError, _decode, git
from .repos import _admin_dir_for, _check_branch_name, _common_dir, _rev_or_none, _same_path


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
