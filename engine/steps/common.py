"""What the step kinds share beyond paths: the lease fence (a step's writes and launches happen
only while its lease holds), waits for git's index lock, the frozen definition's integrity check,
the run's manifests, its reviewers, and what a defect leads to (a repair or a stop)."""
from __future__ import annotations

import json
import os
import time

from django.conf import settings
from django.db import transaction

from .. import machine, workspace
from ..models import AttemptStatus, Manifest, Run, RunStatus, StageRun
from .paths import control_path, sha256_file, var_path
from .plans import CheckpointPlan, StagePlan


#: Kept for callers of this module: engine/machine.py decides what a stored value may hold.
storable = machine.storable


def stage_row(plan: StagePlan) -> StageRun:
    return StageRun.objects.select_related("run").get(pk=plan["stage_id"])


class LeaseLost(Exception):
    """The step's lease was taken away (the run was failed, or a reconciler took it over) while
    its process was starting: the process tree is stopped and the step's result is late."""


def lease_guard(run_id: int, lease: str):
    """An ``on_start`` callback for ``process.run_supervised`` that raises LeaseLost when ``lease``
    is no longer the run's token. It closes the gap between the last look at the lease and the
    launch: a ``fail_run`` that took the lease before the process started finds it by its marker
    or its recorded pid, and one that took it after is seen here."""
    def guard(pid: int, create_time: float) -> None:
        if not Run.objects.filter(pk=run_id, lease_token=lease, status=RunStatus.RUNNING).exists():
            raise LeaseLost(f"the lease of run {run_id} was taken away as process {pid} started")
    return guard


def fenced(run_id: int, lease: str):
    """Lock the run inside the caller's transaction; None when ``lease`` is no longer its token."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.lease_token != lease or run.status != RunStatus.RUNNING:
        return None
    return run


def lock_waiter(run: Run, plan: dict, what: str):
    """An ``on_wait`` callback for workspace's index operations: the first wait for a live
    ``index.lock`` holder is said on the run (when ``plan``'s lease still holds it)."""
    def on_wait(info: dict) -> None:
        holders = ", ".join(f"pid {h['pid']} ({h['name'] or '?'})" for h in info["holders"][:5]) or "a live process"
        with transaction.atomic():
            locked = fenced(run.pk, plan["lease"])
            if locked is not None:
                machine.event(locked, "index_lock_wait",
                              f"git's index lock of the worktree ({info['path']}) is held by {holders}; {what} waits "
                              f"for it (up to {info['wait_seconds']:.0f} s) and tries again.",
                              stage_id=plan.get("stage_id"), data={"path": info["path"], "holders": info["holders"]})
    return on_wait


def lock_wait_seconds(plan: CheckpointPlan) -> float:
    """Seconds the step of ``plan`` may still wait for git's index lock: CP_INDEX_LOCK_WAIT from the
    step's start (``plan["started"]``, a ``time.time()``), or all of it when the plan has none."""
    limit = float(settings.CP_INDEX_LOCK_WAIT)
    started = plan.get("started")
    return max(0.0, limit - (time.time() - started)) if started else limit


def definition_tampered(run: Run) -> dict | None:
    """None when the run's frozen definition is intact, else ``{"message", "evidence"}``.

    The digest of the row's definition must equal the row's ``definition_sha256`` and the control
    record ``definition.sha256`` written when the run was created (in the var directory, which no
    agent or gate can reach): the file is the authority, so an edit of both columns is caught too.
    """
    actual = machine.definition_digest(run.definition)
    try:
        recorded = var_path(os.path.join(run.control_dir, "definition.sha256")).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    expected = {"row": run.definition_sha256, **({"control_record": recorded} if recorded else {})}
    if all(actual == digest for digest in expected.values()):
        return None
    return {"message": f"The run's frozen definition no longer has the digest it was frozen with (sha256 "
                       f"{(recorded or run.definition_sha256)[:12]}, now {actual[:12]}): it was changed after the run "
                       f"was created. Nothing was launched; a new run of the saved pipeline is needed.",
            "evidence": {"actual_sha256": actual, **{f"{k}_sha256": v for k, v in expected.items()}}}


def manifest_excludes(run: Run) -> list[str]:
    """The run's manifest exclusions: the engine's DEFAULT_EXCLUDES plus the pipeline's ``exclude``."""
    return list(workspace.DEFAULT_EXCLUDES) + list(run.definition["pipeline"].get("exclude") or [])


def save_manifest(run: Run, stage: StageRun | None, data: dict) -> Manifest:
    """Store a manifest dict (``workspace.manifest``) as a control record and a row; reuses an equal one."""
    existing = Manifest.objects.filter(run=run, stage=stage, digest=data["digest"], base_commit=data["base"]).first()
    if existing is not None:
        return existing
    rel = control_path(run, "manifests", f"{data['digest']}-{data['base'][:12]}.json")
    path = var_path(rel)
    path.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    counts = {"added": 0, "modified": 0, "deleted": 0}
    for change in data["changes"]:
        key = {"added": "added", "deleted": "deleted"}.get(change["status"], "modified")
        counts[key] += 1
    return Manifest.objects.create(
        run=run, stage=stage, digest=data["digest"], base_commit=data["base"], path=rel, sha256=sha256_file(path),
        files=len(data["entries"]), excluded=data.get("excluded", []), added=counts["added"],
        modified=counts["modified"], deleted=counts["deleted"],
    )


def changed_paths(before: dict, after: dict) -> list[str]:
    """Paths whose blob or mode differs between two manifests of the same base."""
    old = {e["path"]: (e["mode"], e["blob"]) for e in before["entries"]}
    new = {e["path"]: (e["mode"], e["blob"]) for e in after["entries"]}
    return sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))


def reviewers(run: Run) -> list[str]:
    """The reviewer profiles of the run, in order (``roles.reviewer``: one name or a list); all must
    pass. ``[]`` when the pipeline has no review (``reviewer: null``)."""
    return role_profiles(run.definition["roles"].get("reviewer"))


def role_profiles(names) -> list[str]:
    """The profile names a role's entry in ``roles`` holds: one name, a list (reviewers), or None (a role
    the pipeline leaves out: no profile)."""
    if names is None:
        return []
    return [names] if isinstance(names, str) else list(names)


def passed_reviewers(stage: StageRun) -> set[str]:
    """Reviewer profiles whose verdict was ``pass`` on the stage's verified files (its accepted
    manifest), given after the last note a person wrote about the stage (a recovery, a recheck, a
    request for changes: a verdict given before it was not given with what the person said, so the
    reviewer reads it and answers again, engine/steps/prompts.py ``people_section``)."""
    done = set()
    reviews = stage.attempts.filter(operation="review", start_manifest=stage.accepted_manifest,
                                    status=AttemptStatus.SUCCEEDED, late=False)
    heard = (stage.decisions.exclude(note="").exclude(decided_at=None).order_by("-decided_at")
             .values_list("decided_at", flat=True).first())
    if heard is not None:
        reviews = reviews.filter(created_at__gt=heard)
    for attempt in reviews:
        if (attempt.verdict or {}).get("verdict") == "pass":
            done.add(attempt.profile_name)
    return done


def defect(run: Run, stage: StageRun, kind: str, name: str, digest: str, message: str, evidence: dict) -> None:
    """A failed gate or a reviewer's ``repair``: a repair attempt, or a stop when none may help."""
    allowance = stage.spec.get("repair_allowance", 0)
    if kind == "gate" and allowance == 0:  # no repair may follow: the failed gate itself is the reason
        machine.stop(run, "gate_failed", f"{message} The stage allows no repairs (repair_allowance: 0).",
                     stage=stage, evidence=evidence)
        return
    decision = machine.defect(stage, kind, name, digest, message, evidence)
    if decision == machine.REPAIR:
        machine.event(run, "repair_needed",
                      f"{message} Repair {stage.repairs_used} of {allowance} starts a fresh session with this "
                      f"evidence; the checks run again afterwards.", stage=stage, data={"defect": kind, "name": name})
        return
    if decision == machine.UNCHANGED_FAILURE:
        machine.stop(run, "unchanged_failure",
                     f"The same failure again on unchanged files ({digest[:12]}): {message} Another repair would "
                     f"not help.", stage=stage, evidence={**evidence, "manifest": digest})
        return
    machine.stop(run, "repair_exhausted",
                 f"{message} The stage's repair allowance ({allowance}) is used up ({stage.repairs_used} repairs).",
                 stage=stage, evidence={**evidence, "manifest": digest})


def hosts_sentence(refused: list[dict], shown: int = 10) -> str:
    """``host:port`` of the refusals, distinct and sorted, the first ``shown`` and how many more."""
    hosts = sorted({f"{item['host']}:{item['port']}" for item in refused})
    more = f" and {len(hosts) - shown} more (all on the attempt's network record)" if len(hosts) > shown else ""
    return ", ".join(hosts[:shown]) + more
