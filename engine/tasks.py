"""Thin Celery tasks of the Run Engine. They take ids, re-read state, and are no-ops when late.

Only ids and fencing tokens travel through the broker: no prompt, output or secret ever does
(field case C14).
"""
from celery import shared_task

from . import reconcile as reconciliation
from . import runner


@shared_task(name="engine.advance_run", ignore_result=True, acks_late=True)
def advance_run(run_id: int, token: str | None = None) -> str:
    """Move run ``run_id`` one step (``engine.runner.advance``)."""
    return runner.advance(run_id, token)


@shared_task(name="engine.reconcile", ignore_result=True)
def reconcile() -> dict:
    """One reconciliation pass (``engine.reconcile.reconcile``); safe to run twice at once."""
    return reconciliation.reconcile()


def _reconcile_at_worker_start(sender=None, **kwargs) -> None:
    """When a worker starts, ask for one reconciliation pass (through the queue, not in the parent)."""
    reconcile.delay()


def connect_signals() -> None:
    from celery.signals import worker_ready

    worker_ready.connect(_reconcile_at_worker_start, weak=False, dispatch_uid="engine-reconcile-at-start")


connect_signals()
