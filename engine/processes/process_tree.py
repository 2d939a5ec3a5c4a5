"""Finding and stopping the process trees the engine starts (docs/field-cases.md C06, C08).

Every process of a supervised tree carries ``CP_PROCESS_MARKER=<marker>`` in its environment
(engine/processes/process.py ``run_supervised``), so the tree is found by its marker even after a process
escaped into a session of its own, and by a later reconciler (``kill_tree``,
``kill_marked_prefix``). Signals go politely first (SIGINT, SIGTERM), then SIGKILL; this process
and its ancestors are never signalled. No Django imports.
"""

from __future__ import annotations

import os
import signal as _signal
import time
from collections.abc import Iterable

import psutil

__all__ = ["MARKER_ENV", "find_marked", "kill_marked_prefix", "kill_tree", "markers_with_prefix"]

#: Environment variable that tags every process of a supervised tree.
MARKER_ENV = "CP_PROCESS_MARKER"

_SIGINT_SHARE = 0.5  # part of the grace period reserved for SIGINT before SIGTERM...
_SIGINT_MAX = 1.0  # ...but never more than this many seconds
_KILL_WAIT = 0.5  # seconds to wait for SIGKILLed processes to disappear
_CREATE_TIME_TOLERANCE = 2.0  # seconds; the boot time psutil reads can drift by a second or so

def _protected() -> tuple[set[int], set[int]]:
    """Our own pid and our ancestors' pids, and their process groups: never signalled."""
    pids = {0, 1, os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pids.add(os.getppid())
    pgids = {0, 1}
    for pid in pids - {0}:
        try:
            pgids.add(os.getpgid(pid))
        except OSError:
            continue
    return pids, pgids


def _in_session(proc: psutil.Process, sid: int, not_before: float) -> bool:
    try:
        return os.getsid(proc.pid) == sid and proc.create_time() >= not_before
    except (OSError, psutil.Error):
        return False


def _marked(
    marker: str | None,
    protected: set[int],
    sid: int | None = None,
    not_before: float = 0.0,
) -> list[psutil.Process]:
    """Live processes carrying ``marker``, plus (with ``sid``) members of session ``sid``
    created at or after ``not_before`` (epoch seconds): they catch descendants that
    cleared their environment but stayed in the child's session."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid in protected:
            continue
        try:
            ours = bool(marker) and proc.environ().get(MARKER_ENV) == marker
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            ours = False
        except OSError:
            # /proc/<pid>/environ can fail in odd ways for kernel threads; not ours
            ours = False
        if not ours and (sid is None or not _in_session(proc, sid, not_before)):
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        found.append(proc)
    return found


def find_marked(marker: str) -> list[psutil.Process]:
    """Live processes whose environment has ``CP_PROCESS_MARKER == marker``.

    Skips zombies, processes whose environment cannot be read (other users, kernel
    threads), this process and its ancestors.

    :param marker: the marker value given to :func:`run_supervised`.
    :returns: ``psutil.Process`` objects (may already be gone by the time they are used).
    :raises ValueError: if ``marker`` is empty.
    """
    if not marker:
        raise ValueError("marker must be a non-empty string")
    return _marked(marker, _protected()[0])


def markers_with_prefix(prefix: str) -> set[str]:
    """The distinct ``CP_PROCESS_MARKER`` values of live processes that start with ``prefix``.

    Skips zombies, unreadable environments, this process and its ancestors.

    :raises ValueError: if ``prefix`` is empty (it would match every marked process).
    """
    if not prefix:
        raise ValueError("prefix must be a non-empty string")
    protected = _protected()[0]
    found = set()
    for proc in psutil.process_iter():
        if proc.pid in protected:
            continue
        try:
            value = proc.environ().get(MARKER_ENV) or ""
            if value.startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(value)
        except (psutil.Error, OSError):
            continue
    return found


def kill_marked_prefix(prefix: str, grace_seconds: float = 5.0) -> int:
    """Stop every process tree whose ``CP_PROCESS_MARKER`` starts with ``prefix`` (e.g. all the
    processes of one run: its agents and its gates), as :func:`kill_tree` does with a marker.

    :param prefix: a non-empty marker prefix (the Run Engine's is ``cp-run-<id>-<uid8>-``).
    :param grace_seconds: seconds between the polite signals and SIGKILL.
    :returns: how many distinct processes were signalled (0 if none carried such a marker).
    :raises ValueError: if ``prefix`` is empty.
    """
    return sum(kill_tree(None, None, marker, grace_seconds) for marker in sorted(markers_with_prefix(prefix)))


def _alive(proc: psutil.Process) -> bool:
    # Never reaps (no waitpid): psutil.wait_procs() would reap our own child and
    # subprocess would then report its exit status as 0.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _collect(
    root: psutil.Process | None,
    marker: str | None,
    protected: set[int],
    session: tuple[int, float] | None = None,
) -> dict[int, psutil.Process]:
    procs: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            if _alive(root):
                procs[root.pid] = root
            for child in root.children(recursive=True):
                if _alive(child):
                    procs[child.pid] = child
        except psutil.NoSuchProcess:
            pass
    if marker or session:
        sid, not_before = session if session else (None, 0.0)
        for proc in _marked(marker, protected, sid, not_before):
            procs.setdefault(proc.pid, proc)
    for pid in protected:
        procs.pop(pid, None)
    return procs


#: The sandbox's own processes (bubblewrap's monitor and its PID namespace's init). A polite
#: signal spares them: bubblewrap ends on SIGINT or SIGTERM, and with it, at once, everything in
#: its PID namespace, which would cut the grace an agent inside gets to clean up. SIGKILL reaches them.
SANDBOX_PROCESS_NAMES = ("bwrap",)


def _is_sandbox(proc: psutil.Process) -> bool:
    try:
        return proc.name() in SANDBOX_PROCESS_NAMES
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _send(
    procs: Iterable[psutil.Process],
    sig: int,
    protected_pgids: set[int],
    signalled: set[int],
) -> None:
    """Signal each distinct process group of ``procs``, then each process. A polite signal (not
    SIGKILL) skips the sandbox's own processes (SANDBOX_PROCESS_NAMES) and the groups they are in;
    the processes inside the sandbox get it one by one."""
    procs = list(procs)
    groups, spared_groups = set(), set()
    if sig != _signal.SIGKILL:
        spared = [proc for proc in procs if _is_sandbox(proc)]
        procs = [proc for proc in procs if proc not in spared]
        for proc in spared:
            try:
                spared_groups.add(os.getpgid(proc.pid))
            except OSError:
                continue
    for proc in procs:
        try:
            groups.add(os.getpgid(proc.pid))
        except OSError:
            continue
    for pgid in groups - protected_pgids - spared_groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            continue
    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil checks the pid was not reused
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        signalled.add(proc.pid)


def _wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll until every process is gone or a zombie; return the ones still alive."""
    end = time.monotonic() + max(0.0, timeout)
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        alive = [p for p in alive if _alive(p)]
    return alive


def _terminate(
    root: psutil.Process | None,
    marker: str | None,
    grace_seconds: float,
    *,
    polite: bool = True,
    session: tuple[int, float] | None = None,
) -> set[int]:
    """Stop ``root``'s tree plus every process carrying ``marker`` (plus, with
    ``session=(sid, not_before)``, the members of that session started since then).

    SIGINT (one agent CLI cleans up its tool shells only on SIGINT), then SIGTERM, each
    sent to every distinct process group and to every process; after ``grace_seconds``
    in total, SIGKILL to whatever is left, re-collected first to catch new children.
    With ``polite=False`` SIGKILL is sent at once.  Returns the pids signalled.
    """
    protected, protected_pgids = _protected()
    signalled: set[int] = set()
    procs = _collect(root, marker, protected, session)
    if not procs:
        return signalled
    if polite:
        grace = max(0.0, grace_seconds)
        end = time.monotonic() + grace
        _send(procs.values(), _signal.SIGINT, protected_pgids, signalled)
        alive = _wait_gone(procs.values(), min(_SIGINT_MAX, grace * _SIGINT_SHARE))
        procs = {p.pid: p for p in alive}
        procs.update(_collect(root, marker, protected, session))
        if procs:
            _send(procs.values(), _signal.SIGTERM, protected_pgids, signalled)
            alive = _wait_gone(procs.values(), end - time.monotonic())
            procs = {p.pid: p for p in alive}
            procs.update(_collect(root, marker, protected, session))
    if procs:
        _send(procs.values(), _signal.SIGKILL, protected_pgids, signalled)
        _wait_gone(procs.values(), _KILL_WAIT)
    return signalled


def kill_tree(
    pid: int | None,
    create_time: float | None = None,
    marker: str | None = None,
    grace_seconds: float = 5.0,
) -> int:
    """Kill a recorded process tree, e.g. when reconciling after a worker crash.

    The process ``pid`` and its descendants are stopped only if the pid still belongs to
    the recorded process: its start time must equal ``create_time`` (epoch seconds, as
    given to ``on_start`` by :func:`run_supervised`), within 2 s because the boot time
    another process computes can drift by a second.  A mismatch means the pid was reused
    and the process is skipped.  Without ``create_time`` the pid is accepted only if it
    carries ``marker``.  Every process carrying ``marker`` is stopped as well.  Stopping
    is SIGINT, SIGTERM, then SIGKILL after ``grace_seconds`` (seconds).  This process and
    its ancestors are never signalled.

    :returns: how many distinct processes were signalled (0 if nothing was left).
    """
    protected, _ = _protected()
    root = None
    session = None
    if pid is not None and pid not in protected:
        try:
            proc = psutil.Process(pid)
            if create_time is not None:
                if abs(proc.create_time() - create_time) <= _CREATE_TIME_TOLERANCE:
                    root = proc
            elif marker and proc.environ().get(MARKER_ENV) == marker:
                root = proc
            # A verified root that leads its own session (run_supervised starts it so):
            # its session's members are part of the tree.
            if root is not None and os.getsid(pid) == pid != os.getsid(0):
                session = (pid, root.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            root = None
            session = None
    if root is None and not marker:
        return 0
    return len(_terminate(root, marker, grace_seconds, session=session))
