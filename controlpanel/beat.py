"""The beat scheduler of the Run Engine: reconciliation runs in the beat process itself.

Celery beat only sends messages; a reconciliation pass sent to the queue waits for a live
worker. But reconciliation is what must happen when the workers are gone: a ``kill -9`` of the
only worker leaves its agent tree running and its run "running" until somebody notices. So the
``engine.reconcile`` entry of the schedule is not sent: beat calls ``engine.reconcile.reconcile``
in its own process every ``CP_RECONCILE_PERIOD`` seconds (a pass takes milliseconds, plus a few
seconds per interrupted run while its processes are reaped). A stale run pinned to another host
that still beats is that host's to take over (its processes and worktree are there): the beat
sends a pass to that host's queue (engine/reconcile.py ``hosts_to_reconcile``). Every other entry
is sent as usual.
Two beats at once still act once per run (each takeover is a compare-and-swap; docs/field-cases.md C17).

Used by ``celery -A controlpanel beat`` and a worker's embedded beat (``-B``) through the
``CELERY_BEAT_SCHEDULER`` setting.
"""
from __future__ import annotations

import json
import logging

from celery.beat import PersistentScheduler

log = logging.getLogger("celery.beat")

RECONCILE_TASK = "engine.reconcile"


class ReconcilingScheduler(PersistentScheduler):
    """A PersistentScheduler (schedule state in the ``--schedule`` file) that runs the
    ``engine.reconcile`` entry in-process instead of sending it to the queue."""

    def apply_entry(self, entry, producer=None):
        if entry.task != RECONCILE_TASK:
            return super().apply_entry(entry, producer=producer)
        import django

        django.setup()
        from django.db import close_old_connections

        from engine.reconcile import reconcile

        from engine.reconcile import hosts_to_reconcile

        close_old_connections()
        try:
            counts = reconcile()
            log.info("Scheduler: reconciliation pass (%s) in the beat process: %s", entry.name, json.dumps(counts))
            # the runs of other live hosts are theirs to take over: a pass on their own queue
            for host in hosts_to_reconcile():
                self.app.send_task(RECONCILE_TASK, queue=host.queue, expires=max(1.0, float(entry.schedule.seconds)))
                log.info("Scheduler: reconciliation pass sent to host %s (queue %s)", host.name, host.queue)
        except Exception:  # a database that is down now may be up at the next period: say so, go on
            log.exception("beat: a reconciliation pass failed; the next one comes in one period")
        finally:
            close_old_connections()
