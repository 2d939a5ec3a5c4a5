"""Bounded attempts: processes, memory, bytes written and output of each agent attempt and gate.

An agent is hostile (README.md, "Who decides what"), and so is the code it wrote, which a gate
runs. Each process tree the engine starts for one of them gets limits (``Limits``):

* ``max_processes`` and ``max_memory_mb``: a control group of the tree's own, made before it
  starts and removed after (``Bounds``). Where the host has cgroup v2 with the ``pids`` and
  ``memory`` controllers delegated to the worker, there; else in the v1 ``pids`` and ``memory``
  hierarchies (this project's machines mount those). The tree joins it before its first
  instruction (a ``sh`` that writes its own pid to ``cgroup.procs``, then ``exec``s the command),
  so nothing it forks escapes. A fork past the limit fails; the engine sees the limit's counter
  (``pids.events``, ``memory.events`` or v1 ``memory.oom_control``) and stops the tree:
  ``process_limit`` or ``memory_limit``. Where neither can be made, the fallback is documented
  (docs/agents.md, "Bounded attempts"): the processes carrying the tree's marker are counted, and
  their resident memory summed, at each poll; ``mechanism`` says which is in force, and the worker
  says it when it starts (engine/tasks.py). ``remove_stale_groups`` (the reconciler's) removes the
  empty groups a worker that died left behind.
* ``max_write_mb``: the bytes the tree adds to its writable folders (worktree, HOME, TMPDIR,
  data folder), measured against their size at the start by a scan at least every few seconds
  (``WriteMeter``), and no single file larger than the limit (``ulimit -f``, so a 1 GB write
  stops at the limit however fast it is): ``write_limit``.
* ``max_output_mb``: the captured output (each of stdout and stderr); past it the tree is stopped
  (``output_too_large``) and the first and last part are kept (engine/processes/capture.py).

``operator_limits`` reads the operator's settings (``CP_ATTEMPT_MAX_*``, controlpanel/settings.py);
a pipeline's ``limits`` may lower each, never raise it (``effective``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("engine.processes.limits")

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: What a limit reached is called (a failure kind of the attempt, a failure of the check).
REASONS = {
    "process_limit": "the attempt started more processes than its limit allows (max_processes)",
    "memory_limit": "the attempt used more memory than its limit allows (max_memory_mb)",
    "write_limit": "the attempt wrote more bytes than its limit allows (max_write_mb)",
    "output_too_large": "the attempt printed more output than its limit allows (max_output_mb)",
}


@dataclass(frozen=True)
class Limits:
    """Per process tree: processes, memory (MB), bytes written to its folders (MB), output (MB)."""

    max_processes: int = 512
    max_memory_mb: int = 4096
    max_write_mb: int = 2048
    max_output_mb: int = 64

    def as_dict(self) -> dict:
        return asdict(self)


DEFAULTS = Limits()
#: The operator's settings, one per limit (controlpanel/settings.py reads them).
SETTINGS = {name: f"CP_ATTEMPT_{name.upper()}" for name in Limits.__dataclass_fields__}


def operator_limits() -> Limits:
    """The operator's limits: ``settings.CP_ATTEMPT_MAX_*`` where Django is configured, else the defaults."""
    try:
        from django.conf import settings  # noqa: PLC0415 - where Django is configured

        configured = settings.configured
    except ImportError:
        configured = False
    if not configured:
        return DEFAULTS
    return Limits(**{name: int(getattr(settings, setting, getattr(DEFAULTS, name)))
                     for name, setting in SETTINGS.items()})


def effective(pipeline_limits: dict | None) -> Limits:
    """The operator's limits, each lowered to the pipeline's where the pipeline asks for less."""
    ours = operator_limits()
    asked = pipeline_limits or {}
    return Limits(**{name: min(int(asked[name]), getattr(ours, name)) if asked.get(name) else getattr(ours, name)
                     for name in SETTINGS})


# ----------------------------------------------------------------------------- control groups


def _v1_folder(controller: str) -> Path | None:
    """The v1 hierarchy folder of ``controller`` this process is in (from /proc/self/cgroup), if writable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            folder = CGROUP_ROOT / controller / path.lstrip("/")
            return folder if os.access(folder, os.W_OK) and (folder / "cgroup.procs").exists() else None
    return None


def _v2_folder() -> Path | None:
    """The v2 folder under which this process may make groups with ``pids`` and ``memory``, if any."""
    root = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() else None
    if root is None:
        return None
    try:
        path = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    except (OSError, StopIteration):
        return None
    folder = root / path.lstrip("/")
    try:
        enabled = (folder / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    return folder if {"pids", "memory"} <= set(enabled) and os.access(folder, os.W_OK) else None


_mechanism: dict[str, object] = {}
_mechanism_lock = threading.Lock()


def mechanism() -> tuple[str, str]:
    """``(kind, sentence)``: ``cgroup-v2``, ``cgroup-v1`` or ``fallback``, and what is in force.
    Found once per process by making (and removing) a test group."""
    with _mechanism_lock:
        if not _mechanism:
            _mechanism["kind"] = "fallback"
            _mechanism["sentence"] = _probe()  # which sets the kind it could make
        return str(_mechanism["kind"]), str(_mechanism["sentence"])


def _probe() -> str:
    name = f"cp-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    v2 = _v2_folder()
    if v2 is not None and _try_make([v2 / name]):
        _mechanism["kind"] = "cgroup-v2"
        return f"processes and memory by cgroup v2 under {v2}"
    pids, memory = _v1_folder("pids"), _v1_folder("memory")
    if pids is not None and memory is not None and _try_make([pids / name, memory / name]):
        _mechanism["kind"] = "cgroup-v1"
        return f"processes and memory by the cgroup v1 pids ({pids}) and memory ({memory}) controllers"
    return ("no control group can be made here (neither cgroup v2 with pids and memory delegated nor the v1 "
            "pids and memory controllers writable): the tree's processes are counted and their memory summed at "
            "each poll, which a fast fork bomb or allocation can outrun")


def _try_make(folders: list[Path]) -> bool:
    made = []
    try:
        for folder in folders:
            folder.mkdir()
            made.append(folder)
        return True
    except OSError:
        return False
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass


# ----------------------------------------------------------------------------- bytes written


def folder_bytes(folders: list[str]) -> int:
    """The bytes the files under ``folders`` take on disk (allocated blocks; a hard link counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [f for f in dict.fromkeys(folders) if f and os.path.isdir(f)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += max(st.st_blocks * 512, 0)
    return total


class WriteMeter:
    """The bytes added to ``folders`` since ``start()``, scanned at most every ``interval`` seconds
    (longer when a scan is slow: ten times its own duration)."""

    def __init__(self, folders: list[str], interval: float = 2.0):
        self.folders, self.interval = folders, interval
        self.baseline = self.last = 0
        self._next = 0.0

    def start(self) -> WriteMeter:
        self.baseline = folder_bytes(self.folders)
        self._next = time.monotonic() + self.interval
        return self

    def added(self, force: bool = False) -> int | None:
        """Bytes added since the start; None when it is not yet time to scan again."""
        now = time.monotonic()
        if not force and now < self._next:
            return None
        self.last = folder_bytes(self.folders) - self.baseline
        took = time.monotonic() - now
        self._next = time.monotonic() + max(self.interval, 10 * took)
        return self.last


# ----------------------------------------------------------------------------- one process tree


class Bounds:
    """The limits of one process tree: ``run(argv, ...)`` runs it under them (engine/processes/process.py
    ``run_supervised`` with ``wrap``, ``watch`` and the output cap, then ``close`` and ``settle``).
    ``record()`` says what was in force and what was used, for the attempt's or the check's record."""

    def __init__(self, limits: Limits, name: str, folders: list[str], marker: str | None = None):
        self.limits, self.name, self.marker = limits, name, marker
        self.kind, self.sentence = mechanism()
        self.groups: dict[str, Path] = {}
        self.meter = WriteMeter(folders)
        self.reached: str | None = None
        self.peak_processes = 0
        self.made: list[str] = []  # the groups' folders, as made (for the record)

    def run(self, argv: list[str], *, log_path: str, **run_options):
        """``argv`` under these limits: made (``open``), run by ``run_supervised`` (the tree in its
        group, ``watch`` polled, stopped past the output cap), the group removed (``close``) and the
        limit reached set on the result (``settle``). Returns ``engine.processes.process.ProcessResult``."""
        from engine.processes import process  # noqa: PLC0415 - engine/processes/process.py is the tree's owner

        self.open()
        try:
            result = process.run_supervised(
                self.wrap(argv), log_path=log_path, watch=self.watch, stop_at_output_cap=True,
                max_output_bytes=self.limits.max_output_mb * 1024 * 1024, marker=self.marker, **run_options)
        finally:
            self.close()
        self.settle(result, log_path)
        return result

    # -- before
    def open(self) -> Bounds:
        """Make the tree's control group(s) and write the limits; measure the folders."""
        name = f"cp-{self.name}-{uuid.uuid4().hex[:8]}"
        try:
            if self.kind == "cgroup-v2":
                folder = _v2_folder() / name
                folder.mkdir()
                self.groups = {"v2": folder}
                (folder / "pids.max").write_text(str(self.limits.max_processes))
                (folder / "memory.max").write_text(str(self.limits.max_memory_mb * 1024 * 1024))
                if (folder / "memory.swap.max").exists():  # no swap: the limit is the memory it may use
                    (folder / "memory.swap.max").write_text("0")
            elif self.kind == "cgroup-v1":
                pids, memory = _v1_folder("pids") / name, _v1_folder("memory") / name
                pids.mkdir()
                self.groups["pids"] = pids
                memory.mkdir()
                self.groups["memory"] = memory
                (pids / "pids.max").write_text(str(self.limits.max_processes))
                (memory / "memory.limit_in_bytes").write_text(str(self.limits.max_memory_mb * 1024 * 1024))
                if (memory / "memory.memsw.limit_in_bytes").exists():  # memory and swap together: no swap
                    (memory / "memory.memsw.limit_in_bytes").write_text(str(self.limits.max_memory_mb * 1024 * 1024))
        except (OSError, TypeError) as exc:
            log.warning("no control group for %s (%s): the fallback limits apply", self.name, exc)
            self._remove_groups()
            self.kind = "fallback"
        self.made = [str(folder) for folder in self.groups.values()]
        self.meter.start()
        return self

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` behind a ``sh`` that joins the group(s) and sets the file-size limit, then
        becomes the command (``exec``)."""
        script = []
        paths = [str(folder / "cgroup.procs") for folder in self.groups.values()]
        for index in range(len(paths)):
            script.append(f'echo $$ > "${index + 1}" || exit 125')
        blocks = self.limits.max_write_mb * 1024 * 1024 // 512  # POSIX sh: ulimit -f counts 512-byte blocks
        script.append(f"ulimit -f {blocks} || exit 125")
        script.append(f"shift {len(paths)}" if paths else ":")
        script.append('exec "$@"')
        return ["/bin/sh", "-c", "; ".join(script), "cp-limits", *paths, *argv]

    # -- while
    def watch(self) -> str | None:
        """The limit the tree reached (``process_limit``, ``memory_limit``, ``write_limit``), or None."""
        if self.reached:
            return self.reached
        self.reached = self._cgroup_reached() or self._fallback_reached() or self._write_reached()
        return self.reached

    def _cgroup_reached(self) -> str | None:
        if "v2" in self.groups:
            events = _events(self.groups["v2"] / "pids.events")
            if events.get("max", 0) > 0:
                return "process_limit"
            memory = _events(self.groups["v2"] / "memory.events")
            if memory.get("oom", 0) > 0 or memory.get("oom_kill", 0) > 0:
                return "memory_limit"
            self.peak_processes = max(self.peak_processes, _read_int(self.groups["v2"] / "pids.current"))
        if "pids" in self.groups:
            if _events(self.groups["pids"] / "pids.events").get("max", 0) > 0:
                return "process_limit"
            self.peak_processes = max(self.peak_processes, _read_int(self.groups["pids"] / "pids.current"))
        if "memory" in self.groups:
            if _events(self.groups["memory"] / "memory.oom_control").get("oom_kill", 0) > 0:
                return "memory_limit"
        return None

    def _fallback_reached(self) -> str | None:
        if self.kind != "fallback" or not self.marker:
            return None
        from engine.processes.process import find_marked  # noqa: PLC0415 - engine/processes/process.py is the tree's owner

        found = find_marked(self.marker)
        self.peak_processes = max(self.peak_processes, len(found))
        if len(found) > self.limits.max_processes:
            return "process_limit"
        resident = 0
        for proc in found:
            try:
                resident += proc.memory_info().rss
            except Exception:  # noqa: BLE001 - gone meanwhile (psutil.Error)
                continue
        return "memory_limit" if resident > self.limits.max_memory_mb * 1024 * 1024 else None

    def _write_reached(self, force: bool = False) -> str | None:
        added = self.meter.added(force)
        return "write_limit" if added is not None and added >= self.limits.max_write_mb * 1024 * 1024 else None

    # -- after
    def close(self) -> None:
        """Check once more (a limit reached just before the tree ended), then remove the group(s):
        anything still in them is killed first."""
        if not self.reached:
            self.reached = self._cgroup_reached() or self._write_reached(force=True)
        self._remove_groups()

    def _remove_groups(self) -> None:
        for folder in list(self.groups.values()):
            for attempt in range(50):
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                except OSError:
                    pids = []
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
                try:
                    folder.rmdir()
                    break
                except OSError:
                    time.sleep(0.02 * (attempt + 1))
        self.groups = {}

    def settle(self, result, log_path: str | None) -> None:
        """After the tree ended: make ``result.limit`` and ``reached`` agree (a limit the capture
        enforced, ``output_too_large``, or one found only as the tree ended), and note in the display
        log a limit the process's own stop note did not name."""
        if result.limit and not self.reached:
            self.reached = result.limit
        elif self.reached and not result.limit:
            result.limit = self.reached
            if log_path:
                with open(log_path, "a", encoding="utf-8") as log_file:
                    log_file.write(f"\n[run-engine] limit reached: {self.reached} ({REASONS[self.reached]})\n")

    def record(self) -> dict:
        """What was in force and used: ``{"limits", "mechanism", "reached", "written_bytes", "peak_processes"}``."""
        return {"limits": self.limits.as_dict(), "mechanism": self.kind, "reached": self.reached,
                "written_bytes": max(self.meter.last, 0), "peak_processes": self.peak_processes,
                "groups": list(self.made)}


def remove_stale_groups(min_age: float = 300.0) -> int:
    """Remove this host's attempt and check groups (``cp-attempt-*``, ``cp-check-*``) that are empty
    and older than ``min_age`` seconds: what a worker that died during an attempt left (the
    reconciler kills the tree by its marker first). A group with a process in it is never removed
    (the kernel refuses), nor a young one (its tree may be about to join it). Returns how many."""
    removed = 0
    now = time.time()
    for folder in (_v1_folder("pids"), _v1_folder("memory"), _v2_folder()):
        if folder is None:
            continue
        for group in list(folder.glob("cp-attempt-*")) + list(folder.glob("cp-check-*")):
            try:
                if now - group.stat().st_mtime < min_age or (group / "cgroup.procs").read_text().strip():
                    continue
                group.rmdir()
                removed += 1
            except OSError:
                continue
    return removed


def _events(path: Path) -> dict[str, int]:
    """``key value`` lines of a cgroup file (``pids.events``, ``memory.events``, ``memory.oom_control``)."""
    found = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                found[key] = int(value)
    except OSError:
        pass
    return found


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def describe(limits: Limits | None = None) -> str:
    """One sentence for the worker's start: the limits in force and how each is kept."""
    limits = limits or operator_limits()
    _, how = mechanism()
    return (f"attempt limits: {limits.max_processes} processes and {limits.max_memory_mb} MB of memory ({how}); "
            f"{limits.max_write_mb} MB written to its folders (scanned, and ulimit -f); {limits.max_output_mb} MB of "
            "output (each stream; past it the first and last part are kept)")


__all__ = ["Bounds", "DEFAULTS", "Limits", "REASONS", "WriteMeter", "describe", "effective", "folder_bytes",
           "mechanism", "operator_limits", "remove_stale_groups"]
