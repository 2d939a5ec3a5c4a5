"""The state machine: the only place that decides a run's next step and changes a status.

Two kinds of functions live here:

* compare-and-swap moves (``queue_run``, ``claim``) that are correct on PostgreSQL and on
  SQLite alike (``select_for_update`` does nothing on SQLite, a conditional UPDATE does), and
* moves applied to a run already locked by the caller inside ``transaction.atomic()``
  (``next_step``, ``stop``, ``succeed``, ``hand_off``, the stage moves).

Every status or state a record holds is assigned here and nowhere else (tests/test_state_writes.py
reads the code and fails on a write elsewhere): runs (``RUN_TRANSITIONS``), stages
(``STAGE_TRANSITIONS``), attempts (``ATTEMPT_TRANSITIONS``), decisions (``DECISION_TRANSITIONS``),
checkpoint journal entries (``JOURNAL_TRANSITIONS``) and the run's lease (``LEASE_TRANSITIONS``).
Each move checks its table and raises ``IllegalTransition`` for a move it does not allow. Stop
reasons (``STOP_REASONS``) and event kinds (``EVENT_KINDS``) are closed choices, part of the
``run_status --json`` contract (docs/run-status.md lists them; a test keeps the two equal).
"""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from . import environments
from .vocabulary import EVENT_KINDS, STOP_REASONS
from .models import (
    ATTEMPT_OPEN,
    RUN_STOPPED,
    Attempt,
    AttemptStatus,
    Decision,
    JournalEntry,
    Notification,
    Run,
    RunEvent,
    RunStatus,
    StagePhase,
    StageRun,
    StageStatus,
    StartRequest,
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


ATTEMPT_TRANSITIONS: dict[str, frozenset[str]] = {
    # an attempt is recorded (preparing) before its process launches; one that never launched fails
    # (or is cancelled or interrupted) from there
    AttemptStatus.PREPARING: frozenset(
        {AttemptStatus.RUNNING, AttemptStatus.FAILED, AttemptStatus.CANCELLED, AttemptStatus.INTERRUPTED}
    ),
    AttemptStatus.RUNNING: frozenset(
        {AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMEOUT, AttemptStatus.CANCELLED,
         AttemptStatus.INTERRUPTED}
    ),
    AttemptStatus.SUCCEEDED: frozenset(),
    AttemptStatus.FAILED: frozenset(),
    AttemptStatus.TIMEOUT: frozenset(),
    AttemptStatus.CANCELLED: frozenset(),
    AttemptStatus.INTERRUPTED: frozenset(),
}

DECISION_TRANSITIONS: dict[str, frozenset[str]] = {
    # a human gate's approval decision is approved or sent back with a person's findings
    # (changes_requested); a review decision is recovered; any pending one can be superseded
    Decision.State.PENDING: frozenset(
        {Decision.State.APPROVED, Decision.State.CHANGES_REQUESTED, Decision.State.RECOVERED,
         Decision.State.SUPERSEDED}
    ),
    Decision.State.APPROVED: frozenset(),
    Decision.State.CHANGES_REQUESTED: frozenset(),
    Decision.State.RECOVERED: frozenset(),
    Decision.State.SUPERSEDED: frozenset(),
}

JOURNAL_TRANSITIONS: dict[str, frozenset[str]] = {
    # intent: recorded before git runs; done: its commit is on the branch; abandoned: git never
    # made it (a checkpoint whose commit exists is never abandoned)
    JournalEntry.State.INTENT: frozenset({JournalEntry.State.DONE, JournalEntry.State.ABANDONED}),
    JournalEntry.State.DONE: frozenset(),
    JournalEntry.State.ABANDONED: frozenset(),
}


class Lease:
    """The states of a run's lease, read from ``Run.lease_owner`` and ``Run.lease_token``
    (``lease_state``): ``free`` (no token: the run is not running, or stopped), ``held`` (an
    owner runs a step with that fencing token; a worker ``host:pid``, ``reconciler:HOST`` taking
    over, or ``fail:WHO`` failing it), ``handed_off`` (a token and no owner: the next step's
    message carries the token)."""

    FREE, HELD, HANDED_OFF = "free", "held", "handed_off"


LEASE_TRANSITIONS: dict[str, frozenset[str]] = {
    Lease.FREE: frozenset({Lease.HELD}),  # claim of a queued run
    # another owner takes it over (fence, reconciler); a step hands it off; the run stops
    Lease.HELD: frozenset({Lease.HELD, Lease.HANDED_OFF, Lease.FREE}),
    Lease.HANDED_OFF: frozenset({Lease.HELD, Lease.FREE}),  # the next step claims it; a person fails the run
}


def lease_state(run: Run) -> str:
    """``Lease.FREE``, ``Lease.HELD`` or ``Lease.HANDED_OFF`` for ``run``'s lease columns."""
    if not run.lease_token:
        return Lease.FREE
    return Lease.HELD if run.lease_owner else Lease.HANDED_OFF


#: STOP_REASONS and EVENT_KINDS: the closed choices of a run's record, in engine/vocabulary.py (models use them too)


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


#: Columns a move sets itself: a caller's ``fields`` never carry them.
_MOVED_COLUMNS = frozenset({"status", "state", "phase", "lease_owner", "lease_token", "stop_reason"})


def _plain(fields: dict) -> None:
    moved = _MOVED_COLUMNS & set(fields)
    if moved:
        raise IllegalTransition(f"fields {sorted(moved)} are set by the machine's moves, not by a caller")


def _check_reason(reason: str) -> None:
    if reason not in STOP_REASONS:
        raise IllegalTransition(f"stop reason {reason!r} is not one of STOP_REASONS")


def _check_lease(run_id, current: str, target: str) -> None:
    _check(LEASE_TRANSITIONS, current, target, f"lease of run {run_id}")


def _set_run_status(run: Run, target: str) -> None:
    _check(RUN_TRANSITIONS, run.status, target, f"run {run.pk}")
    run.status = target
    if target in RUN_STOPPED:
        if run.lease_token:
            _check_lease(run.pk, lease_state(run), Lease.FREE)
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
    (``message`` and ``data`` pass through ``storable``). Raises IllegalTransition for a ``kind``
    that is not in ``EVENT_KINDS``."""
    if kind not in EVENT_KINDS:
        raise IllegalTransition(f"event kind {kind!r} is not one of EVENT_KINDS")
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


def claim(run_id: int, token: str | None, owner: str, host: str = "") -> str | None:
    """Take the run's lease for one step; returns the new fencing token, or None when not ours.

    ``token`` None claims a queued run (queued -> running); a token claims the step that the
    previous step handed off (running, that token, no owner). A redelivered or duplicated
    message carries no token that still matches, so it claims nothing (docs/field-cases.md C15).
    ``host`` (the claimer's, engine/hosts.py): a run pinned to another host is never claimed, and
    the first claim pins an unpinned run to ``host`` (its worktree will be made there).
    """
    mine = new_token()
    now = timezone.now()
    here = Q(host="") | Q(host=host) if host else Q()
    pin = {"host": host} if host else {}
    with transaction.atomic():
        if token is None:
            _check(RUN_TRANSITIONS, RunStatus.QUEUED, RunStatus.RUNNING, "claim")
            _check_lease(run_id, Lease.FREE, Lease.HELD)
            won = Run.objects.filter(here, pk=run_id, status=RunStatus.QUEUED).update(
                status=RunStatus.RUNNING, lease_owner=owner, lease_token=mine, heartbeat_at=now, updated_at=now, **pin
            )
            if won:
                Run.objects.filter(pk=run_id, started_at__isnull=True).update(started_at=now)
                # the start request's first claim (a Start, a recovery's requeue: the first wins)
                StartRequest.objects.filter(run_id=run_id, claimed_at__isnull=True).update(claimed_at=now)
        else:
            _check_lease(run_id, Lease.HANDED_OFF, Lease.HELD)
            won = Run.objects.filter(
                here, pk=run_id, status=RunStatus.RUNNING, lease_token=token, lease_owner=""
            ).update(lease_owner=owner, lease_token=mine, heartbeat_at=now, updated_at=now, **pin)
    return mine if won else None


def fence(run: Run, owner: str) -> str:
    """Take the lease of the locked, running ``run`` away from whoever holds it (a person is
    failing the run): a new fencing token and ``owner``, a fresh heartbeat. The old owner's next
    heartbeat fails (its step stops its process), its hand-off claims nothing, and its result is
    stored as late. Returns the new token."""
    _check(RUN_TRANSITIONS, run.status, RunStatus.FAILED, f"fence run {run.pk}")
    if run.lease_token:
        _check_lease(run.pk, lease_state(run), Lease.HELD)
    run.lease_token = new_token()
    run.lease_owner = owner
    run.heartbeat_at = timezone.now()
    run.save(update_fields=["lease_token", "lease_owner", "heartbeat_at"])
    return run.lease_token


def heartbeat(run_id: int, token: str, seconds: float) -> bool:
    """Add ``seconds`` of active time and refresh the heartbeat; False when the lease is lost."""
    return bool(
        Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, lease_token=token).update(
            heartbeat_at=timezone.now(), active_seconds=F("active_seconds") + seconds
        )
    )


# ----------------------------------------------------------------------------- decisions on a locked run


@dataclass(frozen=True)
class Step:
    """What the run does next: ``kind`` in setup, implement, verify, review, repair, checkpoint, finish."""

    kind: str
    stage_id: int | None = None


def next_step(run: Run) -> Step:
    """The next step of a running run, from its stages' phases (run locked by the caller): first its
    setup, when the pipeline has one and its environment is not made yet."""
    if (run.definition.get("pipeline") or {}).get("setup") and not environments.is_made(run):
        return Step("setup")
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


def environment_ready(run: Run, record: dict) -> None:
    """The setup step passed: the run's agents and gates see this environment (engine/environments.py)."""
    run.environment = record
    run.save(update_fields=["environment", "updated_at"])


def start_stage(stage: StageRun, base_commit: str) -> None:
    """A stage begins (or resumes) work from ``base_commit``."""
    if not stage.base_commit:
        stage.base_commit = base_commit
    _set_stage(stage, StageStatus.RUNNING)


def carry_stage(stage: StageRun, done: StageRun) -> None:
    """A run continuing another (engine/runs_again.py ``continue_run``) takes over a stage that passed there:
    passed here too, with its commits (its files are in the new run's starting commit)."""
    stage.base_commit, stage.checkpoint_commit = done.base_commit, done.checkpoint_commit
    stage.accepted_manifest = done.accepted_manifest
    _set_stage(stage, StageStatus.RUNNING, StagePhase.CHECKPOINT)
    _set_stage(stage, StageStatus.PASSED, StagePhase.DONE)


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
    approval when the stage has a human gate. After a person's request for changes the
    documentation agent runs once more, on the reworked files (``_documented_since_request``).
    A pipeline without a documenter (``roles.documenter: null``) goes straight on."""
    if run.definition["roles"].get("documenter") is None:
        # documented_manifest stays empty: nothing may write documentation_paths in this stage
        event(run, "docs_skipped", f"No documentation step for files {stage.accepted_manifest[:12]} of stage "
              f"'{stage.key}': the pipeline has no documenter (roles.documenter: null).", stage=stage)
        _to_checkpoint(run, stage)
    elif not stage.documented_manifest or not _documented_since_request(stage):
        _set_stage(stage, StageStatus.RUNNING, StagePhase.DOCUMENT)
    else:
        _to_checkpoint(run, stage)


def _documented_since_request(stage: StageRun) -> bool:
    """False when a person requested changes at the stage's human gate after its last
    documentation attempt began (the rework may change what the notes must say)."""
    asked = stage.decisions.filter(state=Decision.State.CHANGES_REQUESTED).order_by("-decided_at").first()
    if asked is None:
        return True
    last = stage.attempts.filter(operation="document").order_by("-number").first()
    return last is not None and last.created_at > asked.decided_at


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
    rejected = stage.decisions.filter(state=Decision.State.CHANGES_REQUESTED,
                                      artifact=stage.accepted_manifest).order_by("-id").first()
    if rejected is not None:  # a retry or a recheck brought back files a person sent back: say so
        run.stop_message += (f" These are the very files {rejected.decided_by or 'a person'} sent back at decision "
                             f"{rejected.pk}; the work since did not change them.")
    run.stop_evidence = {"manifest": stage.accepted_manifest}
    run.save()
    decision = Decision.objects.create(run=run, stage=stage, kind=Decision.Kind.APPROVAL,
                                       reason="human_gate", artifact=stage.accepted_manifest)
    event(run, "waiting_approval", run.stop_message, stage=stage, decision=decision,
          data={"artifact": stage.accepted_manifest})
    notify(run, "waiting", decision)
    return decision


def approved(run: Run, stage: StageRun, decision: Decision, reviewer: str) -> None:
    """A person approved the pending decision for the stage's current files: checkpoint next."""
    _decide(decision, Decision.State.APPROVED, decided_by=reviewer, action="approve")
    _requeue(run)
    _set_stage(stage, StageStatus.RUNNING, StagePhase.CHECKPOINT)
    event(run, "approved", f"{reviewer} approved stage '{stage.key}' on files {decision.artifact[:12]}; it is "
                           f"checkpointed next.", stage=stage, decision=decision)


def changes_requested(run: Run, stage: StageRun, decision: Decision, reviewer: str, note: str,
                      comments: list[dict]) -> str:
    """A person looked at the files waiting at the stage's human gate and sent them back with
    findings (``note``; ``comments``: ``[{"file", "line" (or None), "text"}]`` on the diff).

    The approval ``decision`` becomes ``changes_requested`` (it can never be approved after
    this). With a repair left in the stage's ``repair_allowance`` (shared with the gates and
    reviewers; nothing resets it) one is consumed: the person's findings become the stage's
    last defect, the evidence a fresh repair session gets, and the stage goes to the repair
    phase; verification, review and documentation then run on the changed files, and a new
    approval decision is made for them (``await_approval``). Documentation runs again, since the
    rework may change what the notes must say (``reviewed``). Returns ``REPAIR``; with the allowance used up the
    run stops ``repair_exhausted`` (waiting_review, a review decision) and ``REPAIR_EXHAUSTED``
    is returned."""
    _decide(decision, Decision.State.CHANGES_REQUESTED, decided_by=reviewer, note=note, comments=comments,
            action="request_changes")
    allowance = int(stage.spec.get("repair_allowance", 0))
    event(run, "changes_requested",
          f"{reviewer} requested changes at the human gate of stage '{stage.key}' on files "
          f"{decision.artifact[:12]} ({len(comments)} comment(s) on the diff). Note: {note}",
          stage=stage, decision=decision, data={"comments": comments, "artifact": decision.artifact})
    if stage.repairs_used >= allowance:
        stop(run, "repair_exhausted",
             f"{reviewer} requested changes at the human gate of stage '{stage.key}', but its repair allowance "
             f"({stage.repairs_used} of {allowance}) is used up: a person decides (recover with a retry, which "
             f"carries the findings to the agent, or fail the run).", stage=stage,
             evidence={"decision": decision.pk, "repairs_used": stage.repairs_used, "allowance": allowance})
        return REPAIR_EXHAUSTED
    _requeue(run)
    stage.repairs_used += 1
    # the note and comments themselves are in every later prompt of the stage, under "From a person"
    # (engine/steps/prompts.py people_section); the defect points there rather than repeating them
    stage.last_defect = {"kind": "person", "name": reviewer, "digest": decision.artifact,
                         "message": f"{reviewer} read the diff at the human gate and requested changes: their note "
                                    f"and {len(comments)} comment(s) on the diff are under \"From a person\" above.",
                         "evidence": {"decision": decision.pk}}
    stage.accepted_manifest = ""
    _set_stage(stage, StageStatus.RUNNING, StagePhase.REPAIR)
    return REPAIR


def rechecked(run: Run, stage: StageRun, note: str, requested_by: str) -> int:
    """A person asked for verification again (a corrected result): the stage's pending decisions
    are superseded, its files are verified and reviewed again and, with a human gate, a new
    approval is asked for. Repair counters and budgets are kept. Returns the decisions superseded."""
    superseded = _supersede(run.decisions.filter(stage=stage, state=Decision.State.PENDING),
                            decided_at=timezone.now(), decided_by=requested_by, action="recheck", note=note)
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


def attempt_interrupted(attempt: Attempt, message: str, elapsed_seconds: float | None = None) -> None:
    """An open attempt (``preparing`` or ``running``) whose worker died: -> ``interrupted``, with
    ``message`` as its failure message, ended now; ``elapsed_seconds`` (seconds it is known to
    have run) is kept when the attempt has none. Saved. Raises IllegalTransition when the
    attempt is not open."""
    if attempt.elapsed_seconds is None and elapsed_seconds is not None:
        attempt.elapsed_seconds = elapsed_seconds
    end_attempt(attempt, AttemptStatus.INTERRUPTED, failure_kind="interrupted", failure_message=storable(message))


def hand_off(run: Run) -> str:
    """End this step's lease and return the token the next step must present."""
    _check_lease(run.pk, lease_state(run), Lease.HANDED_OFF)
    run.lease_owner = ""
    run.lease_token = new_token()
    run.steps += 1
    run.save()
    return run.lease_token


def stop(run: Run, reason: str, message: str, *, stage: StageRun | None = None, evidence: dict | None = None,
         status: str = RunStatus.WAITING_REVIEW) -> Decision | None:
    """Stop a running run with a stable ``reason`` code and a sentence; waiting_review opens a Decision.

    ``evidence`` names the rows that show why, e.g. ``{"attempt": 3}`` or ``{"check": 7}``.
    Raises IllegalTransition for a ``reason`` that is not in ``STOP_REASONS``.
    """
    _check_reason(reason)
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
    notify(run, "waiting" if decision is not None else "ended", decision)
    return decision


def succeed(run: Run) -> None:
    """Every stage passed: the run succeeded."""
    _set_run_status(run, RunStatus.SUCCEEDED)
    run.stop_reason = ""
    run.stop_message = ""
    run.save()
    reviewed = run.definition["roles"].get("reviewer") is not None
    event(run, "succeeded", ("Every stage passed its gates, its review and was checkpointed" if reviewed else
                             "Every stage passed its gates (no reviewer configured) and was checkpointed")
          + ", and every check passed again on the final checkpoint; the run succeeded.")
    notify(run, "ended")


def led_here(run: Run) -> dict | None:
    """The stop a run is leaving (``{"reason", "message", "evidence"}``), kept as ``stop_evidence.led_here``
    when a person fails or recovers it: the run page keeps that stop's evidence (a tampering diff, the failed
    check) on top after the decision. None when the run has no stop."""
    if not run.stop_reason:
        return None
    evidence = {key: value for key, value in (run.stop_evidence or {}).items() if key != "led_here"}
    return {"reason": run.stop_reason, "message": run.stop_message, "evidence": evidence}


def _requeue(run: Run) -> None:
    """A waiting run goes back to the queue after a person's decision; its stop is cleared (and kept as
    ``stop_evidence.led_here``: ``led_here``)."""
    earlier = led_here(run)
    _set_run_status(run, RunStatus.QUEUED)
    run.stop_reason = ""
    run.stop_message = ""
    run.stop_evidence = {"led_here": earlier} if earlier else {}
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
    attempts closed. Raises IllegalTransition for a ``reason`` not in ``STOP_REASONS``."""
    _check_reason(reason)
    closed = []
    for attempt in run.attempts.filter(status__in=ATTEMPT_OPEN):
        end_attempt(attempt, AttemptStatus.CANCELLED, failure_kind=reason,
                    failure_message=f"The run was failed while this attempt was open: {message}")
        closed.append(attempt.number)
    run.checks.filter(ended_at=None).update(ended_at=timezone.now(), failure_kind="cancelled")
    earlier = led_here(run)
    _set_run_status(run, RunStatus.FAILED)
    run.stop_reason = reason
    run.stop_message = message
    run.stop_evidence = {**(evidence or {}), **({"cancelled_attempts": closed} if closed else {}),
                         **({"led_here": earlier} if earlier else {})}
    run.save()
    for stage in run.stages.exclude(status__in=[StageStatus.PASSED, StageStatus.FAILED]):
        if stage.status != StageStatus.PENDING or stage.attempts.exists():
            _set_stage(stage, StageStatus.FAILED)
    _supersede(run.decisions.filter(state=Decision.State.PENDING))
    event(run, "failed", f"Failed ({reason}): {message}", data=run.stop_evidence)
    notify(run, "ended")
    return closed


# ----------------------------------------------------------------------------- the lease, taken over


def take_over(run_id: int, token: str, heartbeat_at, owner: str) -> str | None:
    """A reconciler takes the lease of a running run whose owner stopped beating: a
    compare-and-swap on the token and the heartbeat it saw stale (two reconcilers act once,
    docs/field-cases.md C17). Returns the new fencing token, or None when another got there first."""
    _check_lease(run_id, Lease.HELD, Lease.HELD)
    mine = new_token()
    won = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, lease_token=token, heartbeat_at=heartbeat_at) \
        .exclude(lease_owner="").update(lease_token=mine, lease_owner=owner, heartbeat_at=timezone.now())
    return mine if won else None


def host_confirmed(run_id: int, sentence: str, reaped: int, effects: dict | None = None) -> bool:
    """Record that the host of run ``run_id``, which a reconciler elsewhere marked interrupted while
    the host was gone (``stop_evidence.host_confirmed`` False), confirmed its old processes gone:
    the evidence says ``host_confirmed: True`` (and ``host_reaped``; with ``effects``, engine/reconcile.py
    ``inspect_effects``' answer, its ``effects`` and ``journal_intents``, as a local interruption
    records them), and an event says ``sentence``. The run's status is not changed (a person
    recovers it). False when it was confirmed already."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if (run.stop_evidence or {}).get("host_confirmed") is not False:
            return False
        seen = {"effects": effects["attempts"], "journal_intents": effects["journal_intents"]} if effects else {}
        run.stop_evidence = {**run.stop_evidence, "host_confirmed": True, "host_reaped": reaped, **seen}
        run.save(update_fields=["stop_evidence", "updated_at"])
        event(run, "host_confirmed", sentence, data={"host": run.host, "reaped": reaped})
    return True


def touch_hand_off(run: Run, now) -> bool:
    """A hand-off nobody picked up: refresh its heartbeat so one reconciler sends the wake-up
    again (compare-and-swap on the token and heartbeat it saw). The lease stays handed off."""
    return bool(Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING, lease_owner="", lease_token=run.lease_token,
                                   heartbeat_at=run.heartbeat_at).update(heartbeat_at=now))


# ----------------------------------------------------------------------------- attempts


def attempt_intent(run: Run, stage: StageRun, **fields) -> Attempt:
    """Record an attempt before its process launches (``preparing``); ``fields`` are the
    Attempt's columns (operation, number, role, profile, adapter, deadline, lease, host, marker)."""
    return Attempt.objects.create(run=run, stage=stage, status=AttemptStatus.PREPARING, **fields)


def attempt_launched(attempt_id: int, **fields) -> bool:
    """preparing -> running as the process is about to start (the caller holds the fenced run
    row); ``fields`` are set with it (start manifest, prompt, started_at, deadline_at). False
    when the attempt was no longer preparing."""
    _check(ATTEMPT_TRANSITIONS, AttemptStatus.PREPARING, AttemptStatus.RUNNING, f"attempt {attempt_id}")
    return bool(Attempt.objects.filter(pk=attempt_id, status=AttemptStatus.PREPARING).update(
        status=AttemptStatus.RUNNING, **fields))


def end_attempt(attempt: Attempt, status: str, **fields) -> None:
    """An open attempt ends with ``status`` (succeeded, failed, timeout, cancelled, interrupted);
    ``fields`` are set with it; ``ended_at`` is now unless given. Saves the attempt. Raises
    IllegalTransition for an attempt that already ended."""
    _check(ATTEMPT_TRANSITIONS, attempt.status, status, f"attempt {attempt.pk}")
    _plain(fields)
    for name, value in fields.items():
        setattr(attempt, name, value)
    if "ended_at" not in fields:
        attempt.ended_at = timezone.now()
    attempt.status = status
    attempt.save()


#: Attempt status for an adapter's failure kind (None: the process exited cleanly).
ATTEMPT_END_STATUS = {None: AttemptStatus.SUCCEEDED, "timeout": AttemptStatus.TIMEOUT,
                      "cancelled": AttemptStatus.CANCELLED}


def end_attempt_for(attempt: Attempt, failure_kind: str | None, **fields) -> None:
    """End an open attempt with the status its adapter's ``failure_kind`` means
    (``ATTEMPT_END_STATUS``; any other kind is ``failed``)."""
    end_attempt(attempt, ATTEMPT_END_STATUS.get(failure_kind, AttemptStatus.FAILED),
                failure_kind=failure_kind or "", **fields)


def end_attempt_id(attempt_id: int, status: str, **fields) -> bool:
    """``end_attempt`` for the attempt with ``attempt_id`` when it is still open; False when it
    had already ended (its record is kept as it is)."""
    attempt = Attempt.objects.filter(pk=attempt_id, status__in=ATTEMPT_OPEN).first()
    if attempt is None:
        return False
    end_attempt(attempt, status, **fields)
    return True


def refuse_attempt(attempt_id: int, kind: str, message: str) -> None:
    """Record that an attempt's work was refused (``kind``: protected_files_changed,
    external_symlink, scope_violation, nested_repository, writes_refused, index_incomplete): its process may
    have exited 0; its status stays, its failure kind says why its work does not count."""
    Attempt.objects.filter(pk=attempt_id).update(failure_kind=kind, failure_message=storable(message[:2000]))


# ----------------------------------------------------------------------------- decisions


def _decide(decision: Decision, state: str, **fields) -> None:
    _check(DECISION_TRANSITIONS, decision.state, state, f"decision {decision.pk}")
    _plain(fields)
    for name, value in fields.items():
        setattr(decision, name, value)
    decision.state = state
    decision.decided_at = fields.get("decided_at") or timezone.now()
    decision.save()


def _supersede(pending, **fields) -> int:
    """Supersede the pending decisions of the queryset ``pending``; returns how many."""
    _check(DECISION_TRANSITIONS, Decision.State.PENDING, Decision.State.SUPERSEDED, "decisions")
    return pending.filter(state=Decision.State.PENDING).update(state=Decision.State.SUPERSEDED, **fields)


def recovered(run: Run, stage: StageRun | None, decision: Decision, action: str, note: str, reviewer: str) -> None:
    """A person recovered the run through its pending review ``decision`` (``action`` retry or
    verify): the decision is recorded and the run resumes (retry: implement; verify: verify)."""
    _decide(decision, Decision.State.RECOVERED, action=action, note=note, decided_by=reviewer)
    resume(run, stage, (StagePhase.IMPLEMENT if action == "retry" else StagePhase.VERIFY) if stage is not None else None)


# ----------------------------------------------------------------------------- the checkpoint journal


def journal_intent(run: Run, stage: StageRun) -> JournalEntry:
    """Journal a checkpoint of ``stage`` before git runs: its parent (the stage's base commit)
    and the tree it must commit (the stage's accepted manifest)."""
    return JournalEntry.objects.create(run=run, stage=stage, state=JournalEntry.State.INTENT,
                                       parent_commit=stage.base_commit, expected_tree=stage.accepted_manifest)


def journal_done(entry: JournalEntry, commit: str) -> None:
    """intent -> done: the checkpoint ``commit`` is on the branch. Raises IllegalTransition when
    the entry is not an intent."""
    _check(JOURNAL_TRANSITIONS, entry.state, JournalEntry.State.DONE, f"journal entry {entry.uid}")
    entry.state = JournalEntry.State.DONE
    entry.commit = commit
    entry.save()


def journal_abandoned(entry: JournalEntry) -> None:
    """intent -> abandoned: git made no commit for it. Raises IllegalTransition when the entry is
    not an intent."""
    _check(JOURNAL_TRANSITIONS, entry.state, JournalEntry.State.ABANDONED, f"journal entry {entry.uid}")
    entry.state = JournalEntry.State.ABANDONED
    entry.save()


def journal_found(entry_id: int, commit: str) -> bool:
    """A reconciler found the commit of an intent entry: intent -> done, compare-and-swap (two
    reconcilers settle it once). False when it was no longer an intent."""
    _check(JOURNAL_TRANSITIONS, JournalEntry.State.INTENT, JournalEntry.State.DONE, f"journal entry {entry_id}")
    return bool(JournalEntry.objects.filter(pk=entry_id, state=JournalEntry.State.INTENT).update(
        state=JournalEntry.State.DONE, commit=commit))


# ----------------------------------------------------------------------------- notifications (the outbox)
#
# A notice (a run waits for a person, or ended) is written as one Notification row per configured
# channel in the transaction that made it (``notify``, called by await_approval, stop, succeed and
# fail); engine/notifications.py delivers the rows. A row's ``claimed_at`` is the fencing token of
# one try: every move after the claim is a compare-and-swap on it, so a reconciler that re-claimed
# a row stuck in sending makes the first try's late answer change nothing.

NOTIFICATION_TRANSITIONS: dict[str, frozenset[str]] = {
    Notification.State.PENDING: frozenset({Notification.State.SENDING}),
    # sending -> sending: a try whose worker died is claimed again (it may have been delivered)
    Notification.State.SENDING: frozenset(
        {Notification.State.SENDING, Notification.State.DELIVERED, Notification.State.PENDING,
         Notification.State.FAILED}
    ),
    Notification.State.DELIVERED: frozenset(),
    Notification.State.FAILED: frozenset(),
}


def notify(run: Run, kind: str, decision: Decision | None = None) -> None:
    """Write the outbox rows of a notice on the locked ``run`` (``kind`` "waiting" with the
    ``decision`` that waits, or "ended"), inside the caller's transaction; the rows are sent after
    commit (engine/notifications.py ``notice``). Does nothing when no channel is configured."""
    from . import notifications

    notifications.notice(run, kind, decision)


def notification_outbox(run: Run, decision: Decision | None, *, uid, key: str, kind: str, channel: str, target: str,
                        payload: dict) -> Notification | None:
    """A new ``pending`` outbox row for the notice ``key`` on ``channel``; None when that notice
    already has its row on that channel (the unique (key, channel): never a duplicate)."""
    row, created = Notification.objects.get_or_create(
        key=key, channel=channel,
        defaults={"uid": uid, "run": run, "decision": decision, "kind": kind, "target": target,
                  "payload": storable(payload), "state": Notification.State.PENDING})
    return row if created else None


def notification_claim(pk: int, now, stale_before=None):
    """Claim one try of outbox row ``pk`` by compare-and-swap: pending and due
    (``next_attempt_at`` empty or not after ``now``) -> sending; or, with ``stale_before``, a row
    left in sending by a try claimed before it (its worker died) is claimed again. Counts the
    try. Returns ``now`` (the try's fencing token, ``claimed_at``) when won, else None."""
    _check(NOTIFICATION_TRANSITIONS, Notification.State.PENDING, Notification.State.SENDING, f"notification {pk}")
    won = Notification.objects.filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now), pk=pk,
                                      state=Notification.State.PENDING).update(
        state=Notification.State.SENDING, claimed_at=now, tries=F("tries") + 1)
    if not won and stale_before is not None:
        _check(NOTIFICATION_TRANSITIONS, Notification.State.SENDING, Notification.State.SENDING, f"notification {pk}")
        won = Notification.objects.filter(pk=pk, state=Notification.State.SENDING, claimed_at__lt=stale_before).update(
            claimed_at=now, tries=F("tries") + 1)
    return now if won else None


def _notification_tried(pk: int, claimed_at, target: str, entry: dict, **fields) -> bool:
    _check(NOTIFICATION_TRANSITIONS, Notification.State.SENDING, target, f"notification {pk}")
    _plain(fields)
    with transaction.atomic():
        row = Notification.objects.filter(pk=pk, state=Notification.State.SENDING, claimed_at=claimed_at).first()
        if row is None:
            return False
        return bool(Notification.objects.filter(pk=pk, state=Notification.State.SENDING, claimed_at=claimed_at).update(
            state=target, log=storable([*(row.log or []), entry]), **fields))


def notification_delivered(pk: int, claimed_at, entry: dict, status: int | None) -> bool:
    """sending -> delivered for the try claimed at ``claimed_at``; ``entry`` (the try:
    ``{"at", "try", "status", "error", "seconds"}``) is appended to its log, ``status`` is the
    HTTP status (None for email). False when the try is no longer the row's (re-claimed)."""
    return _notification_tried(pk, claimed_at, Notification.State.DELIVERED, entry, delivered_at=timezone.now(),
                               last_status=status, last_error="", next_attempt_at=None)


def notification_retry(pk: int, claimed_at, entry: dict, status: int | None, error: str, next_attempt_at) -> bool:
    """sending -> pending after a failed try: due again at ``next_attempt_at`` (the backoff);
    ``entry`` appended to the log. False when the try is no longer the row's."""
    return _notification_tried(pk, claimed_at, Notification.State.PENDING, entry, last_status=status,
                               last_error=storable(error[:2000]), next_attempt_at=next_attempt_at)


def notification_failed(pk: int, claimed_at, entry: dict, status: int | None, error: str) -> bool:
    """sending -> failed: the last allowed try failed; ``entry`` appended to the log. False when
    the try is no longer the row's."""
    return _notification_tried(pk, claimed_at, Notification.State.FAILED, entry, last_status=status,
                               last_error=storable(error[:2000]), next_attempt_at=None)
