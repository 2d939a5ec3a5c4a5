"""The documentation step: the documenter's attempt, limited to the documentation paths (its
prompt: the verified diff and the knowledge base, engine/steps/prompts.py). A failure stops the
run; changed documentation is verified and reviewed again before the checkpoint."""
from __future__ import annotations

from .. import context, machine
from ..agents import registry
from ..models import AttemptStatus, Run, StageRun
from .attempts import begin_attempt, execute_agent, finish_attempt
from .plans import AgentOutcome, AgentPlan, StagePlan


#: The file-writing tools of the agent CLIs, by the names their adapters record refusals under
#: (engine/agents/<cli>/policy.py WRITE_TOOLS).
WRITE_TOOLS = registry.write_tools()


def refused_writes(refusals: list[dict] | None) -> list[dict]:
    """The refusals of an attempt (``Attempt.refusals``: ``{"tool", "message", "path"?, "recovered"?}``)
    that are file writes the CLI refused or that failed, for good: a tool of WRITE_TOOLS (one CLI's
    "File has not been read yet" refusal of a Write, a denied permission, another CLI's failed patch) whose
    file no later write of the same attempt wrote (``recovered``: set by the adapter reading the CLI's output,
    engine/agents/<cli>/adapter.py)."""
    return [r for r in refusals or [] if isinstance(r, dict) and r.get("tool") in WRITE_TOOLS
            and not r.get("recovered")]


def begin(run: Run, stage: StageRun, plan: StagePlan) -> AgentPlan:
    """Record the documenter's attempt before it launches."""
    return {**plan, **begin_attempt(run, stage, "document", "documenter", plan["lease"])}


def execute(plan: AgentPlan, should_stop) -> AgentOutcome:
    """Run the documenter's session."""
    return execute_agent(plan, should_stop)


def finish(run: Run, stage: StageRun, plan: AgentPlan, outcome: AgentOutcome) -> None:
    """The documentation agent's attempt: a failure stops the run (docs_failed), and so does an
    attempt that exited 0 after its CLI refused one of its writes (``refused_writes``: the attempt's
    failure kind becomes ``writes_refused``) or that changed a note the specification index does not
    name (engine/context.py ``unindexed_notes``: ``index_incomplete``); changed docs are verified and
    reviewed again before the checkpoint."""
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
    refused = refused_writes(attempt.refusals)
    if refused:
        said = "; ".join(f"{r.get('tool')} {r.get('command') or ''}".strip() + f": {str(r.get('message') or '')[:200]}"
                         for r in refused[:3])
        machine.refuse_attempt(attempt.pk, "writes_refused", f"the CLI refused {len(refused)} of its writes: {said}")
        machine.stop(run, "docs_failed",
                     f"The documentation agent (attempt {attempt.number}) exited 0, but its CLI refused "
                     f"{len(refused)} of its writes ({said}): the documentation is not what it meant to write. The "
                     f"verified files are kept; the stage is not checkpointed without current documentation.",
                     stage=stage, evidence={"attempt": attempt.pk, "failure_kind": "writes_refused",
                                            "refused": refused[:10]})
        return
    changed = outcome.get("changed") or []
    index = run.definition["pipeline"].get("spec_index")
    missing = context.unindexed_notes(run.worktree, index, changed) if index and changed else []
    if missing:
        named = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        machine.refuse_attempt(attempt.pk, "index_incomplete",
                               f"the specification index {index} does not name {len(missing)} of the notes it changed: "
                               f"{named}")
        machine.stop(run, "docs_failed",
                     f"The documentation agent (attempt {attempt.number}) changed {len(missing)} note(s) that the "
                     f"specification index {index} does not name: {named}. Every changed note must be listed in the "
                     f"index; the verified files are kept and the stage is not checkpointed.",
                     stage=stage, evidence={"attempt": attempt.pk, "failure_kind": "index_incomplete",
                                            "unindexed": missing[:50], "spec_index": index})
        return
    machine.event(run, "documented",
                  f"The documentation agent (attempt {attempt.number}) updated {', '.join(changed[:10])}; the checks "
                  f"and reviews run again on the updated files." if changed else
                  f"The documentation agent (attempt {attempt.number}) found the documentation current; nothing "
                  f"changed.", stage=stage, attempt=attempt, data={"changed": changed})
    machine.documented(run, stage, stage.accepted_manifest, bool(changed))
