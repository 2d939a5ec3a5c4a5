"""The documentation step: the documenter's attempt, limited to the documentation paths (its
prompt: the verified diff and the knowledge base, engine/steps/prompts.py). A failure stops the
run; changed documentation is verified and reviewed again before the checkpoint."""
from __future__ import annotations

from .. import machine
from ..models import AttemptStatus, Run, StageRun
from .attempts import begin_attempt, execute_agent, finish_attempt
from .plans import AgentOutcome, AgentPlan, StagePlan


def begin(run: Run, stage: StageRun, plan: StagePlan) -> AgentPlan:
    """Record the documenter's attempt before it launches."""
    return {**plan, **begin_attempt(run, stage, "document", "documenter", plan["lease"])}


def execute(plan: AgentPlan, should_stop) -> AgentOutcome:
    """Run the documenter's session."""
    return execute_agent(plan, should_stop)


def finish(run: Run, stage: StageRun, plan: AgentPlan, outcome: AgentOutcome) -> None:
    """The documentation agent's attempt: a failure stops the run (docs_failed); changed docs are
    verified and reviewed again before the checkpoint."""
    attempt = finish_attempt(run, stage, plan, outcome)
    if attempt is None:
        return
    if not outcome.get("launched"):
        machine.stop(run, attempt.failure_kind, f"The documentation agent was not started: {attempt.failure_message}",
                     stage=stage, evidence={"attempt": attempt.pk})
        return
    if attempt.status != AttemptStatus.SUCCEEDED:
        machine.stop(run, "docs_failed",
                     f"The documentation agent (attempt {attempt.number}) ended {attempt.status} "
                     f"({attempt.failure_kind}): {attempt.failure_message or 'no message'}. The verified files are "
                     f"kept; the stage is not checkpointed without current documentation.",
                     stage=stage, evidence={"attempt": attempt.pk, "failure_kind": attempt.failure_kind})
        return
    changed = outcome.get("changed") or []
    machine.event(run, "documented",
                  f"The documentation agent (attempt {attempt.number}) updated {', '.join(changed[:10])}; the checks "
                  f"and reviews run again on the updated files." if changed else
                  f"The documentation agent (attempt {attempt.number}) found the documentation current; nothing "
                  f"changed.", stage=stage, attempt=attempt, data={"changed": changed})
    machine.documented(run, stage, stage.accepted_manifest, bool(changed))
