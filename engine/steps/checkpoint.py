"""The checkpoint step: the stage's accepted files committed once (journaled before git runs,
found again by the journal trailer after a crash, never committed twice), the worktree's index
made to agree with the commit, and the files the stage added to the protected set carried
forward. engine/reconcile.py finishes a checkpoint whose worker died after its commit with this
module's ``execute`` and ``finish``, through engine/steps/__init__.py."""
from __future__ import annotations

import contextlib

from django.utils import timezone

from .. import faults, machine, workspace
from ..checks import protected
from ..models import JournalEntry, Run, StageRun
from .common import lock_wait_seconds, lock_waiter, manifest_excludes, stage_row
from .paths import control_path, var_path
from .plans import CheckpointOutcome, CheckpointPlan, StagePlan


def begin(run: Run, stage: StageRun, plan: StagePlan) -> CheckpointPlan:
    """Journal the checkpoint (a JournalEntry) before git runs; ``started`` bounds its waits for
    git's index lock."""
    entry = machine.journal_intent(run, stage)
    checkpoint: CheckpointPlan = {**plan, "journal_id": entry.pk, "started": timezone.now().timestamp()}
    machine.event(run, "checkpoint_intent",
                  f"Checkpoint of stage '{stage.key}' journaled (entry {entry.uid}) before git runs.",
                  stage=stage)
    return checkpoint


def execute(plan: CheckpointPlan, should_stop=None) -> CheckpointOutcome:
    """Commit the stage's accepted files (once, found again after a crash), and copy the files it
    added to the protected set into the control records (``carried``: their records)."""
    outcome = _commit_checkpoint(plan)
    if outcome.get("commit"):
        stage = stage_row(plan)
        run = stage.run
        # entries of earlier, crashed checkpoint steps of this stage: their commits looked up here, in git,
        # for ``finish`` to settle them (it runs under the run's row lock, where git never runs)
        outcome["earlier"] = {}
        for old in stage.journal.filter(state=JournalEntry.State.INTENT).exclude(pk=plan["journal_id"]):
            with contextlib.suppress(workspace.WorkspaceError):  # not looked up: left for a later checkpoint
                outcome["earlier"][str(old.pk)] = workspace.find_commit_with_trailer(
                    run.repo_path, run.branch, "Control-Panel-Journal", str(old.uid)) or ""
        outcome["carried"] = protected.carry_forward(
            run.repo_path, outcome["commit"], run.commit, list(run.definition["pipeline"]["protected_paths"]),
            run.protected_files or [],
            str(var_path(control_path(run, "protected", "index.json")).parent), stage.key)
    return outcome


def _commit_checkpoint(plan: CheckpointPlan) -> CheckpointOutcome:
    """Commit the stage's accepted files once and make the worktree's index agree with the commit.

    A commit found by the entry's journal trailer (an earlier try of this step committed and
    died) or by an earlier entry's (``_earlier_checkpoint``) is reused, and what its crash left
    undone is done now (``_settle_worktree``). A failure after the commit exists returns the
    commit with ``index_failure``: the commit is the truth, never abandoned."""
    stage = stage_row(plan)
    run = stage.run
    entry = JournalEntry.objects.get(pk=plan["journal_id"])
    existing = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal", str(entry.uid))
    if existing:
        return _settle_worktree(run, stage, plan, existing, {"commit": existing, "created": False, "recovered": True})
    digest = workspace.manifest_digest(run.worktree, stage.base_commit, manifest_excludes(run))
    if digest != stage.accepted_manifest:
        return {"changed": True, "digest": digest}
    current = {"digest": digest, "tree": digest}  # the digest is the tree id of the deliverable files
    earlier = _earlier_checkpoint(run, stage, current["tree"])
    if earlier:  # an earlier checkpoint step committed these files and died before its journal said so
        return _settle_worktree(run, stage, plan, earlier, {"commit": earlier, "created": False, "recovered": True})
    faults.hit("checkpoint.before_commit")
    message = f"{run.pipeline_name}: stage {stage.key} (run {run.pk})\n\n{stage.spec['title'] or stage.key}"
    trailers = {"Control-Panel-Run": str(run.uid), "Control-Panel-Stage": stage.key,
                "Control-Panel-Journal": str(entry.uid), "Control-Panel-Manifest": current["digest"]}
    try:
        result = workspace.commit_checkpoint(
            run.worktree, run.branch, current["tree"], stage.base_commit, message, trailers,
            keep_agent_commits=f"refs/controlpanel/run-{run.pk}/stage-{stage.order + 1}-agent-commits",
            repo=run.repo_path, lock_wait=lock_wait_seconds(plan),
            on_lock_wait=lock_waiter(run, plan, "the checkpoint's index update"))
    except workspace.WorkspaceError as exc:
        try:  # git is the truth: a commit carrying the entry's id exists whatever failed after it
            made = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal", str(entry.uid))
        except workspace.WorkspaceError:
            made = None
        if made:
            return {"commit": made, "created": True,
                    "index_failure": {"failure_kind": exc.code, "failure_message": exc.message}}
        return {"failure_kind": exc.code, "failure_message": exc.message}
    faults.hit("checkpoint.after_commit")
    return {"commit": result["commit"], "created": result["created"]}


def _settle_worktree(run: Run, stage: StageRun, plan: CheckpointPlan, commit: str,
                     outcome: CheckpointOutcome) -> CheckpointOutcome:
    """What a checkpoint that died after its commit left undone: the worktree's index reset to
    ``commit`` (``workspace.reset_index_to``, living with git's index lock) and its deliverable
    files put to the commit's when they differ (``restore``: the paths undone). A failure is
    returned as ``index_failure`` next to the commit."""
    wait = {"repo": run.repo_path, "on_wait": lock_waiter(run, plan, "the recovered checkpoint's index reset")}
    try:
        workspace.reset_index_to(run.worktree, run.branch, commit, wait_seconds=lock_wait_seconds(plan), **wait)
        tree = workspace.git(["rev-parse", f"{commit}^{{tree}}"], run.worktree).stdout.decode().strip()
        excludes = manifest_excludes(run)
        if workspace.manifest_digest(run.worktree, stage.base_commit, excludes) != tree:
            undone = workspace.restore_to(run.worktree, commit, excludes, repo=run.repo_path,
                                          lock_wait=lock_wait_seconds(plan), on_lock_wait=wait["on_wait"])
            outcome["restored"] = [change["path"] for change in undone]
    except workspace.WorkspaceError as exc:
        outcome["index_failure"] = {"failure_kind": exc.code, "failure_message": exc.message}
    return outcome


def _earlier_checkpoint(run: Run, stage: StageRun, tree: str) -> str | None:
    """The branch tip when an earlier checkpoint step of this stage committed exactly ``tree``
    (found by its journal trailer), so that recovery never makes a second commit; else None."""
    tip = workspace.branch_tip(run.repo_path, run.branch)
    if not tip or tip == stage.base_commit:
        return None
    for entry in stage.journal.exclude(pk=None).order_by("-id"):
        found = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal", str(entry.uid))
        if found == tip and workspace.git(["rev-parse", f"{tip}^{{tree}}"], run.worktree).stdout.decode().strip() == tree:
            return tip
    return None


def finish(run: Run, stage: StageRun, plan: CheckpointPlan, outcome: CheckpointOutcome) -> None:
    """Settle the journal entry (and those of earlier, crashed tries) and pass the stage, or say
    why it is not checkpointed (files changed: verified again; git failed: a stop)."""
    entry = JournalEntry.objects.get(pk=plan["journal_id"])
    if outcome.get("changed"):
        machine.journal_abandoned(entry)
        machine.event(run, "artifact_changed",
                      f"The files of stage '{stage.key}' changed after verification (now {outcome['digest'][:12]}); "
                      f"they are verified again before any checkpoint.", stage=stage)
        machine.reverify(stage)
        return
    if outcome.get("failure_kind"):  # no commit carries the entry's id: git never made it
        machine.journal_abandoned(entry)
        machine.stop(run, outcome["failure_kind"], outcome["failure_message"], stage=stage,
                     evidence={"journal": entry.pk})
        return
    commit = outcome["commit"]
    if entry.state == JournalEntry.State.INTENT:
        machine.journal_done(entry, commit)
    # entries of earlier, crashed checkpoint steps of this stage: settled now, never searched again
    earlier = outcome.get("earlier") or {}
    for old in stage.journal.filter(state=JournalEntry.State.INTENT).exclude(pk=entry.pk):
        if str(old.pk) not in earlier:
            continue  # not looked up by ``execute`` (git failed): settled by a later checkpoint of the stage
        found = earlier[str(old.pk)]
        if found:
            machine.journal_done(old, found)
        else:
            machine.journal_abandoned(old)
    problem = outcome.get("index_failure")
    if problem:  # committed, but the worktree's index could not be made to agree: a clear stop
        machine.stop(run, problem["failure_kind"],
                     f"Stage '{stage.key}' is committed as {commit[:12]} on {run.branch} (journal entry {entry.uid} "
                     f"done), but the worktree's index could not be reset to it: {problem['failure_message']} A "
                     f"recovery checkpoints the stage again, finds this commit and resets the index.",
                     stage=stage, evidence={"journal": entry.pk, "commit": commit})
        return
    how = "committed as" if outcome.get("created") else ("found already committed as" if outcome.get("recovered")
                                                          else "unchanged; reusing")
    restored = outcome.get("restored") or []
    note = (f" The worktree's index was reset to it; {len(restored)} file(s) differing from it were put back "
            f"({', '.join(restored[:8])})." if restored else
            " The worktree's index was reset to it." if outcome.get("recovered") else "")
    machine.event(run, "checkpoint",
                  f"Stage '{stage.key}' checkpoint {how} {commit[:12]} on {run.branch}.{note}", stage=stage,
                  data={"commit": commit, **({"restored": restored} if restored else {})})
    _carry_forward(run, stage, outcome.get("carried") or [])
    machine.checkpointed(stage, commit)


def _carry_forward(run: Run, stage: StageRun, carried: list[dict]) -> None:
    """The accepted stage's new protected files join the run's protected set (evidence: an event)."""
    known = {r["path"] for r in run.protected_files or []}
    carried = [r for r in carried if r["path"] not in known]
    if not carried:
        return
    run.protected_files = [*(run.protected_files or []), *carried]
    run.save(update_fields=["protected_files"])
    protected.save_index(str(var_path(control_path(run, "protected", "index.json")).parent), run.protected_files)
    shown = ", ".join(r["path"] for r in carried[:10]) + (f" and {len(carried) - 10} more" if len(carried) > 10 else "")
    machine.event(run, "protected_carried",
                  f"Stage '{stage.key}' added {len(carried)} file(s) to the protected checks, protected for the "
                  f"rest of the run: {shown}.", stage=stage,
                  data={"paths": [r["path"] for r in carried], "sha256": {r["path"]: r["sha256"] for r in carried}})
