"""Hosts: the machines whose disks hold the runs' worktrees, and the queues that bring a run's steps
back to its host.

A run's worktree, its control records and its agents' processes live on the host that claimed it.
So (README.md, "Several hosts"):

* every worker consumes the shared queue (``CP_QUEUE``, where a run's first message goes) and its
  host's own queue ``host_queue(CP_HOST_NAME)`` (added when the worker starts, controlpanel/celery.py);
* the first claim of a run pins it to the claiming worker's host (``Run.host``, engine/machine.py
  ``claim``), and only on a host that can reach its repository (``can_reach``);
* from then on every message of the run goes to that host's queue (``queue_for``), and a worker of
  another host that is handed one anyway sends it on instead of taking the step (engine/runner.py);
* each host's workers register it (``beat``, from engine/workers.py ``WorkerBeat``): a ``Host`` row
  with its queue, the folders it reaches and its var directory, beating while any of its workers does.

The host's name is ``CP_HOST_NAME`` (default: ``socket.gethostname()``); two machines must not share
one, and two var directories (two "disks") on one machine need two names.
"""
from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from .checks import protected
from .models import Host, Run
from .text import hints

log = logging.getLogger("engine.hosts")

__all__ = ["this_host", "host_queue", "repo_roots", "covers", "can_reach", "beat", "is_alive", "stale_seconds",
           "live_hosts", "queue_for", "host_age", "adopt", "AdoptionError", "host_rows", "reaching_host", "disk_conflict",
           "run_host_facts", "records_place", "on_this_disk"]


def this_host() -> str:
    """This process's host name: ``CP_HOST_NAME`` (default ``socket.gethostname()``)."""
    return settings.CP_HOST_NAME


def host_queue(name: str, base: str | None = None) -> str:
    """The queue of host ``name``'s workers: ``BASE.host.NAME`` (``base``: the shared queue, CP_QUEUE)."""
    return f"{base or settings.CELERY_TASK_DEFAULT_QUEUE}.host.{name}"


def repo_roots() -> list[str]:
    """The folders under which this host reaches repositories (``CP_HOST_REPOS``, each made absolute
    and resolved); [] when any repository path that exists here will do."""
    return [os.path.realpath(os.path.abspath(p)) for p in settings.CP_HOST_REPOS]


def covers(roots: list[str], repo_path: str) -> bool:
    """True when ``repo_path`` lies under one of ``roots`` (or ``roots`` is empty: any path). Compared
    as written and resolved, so that a root given through a symlink still matches."""
    if not roots:
        return True
    candidates = {os.path.abspath(repo_path), os.path.realpath(repo_path)}
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots for path in candidates)


def can_reach(repo_path: str) -> bool:
    """True when this host can run a run on ``repo_path``: under ``CP_HOST_REPOS`` (if set) and a
    folder that exists here."""
    return covers(repo_roots(), repo_path) and os.path.isdir(repo_path)


def beat(now: datetime | None = None) -> Host:
    """Record that this host is alive now (its row upserted: queue, folders, var directory, beat)."""
    now = now or timezone.now()
    host, created = Host.objects.get_or_create(name=this_host(), defaults={
        "queue": host_queue(this_host()), "repo_roots": repo_roots(), "var_dir": str(settings.VAR_DIR),
        "started_at": now, "beat_at": now})
    if not created:
        Host.objects.filter(pk=host.pk).update(queue=host_queue(this_host()), repo_roots=repo_roots(),
                                               var_dir=str(settings.VAR_DIR), beat_at=now)
    return host


def disk_conflict(now: datetime | None = None) -> str:
    """Why a worker starting now must not join this host, or ``""``. Its host's row records another var
    directory, and either another live worker of the same ``CP_HOST_NAME`` serves it (a ``Worker`` row
    of this host, not stopped, that beat less than ``CP_WORKER_STALE`` seconds ago), or an unfinished
    run pinned to the host has its worktree outside this worker's var directory (a lost host's run
    waits for its own disk: another disk under its name would confirm and recover it without its
    files). One host is one disk. Three queries at most."""
    from .models import RUN_TERMINAL, Worker  # engine/workers.py imports this module

    now = now or timezone.now()
    row = Host.objects.filter(name=this_host()).first()
    mine = os.path.realpath(str(settings.VAR_DIR))
    if row is None or not row.var_dir or os.path.realpath(row.var_dir) == mine:
        return ""
    fresh = now - timedelta(seconds=float(settings.CP_WORKER_STALE))
    others = list(Worker.objects.filter(host=this_host(), stopped_at__isnull=True, beat_at__gt=fresh)
                  .order_by("name").values_list("name", flat=True))
    if others:
        return (f"host {this_host()} (CP_HOST_NAME) is already served by live worker(s) {', '.join(others)} with the "
                f"var directory {row.var_dir}; this worker's is {mine}. One host name is one disk: give this worker "
                f"its own CP_HOST_NAME, or the same CP_VAR_DIR (README.md, \"Several hosts\").")
    # its workers are gone: the name may move to another disk only when no unfinished run of it has its
    # worktree on the old one (that run's recovery would otherwise be confirmed, and run, without its files)
    stranded = [pk for pk, worktree in Run.objects.filter(host=this_host(), branch_created=True)
                .exclude(status__in=RUN_TERMINAL).order_by("id").values_list("id", "worktree")
                if not covers([mine], worktree)]
    if stranded:
        return (f"host {this_host()} (CP_HOST_NAME) has unfinished run(s) {', '.join(map(str, stranded[:10]))} whose "
                f"worktrees are on its disk {row.var_dir}; this worker's var directory is {mine}. Start it with "
                f"CP_VAR_DIR={row.var_dir} (that disk), or fail those runs first "
                f"({hints.manage('fail_run ID --reason TEXT')}) (README.md, \"Several hosts\").")
    return ""  # nothing of the old disk is needed: this one takes the name over


def on_this_disk(worktree: str) -> bool:
    """True when ``worktree`` lies under this process's var directory and is there: the disk a run
    pinned to this host made it on."""
    return covers([os.path.realpath(str(settings.VAR_DIR))], worktree) and os.path.isdir(worktree)


def stale_seconds() -> float:
    """``CP_HOST_STALE``: seconds after its last beat a host counts as gone."""
    return float(settings.CP_HOST_STALE)


def host_age(host: Host | None, now: datetime | None = None) -> float | None:
    """Seconds since ``host`` last beat (None for no row: a host that never beat)."""
    if host is None:
        return None
    return max(0.0, ((now or timezone.now()) - host.beat_at).total_seconds())


def is_alive(host: Host | None, now: datetime | None = None) -> bool:
    """True when ``host`` beat less than ``CP_HOST_STALE`` seconds ago."""
    age = host_age(host, now)
    return age is not None and age < stale_seconds()


def run_host_facts(run: Run) -> dict:
    """``{"host", "host_alive", "host_beat_age_seconds"}`` of ``run``: the host its first claim pinned
    it to (null before), whether that host beat less than CP_HOST_STALE seconds ago, and the seconds
    since its last beat (null for no host, or a host that never beat). The shape of ``run_status``'s
    keys (docs/run-status.md). One query."""
    if not run.host:
        return {"host": None, "host_alive": None, "host_beat_age_seconds": None}
    row = Host.objects.filter(name=run.host).first()
    age = host_age(row)
    return {"host": run.host, "host_alive": is_alive(row),
            "host_beat_age_seconds": round(age, 1) if age is not None else None}


def records_place(run: Run) -> str:
    """Where ``run``'s records are, for a person: for a run of another host (its attempts' logs and
    checks are on that host's disk), ``"DIR on host NAME"`` with DIR under that host's var directory as
    its row records it; else their folder here (under CP_VAR_DIR, or a mounted CP_OTHER_VAR_DIRS that
    has them). One query at most."""
    from .steps.paths import var_path  # engine/steps imports this module's neighbours

    if not run.host or run.host == this_host():
        return str(var_path(run.control_dir))
    row = Host.objects.filter(name=run.host).first()
    where = Path(row.var_dir) / run.control_dir if row and row.var_dir else Path(run.control_dir)
    return f"{where} on host {run.host}"


def live_hosts(now: datetime | None = None) -> list[Host]:
    """The hosts alive now, by name (one query)."""
    now = now or timezone.now()
    return list(Host.objects.filter(beat_at__gt=now - timedelta(seconds=stale_seconds())).order_by("name"))


def reaching_host(repo_path: str, exclude: list[str] = ()) -> Host | None:
    """A live host other than ``exclude`` that may reach ``repo_path``: one whose CP_HOST_REPOS name a
    folder holding it first, else one that reaches any path that exists there; the one that beat last
    among them. None when there is none. One query."""
    found = [host for host in live_hosts() if host.name not in exclude and covers(host.repo_roots or [], repo_path)]
    found.sort(key=lambda host: (not host.repo_roots, -host.beat_at.timestamp()))
    return found[0] if found else None


def queue_for(run_id: int) -> str:
    """The queue for run ``run_id``'s next message: its host's queue once a claim pinned it, else the
    shared queue (``CP_QUEUE``), where a worker of any host that can reach its repository claims it.
    One query; a run that is gone goes to the shared queue (its message claims nothing)."""
    host = Run.objects.filter(pk=run_id).values_list("host", flat=True).first()
    return host_queue(host) if host else settings.CELERY_TASK_DEFAULT_QUEUE


class AdoptionError(Exception):
    """A host cannot take a run created elsewhere: its protected files at the run's commit are not the
    ones recorded when it was created (``message`` says which)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def adopt(run_id: int, lease: str) -> list[str]:
    """Make run ``run_id``, just claimed by this host under ``lease``, at home on this host's disk.

    A run is created where the Control Panel runs (its control records under that process's var
    directory), then claimed by a worker of any host. When this host's var directory is another one:

    * the worktree's path, not made yet, moves under this host's var directory (compare-and-swap on
      the lease; a worktree already made, or a branch already created, is never moved);
    * the control records are written here again from the database and the repository: the frozen
      definition and its digest, and the protected files copied afresh from the run's commit, which
      must be exactly the recorded ones (path and sha256), else ``AdoptionError``.

    Returns what was done, as sentences ([] on the host that created the run: one ``stat``). Raises
    AdoptionError, or workspace.WorkspaceError when git cannot read the commit."""
    run = Run.objects.get(pk=run_id)
    var = Path(settings.VAR_DIR)
    done = []
    local = var / "worktrees" / Path(run.worktree).name
    if run.worktree and Path(run.worktree) != local and not run.branch_created and not os.path.exists(run.worktree):
        if Run.objects.filter(pk=run_id, lease_token=lease, branch_created=False).update(worktree=str(local)):
            done.append(f"its worktree will be {local} on host {this_host()}")
    control = var / run.control_dir
    if not (control / "definition.sha256").exists():
        control.mkdir(parents=True, exist_ok=True)
        protected.write_definition(str(control), run.definition, run.definition_sha256)
        definition = run.definition["pipeline"]
        records = protected.snapshot(run.repo_path, run.commit, list(definition.get("protected_paths") or []),
                                     protected.gate_commands(definition), str(control / "protected"))
        have = sorted((r["path"], r["sha256"]) for r in records)
        recorded = sorted((r["path"], r["sha256"]) for r in run.protected_files or [])
        if have != recorded:
            raise AdoptionError(f"Host {this_host()} reads other protected files at commit {run.commit[:12]} of "
                                f"{run.repo_path} than were recorded when the run was created ({len(have)} against "
                                f"{len(recorded)}, or other contents): it does not reach the same repository.")
        done.append(f"its control records were written on host {this_host()} from the database and commit "
                    f"{run.commit[:12]} ({len(records)} protected file(s), the same as recorded)")
    if done:
        log.info("run %s: adopted by host %s: %s", run_id, this_host(), "; ".join(done))
    return done


#: The statuses of a run that is not over: its host still holds what it needs (worktree, records).
UNFINISHED = ("queued", "running", "waiting_review", "waiting_approval")


def host_rows(now: datetime | None = None) -> list[dict]:
    """Every host, by name, for the pages: ``{"name", "queue", "repo_roots": [folder], "var_dir",
    "started_at", "beat_at" (datetimes), "beat_age_seconds" (float), "alive" (bool), "runs" (how many
    unfinished runs are pinned to it), "unconfirmed" (how many of them wait for it to confirm their
    old processes gone)}``. Two queries."""
    from django.db.models import Count, Q

    now = now or timezone.now()
    counts = {row["host"]: row for row in Run.objects.filter(status__in=UNFINISHED).exclude(host="")
              .values("host").annotate(runs=Count("id"), unconfirmed=Count("id", filter=Q(
                  stop_evidence__host_confirmed=False)))}
    rows = []
    for host in Host.objects.order_by("name"):
        found = counts.get(host.name, {})
        rows.append({"name": host.name, "queue": host.queue, "repo_roots": list(host.repo_roots or []),
                     "var_dir": host.var_dir, "started_at": host.started_at, "beat_at": host.beat_at,
                     "beat_age_seconds": host_age(host, now), "alive": is_alive(host, now),
                     "runs": found.get("runs", 0), "unconfirmed": found.get("unconfirmed", 0)})
    return rows
