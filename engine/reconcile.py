"""Reconciliation: find work that a lost message or a dead worker left behind.

Run by Celery beat every CP_RECONCILE_PERIOD seconds and once when a worker starts. Every
action first wins a compare-and-swap on the run row, so two reconcilers running at once (two
beat processes, a beat and a worker start) act once (field case C17).

* queued and not claimed for CP_QUEUED_STALE seconds: enqueue again;
* running, handed off between steps, and not picked up for CP_QUEUED_STALE: enqueue again;
* running with a step owner whose heartbeat is older than CP_HEARTBEAT_STALE: confirm the old
  process tree is gone (pid and its start time; kill what is left, found by its marker), mark
  the open attempt ``interrupted``, keep completed stages, and stop the run for review;
* a checkpoint journal entry left in ``intent``: the commit carrying its id in a trailer tells
  whether git ran; found -> done, else it stays for a person's Recover.
"""
from __future__ import annotations

import logging
import socket
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import machine, process, workspace
from .models import ATTEMPT_OPEN, Attempt, AttemptStatus, JournalEntry, Run, RunStatus, StartRequest

log = logging.getLogger("engine.reconcile")


def reconcile() -> dict:
    """One pass. Returns counts: ``{"requeued", "handoffs", "interrupted", "journal_done"}``."""
    now = timezone.now()
    counts = {"requeued": 0, "handoffs": 0, "interrupted": 0, "journal_done": 0}
    queued_cutoff = now - timedelta(seconds=settings.CP_QUEUED_STALE)
    for start in StartRequest.objects.filter(run__status=RunStatus.QUEUED, last_enqueued_at__lt=queued_cutoff):
        if StartRequest.objects.filter(pk=start.pk, last_enqueued_at=start.last_enqueued_at).update(
                last_enqueued_at=now, enqueued_times=start.enqueued_times + 1):
            _enqueue_on_commit(start.run_id, None)
            counts["requeued"] += 1
    for run in Run.objects.filter(status=RunStatus.RUNNING, lease_owner="", heartbeat_at__lt=queued_cutoff):
        if Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, lease_owner="", lease_token=run.lease_token,
                              heartbeat_at=run.heartbeat_at).update(heartbeat_at=now):
            _enqueue_on_commit(run.pk, run.lease_token)
            counts["handoffs"] += 1
    stale_cutoff = now - timedelta(seconds=settings.CP_HEARTBEAT_STALE)
    for run in Run.objects.filter(status=RunStatus.RUNNING, heartbeat_at__lt=stale_cutoff).exclude(lease_owner=""):
        if interrupt(run.pk, run.lease_token, run.heartbeat_at):
            counts["interrupted"] += 1
    for entry in JournalEntry.objects.filter(state=JournalEntry.State.INTENT).select_related("run"):
        if entry.run.status == RunStatus.RUNNING:
            continue
        commit = workspace.find_commit_with_trailer(entry.run.repo_path, entry.run.branch, "Control-Panel-Journal",
                                                    str(entry.uid))
        if commit and JournalEntry.objects.filter(pk=entry.pk, state=JournalEntry.State.INTENT).update(
                state=JournalEntry.State.DONE, commit=commit):
            counts["journal_done"] += 1
    if any(counts.values()):
        log.info("reconcile: %s", counts)
    return counts


def _enqueue_on_commit(run_id: int, token: str | None) -> None:
    from .runner import enqueue

    transaction.on_commit(lambda: enqueue(run_id, token), robust=True)


def interrupt(run_id: int, token: str, heartbeat_at) -> bool:
    """Take over a run whose step owner stopped beating, reap its processes, stop it for review.

    Returns False when another reconciler (or the owner itself) got there first.
    """
    mine = machine.new_token()
    me = f"reconciler:{socket.gethostname()}"
    if not Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, lease_token=token,
                              heartbeat_at=heartbeat_at).update(lease_token=mine, lease_owner=me):
        return False
    reaped, unconfirmed = 0, []
    for attempt in Attempt.objects.filter(run_id=run_id, status__in=ATTEMPT_OPEN):
        if attempt.host and attempt.host != socket.gethostname():
            unconfirmed.append(attempt.number)
            continue
        reaped += process.kill_tree(attempt.pid, attempt.pid_create_time, attempt.marker or None, grace_seconds=3.0)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.lease_token != mine:
            return False
        stage = None
        for attempt in Attempt.objects.filter(run_id=run_id, status__in=ATTEMPT_OPEN).select_related("stage"):
            attempt.status = AttemptStatus.INTERRUPTED
            attempt.failure_kind = "interrupted"
            attempt.failure_message = "The worker running this attempt stopped beating; the attempt was interrupted."
            attempt.ended_at = timezone.now()
            attempt.save()
            stage = attempt.stage
        if stage is None:
            stage = run.stages.exclude(status__in=["passed", "pending"]).order_by("order").first()
        note = f" Processes reaped: {reaped}." if reaped else " No process of it was left."
        if unconfirmed:
            note += f" Attempts {unconfirmed} ran on another host; their processes could not be confirmed stopped."
        machine.stop(run, "interrupted",
                     f"The worker that held this run stopped sending heartbeats; the step was interrupted and "
                     f"completed stages were kept.{note}", stage=stage, evidence={"reaped": reaped})
    return True
