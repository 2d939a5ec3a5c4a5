"""The run page's views (``RunPages``): the routes of controlpanel/views/__init__.py, each a view of the
admin site, and the conversation box's entries."""
from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from engine import answers, hosts, operations
from engine.text import transcript
from engine.processes import process
from engine.model_gateway import conversation as model_conversation
from engine.models import ATTEMPT_OPEN, Attempt, Check, Run

from ..attempt_files import attempt_file
from ..forms import first_error, mark_kept, typed_fields
from .actions import PERFORM, _initial_for, _keep, _take_kept, also_needs
from .common import (
    ACTIONS,
    CHECK_LOG_BYTES,
    DIFF_BYTES,
    MANIFEST_CHANGES_SHOWN,
    REFUSED_KINDS,
    STATE_POLL_SECONDS,
    TAIL_BYTES,
    TAIL_POLL_SECONDS,
    TRANSCRIPT_ENTRIES,
    TRANSCRIPT_WINDOW,
    applicable_actions,
    read_head,
    render_diff,
    state_version,
    stored_file,
    usage_text,
)
from .page import approval_diff_url, build_header, build_page, earlier_comments
from .rows import check_facts, check_running

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
            path("<int:object_id>/header/", wrap(self.header), name="engine_run_header"),
            path("<int:object_id>/attempt/<int:attempt_id>/tail/", wrap(self.tail), name="engine_run_attempt_tail"),
            path("<int:object_id>/attempt/<int:attempt_id>/diff/", wrap(self.diff), name="engine_run_attempt_diff"),
            path("<int:object_id>/check/<int:check_id>/log/", wrap(self.check_log), name="engine_run_check_log"),
            path("<int:object_id>/check/<int:check_id>/tail/", wrap(self.check_tail), name="engine_run_check_tail"),
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
        """The run detail page (GET; view permission). A form refused just before is filled, once, with
        what was typed (KEPT_KEY in the session), marked, and its field at fault has the focus."""
        run = self._viewable_run(request, object_id)
        page = build_page(run)
        allowed = {verb: initial for verb, initial in applicable_actions(run, page["decisions"]).items()
                   if request.user.has_perm(ACTIONS[verb][0])}
        kept = _take_kept(request, run)
        forms = []
        for verb, initial in allowed.items():
            initial = {**initial, **_initial_for(request, verb)}
            typed = kept.get(verb)
            # ids of its own per form: Recheck and Recover both have a "note", and a label must find its field
            form = ACTIONS[verb][1](initial={**initial, **(typed or {}).get("fields", {})}, auto_id=f"id_{verb}_%s")
            entry = {"verb": verb, "label": ACTIONS[verb][2], "form": form, "kept": bool(typed), "hints": {},
                     "url": reverse("admin:engine_run_action", args=[run.pk, verb])}
            if typed:
                mark_kept(form, typed.get("field", ""))
                if "decision" in initial and str(form.initial.get("decision")) != str(initial["decision"]):
                    entry["hints"]["decision"] = f"the pending decision is {initial['decision']}"
            if verb in ("approve", "request_changes"):
                entry["files"] = page["approval_entry"]
            forms.append(entry)
        approval_forms = [entry for entry in forms if entry["verb"] in ("approve", "request_changes")]
        sim = " (simulated)" if run.simulated else ""
        context = self._context(
            request, run, title=f"Run {run.pk} of {run.pipeline_name}{sim}", subtitle=None,
            status_html=self.model_admin.coloured_status(run), actions=forms,
            state_url=reverse("admin:engine_run_state", args=[run.pk]), state_poll=STATE_POLL_SECONDS,
            change_url=reverse("admin:engine_run_change", args=[run.pk]),
            events_url=reverse("admin:engine_runevent_changelist") + f"?run__id__exact={run.pk}",
            tail_poll=TAIL_POLL_SECONDS,
            manifest_shown=MANIFEST_CHANGES_SHOWN, approval_forms=approval_forms,
            other_forms=[entry for entry in forms if entry not in approval_forms],
            approval_diff_url=approval_diff_url(page) if approval_forms else "",
            earlier_comments=earlier_comments(run, page["decisions"]) if approval_forms else None,
            **page)
        return TemplateResponse(request, "admin/engine/run/detail.html", context)

    def state(self, request, object_id):
        """204 when the run's state version is still ``?v=``; else 200 with ``HX-Refresh: true`` and, as JSON,
        what the run is now: ``{"status": "failed", "label": "failed"}`` (run.js reloads the page, or, while a
        person has typed into a form, says so at the top of the page)."""
        run = self._viewable_run(request, object_id)
        if request.GET.get("v", "") == state_version(run):
            return HttpResponse(status=204)
        response = JsonResponse({"status": run.status, "label": run.get_status_display()})
        response["HX-Refresh"] = "true"
        return response

    def header(self, request, object_id):
        """The page's header as a fragment (``build_header``), polled every HEADER_POLL_SECONDS while the
        run is not ended: status, the step in progress, times, heartbeat, usage."""
        run = self._viewable_run(request, object_id)
        context = {**build_header(run), "status_html": self.model_admin.coloured_status(run),
                   "usage": usage_text(answers.totals(run, list(run.attempts.all())))}
        return TemplateResponse(request, "admin/engine/run/_header.html", context)

    def _attempt(self, request, object_id, attempt_id) -> Attempt:
        run = self._viewable_run(request, object_id)
        attempt = Attempt.objects.filter(pk=attempt_id, run_id=run.pk).first()
        if attempt is None:
            raise Http404("No such attempt in this run.")
        attempt.run = run
        return attempt

    def tail(self, request, object_id, attempt_id):
        """The end of an attempt's display log as an HTML fragment: at most TAIL_BYTES, read from the end.

        While the attempt is open the fragment asks htmx to fetch it again in TAIL_POLL_SECONDS,
        sending the log's size and the attempt's status it shows (``?size=&status=``): while the
        attempt is open with that status and its log still has that size the answer is 204 (htmx 2
        swaps nothing: the box, its scroll position and a selection in it stay). The first fragment after the attempt ended does not poll, so the
        polling stops; asked by a page that saw it open (``?live=1``) it carries
        ``HX-Trigger: cp-attempt-ended``, on which the page looks at the run's state (run.js).
        """
        attempt = self._attempt(request, object_id, attempt_id)
        live = attempt.status in ATTEMPT_OPEN
        seen_live = request.GET.get("live") == "1"
        view = request.GET.get("view")
        wire, claimed = attempt_file(attempt, "conversation"), attempt_file(attempt, "transcript")
        conversation = wire or claimed
        if wire is not None and view == "cli" and claimed is not None:
            return self._conversation(request, attempt, claimed, live, seen_live, wire=wire)
        if conversation is not None and view != "log":
            return self._conversation(request, attempt, conversation, live, seen_live,
                                      cli=claimed if wire is not None else None)
        found = attempt_file(attempt, "log")
        size = found.stat().st_size if found is not None else 0
        if live and request.GET.get("size") == str(size) and request.GET.get("status") == attempt.status:
            return HttpResponse(status=204)
        text = process.tail_text(found, TAIL_BYTES) if found is not None else ""
        shown = len(text.encode("utf-8"))  # from a line's start when there is one: maybe much less than TAIL_BYTES
        context = {"attempt": attempt, "text": text, "size": size, "shown": shown, "cut": shown < size,
                   "from_line": _after_newline(found, size - shown) if shown < size else True,
                   "limit": TAIL_BYTES, "live": live, "tail_poll": TAIL_POLL_SECONDS,
                   "tail_url": reverse("admin:engine_run_attempt_tail", args=[object_id, attempt.pk])
                               + ("?view=log" if conversation is not None else ""),
                   "conversation_url": (reverse("admin:engine_run_attempt_tail", args=[object_id, attempt.pk])
                                        if conversation is not None else ""),
                   "log_url": (reverse("admin:engine_attempt_file", args=[attempt.pk, "log"])
                               if found is not None else "")}
        response = TemplateResponse(request, "admin/engine/run/_tail.html", context)
        if seen_live and not live:
            response["HX-Trigger"] = json.dumps({"cp-attempt-ended": {"attempt": attempt.pk,
                                                                     "status": attempt.status}})
        return response

    def _conversation(self, request, attempt: Attempt, found: Path, live: bool, seen_live: bool,
                      cli: Path | None = None, wire: Path | None = None):
        """The tail's answer for an attempt with a conversation: its last TRANSCRIPT_ENTRIES entries, polled
        like the log's tail (204 while the file's size and the attempt's status are the ones the box shows).
        ``found`` is what the model gateway saw (engine/model_gateway/conversation.py; ``cli``: the CLI's own
        account beside it, one click away), or the CLI's account (engine/text/transcript.py); with ``wire``, the
        CLI's account is checked against it: a tool call the model never asked for is flagged."""
        size = found.stat().st_size
        if live and request.GET.get("size") == str(size) and request.GET.get("status") == attempt.status:
            return HttpResponse(status=204)
        from_start = not live and request.GET.get("from") == "start"  # a finished conversation, read from its start
        entries, last = transcript.read_tail(found, 1 if from_start else TRANSCRIPT_ENTRIES, TRANSCRIPT_WINDOW)
        if from_start:
            entries = transcript.read_head(found, TRANSCRIPT_ENTRIES, TRANSCRIPT_WINDOW)
        tail_url = reverse("admin:engine_run_attempt_tail", args=[attempt.run_id, attempt.pk])
        refused = attempt.failure_kind in REFUSED_KINDS
        shown = [conversation_entry(entry, attempt.simulated) for entry in transcript.joined(entries)]
        unasked_count = 0
        if wire is not None:
            asked = [entry.get("text") for entry in transcript.read_tail(wire, 100000, 8 * 1024 * 1024)[0]
                     if entry.get("kind") == "tool_call"]
            whole = transcript.read_tail(found, 100000, 8 * 1024 * 1024)[0]
            flagged = {whole[index].get("n") for index in model_conversation.unasked(whole, asked)}
            unasked_count = len(flagged)
            for entry in shown:
                if entry.get("n") in flagged:
                    entry["unasked"] = True
        source = "wire" if cli is not None or (wire is None and found.name == "conversation.jsonl") else "cli"
        context = {"attempt": attempt, "entries": shown, "source": source, "checked": wire is not None,
                   "unasked_count": unasked_count,
                   "cli_view_url": tail_url + "?view=cli" if cli is not None else "",
                   "wire_view_url": tail_url if wire is not None else "",
                   "state_text": (f"refused ({attempt.failure_kind})" if refused else attempt.status
                                  + (f" ({attempt.failure_kind})" if attempt.failure_kind
                                     and attempt.failure_kind != attempt.status else "")),
                   "count": last, "shown": len(entries), "size": size, "from_start": from_start,
                   "rest_url": tail_url if from_start and len(entries) < last else "", "live": live, "tail_poll": TAIL_POLL_SECONDS,
                   "tail_url": tail_url, "log_view_url": tail_url + "?view=log",
                   "raw_url": (reverse("admin:engine_attempt_file", args=[attempt.pk, "raw"])
                               if attempt_file(attempt, "raw") is not None else ""),
                   "log_url": (reverse("admin:engine_attempt_file", args=[attempt.pk, "log"])
                               if attempt_file(attempt, "log") is not None else "")}
        response = TemplateResponse(request, "admin/engine/run/_transcript.html", context)
        if seen_live and not live:
            response["HX-Trigger"] = json.dumps({"cp-attempt-ended": {"attempt": attempt.pk,
                                                                     "status": attempt.status}})
        return response

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
        """A check's page: what ran (the command, whole), where, when and how it ended, its run and stage,
        then the end of its log (at most CHECK_LOG_BYTES, read from the end; the page says when it is cut).

        ``?raw=1``: the whole log as text, only from its recorded path inside the run's control records
        (``stored_file``; 404 when there is none). ``?tests=1``: the record its test runner wrote
        (engine/checks/test_reports), as text, the same way."""
        run = self._viewable_run(request, object_id)
        check = Check.objects.select_related("stage", "manifest").filter(pk=check_id, run_id=run.pk).first()
        if request.GET.get("tests") == "1":
            record = (check.tests or {}).get("record_path") if check is not None else None
            found = stored_file(run, record) if isinstance(record, str) and record else None
            if found is None:
                raise Http404("This check has no test runner record in its run's control records.")
            response = FileResponse(open(found, "rb"), content_type="text/plain; charset=utf-8")
            response["Content-Disposition"] = f'inline; filename="check-{check.pk}-tests.jsonl"'
            return response
        found = stored_file(run, check.log_path) if check is not None else None
        if request.GET.get("raw") == "1":
            if found is None:
                raise Http404("This check has no log in its run's control records.")
            response = FileResponse(open(found, "rb"), content_type="text/plain; charset=utf-8")
            response["Content-Disposition"] = f'inline; filename="check-{check.pk}-{found.name}"'
            return response
        if check is None:
            raise Http404("No such check in this run.")
        check.run = run
        detail = reverse("admin:engine_run_detail", args=[run.pk])
        size = found.stat().st_size if found is not None else 0
        text = process.tail_text(found, CHECK_LOG_BYTES) if found is not None else ""
        shown = len(text.encode("utf-8"))
        context = self._context(
            request, run, title=f"Check '{check.name}' of run {run.pk}", subtitle=None, check=check,
            facts=check_facts(run, check, detail), detail_url=detail, back_url=f"{detail}#check-{check.pk}",
            record_url=reverse("admin:engine_check_change", args=[check.pk]), has_log=found is not None,
            log_path=check.log_path, text=text, size=size, shown=shown, cut=shown < size, limit=CHECK_LOG_BYTES,
            elsewhere=run.host if run.host and run.host != hosts.this_host() else "",
            running=check_running(check),
            tail_url=reverse("admin:engine_run_check_tail", args=[run.pk, check.pk]),
            raw_url=reverse("admin:engine_run_check_log", args=[run.pk, check.pk]) + "?raw=1")
        return TemplateResponse(request, "admin/engine/run/check_log.html", context)

    def check_tail(self, request, object_id, check_id):
        """The end of a check's log as a fragment that follows it while the check runs (the run page's row of a
        running gate and the check's page): polled every TAIL_POLL_SECONDS with the size it shows, 204 while the
        check runs and its log still has that size; the first answer after it ended stops the polling and,
        asked by a page that saw it run (``?live=1``), carries ``HX-Trigger: cp-attempt-ended`` (a step ended:
        the page looks at the run's state)."""
        run = self._viewable_run(request, object_id)
        check = Check.objects.filter(pk=check_id, run_id=run.pk).first()
        if check is None:
            raise Http404("No such check in this run.")
        check.run = run
        running = check_running(check)
        found = stored_file(run, check.log_path)
        size = found.stat().st_size if found is not None else 0
        if running and request.GET.get("size") == str(size):
            return HttpResponse(status=204)
        text = process.tail_text(found, TAIL_BYTES) if found is not None else ""
        shown = len(text.encode("utf-8"))
        context = {"check": check, "text": text, "size": size, "shown": shown, "cut": shown < size, "live": running,
                   "tail_poll": TAIL_POLL_SECONDS,
                   "tail_url": reverse("admin:engine_run_check_tail", args=[run.pk, check.pk]),
                   "page_url": reverse("admin:engine_run_check_log", args=[run.pk, check.pk])}
        response = TemplateResponse(request, "admin/engine/run/_check_tail.html", context)
        if request.GET.get("live") == "1" and not running:
            response["HX-Trigger"] = json.dumps({"cp-attempt-ended": {"check": check.pk}})
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
            _keep(request, run, verb, typed_fields(form_class, request.POST), where)
            return back
        lacking = [perm for perm in also_needs(verb, form.cleaned_data) if not request.user.has_perm(perm)]
        if lacking:
            messages.error(request, f"{label} refused (permission_denied; field “start”): starting it needs the "
                                    f"permission {lacking[0]}; leave “start it now” unchecked, or ask for it.")
            _keep(request, run, verb, typed_fields(form_class, request.POST), "start")
            return back
        who = request.user.get_username()
        try:
            said = PERFORM[verb](run, form.cleaned_data, who)
        except operations.OperationError as exc:
            where = f"field “{exc.field}”" if exc.field else "no single field"
            messages.error(request, f"{label} refused ({exc.code}; {where}): {exc.message}")
            _keep(request, run, verb, typed_fields(form_class, request.POST), exc.field)
            return back
        if isinstance(said, tuple):  # (sentence, the run whose page comes next): a re-run leads to the new run
            said, back = said[0], redirect("admin:engine_run_detail", said[1])
        messages.success(request, said)
        return back


#: The look of each transcript entry kind: (CSS class suffix, the mark before its sentence).
_ENTRY_LOOK = {"start": ("start", "▶"), "text": ("text", ""), "thinking": ("thinking", "…"),
               "tool_call": ("call", "⚙"), "tool_result": ("result", "↳"), "refusal": ("refusal", "⛔"),
               "usage": ("usage", "Σ"), "error": ("error", "✖"), "output": ("output", ""),
               "result": ("final", "■"), "cut": ("cut", "✂")}


#: An amount of money in a CLI's own words ("cost $0.2672"): a simulated attempt's is nobody's money.
_DOLLARS = re.compile(r"\$(\d[\d,]*(?:\.\d+)?)")


def conversation_entry(entry: dict, simulated: bool = False) -> dict:
    """A transcript entry (engine/text/transcript.py) as the conversation box shows it: ``look`` (CSS class
    suffix), ``mark``, ``when`` (an aware datetime, or None), ``outcome`` (ok/bad/'' for results). In a
    ``simulated`` attempt every amount the CLI printed reads "(simulated, not money)"."""
    look, mark = _ENTRY_LOOK.get(entry.get("kind"), ("output", ""))
    when = entry.get("t")
    ok = entry.get("ok")
    if simulated and isinstance(entry.get("text"), str) and entry.get("kind") in ("result", "usage", "error", "start"):
        entry = {**entry, "text": _DOLLARS.sub(r"$\1 (simulated, not money)", entry["text"])}
    return {**entry, "look": look, "mark": mark, "outcome": "" if ok is None else ("ok" if ok else "bad"),
            "when": (datetime.datetime.fromtimestamp(when, tz=datetime.timezone.utc)
                     if isinstance(when, (int, float)) else None)}


def _after_newline(path: Path, offset: int) -> bool:
    """Whether the byte before ``offset`` of ``path`` is a newline (a tail starting there starts a line)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, offset - 1))
            return offset == 0 or fh.read(1) == b"\n"
    except OSError:
        return False
