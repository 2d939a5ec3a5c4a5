"""The run detail page of the Control Panel and its action buttons, inside the admin site.

``RunPages(model_admin).urls()`` gives the routes that ``RunAdmin.get_urls`` puts before the
admin's own (names in the ``admin`` namespace; ``<run>`` and the others are integer ids):

==============================  ==========================  ==================================================
``<run>/detail/``               ``engine_run_detail``       the page (staff with view permission)
``<run>/state/?v=VERSION``      ``engine_run_state``        204 while nothing changed, else ``HX-Refresh`` (the
                                                            page of a queued or running run polls it)
``<run>/attempt/<a>/tail/``     ``engine_run_attempt_tail`` the last ``TAIL_BYTES`` of the attempt's display log
                                                            (polled while the attempt is open, then no more)
``<run>/attempt/<a>/diff/``     ``engine_run_attempt_diff`` the attempt's patch as a coloured diff (the first
                                                            ``DIFF_BYTES``)
``<run>/check/<c>/log/``        ``engine_run_check_log``    a check's log, as text
``<run>/action/<verb>/``        ``engine_run_action``       POST only: start, approve, recheck, recover, fail
==============================  ==========================  ==================================================

Each action needs its permission (``ACTIONS``; 403 otherwise), validates its form
(controlpanel.forms) and calls only ``engine.operations``; a refusal comes back as an error
message naming the field, success as a success message, and both redirect to the page.

Cost of the page: a fixed number of queries whatever the number of attempts, checks and
events (the run, its stages, attempts, checks, decisions, the last ``EVENT_LIMIT`` events);
files are referred to, never read, except the tail of an open attempt's log (one seek and
at most ``TAIL_BYTES``). Patches and finished attempts' logs load on demand.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from engine import operations, process
from engine.admin import attempt_file
from engine.models import ATTEMPT_OPEN, RUN_ACTIVE, RUN_TERMINAL, Attempt, Check, Decision, Run, RunStatus

from .forms import ApproveForm, FailForm, RecheckForm, RecoverForm, StartForm, first_error

#: Bytes of an attempt's display log the tail endpoint returns (read from the end, never the whole file).
TAIL_BYTES = 64 * 1024
#: Bytes of a patch the diff view renders; the whole patch stays one link away.
DIFF_BYTES = 512 * 1024
#: Events shown on the page, the most recent ones; the rest are one link away (the events list).
EVENT_LIMIT = 500
#: Seconds between two looks of the page (htmx) at an open attempt's log and at an active run's state.
TAIL_POLL_SECONDS = 2
STATE_POLL_SECONDS = 3

#: verb -> (permission, form, button label)
ACTIONS = {
    "start": ("engine.start_run", StartForm, "Start"),
    "approve": ("engine.approve_run", ApproveForm, "Approve"),
    "recheck": ("engine.recheck_run", RecheckForm, "Recheck"),
    "recover": ("engine.recover_run", RecoverForm, "Recover"),
    "fail": ("engine.fail_run", FailForm, "Fail"),
}

#: Usage keys summed and shown (engine.agents.base.USAGE_KEYS has more; these are the ones a person reads).
USAGE_SHOWN = ("input_tokens", "output_tokens", "cached_tokens", "cost_usd")

_ATTEMPT_OUTCOME = {"preparing": "live", "running": "live", "succeeded": "ok", "failed": "bad", "timeout": "bad",
                    "cancelled": "off", "interrupted": "warn"}
_VERDICT_OUTCOME = {"pass": "ok", "repair": "warn", "escalate": "warn"}


# ----------------------------------------------------------------------------- small helpers


def seconds_text(seconds: float | None) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``; '' for None."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _span(start, end) -> float | None:
    if start is None:
        return None
    return max(0.0, ((end or timezone.now()) - start).total_seconds())


def add_usage(total: dict, usage: dict | None) -> dict:
    """Add an attempt's reported ``usage`` into ``total`` (USAGE_SHOWN keys; None stays None until reported)."""
    for key in USAGE_SHOWN:
        value = (usage or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            total[key] = (total.get(key) or 0) + value
    return total


def empty_usage() -> dict:
    """A usage total with nothing reported yet: every USAGE_SHOWN key None."""
    return {key: None for key in USAGE_SHOWN}


def usage_text(usage: dict) -> dict:
    """USAGE_SHOWN keys formatted for a person: ``12,345`` tokens, ``$0.0123``; '—' when not reported."""
    shown = {}
    for key in USAGE_SHOWN:
        value = usage.get(key)
        if value is None:
            shown[key] = "—"
        elif key == "cost_usd":
            shown[key] = f"${value:,.4f}"
        else:
            shown[key] = f"{int(value):,}"
    return shown


def exit_text(exit_code: int | None, signal: int | None) -> str:
    """``exit 0``, ``signal 9`` or '—' (no exit status recorded)."""
    if exit_code is not None:
        return f"exit {exit_code}"
    if signal is not None:
        return f"signal {signal}"
    return "—"


def stored_file(run: Run, rel: str) -> Path | None:
    """A file recorded by path relative to CP_VAR_DIR, when it resolves inside ``run``'s control records."""
    if not rel or os.path.isabs(rel) or "\x00" in rel:
        return None
    base = os.path.realpath(os.path.join(settings.VAR_DIR, run.control_dir))
    real = os.path.realpath(os.path.join(settings.VAR_DIR, rel))
    if not real.startswith(base + os.sep) or not os.path.isfile(real):
        return None
    return Path(real)


def render_diff(text: str) -> str:
    """A unified diff as HTML: a ``<pre class="cp-diff">`` whose lines are spans classed by their kind
    (``cp-dhead`` git headers, ``cp-dfile`` ---/+++ lines, ``cp-dhunk`` hunk headers, ``cp-dadd`` added,
    ``cp-ddel`` removed, ``cp-dctx`` context). Escaped."""
    out = []
    for line in text.splitlines():
        if line.startswith(("diff --git", "index ", "new file", "deleted file", "old mode", "new mode",
                            "similarity", "rename ", "Binary files")):
            cls = "cp-dhead"
        elif line.startswith(("+++ ", "--- ")):
            cls = "cp-dfile"
        elif line.startswith("@@"):
            cls = "cp-dhunk"
        elif line.startswith("+"):
            cls = "cp-dadd"
        elif line.startswith("-"):
            cls = "cp-ddel"
        else:
            cls = "cp-dctx"
        out.append(f'<span class="{cls}">{escape(line)}</span>')
    # each line is a block of its own (its colour spans the width): no newline between them
    return mark_safe('<pre class="cp-diff">' + "".join(out) + "</pre>")


def read_head(path: Path, limit: int) -> tuple[str, int]:
    """The first ``limit`` bytes of ``path`` as text (UTF-8, errors replaced) and the file's size in bytes."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(limit)
    return data.decode("utf-8", errors="replace"), size


def applicable_actions(run: Run, decisions: list[Decision]) -> dict[str, dict]:
    """The actions that apply to ``run`` now, each with the initial values of its form.

    Start: pending. Approve: waiting_approval with a pending approval decision (its id and
    artifact). Recheck: waiting_review or waiting_approval. Recover: waiting_review with a
    pending review decision (its id). Fail: any status but succeeded or failed.
    """
    pending = {d.kind: d for d in decisions if d.state == Decision.State.PENDING}  # the last one of each kind
    found = {}
    if run.status == RunStatus.PENDING:
        found["start"] = {}
    if run.status == RunStatus.WAITING_APPROVAL and Decision.Kind.APPROVAL in pending:
        decision = pending[Decision.Kind.APPROVAL]
        found["approve"] = {"decision": decision.pk, "artifact": decision.artifact}
    if run.status in (RunStatus.WAITING_REVIEW, RunStatus.WAITING_APPROVAL):
        found["recheck"] = {}
    if run.status == RunStatus.WAITING_REVIEW and Decision.Kind.REVIEW in pending:
        found["recover"] = {"decision": pending[Decision.Kind.REVIEW].pk, "action": "retry"}
    if run.status not in RUN_TERMINAL:
        found["fail"] = {}
    return found


def state_version(run: Run) -> str:
    """What the page of an active run compares to know that it changed: status and the last event's id."""
    last = run.events.order_by("-id").values_list("id", flat=True).first() or 0
    return f"{run.status}:{last}"


# ----------------------------------------------------------------------------- the page's rows


@dataclass
class Box:
    """One step of the timeline: an attempt or a check, coloured by ``outcome`` (ok, bad, warn, off, live)."""

    label: str
    outcome: str
    duration: str
    anchor: str
    title: str
    weight: str
    start: float


@dataclass
class AttemptRow:
    """An attempt as its table row shows it: outcome class, texts, file links (URL by kind), htmx URLs."""

    obj: Attempt
    outcome: str
    elapsed: str
    usage: dict
    files: dict
    live: bool
    exit: str
    verdict: str = ""
    tail_url: str = ""
    diff_url: str = ""
    patch_open: bool = False


@dataclass
class CheckRow:
    """A check as its table row shows it."""

    obj: Check
    outcome: str
    elapsed: str
    log_url: str
    running: bool
    exit: str
    verdict: str


@dataclass
class StageBlock:
    """A stage's part of the page (``obj`` None: the checks of no stage): its rows, timeline boxes and usage."""

    obj: object
    repair_allowance: int
    human_gate: bool
    duration: str
    usage: dict = field(default_factory=empty_usage)
    attempts: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    boxes: list = field(default_factory=list)


def _weight(seconds: float | None) -> str:
    # wider for longer steps, without letting one long step hide the short ones
    return f"{1 + math.sqrt(max(0.0, seconds or 0.0)):.2f}"


def _moment(*stamps) -> float:
    for stamp in stamps:
        if stamp is not None:
            return stamp.timestamp()
    return float("inf")


def attempt_row(run: Run, attempt: Attempt) -> AttemptRow:
    """An attempt as the page shows it (no query: ``attempt.run`` is ``run``)."""
    live = attempt.status in ATTEMPT_OPEN
    seconds = attempt.elapsed_seconds if attempt.elapsed_seconds is not None else (
        _span(attempt.started_at, attempt.ended_at) if live else None)
    outcome = _ATTEMPT_OUTCOME.get(attempt.status, "off")
    verdict = ""
    if attempt.operation == "review" and attempt.status == "succeeded":
        if attempt.verdict:
            verdict = str(attempt.verdict.get("verdict", ""))
            outcome = _VERDICT_OUTCOME.get(verdict, "bad")
        elif attempt.verdict_problem:
            verdict, outcome = "no valid verdict", "bad"
    if attempt.late:
        outcome = "off"
    files = {}
    for kind in ("prompt", "log", "raw", "patch"):
        if attempt_file(attempt, kind) is not None:
            files[kind] = reverse("admin:engine_attempt_file", args=[attempt.pk, kind])
    row = AttemptRow(obj=attempt, outcome=outcome, elapsed=seconds_text(seconds), live=live, verdict=verdict,
                     usage=usage_text(add_usage(empty_usage(), attempt.usage)), files=files,
                     exit=exit_text(attempt.exit_code, attempt.signal))
    if "log" in files:
        row.tail_url = reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])
    if "patch" in files:
        row.diff_url = reverse("admin:engine_run_attempt_diff", args=[run.pk, attempt.pk])
    return row


def check_row(run: Run, check: Check) -> CheckRow:
    running = check.ended_at is None and check.exit_code is None and check.signal is None and not check.failure_kind
    if running:
        outcome = "live"
    elif check.stale:
        outcome = "off"
    else:
        outcome = "ok" if check.passed else "bad"
    log_url = (reverse("admin:engine_run_check_log", args=[run.pk, check.pk])
               if stored_file(run, check.log_path) is not None else "")
    seconds = check.elapsed_seconds if check.elapsed_seconds is not None else (
        _span(check.started_at, None) if running else None)
    verdict = "running" if running else ("stale" if check.stale else ("pass" if check.passed else "fail"))
    return CheckRow(obj=check, outcome=outcome, elapsed=seconds_text(seconds), log_url=log_url, running=running,
                    exit=exit_text(check.exit_code, check.signal), verdict=verdict)


def build_page(run: Run) -> dict:
    """Everything the detail page shows, in a fixed number of queries (see the module's docstring)."""
    stages = list(run.stages.order_by("order"))
    attempts = list(run.attempts.select_related("result_manifest").order_by("stage__order", "number"))
    checks = list(run.checks.order_by("id"))
    decisions = list(run.decisions.order_by("id"))
    event_count = run.events.count()
    events = list(run.events.order_by("-id")[:EVENT_LIMIT])[::-1]

    spec = {s["key"]: s for s in run.definition.get("pipeline", {}).get("stages", [])}
    blocks, by_id = [], {}
    for stage in stages:
        stage.run = run
        own = spec.get(stage.key, {})
        block = StageBlock(obj=stage, repair_allowance=own.get("repair_allowance", 0),
                           human_gate=bool(own.get("human_gate")),
                           duration=seconds_text(_span(stage.started_at, stage.finished_at)
                                                 if stage.finished_at or stage.status == "running" else None))
        blocks.append(block)
        by_id[stage.pk] = block
    loose = StageBlock(obj=None, repair_allowance=0, human_gate=False, duration="")  # checks of no stage
    total = empty_usage()
    for attempt in attempts:
        attempt.run = run
        row = attempt_row(run, attempt)
        block = by_id.get(attempt.stage_id, loose)
        block.attempts.append(row)
        add_usage(block.usage, attempt.usage)
        add_usage(total, attempt.usage)
        label = f"{attempt.operation} {attempt.number}" + (f" · {row.verdict}" if row.verdict else "")
        title = f"attempt {attempt.number}: {attempt.operation}, {attempt.status}" + (
            f" ({attempt.failure_kind})" if attempt.failure_kind else "")
        block.boxes.append(Box(label=label, outcome=row.outcome, duration=row.elapsed or attempt.status,
                               anchor=f"attempt-{attempt.pk}", title=title, weight=_weight(attempt.elapsed_seconds),
                               start=_moment(attempt.started_at, attempt.created_at)))
    for check in checks:
        check.run = run
        row = check_row(run, check)
        block = by_id.get(check.stage_id, loose)
        block.checks.append(row)
        block.boxes.append(Box(label=f"{check.kind} · {check.name}", outcome=row.outcome,
                               duration=row.elapsed or row.verdict, anchor=f"check-{check.pk}",
                               title=f"{check.get_kind_display()} '{check.name}': {row.verdict}"
                                     + (f" ({check.failure_kind})" if check.failure_kind else ""),
                               weight=_weight(check.elapsed_seconds),
                               start=_moment(check.started_at, check.ended_at)))
    for block in blocks + [loose]:
        block.boxes.sort(key=lambda box: box.start)
        patched = [row for row in block.attempts if row.diff_url and row.obj.operation != "review"]
        if patched:
            patched[-1].patch_open = True  # the stage's latest change of files is shown open
    if loose.boxes:
        blocks.append(loose)
    for block in blocks:
        block.usage = usage_text(block.usage)

    stage_keys = {s.pk: s.key for s in stages}
    pending = [d for d in decisions if d.state == Decision.State.PENDING]
    for decision in decisions:
        decision.stage_key = stage_keys.get(decision.stage_id, "")
    heartbeat_age = _span(run.heartbeat_at, None) if run.heartbeat_at and run.status == RunStatus.RUNNING else None
    return {
        "run": run, "stages": blocks, "decisions": decisions,
        "events": event_rows(events, attempts, checks, stage_keys), "event_count": event_count,
        "events_cut": event_count > len(events), "usage": usage_text(total),
        "heartbeat_age": seconds_text(heartbeat_age),
        "heartbeat_stale": heartbeat_age is not None and heartbeat_age > settings.CP_HEARTBEAT_STALE,
        "active_time": seconds_text(run.active_seconds),
        "stop_evidence": json.dumps(run.stop_evidence, indent=1, sort_keys=True) if run.stop_evidence else "",
        "waiting_for": _waiting_for(run, pending),
        "live": run.status in RUN_ACTIVE, "version": "",
    }


def event_rows(events: list, attempts: list, checks: list, stage_keys: dict) -> list[tuple]:
    """``[(event, [(href, text), ...])]``: each event with links to the evidence it names, on this page."""
    attempt_names = {a.pk: f"attempt {a.number} ({a.operation})" for a in attempts}
    check_names = {c.pk: f"check '{c.name}'" for c in checks}
    rows = []
    for event in events:
        links = []
        if event.stage_id in stage_keys:
            links.append((f"#stage-{event.stage_id}", f"stage '{stage_keys[event.stage_id]}'"))
        if event.attempt_id in attempt_names:
            links.append((f"#attempt-{event.attempt_id}", attempt_names[event.attempt_id]))
        if event.gate_check_id in check_names:
            links.append((f"#check-{event.gate_check_id}", check_names[event.gate_check_id]))
        if event.decision_id is not None:
            links.append((f"#decision-{event.decision_id}", f"decision {event.decision_id}"))
        rows.append((event, links))
    return rows


def _waiting_for(run: Run, pending: list[Decision]) -> str:
    approval = next((d for d in reversed(pending) if d.kind == Decision.Kind.APPROVAL), None)
    return {
        RunStatus.PENDING: "Waiting for Start.",
        RunStatus.QUEUED: "Waiting for a worker to claim it.",
        RunStatus.WAITING_REVIEW: "Waiting for a person: recover it (retry or verify), recheck it, or fail it.",
        RunStatus.WAITING_APPROVAL: (f"Waiting for a person to approve files {approval.artifact[:12]}, recheck or "
                                     f"fail it." if approval else "Waiting for approval."),
    }.get(run.status, "")


# ----------------------------------------------------------------------------- the views


class RunPages:
    """The detail page's views, bound to the RunAdmin that routes them (``urls()``)."""

    def __init__(self, model_admin):
        self.model_admin = model_admin
        self.site = model_admin.admin_site

    def urls(self) -> list:
        """The routes, to be put before ModelAdmin.get_urls() (whose catch-all would take them)."""
        wrap = self.site.admin_view
        return [
            path("<int:object_id>/detail/", wrap(self.detail), name="engine_run_detail"),
            path("<int:object_id>/state/", wrap(self.state), name="engine_run_state"),
            path("<int:object_id>/attempt/<int:attempt_id>/tail/", wrap(self.tail), name="engine_run_attempt_tail"),
            path("<int:object_id>/attempt/<int:attempt_id>/diff/", wrap(self.diff), name="engine_run_attempt_diff"),
            path("<int:object_id>/check/<int:check_id>/log/", wrap(self.check_log), name="engine_run_check_log"),
            path("<int:object_id>/action/<str:verb>/", wrap(self.action), name="engine_run_action"),
        ]

    # --------------------------------------------------------------- reading

    def _viewable_run(self, request, object_id) -> Run:
        run = Run.objects.filter(pk=object_id).first()
        if run is None:
            raise Http404("No such run.")
        if not self.model_admin.has_view_permission(request, run):
            raise PermissionDenied
        return run

    def _context(self, request, obj: Run, **extra) -> dict:
        return {**self.site.each_context(request), "opts": Run._meta, "app_label": "engine",
                "has_view_permission": True, "original": obj, **extra}

    def detail(self, request, object_id):
        """The run detail page (GET; view permission)."""
        run = self._viewable_run(request, object_id)
        page = build_page(run)
        allowed = {verb: initial for verb, initial in applicable_actions(run, page["decisions"]).items()
                   if request.user.has_perm(ACTIONS[verb][0])}
        forms = [{"verb": verb, "label": ACTIONS[verb][2], "form": ACTIONS[verb][1](initial=initial),
                  "url": reverse("admin:engine_run_action", args=[run.pk, verb])} for verb, initial in allowed.items()]
        if page["live"]:
            page["version"] = state_version(run)
        sim = " (simulated)" if run.simulated else ""
        context = self._context(
            request, run, title=f"Run {run.pk} of {run.pipeline_name}{sim}", subtitle=None,
            status_html=self.model_admin.coloured_status(run), actions=forms,
            state_url=reverse("admin:engine_run_state", args=[run.pk]), state_poll=STATE_POLL_SECONDS,
            change_url=reverse("admin:engine_run_change", args=[run.pk]),
            events_url=reverse("admin:engine_runevent_changelist") + f"?run__id__exact={run.pk}",
            tail_poll=TAIL_POLL_SECONDS, stale_limit=f"{settings.CP_HEARTBEAT_STALE:.0f}", **page)
        return TemplateResponse(request, "admin/engine/run/detail.html", context)

    def state(self, request, object_id):
        """204 when the run's state version is still ``?v=``; else 200 with ``HX-Refresh: true``."""
        run = self._viewable_run(request, object_id)
        if request.GET.get("v", "") == state_version(run):
            return HttpResponse(status=204)
        response = HttpResponse("changed", content_type="text/plain")
        response["HX-Refresh"] = "true"
        return response

    def _attempt(self, request, object_id, attempt_id) -> Attempt:
        run = self._viewable_run(request, object_id)
        attempt = Attempt.objects.filter(pk=attempt_id, run_id=run.pk).first()
        if attempt is None:
            raise Http404("No such attempt in this run.")
        attempt.run = run
        return attempt

    def tail(self, request, object_id, attempt_id):
        """The end of an attempt's display log as an HTML fragment: at most TAIL_BYTES, read from the end.

        While the attempt is open the fragment asks htmx to fetch it again in TAIL_POLL_SECONDS;
        the first fragment after the attempt ended does not, so the polling stops.
        """
        attempt = self._attempt(request, object_id, attempt_id)
        found = attempt_file(attempt, "log")
        text, size = "", 0
        if found is not None:
            size = found.stat().st_size
            text = process.tail_text(found, TAIL_BYTES)
        live = attempt.status in ATTEMPT_OPEN
        context = {"attempt": attempt, "text": text, "size": size, "cut": size > TAIL_BYTES, "limit": TAIL_BYTES,
                   "live": live, "tail_poll": TAIL_POLL_SECONDS,
                   "tail_url": reverse("admin:engine_run_attempt_tail", args=[object_id, attempt.pk]),
                   "log_url": (reverse("admin:engine_attempt_file", args=[attempt.pk, "log"])
                               if found is not None else "")}
        return TemplateResponse(request, "admin/engine/run/_tail.html", context)

    def diff(self, request, object_id, attempt_id):
        """The attempt's patch as a coloured diff: a fragment for htmx, a page otherwise."""
        attempt = self._attempt(request, object_id, attempt_id)
        found = attempt_file(attempt, "patch")
        if found is None:
            raise Http404("This attempt has no patch in its run's control records.")
        text, size = read_head(found, DIFF_BYTES)
        context = {"attempt": attempt, "diff": render_diff(text), "size": size, "cut": size > DIFF_BYTES,
                   "limit": DIFF_BYTES, "empty": not text.strip(),
                   "patch_url": reverse("admin:engine_attempt_file", args=[attempt.pk, "patch"])}
        if request.headers.get("HX-Request"):
            return TemplateResponse(request, "admin/engine/run/_diff.html", context)
        run = attempt.run
        context = self._context(request, run, title=f"Patch of attempt {attempt.number} ({attempt.operation}) of "
                                f"run {run.pk}", detail_url=reverse("admin:engine_run_detail", args=[run.pk]),
                                **context)
        return TemplateResponse(request, "admin/engine/run/diff_page.html", context)

    def check_log(self, request, object_id, check_id):
        """A check's log as text, only from its recorded path inside the run's control records."""
        run = self._viewable_run(request, object_id)
        check = Check.objects.filter(pk=check_id, run_id=run.pk).first()
        found = stored_file(run, check.log_path) if check is not None else None
        if found is None:
            raise Http404("This check has no log in its run's control records.")
        response = FileResponse(open(found, "rb"), content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="check-{check.pk}-{found.name}"'
        return response

    # --------------------------------------------------------------- acting

    def action(self, request, object_id, verb):
        """POST one action (ACTIONS) with its form; its permission first (403), then the operation."""
        if verb not in ACTIONS:
            raise Http404("No such action.")
        permission, form_class, label = ACTIONS[verb]
        if not request.user.has_perm(permission):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        run = Run.objects.filter(pk=object_id).first()
        if run is None:
            raise Http404("No such run.")
        back = redirect("admin:engine_run_detail", run.pk)
        form = form_class(request.POST)
        if not form.is_valid():
            where, message = first_error(form)
            messages.error(request, f"{label} refused: field “{where}”: {message}")
            return back
        who = request.user.get_username()
        try:
            said = PERFORM[verb](run, form.cleaned_data, who)
        except operations.OperationError as exc:
            where = f"field “{exc.field}”" if exc.field else "no single field"
            messages.error(request, f"{label} refused ({exc.code}; {where}): {exc.message}")
            return back
        messages.success(request, said)
        return back


def _start(run: Run, data: dict, who: str) -> str:
    operations.request_start(run, requested_by=who, source="admin")
    return f"Start requested by {who}: run {run.pk} is queued for a worker."


def _approve(run: Run, data: dict, who: str) -> str:
    decision = operations.approve(run, data["decision"], data["artifact"], reviewer=who)
    return f"Decision {decision.pk} approved by {who} for files {decision.artifact[:12]}: the run continues."


def _recheck(run: Run, data: dict, who: str) -> str:
    stage = operations.recheck(run, data["note"], requested_by=who)
    return f"Recheck of stage '{stage.key}' requested by {who}: its gates and reviews run again."


def _recover(run: Run, data: dict, who: str) -> str:
    decision = operations.recover(run, data["decision"], data["note"], data["action"], reviewer=who)
    return f"Recovery by {who} ({decision.action}) on decision {decision.pk}: the run continues."


def _fail(run: Run, data: dict, who: str) -> str:
    failed = operations.fail_run(run, data["reason"], requested_by=who)
    return f"Run {failed.pk} failed. {failed.stop_message}"


#: verb -> the call of engine.operations it makes: (run, cleaned form data, user name) -> the success sentence.
PERFORM = {"start": _start, "approve": _approve, "recheck": _recheck, "recover": _recover, "fail": _fail}
