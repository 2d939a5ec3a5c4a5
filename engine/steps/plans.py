"""The shapes of the plans and outcomes the steps pass around.

A step's ``begin`` returns a plan, its ``execute`` an outcome, its ``finish`` reads both
(engine/steps/__init__.py); engine/runner.py and engine/reconcile.py hold them in between. At
run time they are plain dicts: these ``TypedDict`` classes only name their keys and the types of
their values, for the signatures and for a reader. An outcome's keys are all optional: which ones
are present says what happened (``NotRequired`` would say the same of each key, ``total=False``
says it once).

No ``from __future__ import annotations`` here: ``typing`` reads ``NotRequired`` from the class
body's annotations themselves.
"""
from typing import NotRequired, TypedDict, Union


class StepPlan(TypedDict):
    """What every plan holds: the step's kind, its run, its lease (the fencing token) and its stage
    (None for the run's ``finish`` step)."""
    kind: str
    run_id: int
    lease: str
    stage_id: int | None


class FinalPlan(StepPlan):
    """The ``finish`` step: the final checkpoint to verify."""
    checkpoint: str


class StagePlan(StepPlan):
    """A step of a stage (the plan of a ``verify`` step holds nothing more)."""
    stage_key: str


class AgentPlan(StagePlan):
    """An implement, repair, review or document step: the Attempt recorded before launch."""
    attempt_id: int
    operation: str
    role: str
    profile: dict
    profile_name: str
    #: this attempt's number among the stage's attempts of the same operation (1 for the first)
    operation_attempt: int
    #: the attempt's folder of control records, relative to the run's control folder
    folder: str
    #: the run's active-time budget cut the attempt's deadline
    budget_cut: bool


class CheckpointPlan(StagePlan):
    """A checkpoint step: its journal entry, and when it began (``time.time()``), which bounds its
    waits for git's index lock; a plan engine/reconcile.py makes to finish a checkpoint has none."""
    journal_id: int
    started: NotRequired[float]


class Tamper(TypedDict):
    """Protected files an attempt or the gates changed: the changes and the report's control records."""
    changes: list[dict]
    report: str
    files: str
    dropped: NotRequired[dict]  # engine/steps/agreed.py ``dropped``: agreed tests the files would take away


class CrashOutcome(TypedDict, total=False):
    """A step whose own machinery raised (``crashed``); ``stop_reason`` when an agent's files caused it."""
    crashed: bool
    failure_kind: str
    failure_message: str
    stop_reason: str


class AgentOutcome(TypedDict, total=False):
    """What an agent attempt left: not launched (``failure_kind``, ``failure_message``), or its
    result and what the checks made before and after git read its files found."""
    launched: bool
    failure_kind: str
    failure_message: str
    #: engine/agents/base.py ``AgentResult.as_dict()``
    result: dict
    prompt_redactions: int
    #: the worktree's .git file was rewritten: no git ran
    tampered: bool
    #: paths of git repositories the agent made in the worktree: no git ran
    nested: list[str]
    #: the manifest of the files after the attempt (engine/workspace.py ``manifest``); None when no git ran
    manifest: dict | None
    patch_path: str
    patch: dict
    changed: list[str]
    tamper: Tamper | None
    outward: list[dict]
    #: a reviewer's verdict (engine/checks/review.py ``parse``), or why its answer was not one
    verdict: dict
    verdict_problem: str


class VerifyOutcome(TypedDict, total=False):
    """The gates' run: the Check ids, the files' digest they ran on, or why they did not (or not to the end)."""
    checks: list[int]
    digest: str
    rounds: int
    changed: list[str]
    cancelled: bool
    unstable: bool
    tamper: Tamper
    outward: list[dict]
    gates_wrote_outside: list[str]


class CheckpointOutcome(TypedDict, total=False):
    """The commit (made now, or found again after a crash), or why there is none."""
    commit: str
    created: bool
    recovered: bool
    #: the commit exists but the worktree's index could not be made to agree with it
    index_failure: dict
    #: deliverable files put back to the commit's
    restored: list[str]
    #: records of the protected files the stage added (engine/checks/protected.py ``carry_forward``)
    carried: list[dict]
    #: {journal entry id: its commit, or ""}: the earlier, crashed tries of the stage's checkpoint
    earlier: dict[str, str]
    #: the files are no longer the verified ones (``digest``): verified again
    changed: bool
    digest: str
    failure_kind: str
    failure_message: str


class FinalOutcome(TypedDict, total=False):
    """The final checks' Check ids and the final checkpoint's tree, or ``cancelled``."""
    checks: list[int]
    digest: str
    cancelled: bool


#: Any plan or outcome, where a function takes every step kind's (engine/steps/__init__.py).
Plan = Union[StagePlan, AgentPlan, CheckpointPlan, FinalPlan]
Outcome = Union[AgentOutcome, VerifyOutcome, CheckpointOutcome, FinalOutcome, CrashOutcome]
