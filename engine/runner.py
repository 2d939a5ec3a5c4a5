"""The step protocol: lock, commit, work, lock again.

``advance(run_id, token)`` moves a run one step:

1. claim the lease by compare-and-swap (``machine.claim``), then in a short transaction with
   the run row locked ask ``machine.next_step`` and persist the step's intent (``steps.begin``);
2. do the slow work outside any transaction (``steps.execute``) while a heartbeat thread adds
   to the run's active time and notices a lost lease;
3. lock the run again: if the fencing token no longer matches, the result is stored as late
   and changes nothing; otherwise record it (``steps.finish``) and, when the run is still
   running, hand the lease to the next step and enqueue it on commit.

A redelivered or duplicated message finds the step claimed or done, and returns.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from celery import current_app

from . import machine, steps
from .models import Run, RunStatus

log = logging.getLogger("engine.runner")


def worker_identity() -> str:
    """``host:pid`` of this process, recorded as the lease owner."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat(threading.Thread):
    """Refreshes the run's heartbeat and active time every CP_HEARTBEAT_INTERVAL seconds.

    ``lost()`` turns true once an update finds the lease gone (the run was failed, or a
    reconciler took it over); the step then stops its process.
    """

    def __init__(self, run_id: int, token: str, interval: float):
        super().__init__(name=f"heartbeat-run-{run_id}", daemon=True)
        self.run_id, self.token, self.interval = run_id, token, interval
        self._stop_event = threading.Event()
        self._lost = threading.Event()
        self._last = time.monotonic()

    def lost(self) -> bool:
        return self._lost.is_set()

    def _beat(self) -> None:
        now = time.monotonic()
        seconds, self._last = now - self._last, now
        if not machine.heartbeat(self.run_id, self.token, seconds):
            self._lost.set()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self.interval):
                try:
                    self._beat()
                except Exception:  # a database hiccup must not kill the heartbeat; say so
                    log.exception("run %s: heartbeat failed; trying again", self.run_id)
            if not self._lost.is_set():
                self._beat()
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


#: The Celery task that takes one step of a run (engine/tasks.py ``advance_run``).
ADVANCE_TASK = "engine.advance_run"


def enqueue(run_id: int, token: str | None) -> None:
    """Send ``engine.advance_run``; called only from ``transaction.on_commit``.

    If the broker is down the request stays durable in the database and reconciliation
    sends it again; the failure is logged, not hidden.
    """
    try:
        # by name: engine/tasks.py defines the task and imports this module
        current_app.send_task(ADVANCE_TASK, args=[run_id, token], retry=True, retry_policy={"max_retries": 3})
    except Exception:
        log.exception("run %s: could not reach the broker; reconciliation will enqueue it again", run_id)


def advance(run_id: int, token: str | None = None) -> str:
    """Take one step of run ``run_id``. Returns what happened: dropped, late, stepped or a step kind."""
    close_old_connections()
    owner = worker_identity()
    lease = machine.claim(run_id, token, owner)
    if lease is None:
        log.info("run %s: message (token %s) claims nothing: the step is owned or done; dropped",
                 run_id, token or "-")
        return "dropped"
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        step = machine.next_step(run)
        tampered = steps.definition_tampered(run)
        if tampered is not None:
            machine.fail(run, "definition_tampered", tampered["message"], evidence=tampered["evidence"])
            log.error("run %s: definition tampered; failed before the %s step: %s", run_id, step.kind,
                      tampered["message"])
            return "definition_tampered"
        problem = machine.budget_problem(run, step)
        if problem is not None:
            stage = run.stages.filter(pk=step.stage_id).first() if step.stage_id else None
            machine.stop(run, "budget_exhausted", f"{problem} An exhausted budget needs a new run.", stage=stage,
                         evidence={"budgets": run.definition["pipeline"].get("budgets") or {}})
            log.info("run %s: budget exhausted before the %s step", run_id, step.kind)
            return "budget_exhausted"
        try:
            with transaction.atomic():
                plan = steps.begin(run, step, lease)
        except Exception as exc:  # the engine's own fault: say so on the run instead of leaving it running
            log.exception("run %s: could not begin the %s step", run_id, step.kind)
            run.refresh_from_db()
            stage = run.stages.filter(pk=step.stage_id).first() if step.stage_id else None
            machine.stop(run, "crashed", f"The engine failed to begin the {step.kind} step: "
                         f"{type(exc).__name__}: {exc}", stage=stage)
            return "crashed"
        simulated = " [simulated]" if run.simulated else ""
    log.info("run %s%s: %s step claimed by %s", run_id, simulated, step.kind, owner)
    beat = Heartbeat(run_id, lease, settings.CP_HEARTBEAT_INTERVAL)
    beat.start()
    try:
        outcome = steps.execute(plan, should_stop=beat.lost)
    except Exception as exc:  # infrastructure broke: recorded as a crash with its cause
        outcome = steps.crashed(plan, exc)
        if outcome.get("stop_reason"):  # a refusal the agent's files caused, not the engine's fault
            log.warning("run %s: %s step refused (%s): %s", run_id, step.kind, outcome["stop_reason"],
                        outcome["failure_message"])
        else:
            log.exception("run %s: %s step crashed", run_id, step.kind)
    finally:
        beat.stop()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.lease_token != lease or run.status != RunStatus.RUNNING:
            steps.record_late(run, plan, outcome)
            log.warning("run %s: result of %s arrived after the run moved on; stored as late", run_id, step.kind)
            return "late"
        steps.finish(run, plan, outcome)
        if run.status == RunStatus.RUNNING:
            next_token = machine.hand_off(run)
            transaction.on_commit(lambda: enqueue(run_id, next_token))
        else:
            run.save()
    return step.kind
