"""Thin Celery tasks of the Run Engine. They take ids, re-read state, and are no-ops when late.

Only ids and fencing tokens travel through the broker: no prompt, output or secret ever does
(docs/field-cases.md C14).
"""
import logging

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from . import boundary, notifications, runner, workers
from .processes import limits
from . import reconcile as reconciliation
from .pipeline.schema import MAX_DEADLINE_SECONDS

log = logging.getLogger("engine.tasks")

#: Celery's time limits of each task, in seconds: ``(soft, hard)``. Past its soft limit a task gets
#: SoftTimeLimitExceeded (a step under way ends as a crash naming it: engine/runner.py), past its hard limit
#: its pool process is killed (reconciliation then interrupts the run, as for any worker lost). A run's task
#: takes steps for up to CP_STEP_CHAIN_SECONDS and may then start one more, whose processes a pipeline may give
#: up to MAX_DEADLINE_SECONDS each: its limits lie above both, with an hour to spare for the step's own work
#: (git, records); only a task wedged past any deadline meets them. Reconciliation and notifications are
#: short passes.
TIME_LIMITS = {
    "advance": (settings.CP_STEP_CHAIN_SECONDS + MAX_DEADLINE_SECONDS + 3600.0,
                settings.CP_STEP_CHAIN_SECONDS + MAX_DEADLINE_SECONDS + 3900.0),
    "reconcile": (900.0, 1200.0),
    "notify": (600.0, 900.0),
}


@shared_task(name=runner.ADVANCE_TASK, ignore_result=True, acks_late=True,
             soft_time_limit=TIME_LIMITS["advance"][0], time_limit=TIME_LIMITS["advance"][1])
def advance_run(run_id: int, token: str | None = None, tried: list[str] | None = None) -> str:
    """Move run ``run_id`` on: its steps one after another for up to CP_STEP_CHAIN_SECONDS, then its
    next step through the queue (``engine.runner.advance_chain``). ``tried``: the hosts that found they
    cannot reach the run's repository (a start sent on from one host to another, engine/hosts.py)."""
    return runner.advance_chain(run_id, token, tried=tried)


@shared_task(name="engine.reconcile", ignore_result=True,
             soft_time_limit=TIME_LIMITS["reconcile"][0], time_limit=TIME_LIMITS["reconcile"][1])
def reconcile() -> dict:
    """One reconciliation pass (``engine.reconcile.reconcile``); safe to run twice at once."""
    return reconciliation.reconcile()


@shared_task(name=notifications.NOTIFY_TASK, ignore_result=True,
             soft_time_limit=TIME_LIMITS["notify"][0], time_limit=TIME_LIMITS["notify"][1])
def notify(ids: list[int]) -> dict:
    """Deliver the notification outbox rows ``ids`` (``engine.notifications.deliver_all``); a row
    already delivered, not due or claimed by another is left alone, so a duplicate message sends nothing."""
    return notifications.deliver_all(ids)


def _reconcile_at_worker_start(sender=None, **kwargs) -> None:
    """When a worker starts, ask for one reconciliation pass (through its host's own queue, so that a
    worker of this host takes it: it reaps and inspects this host's processes and worktrees)."""
    from .hosts import host_queue, this_host

    reconcile.apply_async(queue=host_queue(this_host()))


def _check_boundary_at_worker_start(sender=None, **kwargs) -> None:
    """When a worker starts, probe the sandbox (engine/boundary.py ``self_check``) and say in its log
    whether agents can run here; each pool process checks again before its first launch and
    refuses agents and gates (``boundary_not_enforced``) while a service answers from inside."""
    problems = boundary.probe()
    if problems:
        log.error("SANDBOX BOUNDARY NOT ENFORCED: agents and gates will be refused (boundary_not_enforced): %s",
                  "; ".join(problems))
    else:
        log.info("sandbox boundary enforced: no database, broker or web port answers from inside a sandbox")
    kind, _ = limits.mechanism()  # which of engine/processes/limits.py's ways bounds each attempt here
    (log.info if kind != "fallback" else log.warning)("%s", limits.describe())


def connect_signals() -> None:
    """Connect the worker_ready handlers, and the worker's beat (engine/workers.py: its ``Worker`` row
    every CP_WORKER_BEAT seconds, marked stopped at a clean shutdown); idempotent: each has a dispatch_uid."""
    worker_ready.connect(_reconcile_at_worker_start, weak=False, dispatch_uid="engine-reconcile-at-start")
    worker_ready.connect(_check_boundary_at_worker_start, weak=False, dispatch_uid="engine-boundary-at-start")
    workers.connect_signals()


connect_signals()
