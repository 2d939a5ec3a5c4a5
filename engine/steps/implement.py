"""The implement and repair steps: the implementer's attempt, limited to the stage's scope (a
repair is a fresh session told the defect and the current patch: engine/steps/prompts.py). Its
exit status is not evidence: its files go to the gates (the verify step)."""
from __future__ import annotations

from .. import machine
from ..models import AttemptStatus, Run, StageRun
from .attempts import begin_attempt, execute_agent, finish_attempt
from .common import defect
from .plans import AgentOutcome, AgentPlan, StagePlan





def begin(run: Run, stage: StageRun, plan: StagePlan) -> AgentPlan:
    """Record the implementer's attempt before it launches (an implement or a repair: ``plan["kind"]``)."""
    return {**plan, **begin_attempt(run, stage, plan["kind"], "implementer", plan["lease"])}


def execute(plan: AgentPlan, should_stop) -> AgentOutcome:
    """Run the implementer's session (a first attempt after a person's retry starts from the
    stage's starting checkpoint: engine/steps/attempts.py)."""
    return execute_agent(plan, should_stop)


def finish(run: Run, stage: StageRun, plan: AgentPlan, outcome: AgentOutcome) -> None:
    """Record the attempt; files that pass every attempt's checks go to the gates, a failed
    attempt stops the run."""
    attempt = finish_attempt(run, stage, plan, outcome)
    if attempt is None:
        return
    evidence = {"attempt": attempt.pk}
    if attempt.failure_kind == "stalled":
        _stalled(run, stage, attempt, outcome)
        return
    if attempt.status != AttemptStatus.SUCCEEDED:
        what = {"workspace_branch_in_use": "the run's branch is checked out in another worktree",
                "missing_executable": "the agent's executable was not found"}.get(attempt.failure_kind, "")
        message = attempt.failure_message or what or f"attempt {attempt.number} ended {attempt.status}"
        machine.event(run, "attempt_failed",
                      f"Attempt {attempt.number} ({attempt.operation}) of stage '{stage.key}' ended "
                      f"{attempt.status} ({attempt.failure_kind}).", stage=stage, attempt=attempt)
        machine.stop(run, attempt.failure_kind or "crashed", message, stage=stage, evidence=evidence)
        return
    changes = outcome["manifest"]["changes"]
    machine.event(run, "attempt_done",
                  f"Attempt {attempt.number} ({attempt.operation}) of stage '{stage.key}' exited 0 after "
                  f"{attempt.elapsed_seconds:.1f} s and changed {len(changes)} file(s); its claim is not evidence, "
                  f"the gates decide.", stage=stage, attempt=attempt)
    asked = stage.last_defect or {}
    if plan["operation"] == "repair" and asked.get("kind") == "person" \
            and outcome["manifest"]["digest"] == asked.get("digest"):
        machine.stop(run, "unchanged_failure",
                     f"The repair session for the changes {asked.get('name')} requested left the files unchanged "
                     f"({asked.get('digest', '')[:12]}): the request was not acted on. A person decides: recover with "
                     f"a retry (the note goes to the agent again) or fail the run.", stage=stage,
                     evidence={"attempt": attempt.pk, **(asked.get("evidence") or {})})
    elif plan["operation"] == "repair":
        machine.repaired(stage)
    else:
        machine.implemented(stage)



def _stalled(run: Run, stage: StageRun, attempt, outcome: AgentOutcome) -> None:
    """The model gateway stopped the implementer in a loop (engine/model_gateway/meter.py ``LoopWatch``): a
    defect for the stage's repair allowance (a fresh session is told of the loop and starts from the files
    as the looping one left them), else a stop (``stalled``)."""
    loop = next((call.get("stalled") or call.get("why") for call in reversed((attempt.gateway or {}).get("ledger") or [])
                 if call.get("stalled") or (call.get("refused") == "stalled" and call.get("why"))),
                attempt.failure_message)
    message = (f"Attempt {attempt.number} ({attempt.operation}) was stopped in a loop: {loop}. Do not repeat that "
               f"call; find what keeps it from making progress.")
    machine.event(run, "attempt_failed", f"Attempt {attempt.number} ({attempt.operation}) of stage '{stage.key}' "
                  f"looped and was stopped (stalled).", stage=stage, attempt=attempt)
    evidence = {"attempt": attempt.pk, "loop": loop}
    if int(stage.spec.get("repair_allowance", 0)) == 0:
        machine.stop(run, "stalled", f"{message} The stage allows no repairs (repair_allowance: 0).", stage=stage,
                     evidence=evidence)
        return
    defect(run, stage, "stalled", attempt.profile_name, outcome["manifest"]["digest"], message, evidence)
