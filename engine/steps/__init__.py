"""The steps of a stage: implement, verify, checkpoint, and the run's finish.

Each step has three parts, called by ``engine.runner``:

* ``begin(run, step, lease)``: inside the short locking transaction; persists the intent
  (an Attempt row before an agent starts, a JournalEntry before git commits) and returns a
  plain ``plan`` dict;
* ``execute(plan, should_stop)``: outside any transaction; runs git, the agent, the gates;
  returns a plain ``outcome`` dict;
* ``finish(run, plan, outcome)``: inside the second locking transaction; records evidence and
  asks ``engine.machine`` for the transition.

``crashed(plan, exc)`` is the outcome of a step whose machinery raised, ``record_late`` keeps a
result that arrived after the run moved on. engine/reconcile.py finishes a checkpoint through the
same functions.

This module dispatches by step kind; each kind is a module of this package: ``implement``
(implement and repair), ``review``, ``document``, ``verify``, ``checkpoint``, ``final`` (the
``finish`` step's final verification) and ``setup`` (the run's first step when its pipeline has a
``setup``: its environment, engine/environments.py). What they share: ``attempts`` (an agent attempt, whatever
its role), ``gates`` (running and recording gate commands), ``prompts`` (every prompt an agent is
given), ``common`` (the lease fence, index-lock waits, manifests, reviewers, defects) and
``paths`` (files under CP_VAR_DIR, the environment of the run's commands). The names other
modules use are re-exported here, so ``engine.steps.X`` keeps working.
"""
from __future__ import annotations

from .. import boundary, machine, workspace
from ..models import Attempt, AttemptStatus, Run, StageRun, StageStatus
from . import checkouts, checkpoint, document, final, implement, review, setup, verify
from .attempts import apply_attempt_result
from .common import (
    LeaseLost,
    definition_tampered,
    manifest_excludes,
    reviewers,
    save_manifest,
    storable,
)
from .gates import MAX_BOUND_PROTECTED, gate_commands, gate_results, remove_bytecode
from .paths import control_path, process_marker_prefix, remove_scratch, run_env, scratch_dirs, sha256_file, var_path
from .plans import CrashOutcome, Outcome, Plan, StagePlan, StepPlan

#: What each step kind of a stage does before it runs (the run locked; returns its plan).
BEGINNERS = {"implement": implement.begin, "repair": implement.begin, "review": review.begin,
             "document": document.begin, "verify": verify.begin, "checkpoint": checkpoint.begin}

#: The slow work of each step kind, outside any transaction (returns its outcome).
EXECUTORS = {"implement": implement.execute, "repair": implement.execute, "review": review.execute,
             "document": document.execute, "verify": verify.execute, "checkpoint": checkpoint.execute,
             "finish": final.execute, "setup": setup.execute}

#: How each step kind of a stage records its outcome (the run locked again).
FINISHERS = {"implement": implement.finish, "repair": implement.finish, "review": review.finish,
             "document": document.finish, "verify": verify.finish, "checkpoint": checkpoint.finish}

#: Kept for tests/test_index_lock_recovery.py, which makes and removes a final checkout itself.
_final_checkout = checkouts.final_checkout
_remove_final_checkout = checkouts.remove_final_checkout


def begin(run: Run, step: machine.Step, lease: str) -> Plan:
    """Persist the intent of ``step`` (run locked by the caller) and return its plan."""
    plan: StepPlan = {"kind": step.kind, "run_id": run.pk, "lease": lease, "stage_id": step.stage_id}
    if step.kind == "finish":
        return final.begin(run, plan)
    if step.kind == "setup":
        return setup.begin(run, plan)
    stage = StageRun.objects.select_related("run").get(pk=step.stage_id)
    if stage.status == StageStatus.PENDING or not stage.base_commit:
        previous = run.stages.filter(order__lt=stage.order).order_by("-order").first()
        machine.start_stage(stage, previous.checkpoint_commit if previous else run.commit)
    elif stage.status != StageStatus.RUNNING:
        machine.start_stage(stage, stage.base_commit)
    stage_plan: StagePlan = {**plan, "stage_key": stage.key}
    beginner = BEGINNERS.get(step.kind)
    return beginner(run, stage, stage_plan) if beginner is not None else stage_plan


def execute(plan: Plan, should_stop) -> Outcome:
    """Do the step's slow work outside any transaction; returns its outcome dict."""
    executor = EXECUTORS.get(plan["kind"])
    return executor(plan, should_stop) if executor is not None else {}


#: Errors of a step's machinery that an agent or a gate caused: the run stops with their own code.
_STOP_CODES = ("nested_repository", "boundary_not_enforced")


def crashed(plan: Plan, exc: BaseException) -> CrashOutcome:
    """The outcome of a step whose own machinery raised: infrastructure broke, not the agent; or
    a refusal an agent's files caused (a nested repository found by the manifest, a boundary the
    sandbox cannot enforce), whose code becomes the stop reason."""
    code = getattr(exc, "code", "") if isinstance(exc, workspace.WorkspaceError) else ""
    if isinstance(exc, boundary.BoundaryNotEnforced):
        code = "boundary_not_enforced"
    if code in _STOP_CODES:
        return {"crashed": True, "failure_kind": code, "stop_reason": code,
                "failure_message": getattr(exc, "message", str(exc))}
    return {"crashed": True, "failure_kind": "crashed", "failure_message": f"{type(exc).__name__}: {exc}"}


def finish(run: Run, plan: Plan, outcome: Outcome) -> None:
    """Record the outcome of a step on the locked ``run`` and move it on or stop it."""
    if plan["kind"] == "finish":
        final.finish(run, plan, outcome)
        return
    if plan["kind"] == "setup":
        setup.finish(run, plan, outcome)
        return
    stage = StageRun.objects.select_related("run").get(pk=plan["stage_id"])
    stage.run = run
    if outcome.get("crashed"):
        if plan.get("attempt_id"):
            machine.end_attempt_id(plan["attempt_id"], AttemptStatus.FAILED, failure_kind=outcome["failure_kind"],
                                   failure_message=storable(outcome["failure_message"]))
        if outcome.get("stop_reason"):
            machine.stop(run, outcome["stop_reason"], f"The {plan['kind']} step of stage '{stage.key}' was refused: "
                         f"{outcome['failure_message']}", stage=stage)
            return
        machine.stop(run, "crashed", f"The engine failed during the {plan['kind']} step of stage '{stage.key}': "
                     f"{outcome['failure_message']}", stage=stage)
        return
    FINISHERS[plan["kind"]](run, stage, plan, outcome)


def record_late(run: Run, plan: Plan, outcome: Outcome) -> None:
    """A result that arrived after the run moved on: kept as evidence, changes nothing."""
    if plan.get("attempt_id"):
        attempt = Attempt.objects.get(pk=plan["attempt_id"])
        if attempt.status in (AttemptStatus.PREPARING, AttemptStatus.RUNNING) and "launched" in outcome:
            apply_attempt_result(attempt, outcome)
        attempt.late = True
        attempt.save(update_fields=["late"])
    result = outcome.get("result") or {}
    summary = {"step": plan["kind"], "attempt": plan.get("attempt_id"), "exit_code": result.get("exit_code"),
               "signal": result.get("signal"), "failure_kind": result.get("failure_kind") or outcome.get("failure_kind"),
               "checks": outcome.get("checks") or []}
    machine.event(run, "late_result",
                  f"A result of the {plan['kind']} step arrived after the run moved on "
                  f"({'it is being failed' if run.lease_owner.startswith('fail:') else 'it is ' + run.status}); it was "
                  f"stored as late and changed nothing.", data=storable(summary))


__all__ = ["BEGINNERS", "EXECUTORS", "FINISHERS", "LeaseLost", "MAX_BOUND_PROTECTED", "begin", "control_path",
           "crashed", "definition_tampered", "execute", "finish", "gate_commands", "gate_results",
           "manifest_excludes", "process_marker_prefix", "record_late", "remove_bytecode", "remove_scratch",
           "reviewers", "run_env", "save_manifest", "scratch_dirs", "sha256_file", "storable", "var_path"]
