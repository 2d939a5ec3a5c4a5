"""Which Run Engine workers are alive, what they hold, and what a queued run waits for.

The writing side runs in a worker's main process: ``connect_signals`` (called by engine/tasks.py)
starts a ``WorkerBeat`` thread at Celery's ``worker_ready``, which upserts the worker's ``Worker``
row (engine/models.py) every ``CP_WORKER_BEAT`` seconds, and stops it at ``worker_shutdown`` (sent
after a warm shutdown let the steps in progress end), which marks the row ``stopped_at``. A worker
killed outright leaves its row, whose beat goes stale. The beat is a report for people: the engine
never acts on it (reconciliation judges a run by the run's own heartbeat, engine/reconcile.py).

The reading side is plain reads for the pages (controlpanel/home.py, controlpanel/admin_hosts.py) and
whoever else asks, in a fixed number of queries whatever the number of workers and runs:

* ``worker_rows()`` / ``live_workers()``: each worker as a plain dict, with the runs in its hands;
* ``runs_in_hand(workers)``: the runs whose lease a worker's pool process holds;
* ``queued_without_worker(run)``: why a queued run is not being claimed, or ``""``.

A worker is alive while its last beat is less than ``CP_WORKER_STALE`` seconds old and it has not
stopped. Ages are computed with this process's clock against the worker's (as the runs' heartbeats
are): keep the hosts' clocks in step (NTP).
"""
from __future__ import annotations

import logging
import os
import threading
from datetime import datetime, timedelta

import psutil
from django.conf import settings
from django.db import connection
from django.utils import timezone

from . import hosts
from .answers import current_stage
from .models import Run, RunStatus, StageRun, Worker

log = logging.getLogger("engine.workers")

__all__ = ["WorkerBeat", "connect_signals", "stale_seconds", "is_alive", "worker_rows", "live_workers",
           "runs_in_hand", "run_queue", "queued_without_worker", "age_text", "START_HINT", "shutting_down",
           "stopping_flag"]

#: How a person starts a worker (README.md, "Processes").
START_HINT = "Start one with `make worker` (README.md, \"Processes\")."


# ----------------------------------------------------------------------------- the worker's side


class WorkerBeat(threading.Thread):
    """A daemon thread of a worker's main process that upserts its ``Worker`` row every
    ``interval`` seconds (the first beat at once), and on ``stop()`` marks it ``stopped_at``.

    ``describe()`` returns the row's changing facts at each beat: ``{"name": node name, "queues":
    [name], "concurrency": int, "pool_pids": [pid]}``; ``host`` is ``CP_HOST_NAME`` (engine/hosts.py) and
    ``pid`` this process's, the two halves of a run's lease owner (engine/runner.py
    ``worker_identity``). A failed beat (the database away, a describe that raised) is logged and
    tried again at the next interval: it never ends the thread nor the worker. The thread opens its
    database connection for each beat and closes it after (a pool process forked meanwhile inherits
    none), and closes it when it ends.

    Two live workers with one node name (two ``make worker`` on one host both default to
    ``celery@HOST``) would overwrite one row: the one that finds the name's row held by another
    live process (another host's beating row, or a pid alive on this host) records itself as
    ``NAME (pid PID)`` instead, from then on (``name`` holds what it records under).
    """

    def __init__(self, describe, interval: float):
        super().__init__(name="worker-beat", daemon=True)
        self.describe, self.interval = describe, max(0.05, float(interval))
        self.host, self.pid = hosts.this_host(), os.getpid()
        self.started_at = timezone.now()
        self.name = ""
        self.beats = 0
        self.failures = 0
        self._stop_event = threading.Event()

    def _taken(self, name: str) -> bool:
        """True when ``name``'s row belongs to another process that is alive."""
        row = Worker.objects.filter(name=name).first()
        if row is None or (row.host, row.pid) == (self.host, self.pid) or not is_alive(row):
            return False
        return row.host != self.host or psutil.pid_exists(row.pid)

    def beat(self) -> None:
        """One upsert of the row (raises what the database raises)."""
        facts = self.describe()
        if not self.name or self._taken(self.name):
            own = facts["name"] if not self._taken(facts["name"]) else f"{facts['name']} (pid {self.pid})"
            if own != facts["name"]:
                log.warning("worker beat: the node name %s is recorded by another live worker; recording this "
                            "one as %s", facts["name"], own)
            self.name = own
        Worker.objects.update_or_create(name=self.name, defaults={
            "host": self.host, "pid": self.pid, "queues": list(facts.get("queues") or []),
            "concurrency": int(facts.get("concurrency") or 0), "pool_pids": list(facts.get("pool_pids") or []),
            "started_at": self.started_at, "beat_at": timezone.now(), "stopped_at": None})
        hosts.beat()
        self.beats += 1

    def mark_stopped(self) -> int:
        """Set ``stopped_at`` (and a last ``beat_at``) on this process's row; returns the rows changed
        (0 when another process took the name over since)."""
        if not self.name:
            return 0
        now = timezone.now()
        return Worker.objects.filter(name=self.name, pid=self.pid, host=self.host).update(
            stopped_at=now, beat_at=now, pool_pids=[])

    def run(self) -> None:
        try:
            while True:
                try:
                    self.beat()
                    if self.failures:
                        log.info("worker beat: recorded again after %s failed beat(s)", self.failures)
                    self.failures = 0
                except Exception:  # a database hiccup must not stop the beat, nor the worker: say so, try again
                    self.failures += 1
                    log.warning("worker beat failed (%s in a row); trying again in %.1f s", self.failures,
                                self.interval, exc_info=self.failures == 1)
                finally:
                    connection.close()
                if self._stop_event.wait(self.interval):
                    break
            try:
                self.mark_stopped()
            except Exception:
                log.warning("worker beat: could not mark the worker stopped; its beat will go stale", exc_info=True)
        finally:
            connection.close()

    def stop(self, timeout: float = 10.0) -> None:
        """End the beats and mark the row stopped (waits at most ``timeout`` seconds for the thread)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=timeout)


#: The main process's beat thread (None before ``worker_ready`` and in any other process).
_beat: WorkerBeat | None = None


def describe_consumer(consumer) -> dict:
    """What a worker's main process reports of itself, from Celery's consumer (the ``worker_ready``
    sender): ``{"name", "queues", "concurrency", "pool_pids"}``. ``pool_pids`` are the prefork pool's
    processes now (celery 5.7 ``TaskPool.info["processes"]``; they change when one is replaced), or
    this process alone for a pool that runs tasks in it (solo, threads)."""
    controller = getattr(consumer, "controller", None)
    pool = getattr(consumer, "pool", None) or getattr(controller, "pool", None)
    try:
        info = pool.info if pool is not None else {}
        pids = info.get("processes") if isinstance(info, dict) else None
    except Exception:  # a pool being stopped or restarted: report no process rather than no beat
        info, pids = {}, []
    queues = getattr(getattr(consumer.app.amqp, "queues", None), "consume_from", None) or {}
    concurrency = getattr(controller, "concurrency", None) or (info.get("max-concurrency") if info else 0) or 0
    return {"name": consumer.hostname, "queues": sorted(queues), "concurrency": int(concurrency),
            "pool_pids": [int(p) for p in pids if p] if pids is not None else [os.getpid()]}


def _start_beating(sender=None, **kwargs) -> None:
    """``worker_ready`` (main process; ``sender`` is the consumer): start the beat thread once."""
    global _beat
    if _beat is not None and _beat.is_alive():
        return
    _beat = WorkerBeat(lambda: describe_consumer(sender), settings.CP_WORKER_BEAT)
    _beat.start()
    log.info("worker beat: recording this worker every %.1f s", settings.CP_WORKER_BEAT)


def stopping_flag(pid: int) -> str:
    """The file whose presence says that worker main process ``pid`` (of this host) began a
    shutdown: ``VAR_DIR/workers/stopping-PID``."""
    return os.path.join(str(settings.VAR_DIR), "workers", f"stopping-{int(pid)}")


def shutting_down() -> bool:
    """True in a worker's pool process (or a solo worker) once its main process began a warm
    shutdown (``worker_shutting_down``): a chain of steps (engine/runner.py ``advance_chain``) then
    hands the next step to the queue instead of taking it, so that the shutdown waits for one step,
    not for a run. One ``stat`` of ``stopping_flag``; False outside a worker."""
    return any(os.path.exists(stopping_flag(pid)) for pid in {os.getppid(), os.getpid()})


def _mark_shutting_down(sender=None, **kwargs) -> None:
    """``worker_shutting_down`` (main process, when the shutdown begins): write ``stopping_flag``."""
    path = stopping_flag(os.getpid())
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"{kwargs.get('how') or 'shutdown'}\n")
    except OSError:  # the chain then runs to its budget, as before: a slower shutdown, nothing lost
        log.warning("worker: could not write the shutdown flag %s", path, exc_info=True)


def _clear_shutting_down(sender=None, **kwargs) -> None:
    """``worker_ready`` and ``worker_shutdown`` (main process): remove this process's ``stopping_flag``
    (one left by a killed worker whose pid this one now has, or its own at the end)."""
    try:
        os.unlink(stopping_flag(os.getpid()))
    except OSError:
        pass


def _stop_beating(sender=None, **kwargs) -> None:
    """``worker_shutdown`` (main process, after the pool stopped): the last beat marks the row stopped."""
    global _beat
    if _beat is not None:
        _beat.stop()
        _beat = None


def connect_signals() -> None:
    """Connect the worker's beat to Celery's ``worker_ready`` and ``worker_shutdown``, and its
    shutdown flag (``shutting_down``) to ``worker_shutting_down`` (idempotent: dispatch_uid). Called by engine/tasks.py, which every worker imports."""
    from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

    worker_ready.connect(_clear_shutting_down, weak=False, dispatch_uid="engine-worker-flag-clear-start")
    worker_ready.connect(_start_beating, weak=False, dispatch_uid="engine-worker-beat-start")
    worker_shutting_down.connect(_mark_shutting_down, weak=False, dispatch_uid="engine-worker-flag-set")
    worker_shutdown.connect(_stop_beating, weak=False, dispatch_uid="engine-worker-beat-stop")
    worker_shutdown.connect(_clear_shutting_down, weak=False, dispatch_uid="engine-worker-flag-clear-end")


# ----------------------------------------------------------------------------- the reading side


def stale_seconds() -> float:
    """``CP_WORKER_STALE``: seconds after its last beat a worker no longer counts as alive."""
    return float(settings.CP_WORKER_STALE)


def is_alive(worker: Worker, now: datetime | None = None) -> bool:
    """True when ``worker`` has not stopped and beat less than ``CP_WORKER_STALE`` seconds ago."""
    now = now or timezone.now()
    return worker.stopped_at is None and (now - worker.beat_at).total_seconds() < stale_seconds()


def _owner_parts(owner: str) -> tuple[str, int] | None:
    """``("host", pid)`` of a lease owner ``host:pid`` (engine/runner.py ``worker_identity``)."""
    host, _, pid = owner.rpartition(":")
    return (host, int(pid)) if host and pid.isdigit() else None


def runs_in_hand(workers: list[Worker], now: datetime | None = None) -> dict[int, list[dict]]:
    """The running runs each of ``workers`` holds now, by worker pk: ``[{"id", "pipeline", "stage"
    (key, or None in the final verification), "phase" (the stage's phase, or None), "lease_owner"
    ("host:pid"), "pool_pid", "heartbeat_age_seconds" (float or None), "simulated"}]``, oldest run
    first. A run is in a worker's hands when its lease owner is ``host:pid`` of one of the worker's
    pool processes (or of its main process, for a pool that runs tasks there). When two rows claim one
    pid (a stale row of an earlier worker whose pid was reused), the one that beat last wins. A run
    handed off between two steps has no owner and is in nobody's hands. Two queries, whatever the
    number of workers and runs."""
    now = now or timezone.now()
    found: dict[int, list[dict]] = {w.pk: [] for w in workers}
    owner_of: dict[tuple[str, int], Worker] = {}
    for worker in sorted(workers, key=lambda w: w.beat_at):
        for pid in [worker.pid, *(worker.pool_pids or [])]:
            owner_of[(worker.host, int(pid))] = worker
    if not owner_of:
        return found
    runs = list(Run.objects.filter(status=RunStatus.RUNNING).exclude(lease_owner="").order_by("id"))
    held = [(run, owner_of.get(_owner_parts(run.lease_owner) or ("", -1))) for run in runs]
    held = [(run, worker) for run, worker in held if worker is not None]
    stages = _stages_of([run.pk for run, _ in held])
    for run, worker in held:
        stage = current_stage(run, stages.get(run.pk, []))
        found[worker.pk].append({
            "id": run.pk, "pipeline": run.pipeline_name, "stage": stage.key if stage else None,
            "phase": stage.phase if stage else None, "lease_owner": run.lease_owner,
            "pool_pid": _owner_parts(run.lease_owner)[1], "simulated": run.simulated,
            "heartbeat_age_seconds": (now - run.heartbeat_at).total_seconds() if run.heartbeat_at else None})
    return found


def _stages_of(run_ids: list[int]) -> dict[int, list[StageRun]]:
    """The stages of ``run_ids``, in order, by run id (one query; none for no run)."""
    stages: dict[int, list[StageRun]] = {}
    if run_ids:
        for stage in StageRun.objects.filter(run_id__in=run_ids).order_by("run_id", "order"):
            stages.setdefault(stage.run_id, []).append(stage)
    return stages


def _row(worker: Worker, runs: list[dict], now: datetime) -> dict:
    age = max(0.0, (now - worker.beat_at).total_seconds())
    alive = is_alive(worker, now)
    return {"id": worker.pk, "name": worker.name, "host": worker.host, "pid": worker.pid,
            "queues": list(worker.queues or []), "concurrency": worker.concurrency,
            "pool_pids": list(worker.pool_pids or []), "started_at": worker.started_at, "beat_at": worker.beat_at,
            "stopped_at": worker.stopped_at, "beat_age_seconds": age, "alive": alive,
            "liveness": "alive" if alive else ("stopped" if worker.stopped_at else "lost"), "runs": runs}


def worker_rows(limit: int | None = 20, now: datetime | None = None) -> list[dict]:
    """The workers that beat last (at most ``limit``; None: all), most recent beat first, each as
    ``{"id", "name", "host", "pid", "queues": [name], "concurrency", "pool_pids": [pid], "started_at",
    "beat_at", "stopped_at" (datetimes; stopped_at None while it runs), "beat_age_seconds" (float,
    seconds since its last beat), "alive" (bool), "liveness" ("alive", "stopped": it shut down
    cleanly, or "lost": no beat for CP_WORKER_STALE seconds and no clean stop, as after a kill -9),
    "runs": the runs in its hands (``runs_in_hand``)}``. Three queries."""
    now = now or timezone.now()
    query = Worker.objects.order_by("-beat_at", "-id")
    workers = list(query[:limit] if limit else query)
    held = runs_in_hand(workers, now)
    return [_row(worker, held[worker.pk], now) for worker in workers]


def live_workers(now: datetime | None = None) -> list[dict]:
    """The workers alive now (``worker_rows``' dicts), most recent beat first: not stopped, and a beat
    less than ``CP_WORKER_STALE`` seconds old. Three queries."""
    now = now or timezone.now()
    workers = list(Worker.objects.filter(stopped_at__isnull=True, beat_at__gt=now - timedelta(seconds=stale_seconds()))
                   .order_by("-beat_at", "-id"))
    held = runs_in_hand(workers, now)
    return [_row(worker, held[worker.pk], now) for worker in workers if is_alive(worker, now)]


def run_queue(run: Run) -> str:
    """The queue whose workers take ``run``'s steps (engine/hosts.py ``queue_for``, without a query):
    its host's queue once a claim pinned it, else the shared one (``CP_QUEUE``)."""
    return hosts.host_queue(run.host) if run.host else settings.CELERY_TASK_DEFAULT_QUEUE


def age_text(seconds: float | None) -> str:
    """A duration for a person: ``4 s``, ``3 min 05 s``, ``2 h 03 min``, ``3 d 04 h``; ``""`` for None
    (``seconds`` rounded down)."""
    if seconds is None:
        return ""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


def queued_without_worker(run: Run, rows: list[dict] | None = None, now: datetime | None = None,
                          live_hosts: list | None = None) -> str:
    """Why queued ``run`` is not being claimed, for a person; ``""`` when it is not queued or a live
    worker of its queue has a free pool process (it will be claimed shortly).

    The sentences: no worker alive at all ("No worker is alive: no worker has beaten in the last 15 s
    (the last one, NAME on HOST, beat 85 s ago). Start one with `make worker` ..."); live workers,
    none of them on the run's queue (``run_queue``); every live worker of the queue busy (each pool
    process holds a run); a run not pinned yet whose repository no live host's ``CP_HOST_REPOS`` cover
    (engine/hosts.py). ``rows`` (``worker_rows(limit=None)`` or the home page's, with the most recent
    beat first) and ``live_hosts`` (``hosts.live_hosts()``) spare the queries when the caller has them;
    else four queries."""
    if run.status != RunStatus.QUEUED:
        return ""
    now = now or timezone.now()
    rows = rows if rows is not None else worker_rows(limit=None, now=now)
    live = [row for row in rows if row["alive"]]
    stale = stale_seconds()
    if not live:
        last = max(rows, key=lambda row: row["beat_at"], default=None)
        if last is None:
            seen = "none has ever beaten here"
        elif last["stopped_at"] is not None:
            seen = (f"the last one, {last['name']} on {last['host']}, stopped "
                    f"{age_text(max(0.0, (now - last['stopped_at']).total_seconds()))} ago")
        else:
            seen = f"the last one, {last['name']} on {last['host']}, beat {age_text(last['beat_age_seconds'])} ago"
        return f"No worker is alive: no worker has beaten in the last {stale:.0f} s ({seen}). {START_HINT}"
    queue = run_queue(run)
    on_queue = [row for row in live if queue in row["queues"]]
    if not on_queue and run.host:
        return (f"This run is pinned to host {run.host} (its worktree is on that host's disk), and no live worker "
                f"of host {run.host} consumes its queue '{queue}'. Start a worker there (CP_HOST_NAME={run.host}; "
                f"README.md, \"Several hosts\"); no other host takes its steps.")
    if not run.host:
        alive = live_hosts if live_hosts is not None else hosts.live_hosts(now)
        reaching = {host.name for host in alive if hosts.covers(host.repo_roots or [], run.repo_path)}
        # the workers of a live host that does not reach its repository cannot take it: not its slots
        unreaching = {host.name for host in alive} - reaching
        on_queue = [row for row in on_queue if row["host"] not in unreaching]
        if alive and not reaching:
            said = "; ".join(f"{host.name}: {', '.join(host.repo_roots)}" for host in alive)
            return (f"No live host reaches its repository {run.repo_path}: the live hosts' CP_HOST_REPOS are {said}. "
                    f"Start a worker on a host that has it, with CP_HOST_REPOS naming a folder that holds it "
                    f"(README.md, \"Several hosts\").")
    if not on_queue:
        others = ", ".join(f"{row['name']} ({', '.join(row['queues']) or 'no queue'})" for row in live)
        return (f"No live worker consumes queue '{queue}', where this run's messages go: the live ones are "
                f"{others}. Start one on it with `make worker` (CP_QUEUE={queue}; README.md, \"Processes\").")
    slots = sum(max(row["concurrency"], 1) for row in on_queue)
    # the run itself, claimed between the reading of its row and of the workers', is no other run's slot
    busy = sum(len([held for held in row["runs"] if held["id"] != run.pk]) for row in on_queue)
    if busy >= slots:
        return (f"Every live worker of queue '{queue}' is busy: {busy} run(s) in the hands of {slots} pool "
                f"process(es). It is claimed when one is free; start another worker to run more at once.")
    return ""
