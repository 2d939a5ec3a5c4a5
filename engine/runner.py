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

A worker's task (engine/tasks.py) calls ``advance_chain``: the same steps, one after another in
one task for up to CP_STEP_CHAIN_SECONDS, each still claimed, fenced and handed off as above.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from celery import current_app

from . import budgets, faults, hosts, machine, steps, workers, workspace
from .models import Run, RunStatus, StageStatus

log = logging.getLogger("engine.runner")


def worker_identity() -> str:
    """``host:pid`` of this process (the host: ``CP_HOST_NAME``, engine/hosts.py), recorded as the lease owner."""
    return f"{hosts.this_host()}:{os.getpid()}"


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
    """Send ``engine.advance_run`` to the run's queue (its host's once a claim pinned it, else the
    shared one: engine/hosts.py ``queue_for``); called only from ``transaction.on_commit``.

    If the broker is down the request stays durable in the database and reconciliation
    sends it again; the failure is logged, not hidden.
    """
    try:
        queue = hosts.queue_for(run_id)
    except Exception:
        log.exception("run %s: could not read its host; reconciliation will enqueue it again", run_id)
        return
    send(run_id, [run_id, token], queue)


def send(run_id: int, args: list, queue: str) -> bool:
    """Send ``engine.advance_run(*args)`` to ``queue`` (by name: engine/tasks.py defines the task and
    imports this module), retried 3 times by kombu. False when the broker could not be reached: logged,
    and reconciliation sends the run's message again (its request is durable in the database)."""
    try:
        current_app.send_task(ADVANCE_TASK, args=args, queue=queue, retry=True, retry_policy={"max_retries": 3})
        return True
    except Exception:
        log.exception("run %s: could not reach the broker; reconciliation will enqueue it again", run_id)
        return False


def advance(run_id: int, token: str | None = None) -> str:
    """Take one step of run ``run_id`` and, when the run goes on, enqueue its next step once this
    commits. Returns what happened: dropped, late, a stop code or the step kind."""
    return _step(run_id, token, chained=False)[0]


#: Seconds a stopping worker waits before it sends a message it was handed back to the queue (a
#: worker that goes on receiving its own message re-sends it at most this often).
SHUTDOWN_RESEND_SECONDS = 1.0


def advance_chain(run_id: int, token: str | None = None, budget: float | None = None,
                  tried: list[str] | None = None) -> str:
    """Take steps of run ``run_id`` one after another in this process while the run goes on and
    less than ``budget`` seconds (default ``CP_STEP_CHAIN_SECONDS``) have passed since the first
    began; then enqueue the next step (the message carries its token), so that a long run gives
    its worker back to the queue between steps. Returns what the last step did.

    Each step is exactly one ``advance`` step: its own claim by compare-and-swap, its fenced record
    before and after, a journal entry before git commits, its heartbeat; between two steps the lease
    is handed off and committed, then claimed again with the handed-off token, as the next message
    would claim it. A process that dies between the two leaves a handed-off run without a message,
    which reconciliation enqueues again (engine/reconcile.py, CP_QUEUED_STALE) as it does when the
    broker lost a message. Consecutive cheap steps so cost no broker round trip, and a run started
    earlier runs on to its end instead of waiting behind every run started later. Once the worker
    began a warm shutdown (engine/workers.py ``shutting_down``) the next step goes to the queue, and
    a message received then is sent back to it untouched (after ``SHUTDOWN_RESEND_SECONDS``)."""
    budget = settings.CP_STEP_CHAIN_SECONDS if budget is None else budget
    if workers.shutting_down():
        # a stopping worker may still be handed messages (the filesystem transport goes on reading):
        # it takes no new step; the message goes back to the queue for another worker, or this one
        # once restarted (its claim is by token, so a copy that also survives claims nothing)
        time.sleep(SHUTDOWN_RESEND_SECONDS)
        enqueue(run_id, token)
        log.info("run %s: this worker is shutting down; the step (token %s) is sent back to the queue",
                 run_id, token or "-")
        return "deferred"
    started = time.monotonic()
    while True:
        result, next_token = _step(run_id, token, chained=True, tried=tried)
        tried = None
        if next_token is None:
            return result
        faults.hit("chain.after_hand_off")  # tests: the next step is handed off and no message carries it
        if time.monotonic() - started >= budget or workers.shutting_down():
            enqueue(run_id, next_token)  # a warm shutdown waits for the step in progress, not the run
            return result
        token = next_token


def _not_here(run_id: int, token: str | None, tried: list[str] | None = None) -> str:
    """``"forwarded"`` when run ``run_id`` is pinned to another host (its message is sent on to that
    host's queue: a message of the shared queue, sent before the pin or by an older sender),
    ``"unreachable"`` when it is not pinned yet and this host cannot reach its repository (the
    message goes on to a live host whose CP_HOST_REPOS cover it and that is not in ``tried``, the hosts
    that already found they cannot; with none left it is dropped and reconciliation sends it to the
    shared queue again after CP_QUEUED_STALE); ``""`` when this host may claim it."""
    row = Run.objects.filter(pk=run_id).values("host", "repo_path", "status").first()
    if row is None:
        return ""
    me = hosts.this_host()
    if row["host"] and row["host"] != me:
        send(run_id, [run_id, token], hosts.host_queue(row["host"]))
        log.info("run %s: pinned to host %s (its worktree is there); the message (token %s) is sent on to its "
                 "queue", run_id, row["host"], token or "-")
        return "forwarded"
    if not row["host"] and row["status"] == RunStatus.QUEUED and not hosts.can_reach(row["repo_path"]):
        tried = sorted({*(tried or []), me})
        other = hosts.reaching_host(row["repo_path"], exclude=tried)
        if other is not None:  # straight to a host that says it reaches it, not back to the shared queue
            send(run_id, [run_id, token, tried], other.queue)
            log.info("run %s: host %s cannot reach its repository %s (CP_HOST_REPOS); sent on to host %s",
                     run_id, me, row["repo_path"], other.name)
            return "forwarded"
        log.warning("run %s: host %s cannot reach its repository %s (CP_HOST_REPOS), nor can any other live host "
                    "that was asked (%s); reconciliation sends it again after CP_QUEUED_STALE", run_id, me,
                    row["repo_path"], ", ".join(tried))
        return "unreachable"
    return ""


def _adopt(run_id: int, lease: str) -> str:
    """``hosts.adopt`` the run just claimed; ``""`` when it is at home here, else the stop reason with
    which the run was stopped (``host_mismatch``, or a workspace error's code)."""
    try:
        hosts.adopt(run_id, lease)
        return ""
    except (hosts.AdoptionError, workspace.WorkspaceError) as exc:
        code = getattr(exc, "code", "host_mismatch")
        reason = code if code in machine.STOP_REASONS else "host_mismatch"
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if run.lease_token == lease and run.status == RunStatus.RUNNING:
                machine.stop(run, reason, f"Host {hosts.this_host()} cannot take this run: {exc.message}")
        log.error("run %s: host %s cannot take it: %s", run_id, hosts.this_host(), exc.message)
        return reason


def _step(run_id: int, token: str | None, chained: bool, tried: list[str] | None = None) -> tuple[str, str | None]:
    """One step (module docstring); returns ``(what happened, the handed-off token or None)``. With
    ``chained`` False the next step's message is sent on commit; with True the caller takes it."""
    close_old_connections()
    elsewhere = _not_here(run_id, token, tried)
    if elsewhere:
        return elsewhere, None
    owner = worker_identity()
    lease = machine.claim(run_id, token, owner, hosts.this_host())
    if lease is None:
        log.info("run %s: message (token %s) claims nothing: the step is owned or done; dropped",
                 run_id, token or "-")
        return "dropped", None
    if token is None:  # a start (or a recovery's): the run may have been created on another machine
        refused = _adopt(run_id, lease)
        if refused:
            return refused, None
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        step = machine.next_step(run)
        tampered = steps.definition_tampered(run)
        if tampered is not None:
            machine.fail(run, "definition_tampered", tampered["message"], evidence=tampered["evidence"])
            log.error("run %s: definition tampered; failed before the %s step: %s", run_id, step.kind,
                      tampered["message"])
            return "definition_tampered", None
        problem = budgets.budget_problem(run, step)
        if problem is not None:
            stage = run.stages.filter(pk=step.stage_id).first() if step.stage_id else None
            if stage is not None and stage.status == StageStatus.PENDING:
                # the budget ran out between two stages: the next one begins where the last checkpoint left off,
                # and waits there (a pending stage cannot wait for a person)
                previous = run.stages.filter(order__lt=stage.order).order_by("-order").first()
                machine.start_stage(stage, previous.checkpoint_commit if previous else run.commit)
            machine.stop(run, "budget_exhausted", f"{problem} An exhausted budget needs a new run.", stage=stage,
                         evidence={"budgets": run.definition["pipeline"].get("budgets") or {}})
            log.info("run %s: budget exhausted before the %s step", run_id, step.kind)
            return "budget_exhausted", None
        try:
            with transaction.atomic():
                plan = steps.begin(run, step, lease)
        except Exception as exc:  # the engine's own fault: say so on the run instead of leaving it running
            log.exception("run %s: could not begin the %s step", run_id, step.kind)
            run.refresh_from_db()
            stage = run.stages.filter(pk=step.stage_id).first() if step.stage_id else None
            machine.stop(run, "crashed", f"The engine failed to begin the {step.kind} step: "
                         f"{type(exc).__name__}: {exc}", stage=stage)
            return "crashed", None
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
            return "late", None
        steps.finish(run, plan, outcome)
        next_token = None
        if run.status == RunStatus.RUNNING:
            next_token = machine.hand_off(run)
            if not chained:
                transaction.on_commit(lambda: enqueue(run_id, next_token))
        else:
            run.save()
    return step.kind, next_token
