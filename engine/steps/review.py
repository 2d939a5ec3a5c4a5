"""The review step: the attempt of the next reviewer that has not yet passed the stage's verified
files, its verdict parsed from the agent's answer (engine/checks/review.py is the verdict's schema and
the reviewer's prompt text), and what the verdict does: a pass, a repair, or an escalation."""
from __future__ import annotations

from .. import machine
from ..checks import review as verdicts
from ..models import Attempt, AttemptStatus, Run, StageRun
from .attempts import begin_attempt, execute_agent, finish_attempt
from .common import defect, passed_reviewers, reviewers, storable
from .gates import gate_results
from .plans import AgentOutcome, AgentPlan, StagePlan


def begin(run: Run, stage: StageRun, plan: StagePlan) -> AgentPlan:
    """Record the attempt of the next reviewer (in ``roles.reviewer`` order) before it launches."""
    return {**plan, **begin_attempt(run, stage, "review", "reviewer", plan["lease"],
                                    profile_name=_next_reviewer(run, stage))}


def execute(plan: AgentPlan, should_stop) -> AgentOutcome:
    """Run the reviewer's session; when it ran and its files passed the checks made before git
    reads them (a manifest was taken), parse its verdict (``verdict``, or ``verdict_problem``)."""
    outcome = execute_agent(plan, should_stop)
    if outcome.get("manifest") is not None:
        result = outcome["result"]
        try:
            outcome["verdict"] = verdicts.parse(result["final_message"], (result["extra"] or {}).get("verdict"))
        except verdicts.InvalidVerdict as exc:
            outcome["verdict_problem"] = str(exc)
    return outcome


def finish(run: Run, stage: StageRun, plan: AgentPlan, outcome: AgentOutcome) -> None:
    """Record the reviewer's attempt; when its files pass every attempt's checks, act on its verdict."""
    attempt = finish_attempt(run, stage, plan, outcome)
    if attempt is not None:
        _finish_review(run, stage, attempt, outcome)


def _next_reviewer(run: Run, stage: StageRun) -> str:
    passed = passed_reviewers(stage)
    return next(name for name in reviewers(run) if name not in passed)


def _finish_review(run: Run, stage: StageRun, attempt: Attempt, outcome: AgentOutcome) -> None:
    """Record a reviewer's verdict and act on it: pass, repair (a defect) or escalate."""
    who = f"Reviewer '{attempt.profile_name}' (attempt {attempt.number})"
    if not outcome.get("launched"):  # the workspace, not the reviewer, is at fault (e.g. head_moved)
        machine.stop(run, attempt.failure_kind, f"{who} was not started: {attempt.failure_message}", stage=stage,
                     evidence={"attempt": attempt.pk})
        return
    if attempt.status != AttemptStatus.SUCCEEDED:
        machine.event(run, "attempt_failed", f"{who} ended {attempt.status} ({attempt.failure_kind}).",
                      stage=stage, attempt=attempt)
        machine.stop(run, "reviewer_unavailable",
                     f"{who} gave no verdict: it ended {attempt.status} ({attempt.failure_kind}): "
                     f"{attempt.failure_message or 'no message'}. No review, no acceptance.",
                     stage=stage, evidence={"attempt": attempt.pk, "failure_kind": attempt.failure_kind})
        return
    problem = outcome.get("verdict_problem")
    if problem:
        attempt.verdict_problem = storable(problem)
        attempt.save(update_fields=["verdict_problem"])
        machine.stop(run, "invalid_review", f"{who} did not answer a valid verdict: {problem}.", stage=stage,
                     evidence={"attempt": attempt.pk})
        return
    verdict = storable(outcome["verdict"])
    attempt.verdict = verdict
    attempt.save(update_fields=["verdict"])
    if outcome["manifest"]["digest"] != stage.accepted_manifest:
        machine.event(run, "artifact_changed", f"The files of stage '{stage.key}' changed during the review; "
                      f"they are verified again.", stage=stage, attempt=attempt)
        machine.reverify(stage)
        return
    findings = verdict.get("findings") or []
    listed = "; ".join(_finding_text(f) for f in findings[:10])
    kind = verdict["verdict"]
    if kind == "escalate":
        machine.stop(run, "review_escalated", f"{who} escalated to a person: {listed}", stage=stage,
                     evidence={"attempt": attempt.pk, "findings": findings})
        return
    if kind == "repair":
        defect(run, stage, "review", attempt.profile_name, stage.accepted_manifest,
               f"{who} asked for a repair: {listed}", {"attempt": attempt.pk, "findings": findings})
        return
    failed = [name for name, passed in gate_results(stage, stage.accepted_manifest).items() if not passed]
    if failed:  # never reached through the step order; a verdict never overrides a failed command
        machine.stop(run, "gate_failed", f"{who} answered pass, but gate(s) {', '.join(failed)} did not pass on these "
                     f"files; a verdict never overrides a failed command.", stage=stage,
                     evidence={"attempt": attempt.pk})
        return
    remaining = [name for name in reviewers(run) if name not in passed_reviewers(stage)]
    machine.event(run, "review_passed",
                  f"{who} passed files {stage.accepted_manifest[:12]}"
                  + (f"; still to review: {', '.join(remaining)}." if remaining else "; they go to the checkpoint."),
                  stage=stage, attempt=attempt, data={"verdict": verdict})
    if not remaining:
        machine.reviewed(run, stage)


def _finding_text(finding: dict) -> str:
    where = finding.get("file") or "general"
    if finding.get("line"):
        where += f":{finding['line']}"
    return f"[{finding['severity']}] {where}: {finding['text']}"
