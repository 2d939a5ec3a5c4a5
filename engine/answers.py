"""The answers every view of a run gives, each computed in one place.

The run page (controlpanel/views/), the admin lists, the JSON API and ``run_status``
(engine/operations.py ``run_status``), the commands and the demo ask these functions; none
computes its own:

* ``simulation(adapter, profile)``: whether a profile is simulated, and why;
* ``current_stage(run)``: the stage the run is at;
* ``waiting_for(run)`` and ``waiting_sentence(run)``: what the run waits for;
* ``actions(run)``: every action, whether it applies now, and why not;
* ``totals(run)``: usage, cost and time summed over the run.

Plain reads: nothing here changes a record (engine/machine.py does).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import F, Q
from django.utils import timezone

from .budgets import budget_problem, spent_by
from .machine import Step
from .models import RUN_TERMINAL, RUN_WAITING, AttemptStatus, Decision, Run, RunStatus, StageRun, StageStatus
from .simulation import simulation

__all__ = ["simulation", "run_simulation", "current_stage", "waiting_for", "waiting_sentence", "pending_decisions",
           "exhausted_budget", "Action", "ACTION_NAMES", "actions", "applicable", "totals", "USAGE_KEYS",
           "waiting_stage", "stage_has_result"]

#: The usage keys summed over a run's attempts (what the adapters report: engine/agents/base.py).
USAGE_KEYS = ("input_tokens", "output_tokens", "cached_tokens", "cost_usd")


def run_simulation(definition_profiles: dict, used: set[str]) -> str:
    """The reasons (sorted, comma-joined) why a run whose roles use the profiles ``used`` of
    ``definition_profiles`` is simulated; ``""`` when none is."""
    reasons = {simulation(definition_profiles[name]["adapter"], definition_profiles[name]) for name in used}
    return ", ".join(sorted(reason for reason in reasons if reason))


def current_stage(run: Run, stages: list[StageRun] | None = None) -> StageRun | None:
    """The stage the run is at: the first, in order, that has not passed; None when every
    stage passed (the run is in its final verification or has ended). ``stages`` (in order)
    spares a query when the caller has them."""
    ordered = stages if stages is not None else list(run.stages.order_by("order"))
    return next((stage for stage in ordered if stage.status != StageStatus.PASSED), None)


def waiting_for(run: Run) -> str | None:
    """``"start"`` (pending), ``"worker"`` (queued), ``"review"`` (waiting_review), ``"approval"``
    (waiting_approval), or None (running or ended)."""
    return {RunStatus.PENDING: "start", RunStatus.QUEUED: "worker", RunStatus.WAITING_REVIEW: "review",
            RunStatus.WAITING_APPROVAL: "approval"}.get(run.status)


def pending_decisions(run: Run, decisions: list[Decision] | None = None) -> dict[str, Decision]:
    """The run's pending decision of each kind (the latest of it), by ``Decision.Kind``."""
    rows = decisions if decisions is not None else list(run.decisions.order_by("id"))
    return {d.kind: d for d in rows if d.state == Decision.State.PENDING}


def exhausted_budget(run: Run, attempts: list | None = None) -> str | None:
    """A sentence when the run has no budget left for more agent work, else None (as
    ``budgets.budget_problem`` counts it for a review, the step any recovery ends in). ``attempts``
    (every Attempt row of the run) spares its queries when the caller has them."""
    return budget_problem(run, Step("review"), attempts)


def waiting_sentence(run: Run, decisions: list[Decision] | None = None, stages: list[StageRun] | None = None,
                     attempts: list | None = None) -> str:
    """What the run waits for, for a person; ``""`` when it waits for nothing.

    ``decisions``, ``stages`` and ``attempts`` (every row of each of the run's, the attempts with
    their ``result_manifest`` loaded) spare the queries when the caller has them: a page that
    lists many runs reads them once for all (controlpanel/home.py) and asks no query per run."""
    pending = pending_decisions(run, decisions)
    approval = pending.get(Decision.Kind.APPROVAL)
    if run.status in RUN_WAITING and waits_for_host(run):
        return f"Waiting for its host: {waits_for_host(run)}; or fail it."
    if run.status == RunStatus.WAITING_REVIEW and exhausted_budget(run, attempts) is not None:
        return ("Its budget is exhausted: an exhausted execution budget requires a new run (Create a run on the "
                "pipeline's page); fail this one.")
    return {
        RunStatus.PENDING: "Waiting for Start.",
        RunStatus.QUEUED: "Waiting for a worker to claim it.",
        RunStatus.WAITING_REVIEW: _review_sentence(run, stages, attempts) if run.status == RunStatus.WAITING_REVIEW
        else "",
        RunStatus.WAITING_APPROVAL: (f"Waiting for a person to approve files {approval.artifact[:12]}, request "
                                     f"changes, recheck or fail it." if approval else "Waiting for approval."),
    }.get(run.status, "")


#: A run waiting for review with every stage passed: it stopped in the final verification.
FINAL_REVIEW_SENTENCE = ("Waiting for a person: every stage passed and the run stopped in its final verification; "
                         "recover it to run the final verification again, or fail it.")


def waits_for_host(run: Run) -> str:
    """Why no recovery or recheck of ``run`` is accepted yet, or ``""``: a reconciler elsewhere marked it
    interrupted when its host stopped beating (engine/reconcile.py ``interrupt_lost_host``:
    ``stop_evidence.host_confirmed`` False), and that host has not confirmed its old processes gone."""
    evidence = run.stop_evidence or {}
    if evidence.get("host_confirmed") is not False:
        return ""
    host = evidence.get("host") or run.host
    return (f"the run's host {host} stopped beating and has not yet confirmed its old processes gone: start a "
            f"worker on host {host} (CP_HOST_NAME={host}, its own CP_VAR_DIR) first")


def _review_sentence(run: Run, stages: list[StageRun] | None, attempts: list | None) -> str:
    """What a run waiting for review waits for: recover (retry or verify), recheck or fail when its
    waiting stage has a result (``stage_has_result``), only a retry when it has none, and the final
    verification again when no stage waits (every stage passed). From the caller's rows when it has them."""
    stage = waiting_stage(run, stages)
    if stage is None:
        return FINAL_REVIEW_SENTENCE
    has = stage_has_result(stage) if attempts is None else stage_has_result(
        stage, [a for a in attempts if a.stage_id == stage.pk])
    if has:
        return "Waiting for a person: recover it (retry or verify), recheck it, or fail it."
    return ("Waiting for a person: recover it with a retry (the stage never produced a result to verify or "
            "recheck), or fail it.")


def waiting_stage(run: Run, stages: list[StageRun] | None = None) -> StageRun | None:
    """The stage a waiting run waits at, the one Recheck verifies again: the first, in order, that
    has neither passed nor is still pending (engine/operations.py ``recheck``); None when none is.
    ``stages`` (every stage of the run) spares the query when the caller has them."""
    if stages is not None:
        return next((stage for stage in sorted(stages, key=lambda s: s.order)
                     if stage.status not in (StageStatus.PASSED, StageStatus.PENDING)), None)
    return run.stages.exclude(status__in=[StageStatus.PASSED, StageStatus.PENDING]).order_by("order").first()


def stage_has_result(stage: StageRun | None, attempts: list | None = None) -> bool:
    """True when an implement or repair attempt of ``stage`` produced a result to verify: it has a
    result manifest and either succeeded or changed the files (its result manifest differs from the
    files it started on). An attempt that failed before doing anything (``auth_failed`` seconds
    after Start) leaves a manifest of the unchanged files: that is no result. Only the latest
    implement attempt and the repairs after it count (a retry starts from the stage's starting
    checkpoint). Recheck and
    Recover's verify need one (engine/operations.py ``recheck``, ``recover``: ``nothing_to_verify``).
    ``attempts`` (every attempt of the stage, each with its ``result_manifest`` loaded) spares the
    queries when the caller has them; the same rule is applied to them."""
    if stage is None:
        return False
    if attempts is not None:
        implements = [a for a in attempts if a.operation == "implement"]
        if not implements:
            return False
        first = max(a.number for a in implements)
        return any(a.operation in ("implement", "repair") and a.number >= first and a.result_manifest_id is not None
                   and (a.status == AttemptStatus.SUCCEEDED or a.result_manifest.digest != a.start_manifest)
                   for a in attempts)
    # from the latest implement attempt on: a retry starts again from the stage's starting checkpoint, so
    # what the attempts before it left is no longer in the worktree (repairs build on what is there)
    latest = stage.attempts.filter(operation="implement").order_by("-number").first()
    if latest is None:
        return False
    return stage.attempts.filter(operation__in=("implement", "repair"), number__gte=latest.number,
                                 result_manifest__isnull=False).filter(
        Q(status=AttemptStatus.SUCCEEDED) | ~Q(result_manifest__digest=F("start_manifest"))).exists()


@dataclass(frozen=True)
class Action:
    """One action on a run: whether it ``applies`` now, ``why`` not when it does not, and the
    initial values of its form when it does (``initial``: decision id, artifact, action)."""

    name: str
    applies: bool
    why: str = ""
    initial: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"action": self.name, "applies": self.applies, "why": self.why or None, "initial": self.initial}


#: Every action a person can take on a run, in the order they are shown (Re-run, engine/operations.py
#: ``rerun``: a new run from an ended one, last).
ACTION_NAMES = ("start", "approve", "request_changes", "recheck", "recover", "fail", "rerun", "continue")


def actions(run: Run, decisions: list[Decision] | None = None) -> dict[str, Action]:
    """Every action of ``ACTION_NAMES`` for ``run`` now: Start (pending); Approve (waiting_approval
    with a pending approval decision: its id and artifact); Request changes (as Approve, and not
    while the run's budget is exhausted); Recheck (waiting_review or
    waiting_approval, when the waiting stage produced a result: ``stage_has_result``); Recover
    (waiting_review with a pending review decision: its id, and ``verify`` False with ``verify_why``
    when the stage has no result, so that only retry is offered); Recheck
    and Recover not while the run's budget is exhausted (a new run is needed); Fail (any status
    but succeeded or failed); Re-run (an ended run); Continue (a run its budget stopped: its budgets as
    the form's start). The operations in engine/operations.py refuse what does not apply with the same
    reasons."""
    pending = pending_decisions(run, decisions)
    status = run.status
    found: dict[str, Action] = {}

    def add(name: str, why: str, initial: dict | None = None) -> None:
        found[name] = Action(name, not why, why, (initial or {}) if not why else {})

    add("start", "" if status == RunStatus.PENDING else f"the run is {status}; only a pending run is started")
    approval = pending.get(Decision.Kind.APPROVAL)
    if status != RunStatus.WAITING_APPROVAL:
        add("approve", f"the run is {status}; only a run waiting for approval is approved")
    elif approval is None:
        add("approve", "no approval decision is pending")
    else:
        add("approve", "", {"decision": approval.pk, "artifact": approval.artifact})
    exhausted = exhausted_budget(run) if status in RUN_WAITING else None
    spent = f"the run's budget is exhausted ({exhausted}): a new run is needed" if exhausted else ""
    if status in RUN_WAITING and waits_for_host(run):
        spent = waits_for_host(run)
    if "approve" in found and not found["approve"].applies:
        add("request_changes", found["approve"].why)
    else:
        add("request_changes", spent, {"decision": approval.pk, "artifact": approval.artifact})
    add("recheck", (spent or _nothing_to_recheck(run)) if status in RUN_WAITING
        else f"the run is {status}; only a waiting run is rechecked")
    review = pending.get(Decision.Kind.REVIEW)
    if status != RunStatus.WAITING_REVIEW:
        add("recover", f"the run is {status}; only a run waiting for review is recovered")
    elif review is None:
        add("recover", "no review decision is pending")
    else:
        add("recover", spent, {"decision": review.pk, "action": "retry", **_verify_offer(review.stage)})
    add("fail", f"the run has ended ({status})" if status in RUN_TERMINAL else "")
    add("rerun", "" if status in RUN_TERMINAL else f"the run is {status}; only an ended run (succeeded or failed) "
                                                   "is re-run", {"seen": run.rerun_count})
    budget_stop = status == RunStatus.WAITING_REVIEW and run.stop_reason in ("budget_reached", "budget_exhausted")
    add("continue", "" if budget_stop else "only a run its budget stopped (budget_reached, budget_exhausted) is "
        "continued with a raised budget", {"seen": run.rerun_count,
                                           "budgets": (run.definition or {}).get("pipeline", {}).get("budgets") or {}})
    return found


def _nothing_to_recheck(run: Run) -> str:
    """Why Recheck does not apply to a waiting run whose stage never produced a result ('' when it did)."""
    stage = waiting_stage(run)
    if stage is None:
        return ("every stage passed: there is no stage to recheck; recover the run to run its final verification "
                "again")
    if stage_has_result(stage):
        return ""
    return (f"stage '{stage.key}' never produced a result (no implement or repair attempt left one): there is "
            f"nothing to recheck; recover with retry")


def _verify_offer(stage: StageRun | None) -> dict:
    """Recover's ``initial`` about verify: ``{"verify": True}`` when the stage has a result to
    verify, else ``{"verify": False, "verify_why": ...}`` (the form then offers only retry)."""
    if stage is None or stage_has_result(stage):
        return {"verify": True}
    return {"verify": False, "verify_why": f"stage '{stage.key}' never produced a result: only retry applies"}


def applicable(run: Run, decisions: list[Decision] | None = None) -> dict[str, dict]:
    """The actions that apply now, each with the initial values of its form (``actions``)."""
    return {name: action.initial for name, action in actions(run, decisions).items() if action.applies}


def _seconds(start, end) -> float | None:
    if start is None:
        return None
    return max(0.0, ((end or timezone.now()) - start).total_seconds())


def totals(run: Run, attempts: list | None = None) -> dict:
    """What the run has used so far: ``{"input_tokens", "output_tokens", "cached_tokens",
    "cost_usd"}`` summed over its attempts' usage (what their model gateways metered, live while an
    attempt runs; a CLI's own report without one; None while no attempt reported a key), ``"tokens"``
    (every token the budgets count, engine/budgets.py ``spent_by``), ``"caps"`` (the run's
    ``budgets.max_tokens`` and ``max_cost_usd``), ``"attempts"`` (agent attempts), ``"active_seconds"`` (agents and gates, as the
    budget counts it), ``"elapsed_seconds"`` (from the first claim to the end or now, waiting for
    a person included; None before a worker first claimed it)."""
    rows = attempts if attempts is not None else list(run.attempts.all())
    found = _usage_sums(rows)
    found["simulated_cost_usd"] = None
    if run.simulated:  # what a scripted model's answers would have cost is nobody's money
        found["simulated_cost_usd"], found["cost_usd"] = found["cost_usd"], None
    budgets = (run.definition or {}).get("pipeline", {}).get("budgets") or {}
    found["tokens"] = sum(spent_by(row)["tokens"] for row in rows)
    found["caps"] = {"max_tokens": budgets.get("max_tokens"), "max_cost_usd": budgets.get("max_cost_usd")}
    found["active_seconds"] = round(run.active_seconds, 3)
    elapsed = _seconds(run.started_at, run.finished_at)
    found["elapsed_seconds"] = round(elapsed, 3) if elapsed is not None else None
    return found


def _usage_sums(attempts: list) -> dict:
    """``USAGE_KEYS`` summed over the attempts' reported usage (None while none reported a key), and
    ``"attempts"``: how many. The cost is None (unknown) as soon as one real attempt that used tokens has
    no known cost: a sum of the known ones would be less than was spent."""
    found: dict = {key: None for key in USAGE_KEYS}
    unknown = False
    for attempt in attempts:
        usage = attempt.usage or {}
        for key in USAGE_KEYS:
            value = usage.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[key] = (found[key] or 0) + value
        used = any(usage.get(key) for key in ("input_tokens", "output_tokens"))
        unknown = unknown or (used and usage.get("cost_usd") is None and not attempt.simulated)
    if unknown:
        found["cost_usd"] = None
    found["attempts"] = len(attempts)
    return found


def stage_totals(stage: StageRun, attempts: list | None = None, checks: list | None = None) -> dict:
    """What one stage has used: ``{"input_tokens", "output_tokens", "cached_tokens", "cost_usd"}``
    summed over its attempts' reported usage (None while none reported a key), ``"attempts"``,
    ``"active_seconds"`` (its attempts' and checks' own elapsed seconds, summed; a person's wait is
    not in it) and ``"elapsed_seconds"`` (wall time from its start to its end or now, waits included;
    None before it started)."""
    rows = attempts if attempts is not None else list(stage.attempts.all())
    found = _usage_sums(rows)
    ran = [row.elapsed_seconds for row in rows] + [c.elapsed_seconds for c in (
        checks if checks is not None else stage.checks.all())]
    found["active_seconds"] = round(sum(value for value in ran if value), 3)
    elapsed = _seconds(stage.started_at, stage.finished_at)
    found["elapsed_seconds"] = round(elapsed, 3) if elapsed is not None else None
    return found


def totals_sentence(found: dict) -> str:
    """``totals`` for a terminal line: ``3 agent attempts, 105 input / 7 output tokens, cost
    $0.7500, active 12 s, elapsed 30 s`` (what no attempt reported is said to be unreported)."""
    def tokens(key: str) -> str:
        return f"{int(found[key]):,}" if found.get(key) is not None else "unreported"

    cost = (f"${found['cost_usd']:.4f}" if found.get("cost_usd") is not None else
            f"${found['simulated_cost_usd']:.4f} simulated (not money)" if found.get("simulated_cost_usd") is not None
            else "unknown")
    elapsed = f"{found['elapsed_seconds']:.0f} s" if found.get("elapsed_seconds") is not None else "-"
    spend = f", {spend_sentence(found)}" if spend_sentence(found) else ""
    return (f"{found['attempts']} agent attempt(s), {tokens('input_tokens')} input / {tokens('output_tokens')} output "
            f"tokens, cost {cost}{spend}, active {found['active_seconds']:.0f} s, elapsed {elapsed}")


def spend_sentence(found: dict) -> str:
    """The run's spend against its caps (``totals``): ``4,100 tokens of 5,000 (budgets.max_tokens), $0.0135 of
    $10.00 (budgets.max_cost_usd)``; '' when the run has no spend cap."""
    caps = found.get("caps") or {}
    parts = []
    if caps.get("max_tokens") is not None:
        parts.append(f"{int(found.get('tokens') or 0):,} tokens of {caps['max_tokens']:,} (budgets.max_tokens)")
    if caps.get("max_cost_usd") is not None:
        spent = found.get("cost_usd")
        simulated = found.get("simulated_cost_usd")
        if spent is None and simulated is None:  # not "an unknown cost of $10.00": that reads as money spent
            parts.append(f"cost unknown, cap ${caps['max_cost_usd']:.2f} (budgets.max_cost_usd)")
        else:
            said = f"${spent:.4f}" if spent is not None else f"${simulated:.4f} simulated (not money)"
            parts.append(f"{said} of ${caps['max_cost_usd']:.2f} (budgets.max_cost_usd)")
    return ", ".join(parts)
