"""The verify step: the baseline checks and the stage's gates (engine/steps/gates.py) run on the
worktree until they ran on one unchanged set of files, and what their results lead to: the
review, a repair, or a stop."""
from __future__ import annotations

from django.db import transaction

from .. import machine, workspace
from ..checks import globs
from ..models import Check, Run, StageRun
from ..redaction import secret_env_values
from . import agreed
from .attempts import stop_outward, stop_tampered, tamper_report
from .common import (
    changed_paths,
    defect,
    fenced,
    manifest_excludes,
    passed_reviewers,
    reviewers,
    save_manifest,
    stage_row,
)
from .gates import check_sentence
from .paths import run_env
from .plans import StagePlan, VerifyOutcome


def begin(run: Run, stage: StageRun, plan: StagePlan) -> StagePlan:
    """Say that the stage's gates run now; nothing else is persisted before they do."""
    machine.event(run, "verify", f"Verifying stage '{stage.key}': running its gates on the worktree.",
                  stage=stage)
    return plan


def execute(plan: StagePlan, should_stop) -> VerifyOutcome:
    """Run the baseline checks and the stage's gates until they ran on one unchanged artifact.

    A gate that changes the files (or anything else that does) makes passing results belong to
    the old manifest: they are marked stale and every gate runs again on the new one, up to 3
    rounds. A failed gate ends verification at once: a failure is never re-run away.
    """
    stage = stage_row(plan)
    run = stage.run
    gates = agreed.stage_gates(run, stage)
    env = run_env(run, stage.key)
    excludes = manifest_excludes(run)
    for round_no in range(1, 4):
        before = workspace.manifest(run.worktree, stage.base_commit, excludes)
        manifest_row = save_manifest(run, stage, before)
        tamper = tamper_report(run, before, f"stages/{stage.order + 1:02d}-{stage.key}/verify",
                               secret_env_values(env))
        if tamper is not None:  # a weakened check never runs: its result could not be trusted
            tamper["dropped"] = agreed.dropped(run, stage, before["tree"], f"stages/{stage.order + 1:02d}-{stage.key}"
                                               "/verify", env, should_stop, plan["lease"])
            return {"tamper": tamper, "checks": [], "digest": before["digest"]}
        outward = workspace.outward_symlinks(run.worktree, before["changes"])
        if outward:
            return {"outward": outward, "checks": [], "digest": before["digest"]}
        checks = []
        agreed_ids = agreed.ledgers(run, stage, gates, env, should_stop, plan["lease"])
        if should_stop():
            return {"cancelled": True, "checks": checks}
        for gate, kind in gates:
            # every agreed test passes again, by id; apart from the stage's new test modules
            for check in agreed.gate_checks(run, stage, gate, kind, before["digest"], before["changes"], env,
                                            should_stop, round_no, plan["lease"], agreed_ids.get(gate["name"])):
                Check.objects.filter(pk=check.pk).update(manifest=manifest_row)
                checks.append(check.pk)
                if should_stop():
                    return {"cancelled": True, "checks": checks}
                if not check.passed:
                    # a failure stops the stage whatever the files are now: nothing to re-run for
                    return {"digest": before["digest"], "checks": checks, "rounds": round_no}
        if workspace.manifest_digest(run.worktree, stage.base_commit, excludes) == before["digest"]:
            return {"digest": before["digest"], "checks": checks, "rounds": round_no,
                    "changed": [change["path"] for change in before["changes"]]}
        after = workspace.manifest(run.worktree, stage.base_commit, excludes)
        Check.objects.filter(pk__in=checks).update(stale=True)
        changed = changed_paths(before, after)
        stray = globs.outside(changed, list(stage.spec["scope"]))
        if stray:  # no round can make these acceptable: stop now, deterministically
            return {"gates_wrote_outside": stray, "checks": checks, "digest": after["digest"]}
        with transaction.atomic():
            locked = fenced(run.pk, plan["lease"])
            if locked is not None:
                machine.event(locked, "artifact_changed",
                              f"The files changed while the gates ran ({before['digest'][:12]} -> "
                              f"{after['digest'][:12]}: {', '.join(changed[:10])}); those results belong to the old "
                              f"files and every gate runs again. Gates should write logs under $TMPDIR, not into "
                              f"the worktree.", stage=stage, data={"changed": changed})
    return {"unstable": True, "checks": checks}


def finish(run: Run, stage: StageRun, plan: StagePlan, outcome: VerifyOutcome) -> None:
    """Record the gates' results: every gate passed on files inside the scope goes to the review
    (or past it, when every reviewer already passed these files), a failed gate is a defect."""
    checks = list(Check.objects.filter(pk__in=outcome.get("checks", [])).order_by("id"))
    if outcome.get("cancelled"):
        machine.stop(run, "interrupted", f"Verification of stage '{stage.key}' was stopped before it finished.",
                     stage=stage)
        return
    if outcome.get("unstable"):
        machine.stop(run, "artifact_unstable",
                     f"The files of stage '{stage.key}' kept changing while the gates ran (3 rounds); no result "
                     f"can be trusted.", stage=stage, evidence={"checks": [c.pk for c in checks]})
        return
    if outcome.get("tamper"):
        stop_tampered(run, stage, outcome["tamper"], "Something between the agent's attempt and the gates",
                      {"manifest": outcome.get("digest")})
        return
    if outcome.get("outward"):
        stop_outward(run, stage, outcome["outward"], "Something between the agent's attempt and the gates",
                     {"manifest": outcome.get("digest")})
        return
    if outcome.get("gates_wrote_outside"):
        stray = outcome["gates_wrote_outside"]
        machine.stop(run, "scope_violation",
                     f"While the gates of stage '{stage.key}' ran, files outside its scope "
                     f"({', '.join(stage.spec['scope'])}) changed: {', '.join(stray[:10])}. A gate writing into the "
                     f"worktree would put them in the checkpoint; write logs under $TMPDIR instead.",
                     stage=stage, evidence={"outside": stray, "checks": [c.pk for c in checks]})
        return
    for check in checks:
        machine.event(run, "check_passed" if check.passed else "check_failed", check_sentence(check),
                      stage=stage, gate_check=check)
    failed = [c for c in checks if not c.passed]
    if failed:
        check = failed[0]
        evidence = {"check": check.pk, "gate": check.name, "manifest": check.manifest_digest}
        if check.failure_kind in ("missing_executable", "cancelled"):  # no repair can give the engine bash
            machine.stop(run, "gate_failed", check_sentence(check), stage=stage, evidence=evidence)
            return
        defect(run, stage, "gate", check.name, check.manifest_digest, check_sentence(check), evidence)
        return
    allowed = list(stage.spec["scope"])
    if stage.documented_manifest:  # the documentation agent's changes are part of these files
        allowed += list(run.definition["pipeline"]["documentation_paths"])
    stray = globs.outside(outcome.get("changed", []), allowed)
    if stray:
        machine.stop(run, "scope_violation",
                     f"The verified files of stage '{stage.key}' include changes outside its scope "
                     f"({', '.join(allowed)}): {', '.join(stray[:10])}. Something other than the agent "
                     f"wrote them (a gate writing into the worktree?); they would land in the checkpoint.",
                     stage=stage, evidence={"outside": stray, "manifest": outcome["digest"]})
        return
    names = reviewers(run)
    machine.event(run, "verified",
                  f"Every gate of stage '{stage.key}' exited 0 on files {outcome['digest'][:12]}; they go to "
                  + ("the independent review." if names else "the next step (no reviewer is configured)."),
                  stage=stage)
    machine.gates_passed(stage, outcome["digest"])
    if not names:
        machine.event(run, "review_skipped", f"No review of files {outcome['digest'][:12]}: the pipeline has no "
                      f"reviewer (roles.reviewer: null); only the gates decided.", stage=stage)
        machine.reviewed(run, stage)
    elif not [name for name in names if name not in passed_reviewers(stage)]:
        # a recovery or recheck verified files every reviewer already passed: their verdicts stand
        machine.event(run, "review_passed", f"Every reviewer already passed files {outcome['digest'][:12]}; their "
                      f"verdicts stand for these same files.", stage=stage)
        machine.reviewed(run, stage)
