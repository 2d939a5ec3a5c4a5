"""A new run from an earlier one: ``rerun`` (an ended run, again from its commit) and ``continue_run`` (a
run stopped at its budget, continued from its last checkpoint with a raised budget).

Both freeze the new run as ``engine.operations`` freezes any run (``_freeze_run``) and link it both ways
(``Run.rerun_of``, ``old.reruns``), with a compare-and-swap on the old run's ``rerun_count`` so that two
clicks make one run. ``engine.operations`` re-exports both.
"""
from __future__ import annotations

import copy

from django.db import transaction
from pydantic import ValidationError

from . import machine
from . import operations as ops
from .budgets import spent_by
from .models import RUN_TERMINAL, Run, RunStatus, StageStatus

#: The stops a person may continue from with a raised budget.
BUDGET_STOPS = ("budget_reached", "budget_exhausted")
#: The budgets' caps, as (level, key): ``None`` level is the run's own.
CAPS = [(None, "max_active_seconds"), (None, "max_attempts"), (None, "max_tokens"), (None, "max_cost_usd"),
        ("stage", "max_tokens"), ("stage", "max_cost_usd"), ("attempt", "max_tokens"), ("attempt", "max_cost_usd")]


def rerun(run, latest_pipeline: bool = False, start: bool = False, requested_by: str = "",
          source: str = "api", expect_reruns: int | None = None) -> Run:
    """Create a new run from an ended (succeeded or failed) run: the same repository path,
    revision text and commit, and the same pipeline version (its frozen snapshot, frozen again
    unchanged: definition, version, roles, profiles), or with ``latest_pipeline`` the saved
    pipeline's current definition with the old run's profile override. The new run's
    ``rerun_of`` is the old run (``old.reruns`` lists the new one); its ``created`` event says
    "Re-run of run N" and the old run gets a ``rerun`` event. ``start``: the new run's start
    is requested in the same transaction (it is then queued). ``expect_reruns``: the number of
    re-runs the person saw (the run page's form sends it): when another re-run was made since
    (a double click), this one is refused; without it, the count read now is expected. Either
    way the count moves by a compare-and-swap, so two re-runs at once make one.

    Returns the new Run. Raises OperationError: ``unknown_run`` / ``not_ended`` [run] (only a
    succeeded or failed run is re-run), ``already_rerun`` [run] (re-run meanwhile), ``definition_tampered`` [run] (its frozen snapshot no
    longer matches its digest), ``unknown_profile`` / ``unknown_role`` / ``adapter_unavailable``
    / ``agent_unavailable`` [profile] (e.g. the latest version lacks a profile the override
    names), ``path_not_found`` / ``not_a_repository`` / ``not_a_directory`` [repo],
    ``unknown_revision`` and the other revision codes [rev] (the old commit is gone from the
    repository). Nothing is created when refused.
    """
    old = ops.get_run(run)
    old.refresh_from_db()
    if old.status not in RUN_TERMINAL:
        raise ops.OperationError("not_ended", f"Run {old.pk} is {old.status}; only an ended run (succeeded or failed) "
                             f"is re-run.", "run")
    override = dict(old.profile_override or {})
    pipeline = old.pipeline
    if latest_pipeline:
        pipeline.refresh_from_db()
        roles = ops._effective_roles(pipeline, override or None)
        snapshot = ops._snapshot_of(pipeline, roles)
        how = f"the latest pipeline version v{pipeline.version}"
    else:
        snapshot = old.definition
        if ops.canonical_sha256(snapshot) != old.definition_sha256:
            raise ops.OperationError("definition_tampered", f"Run {old.pk}'s frozen definition no longer matches its "
                                 f"digest {old.definition_sha256[:12]}; it cannot be frozen again (re-run it with "
                                 f"the latest pipeline instead).", "run")
        # the same checks as a new run: the snapshot's own profiles, the old override
        ops._effective_roles(pipeline, override or None, definition={**snapshot["pipeline"],
                                                                  "profiles": snapshot["profiles"]})
        how = f"the same pipeline version v{snapshot.get('pipeline_version', '?')}"
    seen = old.rerun_count if expect_reruns is None else expect_reruns
    return ops._freeze_run(pipeline, snapshot, old.repo_path, old.revision, override, commit_ref=old.commit,
                       rerun_of=old, how=how, start=start, requested_by=requested_by, source=source,
                       reruns_seen=seen)


def _cap(budgets: dict, level: str | None, key: str):
    return (budgets.get(level) or {}).get(key) if level else budgets.get(key)


def _raised_budgets(old: dict, given) -> dict:
    """``given`` validated as a pipeline's ``budgets`` (engine/pipeline/schema/profiles.py ``Budgets``), each cap at least
    the old one (or none: unlimited) and one of them higher. Raises OperationError [budgets]."""
    from .pipeline.schema import Budgets  # noqa: PLC0415 - the schema imports much; only this needs it here

    if not isinstance(given, dict):
        raise ops.OperationError("invalid_budgets", "budgets must be a mapping (the pipeline's budgets, raised).",
                                 "budgets")
    # what is not given stays as it was (a cap is removed only by giving it as null)
    merged = {**old, **{key: value for key, value in given.items() if key not in ("stage", "attempt")}}
    for level in ("stage", "attempt"):
        if level in given:
            merged[level] = ({**(old.get(level) or {}), **given[level]} if isinstance(given[level], dict)
                             else given[level])
    try:
        new = Budgets.model_validate(merged).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc") or ())
        raise ops.OperationError("invalid_budgets", f"budgets{'.' + where if where else ''}: {first.get('msg')}",
                                 "budgets") from None
    raised = False
    for level, key in CAPS:
        before, after = _cap(old, level, key), _cap(new, level, key)
        name = f"budgets.{level + '.' if level else ''}{key}"
        if before is not None and after is not None and after < before:
            raise ops.OperationError("budget_not_raised", f"{name} would be lowered from {before:g} to {after:g}: a "
                                     "continued run's budget is raised, never lowered.", "budgets")
        raised = raised or (before is not None and (after is None or after > before))
    if not raised:
        raise ops.OperationError("budget_not_raised", "No cap of the budgets was raised: raise (or remove) the one "
                                 "the run reached.", "budgets")
    return new


def continue_run(run, budgets, start: bool = True, requested_by: str = "", source: str = "api",
                 expect_reruns: int | None = None) -> Run:
    """Continue a run its budget stopped (``budget_reached``, ``budget_exhausted``) as a new run with a raised
    ``budgets`` (merged over the old ones: a cap not given stays; null removes one): the same frozen definition
    but those budgets, on the old run's repository, starting from its
    last checkpoint (the stages that passed are carried over as passed, their commits kept), linked both ways
    (``rerun_of``). The stopped attempt's patch, final message and model calls go to the new run's first
    attempt of the stopped stage as evidence (``Run.carried``, engine/steps/prompts.py). What the runs before it
    spent counts against the new run's own run-level caps (``carried["spent"]``: a raised cap is the chain's, not
    a fresh allowance). The old run fails,
    saying which run continues it. ``start``: the new run is queued at once.

    Returns the new Run. Raises OperationError: ``unknown_run`` [run], ``not_budget_stopped`` [run] (only a run
    waiting after a budget stop is continued), ``already_rerun`` [run] (continued meanwhile: a second click),
    ``definition_tampered`` [run], ``invalid_budgets`` / ``budget_not_raised`` [budgets], and the repository
    codes of a new run. Nothing is created when refused."""
    old = ops.get_run(run)
    old.refresh_from_db()
    if old.status != RunStatus.WAITING_REVIEW or old.stop_reason not in BUDGET_STOPS:
        raise ops.OperationError("not_budget_stopped", f"Run {old.pk} is {old.status}"
                                 f"{f' ({old.stop_reason})' if old.stop_reason else ''}; only a run its budget stopped "
                                 "(budget_reached, budget_exhausted) is continued with a raised budget.", "run")
    if ops.canonical_sha256(old.definition) != old.definition_sha256:
        raise ops.OperationError("definition_tampered", f"Run {old.pk}'s frozen definition no longer matches its "
                                 f"digest {old.definition_sha256[:12]}; it cannot be continued.", "run")
    new_budgets = _raised_budgets(old.definition["pipeline"].get("budgets") or {}, budgets)
    snapshot = copy.deepcopy(old.definition)
    snapshot["pipeline"]["budgets"] = new_budgets
    stages = list(old.stages.order_by("order"))
    passed = [stage for stage in stages if stage.status == StageStatus.PASSED and stage.checkpoint_commit]
    checkpoint = passed[-1].checkpoint_commit if passed else old.commit
    stopped = next((stage for stage in stages if stage.status != StageStatus.PASSED), None)
    attempt = (old.attempts.filter(stage=stopped).order_by("-number").first() if stopped is not None else None)
    how = (f"continued with a raised budget from its last checkpoint {checkpoint[:12]}" if passed
           else "continued with a raised budget from its start")
    seen = old.rerun_count if expect_reruns is None else expect_reruns
    new = ops._freeze_run(old.pipeline, snapshot, old.repo_path, checkpoint, dict(old.profile_override or {}),
                          commit_ref=checkpoint, rerun_of=old, how=how, start=False, requested_by=requested_by,
                          source=source, reruns_seen=seen)
    with transaction.atomic(durable=True):
        new = Run.objects.select_for_update().get(pk=new.pk)
        carried = {stage.key: stage for stage in passed}
        for stage in new.stages.order_by("order"):
            done = carried.get(stage.key)
            if done is not None:
                machine.carry_stage(stage, done)
        spent = {"tokens": 0, "cost_usd": 0.0, "unpriced_calls": 0}
        for found in [spent_by(row) for row in old.attempts.all()] + [(old.carried or {}).get("spent") or {}]:
            for key in spent:
                spent[key] += found.get(key) or 0
        new.carried = {"run": old.pk, "stage": stopped.key if stopped else "", "attempt": attempt.pk if attempt else None,
                       "stop_reason": old.stop_reason, "stop_message": old.stop_message,
                       "stages": [stage.key for stage in passed], "spent": spent}
        new.save(update_fields=["carried"])
        machine.event(new, "continued", f"Continues run {old.pk} with a raised budget: "
                      f"{len(passed)} stage(s) carried over as passed ({', '.join(carried) or 'none'}), from "
                      f"{checkpoint[:12]}; the stopped attempt's patch and calls go to this run's first attempt of "
                      f"stage '{stopped.key if stopped else '-'}'.", data={"continues": old.pk, "budgets": new_budgets})
        if start:
            ops.request_start(new, requested_by=requested_by, source=source)
    ops.fail_run(old, f"Continued as run {new.pk} with a raised budget", requested_by=requested_by)
    return new
