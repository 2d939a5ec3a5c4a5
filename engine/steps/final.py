"""The final verification (the run's ``finish`` step): every baseline check and every stage's
gates run again, each on a clean checkout of the final checkpoint (the run's worktree reset to it),
and the run succeeds or stops naming what failed."""
from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings

from .. import machine, workspace
from ..models import Check, Manifest, Run
from . import agreed
from .checkouts import final_checkout, remove_final_checkout
from .gates import check_sentence, run_gate
from .paths import run_env, scratch_dirs
from .plans import CrashOutcome, FinalOutcome, FinalPlan, StepPlan

log = logging.getLogger("engine.steps")


def begin(run: Run, plan: StepPlan) -> FinalPlan:
    """The final checkpoint to verify (the last stage's, or the run's commit without stages), said on the run."""
    last = run.stages.order_by("-order").first()
    final: FinalPlan = {**plan, "checkpoint": last.checkpoint_commit if last else run.commit}
    machine.event(run, "final_verify",
                  f"Every stage is checkpointed; verifying the whole result: every baseline check and every "
                  f"stage's gates run again, each on the run's worktree reset to the final checkpoint "
                  f"{final['checkpoint'][:12]} (exactly what was committed, nothing beside it).")
    return final


def execute(plan: FinalPlan, should_stop) -> FinalOutcome:
    """Run every baseline check and every stage's gates (Check kind final), each on a clean
    checkout of the final checkpoint: exactly what was committed, nothing an agent left beside it
    (files git ignores or the exclusions drop are tested nowhere else), and nothing an earlier
    final check wrote (a check runs the agent's code, which could rewrite the files, a protected
    test among them, or leave an ignored helper for the checks after it). Every check runs, so the
    report names all that fail; each has a TMPDIR and data folder of its own, removed after it.

    The checkout is the run's own worktree, reset before each check to the checkpoint
    (``workspace.reset_to_commit``: the commit's files, every other file removed, then the files on
    disk hashed and compared with the commit's tree), so no second copy of the repository is
    written and deleted. When that cannot be made exact (a folder a check made read-only, say), or
    the checkpoint has submodules, or the worktree is gone, the check runs on a fresh detached
    checkout under the run's scratch folder instead (``final_checkout``), removed after it.
    """
    run = Run.objects.get(pk=plan["run_id"])
    checkpoint = plan["checkpoint"]
    folder = Path(scratch_dirs(run.pk)["tmp"]).parent / f"final-{checkpoint[:12]}"
    own = folder.parent / f"{folder.name}-scratch"
    tree = workspace.git(["rev-parse", f"{checkpoint}^{{tree}}"], run.repo_path).stdout.decode().strip()
    manifest_row = Manifest.objects.filter(run=run, digest=tree).order_by("-id").first()
    pipeline = run.definition["pipeline"]
    stages = list(run.stages.order_by("order"))
    plan_gates = [(stages[0] if stages else None, g) for g in pipeline.get("baseline_checks") or []]
    plan_gates += [(stage, g) for stage in stages for g in stage.spec.get("gates") or []]
    in_worktree = _worktree_usable(run, checkpoint)
    checks = []
    try:
        for stage, gate in plan_gates:
            cwd = _prepare(run, checkpoint, folder, own, in_worktree)
            in_worktree = cwd == run.worktree
            env = {**run_env(run, "final"), "CP_WORKTREE": cwd, "TMPDIR": str(own / "tmp"),
                   "CP_TMP_DIR": str(own / "tmp"), "CP_DATA_DIR": str(own / "data")}
            check = run_gate(run, stage, gate, Check.Kind.FINAL, tree, env, should_stop, 1,
                             cwd=cwd, lease=plan["lease"])
            check = agreed.hold(check, agreed.final_ledger(run, gate["name"]))  # its last ledger, by id
            if manifest_row is not None:
                Check.objects.filter(pk=check.pk).update(manifest=manifest_row)
            checks.append(check.pk)
            if should_stop():
                return {"cancelled": True, "checks": checks}
        return {"checks": checks, "digest": tree}
    finally:
        workspace.remove_tree(str(own))
        if folder.exists():
            try:
                remove_final_checkout(run, folder, own)
            except workspace.WorkspaceError as exc:  # the checks' result stands; the leftover is said
                log.warning("run %s: the final checkout %s could not be unregistered: %s", run.pk, folder, exc)


def _worktree_usable(run: Run, checkpoint: str) -> bool:
    """Whether the final checks may run in the run's own worktree reset to ``checkpoint``: it exists,
    and the checkpoint has no ``.gitmodules`` (submodules are populated in a fresh checkout only)."""
    if not run.worktree or not Path(run.worktree, ".git").is_file():
        return False
    proc = workspace.git(["rev-parse", "-q", "--verify", f"{checkpoint}:.gitmodules"], run.repo_path, check=False)
    return proc.returncode != 0


def _prepare(run: Run, checkpoint: str, folder: Path, own: Path, in_worktree: bool) -> str:
    """The folder the next final check runs in, made exactly ``checkpoint`` (``execute``), with an
    empty ``own`` folder for its TMPDIR and data folder. Raises workspace.WorkspaceError."""
    workspace.remove_tree(str(own))
    for sub in ("tmp", "data"):
        (own / sub).mkdir(parents=True, exist_ok=True)
    if in_worktree:
        if workspace.reset_to_commit(run.worktree, checkpoint, repo=run.repo_path,
                                     lock_wait=settings.CP_INDEX_LOCK_WAIT):
            return run.worktree
        log.warning("run %s: the worktree could not be reset exactly to %s; the final checks go on in a fresh "
                    "checkout", run.pk, checkpoint[:12])
    final_checkout(run, checkpoint, folder, own)
    return str(folder)


def finish(run: Run, plan: FinalPlan, outcome: FinalOutcome | CrashOutcome) -> None:
    """Succeed only when every check passed on the final checkpoint; else stop naming what failed."""
    checkpoint = plan["checkpoint"]
    if outcome.get("crashed"):
        if outcome.get("stop_reason"):
            machine.stop(run, outcome["stop_reason"], f"The final verification was refused: {outcome['failure_message']}")
            return
        machine.stop(run, "crashed", f"The engine failed during the final verification: {outcome['failure_message']}")
        return
    if outcome.get("cancelled"):
        machine.stop(run, "interrupted", "The final verification was stopped before it finished.")
        return
    checks = list(Check.objects.filter(pk__in=outcome["checks"]).select_related("stage").order_by("id"))
    for check in checks:
        machine.event(run, "check_passed" if check.passed else "check_failed",
                      f"Final verification on {checkpoint[:12]}: " + check_sentence(check), stage=check.stage,
                      gate_check=check)
    failed = [c for c in checks if not c.passed]
    if failed:
        names = ", ".join(f"'{c.name}' of stage '{c.stage.key}'" if c.stage else f"'{c.name}'" for c in failed)
        machine.stop(run, "final_verification_failed",
                     f"The whole result does not verify: {names} failed on the final checkpoint {checkpoint[:12]} "
                     f"({check_sentence(failed[0])}) A later stage may have broken an earlier stage's gate.",
                     evidence={"checkpoint": checkpoint, "checks": [c.pk for c in failed],
                               "failed": [c.name for c in failed]})
        return
    machine.succeed(run)
