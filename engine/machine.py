"""The state machine: the only place that decides a run's next step and changes a status.

Two kinds of functions live here:

* compare-and-swap moves (``queue_run``, ``claim``) that are correct on PostgreSQL and on
  SQLite alike (``select_for_update`` does nothing on SQLite, a conditional UPDATE does), and
* moves applied to a run already locked by the caller inside ``transaction.atomic()``
  (``next_step``, ``stop``, ``succeed``, ``hand_off``, the stage moves).

Every status assignment in the project goes through ``_set_run_status`` or ``_set_stage``,
which refuse a move the transition table does not allow.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from .models import (
    RUN_STOPPED,
    Attempt,
    AttemptStatus,
    Decision,
    JournalEntry,
    Run,
    RunEvent,
    RunStatus,
    StagePhase,
    StageRun,
    StageStatus,
)

RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.PENDING: frozenset({RunStatus.QUEUED, RunStatus.FAILED}),
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.WAITING_REVIEW, RunStatus.WAITING_APPROVAL, RunStatus.SUCCEEDED, RunStatus.FAILED}
    ),
    RunStatus.WAITING_REVIEW: frozenset({RunStatus.QUEUED, RunStatus.FAILED}),
    RunStatus.WAITING_APPROVAL: frozenset({RunStatus.QUEUED, RunStatus.WAITING_REVIEW, RunStatus.FAILED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
}

STAGE_TRANSITIONS: dict[str, frozenset[str]] = {
    StageStatus.PENDING: frozenset({StageStatus.RUNNING, StageStatus.FAILED}),
    StageStatus.RUNNING: frozenset(
        {StageStatus.RUNNING, StageStatus.WAITING_REVIEW, StageStatus.WAITING_APPROVAL, StageStatus.PASSED,
         StageStatus.FAILED}
    ),
    StageStatus.WAITING_REVIEW: frozenset({StageStatus.RUNNING, StageStatus.FAILED}),
    StageStatus.WAITING_APPROVAL: frozenset({StageStatus.RUNNING, StageStatus.WAITING_REVIEW, StageStatus.FAILED}),
    StageStatus.PASSED: frozenset(),
    StageStatus.FAILED: frozenset(),
}


class IllegalTransition(Exception):
    """A move the transition table does not allow (a bug, never a user error)."""


def definition_digest(data) -> str:
    """sha256 (hex) of the canonical JSON of ``data`` (sorted keys, no spaces): the digest a run's
    frozen definition is recorded with (``Run.definition_sha256``) and checked against before
    every step (engine/runner.py: a mismatch stops the run ``definition_tampered``)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def new_token() -> str:
    """A fresh fencing token (32 hex characters)."""
    return secrets.token_hex(16)


def _check(table: dict, current: str, target: str, what: str) -> None:
    if target not in table[current]:
        raise IllegalTransition(f"{what}: {current} -> {target} is not allowed")


def _set_run_status(run: Run, target: str) -> None:
    _check(RUN_TRANSITIONS, run.status, target, f"run {run.pk}")
    run.status = target
    if target in RUN_STOPPED:
        run.lease_owner = ""
        run.lease_token = ""
    if target in (RunStatus.SUCCEEDED, RunStatus.FAILED):
        run.finished_at = timezone.now()


def _set_stage(stage: StageRun, status: str, phase: str | None = None) -> None:
    if stage.status != status:
        _check(STAGE_TRANSITIONS, stage.status, status, f"stage {stage.key} of run {stage.run_id}")
        stage.status = status
    if phase is not None:
        stage.phase = phase
    if status == StageStatus.RUNNING and stage.started_at is None:
        stage.started_at = timezone.now()
    if status in (StageStatus.PASSED, StageStatus.FAILED):
        stage.finished_at = timezone.now()
    stage.save()


def storable(value):
    """``value`` as the database can store it: every NUL character replaced by U+FFFD (PostgreSQL
    stores no NUL in text or JSON), and every lone surrogate (a path byte that is not UTF-8, as
    ``os.fsdecode`` gives it) written as ``\\xNN``; strings, lists and dicts are walked (keys
    too), anything else is returned as is."""
    if isinstance(value, str):
        value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            value = value.encode("utf-8", "backslashreplace").decode("utf-8")  # other lone surrogates
        return value
    if isinstance(value, list):
        return [storable(item) for item in value]
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    return value


def event(run: Run, kind: str, message: str, **refs) -> RunEvent:
    """Append a sentence to the run's story; ``refs`` may name stage, attempt, gate_check, decision, data
    (``message`` and ``data`` pass through ``storable``)."""
    if "data" in refs:
        refs["data"] = storable(refs["data"])
    return RunEvent.objects.create(run=run, kind=kind, message=storable(message), **refs)


# ----------------------------------------------------------------------------- compare-and-swap moves


def queue_run(run_id: int) -> bool:
    """pending -> queued, as a conditional update; False when the run was not pending.

    Exactly one of any number of concurrent callers gets True (PostgreSQL and SQLite).
    """
    _check(RUN_TRANSITIONS, RunStatus.PENDING, RunStatus.QUEUED, "queue")
    return bool(
        Run.objects.filter(pk=run_id, status=RunStatus.PENDING).update(
            status=RunStatus.QUEUED, queued_at=timezone.now(), updated_at=timezone.now()
        )
    )


def claim(run_id: int, token: str | None, owner: str) -> str | None:
    """Take the run's lease for one step; returns the new fencing token, or None when not ours.

    ``token`` None claims a queued run (queued -> running); a token claims the step that the
    previous step handed off (running, that token, no owner). A redelivered or duplicated
    message carries no token that still matches, so it claims nothing (field case C15).
    """
    mine = new_token()
    now = timezone.now()
    with transaction.atomic():
        if token is None:
            _check(RUN_TRANSITIONS, RunStatus.QUEUED, RunStatus.RUNNING, "claim")
            won = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
                status=RunStatus.RUNNING, lease_owner=owner, lease_token=mine, heartbeat_at=now, updated_at=now
            )
            if won:
                Run.objects.filter(pk=run_id, started_at__isnull=True).update(started_at=now)
        else:
            won = Run.objects.filter(
                pk=run_id, status=RunStatus.RUNNING, lease_token=token, lease_owner=""
            ).update(lease_owner=owner, lease_token=mine, heartbeat_at=now, updated_at=now)
    return mine if won else None


def fence(run: Run, owner: str) -> str:
    """Take the lease of the locked, running ``run`` away from whoever holds it (a person is
    failing the run): a new fencing token and ``owner``, a fresh heartbeat. The old owner's next
    heartbeat fails (its step stops its process), its hand-off claims nothing, and its result is
    stored as late. Returns the new token."""
    _check(RUN_TRANSITIONS, run.status, RunStatus.FAILED, f"fence run {run.pk}")
    run.lease_token = new_token()
    run.lease_owner = owner
    run.heartbeat_at = timezone.now()
    run.save(update_fields=["lease_token", "lease_owner", "heartbeat_at"])
    return run.lease_token


def heartbeat(run_id: int, token: str, seconds: float) -> bool:
    """Add ``seconds`` of active time and refresh the heartbeat; False when the lease is lost."""
    from django.db.models import F

    return bool(
        Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, lease_token=token).update(
            heartbeat_at=timezone.now(), active_seconds=F("active_seconds") + seconds
        )
    )


# ----------------------------------------------------------------------------- decisions on a locked run


@dataclass(frozen=True)
class Step:
    """What the run does next: ``kind`` in implement, verify, review, repair, checkpoint, finish."""

    kind: str
    stage_id: int | None = None


def next_step(run: Run) -> Step:
    """The next step of a running run, from its stages' phases (run locked by the caller)."""
    for stage in run.stages.order_by("order"):
        if stage.status == StageStatus.PASSED:
            continue
        if stage.phase == StagePhase.IMPLEMENT:
            return Step("implement", stage.pk)
        if stage.phase == StagePhase.VERIFY:
            return Step("verify", stage.pk)
        if stage.phase == StagePhase.REVIEW:
            return Step("review", stage.pk)
        if stage.phase == StagePhase.REPAIR:
            return Step("repair", stage.pk)
        if stage.phase == StagePhase.DOCUMENT:
            return Step("document", stage.pk)
        if stage.phase == StagePhase.CHECKPOINT:
            return Step("checkpoint", stage.pk)
        raise IllegalTransition(f"stage {stage.key} is {stage.status} in phase {stage.phase}")
    return Step("finish")


def start_stage(stage: StageRun, base_commit: str) -> None:
    """A stage begins (or resumes) work from ``base_commit``."""
    if not stage.base_commit:
        stage.base_commit = base_commit
    _set_stage(stage, StageStatus.RUNNING)


def implemented(stage: StageRun) -> None:
    """The agent finished cleanly: its files go to verification."""
    _set_stage(stage, StageStatus.RUNNING, StagePhase.VERIFY)


def gates_passed(stage: StageRun, digest: str) -> None:
    """Every gate exited 0 on the files with ``digest``: they go to the independent review."""
    stage.accepted_manifest = digest
    _set_stage(stage, StageStatus.RUNNING, StagePhase.REVIEW)


def reviewed(run: Run, stage: StageRun) -> None:
    """Every reviewer passed the verified files: the documentation agent updates the docs for
    them (once per stage); documented files go to the checkpoint, or first to a person's
    approval when the stage has a human gate."""
    if not stage.documented_manifest:
        _set_stage(stage, StageStatus.RUNNING, StagePhase.DOCUMENT)
    else:
        _to_checkpoint(run, stage)


def documented(run: Run, stage: StageRun, started_from: str, changed: bool) -> None:
    """The documentation agent finished on the reviewed files ``started_from``: when it changed
    files, checks and reviews run again on the updated files; otherwise they go on as reviewed."""
    stage.documented_manifest = started_from
    if changed:
        _set_stage(stage, StageStatus.RUNNING, StagePhase.VERIFY)
    else:
        _to_checkpoint(run, stage)


def _to_checkpoint(run: Run, stage: StageRun) -> None:
    approved = stage.decisions.filter(kind=Decision.Kind.APPROVAL, state=Decision.State.APPROVED,
                                      artifact=stage.accepted_manifest).exists()
    if stage.spec.get("human_gate") and not approved:
        await_approval(run, stage)
    else:
        _set_stage(stage, StageStatus.RUNNING, StagePhase.CHECKPOINT)


def await_approval(run: Run, stage: StageRun) -> Decision:
    """A human gate: the run waits for a person to approve these very files (``accepted_manifest``)."""
    _set_stage(stage, StageStatus.WAITING_APPROVAL, StagePhase.CHECKPOINT)
    _set_run_status(run, RunStatus.WAITING_APPROVAL)
    run.stop_reason = "human_gate"
    run.stop_message = (f"Stage '{stage.key}' passed its checks and review; it waits for a person's approval of "
                        f"files {stage.accepted_manifest[:12]} before its checkpoint.")
    run.stop_evidence = {"manifest": stage.accepted_manifest}
    run.save()
    decision = Decision.objects.create(run=run, stage=stage, kind=Decision.Kind.APPROVAL,
                                       reason="human_gate", artifact=stage.accepted_manifest)
    event(run, "waiting_approval", run.stop_message, stage=stage, decision=decision,
          data={"artifact": stage.accepted_manifest})
    return decision


def approved(run: Run, stage: StageRun, decision: Decision, reviewer: str) -> None:
    """A person approved the pending decision for the stage's current files: checkpoint next."""
    decision.state = Decision.State.APPROVED
    decision.decided_by = reviewer
    decision.action = "approve"
    decision.decided_at = timezone.now()
    decision.save()
    _requeue(run)
    _set_stage(stage, StageStatus.RUNNING, StagePhase.CHECKPOINT)
    event(run, "approved", f"{reviewer} approved stage '{stage.key}' on files {decision.artifact[:12]}; it is "
                           f"checkpointed next.", stage=stage, decision=decision)


def rechecked(run: Run, stage: StageRun, note: str, requested_by: str) -> int:
    """A person asked for verification again (a corrected result): the stage's pending decisions
    are superseded, its files are verified and reviewed again and, with a human gate, a new
    approval is asked for. Repair counters and budgets are kept. Returns the decisions superseded."""
    superseded = run.decisions.filter(stage=stage, state=Decision.State.PENDING).update(
        state=Decision.State.SUPERSEDED, decided_at=timezone.now(), decided_by=requested_by, action="recheck")
    _requeue(run)
    stage.accepted_manifest = ""
    _set_stage(stage, StageStatus.RUNNING, StagePhase.VERIFY)
    event(run, "recheck", f"Recheck requested by {requested_by or 'an operator'}: stage '{stage.key}' is verified "
                          f"again ({superseded} pending decision(s) superseded; repair counters kept). Note: {note}",
          stage=stage)
    return superseded


#: Outcomes of ``defect``.
REPAIR, REPAIR_EXHAUSTED, UNCHANGED_FAILURE = "repair", "repair_exhausted", "unchanged_failure"


def defect(stage: StageRun, kind: str, name: str, digest: str, message: str, evidence: dict) -> str:
    """A defect was found in the stage's files (``kind`` "gate" with the gate's ``name``, or
    "review" with the reviewer's profile): decide whether a repair attempt may fix it.

    Returns ``UNCHANGED_FAILURE`` when it is the same failure as the one the last repair was
    for and the files (``digest``) did not change; ``REPAIR_EXHAUSTED`` when the stage's
    ``repair_allowance`` is used up (the allowance is shared by all gates and reviewers of the
    stage; nothing resets it); else consumes one repair, records the defect as the evidence
    the repair session gets, moves the stage to the repair phase and returns ``REPAIR``.
    """
    last = stage.last_defect or {}
    if last.get("kind") == kind and last.get("name") == name and last.get("digest") == digest:
        return UNCHANGED_FAILURE
    if stage.repairs_used >= int(stage.spec.get("repair_allowance", 0)):
        return REPAIR_EXHAUSTED
    stage.repairs_used += 1
    stage.last_defect = {"kind": kind, "name": name, "digest": digest, "message": message, "evidence": evidence}
    stage.accepted_manifest = ""
    _set_stage(stage, StageStatus.RUNNING, StagePhase.REPAIR)
    return REPAIR


def repaired(stage: StageRun) -> None:
    """A repair attempt finished cleanly: its files are verified again (not re-implemented)."""
    _set_stage(stage, StageStatus.RUNNING, StagePhase.VERIFY)


#: Steps that start an agent attempt (count against the run's max_attempts budget).
AGENT_STEPS = frozenset({"implement", "review", "repair", "document"})


def budget_problem(run: Run, step: Step) -> str | None:
    """A sentence when taking ``step`` would pass one of the run's budgets, else None.

    Budgets (``definition.pipeline.budgets``; None is unlimited): ``max_active_seconds``
    against the persisted active time (agents and gates; waiting for a person does not
    count), ``max_attempts`` against the run's agent attempts, ``max_cost_usd`` against the
    sum of the attempts' reported cost (an unreported cost counts as 0 and is said to be
    unknown on the attempt).
    """
    if step.kind == "finish":
        return None
    budgets = run.definition["pipeline"].get("budgets") or {}
    limit = budgets.get("max_active_seconds")
    if limit is not None and run.active_seconds >= limit:
        return (f"The run has used {run.active_seconds:.0f} s of active time, its budget is {limit:.0f} s "
                f"(budgets.max_active_seconds).")
    limit = budgets.get("max_attempts")
    if limit is not None and step.kind in AGENT_STEPS:
        used = run.attempts.count()
        if used >= limit:
            return f"The run has made {used} agent attempts, its budget is {limit} (budgets.max_attempts)."
    limit = budgets.get("max_cost_usd")
    if limit is not None and step.kind in AGENT_STEPS:
        spent = sum(float((usage or {}).get("cost_usd") or 0) for usage in run.attempts.values_list("usage", flat=True))
        if spent >= limit:
            return (f"The run's agents have reported ${spent:.4f} of cost, its budget is ${limit:.2f} "
                    f"(budgets.max_cost_usd).")
    return None


def reverify(stage: StageRun) -> None:
    """The files changed after verification: they must be verified again before a checkpoint."""
    stage.accepted_manifest = ""
    _set_stage(stage, StageStatus.RUNNING, StagePhase.VERIFY)


def checkpointed(stage: StageRun, commit: str) -> None:
    """The stage's accepted files are committed; the next stage starts from ``commit``."""
    stage.checkpoint_commit = commit
    _set_stage(stage, StageStatus.PASSED, StagePhase.DONE)
    following = stage.run.stages.filter(order__gt=stage.order).order_by("order").first()
    if following is not None and not following.base_commit:
        following.base_commit = commit
        following.save(update_fields=["base_commit"])


def journal_done(entry: JournalEntry, commit: str) -> None:
    """A checkpoint journal entry's commit exists: ``intent`` -> ``done`` with ``commit`` (40-hex),
    saved. Raises IllegalTransition when the entry is not an ``intent``."""
    if entry.state != JournalEntry.State.INTENT:
        raise IllegalTransition(f"journal entry {entry.uid}: {entry.state} -> done is not allowed")
    entry.state = JournalEntry.State.DONE
    entry.commit = commit
    entry.save()


def journal_abandoned(entry: JournalEntry) -> None:
    """A checkpoint journal entry whose commit was never made: ``intent`` -> ``abandoned``, saved.
    Raises IllegalTransition when the entry is not an ``intent``."""
    if entry.state != JournalEntry.State.INTENT:
        raise IllegalTransition(f"journal entry {entry.uid}: {entry.state} -> abandoned is not allowed")
    entry.state = JournalEntry.State.ABANDONED
    entry.save()


def attempt_interrupted(attempt: Attempt, message: str, elapsed_seconds: float | None = None) -> None:
    """An open attempt (``preparing`` or ``running``) whose worker died: -> ``interrupted``, with
    ``message`` as its failure message, ended now; ``elapsed_seconds`` (seconds it is known to
    have run) is kept when the attempt has none. Saved. Raises IllegalTransition when the
    attempt is not open."""
    if attempt.status not in (AttemptStatus.PREPARING, AttemptStatus.RUNNING):
        raise IllegalTransition(f"attempt {attempt.pk}: {attempt.status} -> interrupted is not allowed")
    attempt.status = AttemptStatus.INTERRUPTED
    attempt.failure_kind = "interrupted"
    attempt.failure_message = storable(message)
    attempt.ended_at = timezone.now()
    if attempt.elapsed_seconds is None and elapsed_seconds is not None:
        attempt.elapsed_seconds = elapsed_seconds
    attempt.save()


def hand_off(run: Run) -> str:
    """End this step's lease and return the token the next step must present."""
    run.lease_owner = ""
    run.lease_token = new_token()
    run.steps += 1
    run.save()
    return run.lease_token


def stop(run: Run, reason: str, message: str, *, stage: StageRun | None = None, evidence: dict | None = None,
         status: str = RunStatus.WAITING_REVIEW) -> Decision | None:
    """Stop a running run with a stable ``reason`` code and a sentence; waiting_review opens a Decision.

    ``evidence`` names the rows that show why, e.g. ``{"attempt": 3}`` or ``{"check": 7}``.
    """
    _set_run_status(run, status)
    run.stop_reason = reason
    run.stop_message = storable(message)
    run.stop_evidence = storable(evidence or {})
    run.save()
    decision = None
    if stage is not None:
        target = StageStatus.WAITING_REVIEW if status == RunStatus.WAITING_REVIEW else StageStatus.FAILED
        if stage.status != target:
            _set_stage(stage, target)
    if status == RunStatus.WAITING_REVIEW:
        decision = Decision.objects.create(
            run=run, stage=stage, kind=Decision.Kind.REVIEW, reason=reason,
            artifact=(stage.accepted_manifest if stage else ""),
        )
    event(run, "stopped", f"Stopped ({reason}): {message}", stage=stage, decision=decision, data=evidence or {})
    return decision


def succeed(run: Run) -> None:
    """Every stage passed: the run succeeded."""
    _set_run_status(run, RunStatus.SUCCEEDED)
    run.stop_reason = ""
    run.stop_message = ""
    run.save()
    event(run, "succeeded", "Every stage passed its gates, its review and was checkpointed, and every check passed "
                            "again on the final checkpoint; the run succeeded.")


def _requeue(run: Run) -> None:
    """A waiting run goes back to the queue after a person's decision; its stop is cleared."""
    _set_run_status(run, RunStatus.QUEUED)
    run.stop_reason = ""
    run.stop_message = ""
    run.stop_evidence = {}
    run.queued_at = timezone.now()
    run.save()


def resume(run: Run, stage: StageRun | None, phase: str | None = None) -> None:
    """waiting_review -> queued after a person's recovery decision; the stage is worked on again,
    from ``phase`` when given (retry: implement; verify: verify). Repair counters are kept."""
    _requeue(run)
    if stage is not None and stage.status == StageStatus.WAITING_REVIEW:
        _set_stage(stage, StageStatus.RUNNING, phase)
    elif stage is not None and phase is not None:
        _set_stage(stage, stage.status, phase)


def fail(run: Run, reason: str, message: str, evidence: dict | None = None) -> list[int]:
    """Any non-terminal run -> failed (an operator's decision or an unrecoverable fault).

    Attempts still open are closed as ``cancelled`` (the caller stopped their processes first),
    unfinished stages fail and pending decisions are superseded. Returns the numbers of the
    attempts closed."""
    from .models import ATTEMPT_OPEN, AttemptStatus

    closed = []
    for attempt in run.attempts.filter(status__in=ATTEMPT_OPEN):
        attempt.status = AttemptStatus.CANCELLED
        attempt.failure_kind = reason
        attempt.failure_message = f"The run was failed while this attempt was open: {message}"
        attempt.ended_at = timezone.now()
        attempt.save()
        closed.append(attempt.number)
    run.checks.filter(ended_at=None).update(ended_at=timezone.now(), failure_kind="cancelled")
    _set_run_status(run, RunStatus.FAILED)
    run.stop_reason = reason
    run.stop_message = message
    run.stop_evidence = {**(evidence or {}), **({"cancelled_attempts": closed} if closed else {})}
    run.save()
    for stage in run.stages.exclude(status__in=[StageStatus.PASSED, StageStatus.FAILED]):
        if stage.status != StageStatus.PENDING or stage.attempts.exists():
            _set_stage(stage, StageStatus.FAILED)
    run.decisions.filter(state=Decision.State.PENDING).update(state=Decision.State.SUPERSEDED)
    event(run, "failed", f"Failed ({reason}): {message}", data=run.stop_evidence)
    return closed
