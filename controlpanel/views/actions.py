"""The run page's actions: what a refused action keeps of what was typed, and the call of
engine.operations each verb makes (``PERFORM``)."""
from __future__ import annotations

from engine import operations
from engine.models import Run

from .common import KEPT_KEY


def _keep(request, run: Run, verb: str, fields: dict, field: str) -> None:
    """Keep what was typed into a refused ``verb`` form of ``run`` (and the field at fault) for the page's next look."""
    if not fields:
        return
    kept = request.session.get(KEPT_KEY) or {}
    kept[f"{run.pk}:{verb}"] = {"fields": fields, "field": field or ""}
    request.session[KEPT_KEY] = kept


def _take_kept(request, run: Run) -> dict:
    """``{verb: {"fields", "field"}}`` kept for ``run`` by refused actions, taken out of the session (shown once)."""
    kept = request.session.get(KEPT_KEY)
    if not kept:
        return {}
    prefix = f"{run.pk}:"
    mine = {key[len(prefix):]: value for key, value in kept.items() if key.startswith(prefix)}
    if mine:
        request.session[KEPT_KEY] = {key: value for key, value in kept.items() if not key.startswith(prefix)}
    return mine


def _start(run: Run, data: dict, who: str) -> str:
    operations.request_start(run, requested_by=who, source="admin")
    return f"Start requested by {who}: run {run.pk} is queued for a worker."


def _approve(run: Run, data: dict, who: str) -> str:
    decision = operations.approve(run, data["decision"], data["artifact"], reviewer=who)
    return f"Decision {decision.pk} approved by {who} for files {decision.artifact[:12]}: the run continues."


def _request_changes(run: Run, data: dict, who: str) -> str:
    decision = operations.request_changes(run, data["decision"], data["artifact"], reviewer=who, note=data["note"],
                                          comments=data["comments"])
    run.refresh_from_db()
    if run.status == "waiting_review":
        return (f"Changes requested by {who} on decision {decision.pk}, but the stage's repair allowance is used up: "
                f"the run waits for review ({run.stop_reason}).")
    return (f"Changes requested by {who} on decision {decision.pk}: a repair session gets your note; the gates, "
            f"the review and the documentation run on its files before the gate asks again.")


def _recheck(run: Run, data: dict, who: str) -> str:
    stage = operations.recheck(run, data["note"], requested_by=who)
    return f"Recheck of stage '{stage.key}' requested by {who}: its gates and reviews run again."


def _recover(run: Run, data: dict, who: str) -> str:
    decision = operations.recover(run, data["decision"], data["note"], data["action"], reviewer=who)
    return f"Recovery by {who} ({decision.action}) on decision {decision.pk}: the run continues."


def _fail(run: Run, data: dict, who: str) -> str:
    failed = operations.fail_run(run, data["reason"], requested_by=who)
    return f"Run {failed.pk} failed. {failed.stop_message}"


# ----------------------------------------------------------------------------- re-run


def also_needs(verb: str, data: dict) -> list[str]:
    """Permissions an action needs beyond its own (ACTIONS) for what its form asks: a re-run started at
    once needs ``engine.start_run``."""
    return ["engine.start_run"] if verb in ("rerun", "continue") and data.get("start") else []


def _initial_for(request, verb: str) -> dict:
    """Initial values of a form that depend on the person: "start it now" of Re-run is unchecked for one
    who may not start a run."""
    if verb in ("rerun", "continue") and not request.user.has_perm("engine.start_run"):
        return {"start": False}
    return {}


def _rerun(run: Run, data: dict, who: str) -> tuple[str, int]:
    new = operations.rerun(run, latest_pipeline=data["latest_pipeline"], start=data["start"], requested_by=who,
                           source="admin", expect_reruns=data.get("seen"))
    which = "the latest pipeline version" if data["latest_pipeline"] else "the same pipeline version"
    then = "queued for a worker" if data["start"] else "pending: press Start to run it"
    return (f"Run {new.pk} created by {who} as a re-run of run {run.pk} ({which}, commit {new.commit[:12]}); "
            f"it is {then}.", new.pk)


def _continue(run: Run, data: dict, who: str) -> tuple[str, int]:
    new = operations.continue_run(run, data["budgets"], start=data["start"], requested_by=who, source="admin",
                                  expect_reruns=data.get("seen"))
    then = "queued for a worker" if data["start"] else "pending: press Start to run it"
    return (f"Run {new.pk} created by {who} to continue run {run.pk} with a raised budget, from commit "
            f"{new.commit[:12]}; run {run.pk} failed. It is {then}.", new.pk)


#: verb -> the call of engine.operations it makes: (run, cleaned form data, user name) -> the success sentence.
PERFORM = {"start": _start, "approve": _approve, "request_changes": _request_changes, "recheck": _recheck,
           "recover": _recover, "fail": _fail, "rerun": _rerun, "continue": _continue}
