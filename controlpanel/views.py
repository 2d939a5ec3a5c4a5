"""The run detail page of the Control Panel and its action buttons, inside the admin site.

``RunPages(model_admin).urls()`` gives the routes that ``RunAdmin.get_urls`` puts before the
admin's own (names in the ``admin`` namespace; ``<run>`` and the others are integer ids):

==============================  ==========================  ==================================================
``<run>/detail/``               ``engine_run_detail``       the page (staff with view permission)
``<run>/state/?v=VERSION``      ``engine_run_state``        204 while nothing changed, else ``HX-Refresh`` and
                                                            ``{"status", "label"}`` (the page of an unfinished
                                                            run polls it; run.js reloads, or says what changed
                                                            while a person types)
``<run>/attempt/<a>/tail/``     ``engine_run_attempt_tail`` the last ``TAIL_BYTES`` of the attempt's display log
                                                            (polled while the attempt is open, then no more;
                                                            ``?size=N&status=S``: 204 while the log is still
                                                            N bytes and the attempt S;
                                                            ``?live=1``: the first fragment after the attempt
                                                            ended carries ``HX-Trigger: cp-attempt-ended``)
``<run>/attempt/<a>/diff/``     ``engine_run_attempt_diff`` the attempt's patch as a coloured diff (the first
                                                            ``DIFF_BYTES``)
``<run>/check/<c>/log/``        ``engine_run_check_log``    a check's page: what ran, where, when, its exit
                                                            status, and the end of its log (``CHECK_LOG_BYTES``);
                                                            ``?raw=1``: the whole log, as text
``<run>/action/<verb>/``        ``engine_run_action``       POST only: start, approve, recheck, recover, fail
==============================  ==========================  ==================================================

Each action needs its permission (``ACTIONS``; 403 otherwise), validates its form
(controlpanel.forms) and calls only ``engine.operations``; a refusal comes back as an error
message naming the field, success as a success message, and both redirect to the page. On a
refusal what was typed is kept in the session (``KEPT_KEY``, under the run and the verb) and the
page fills that form with it once, marked and with the focus on the field at fault.

Cost of the page: a fixed number of queries whatever the number of attempts, checks, manifests
and events (the run, its stages, attempts, checks, manifests, decisions, the last
``EVENT_LIMIT`` events); logs and patches are referred to, never read (a log's size is a
``stat``); a manifest's record is read only from its start up to its first
``MANIFEST_CHANGES_SHOWN`` changes (the record's keys are sorted, so the changes come before the
long list of every file). Patches and logs load on demand.
"""
from __future__ import annotations

import codecs
import datetime
import html
import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from engine import answers, hosts, operations, process, test_reports, tool_outcomes, transcript, workers
from engine.model_gateway import conversation as model_conversation
from engine.models import (ATTEMPT_OPEN, RUN_ACTIVE, RUN_TERMINAL, Attempt, Check, Decision, Manifest,
                           Run, RunStatus)

from .attempt_files import attempt_file
from .forms import (ApproveForm, ContinueForm, FailForm, RecheckForm, RecoverForm, RequestChangesForm, RerunForm, StartForm,
                    first_error, mark_kept, typed_fields)
from .readable import code_spans, duration_text, moment_html, yaml_block

#: Bytes of an attempt's display log the tail endpoint returns (read from the end, never the whole file).
TAIL_BYTES = 64 * 1024
#: Bytes of a patch the diff view renders; the whole patch stays one link away.
DIFF_BYTES = 512 * 1024
#: Entries of an attempt's transcript the conversation box shows (its last), read from its last
#: TRANSCRIPT_WINDOW bytes only.
TRANSCRIPT_ENTRIES = 300
TRANSCRIPT_WINDOW = 256 * 1024
#: Bytes of a check's log its page shows (the end; from a line's start); the whole log is ``?raw=1``.
CHECK_LOG_BYTES = 256 * 1024
#: Events shown on the page, the most recent ones; the rest are one link away (the events list).
EVENT_LIMIT = 500
#: Seconds between two looks of the page (htmx) at an open attempt's log and at an active run's state.
TAIL_POLL_SECONDS = 2
STATE_POLL_SECONDS = 3
HEADER_POLL_SECONDS = 3
#: Changes of a manifest listed on the page (its record is read no further); the rest are counted.
MANIFEST_CHANGES_SHOWN = 200
#: Bytes of a manifest's record read at most to find those changes.
MANIFEST_READ_BYTES = 1024 * 1024
#: A stage's requirement longer than this (characters) or than REQUIREMENT_LINES lines is folded.
REQUIREMENT_FOLD = 300
REQUIREMENT_LINES = 4
#: Session key of what a person typed into a refused action: {"<run>:<verb>": {"fields": {...}, "field": str}}.
KEPT_KEY = "cp_run_kept_forms"

#: verb -> (permission, form, button label)
ACTIONS = {
    "start": ("engine.start_run", StartForm, "Start"),
    "approve": ("engine.approve_run", ApproveForm, "Approve"),
    "request_changes": ("engine.approve_run", RequestChangesForm, "Request changes"),
    "recheck": ("engine.recheck_run", RecheckForm, "Recheck"),
    "recover": ("engine.recover_run", RecoverForm, "Recover"),
    "fail": ("engine.fail_run", FailForm, "Fail"),
    # a new run from an ended one; "start it now" needs engine.start_run too (``also_needs``)
    "rerun": ("engine.add_run", RerunForm, "Re-run"),
    # a new run from one its budget stopped, from its last checkpoint (engine/runs_again.py)
    "continue": ("engine.add_run", ContinueForm, "Continue with a raised budget"),
}

#: Usage keys summed and shown (engine.agents.base.USAGE_KEYS has more; these are the ones a person reads).
USAGE_SHOWN = ("input_tokens", "output_tokens", "cached_tokens", "cost_usd")

_ATTEMPT_OUTCOME = {"preparing": "live", "running": "live", "succeeded": "ok", "failed": "bad", "timeout": "bad",
                    "cancelled": "off", "interrupted": "warn"}
#: Failure kinds of an attempt whose work the engine refused (engine/steps/attempts.py), shown red whatever its exit.
REFUSED_KINDS = ("protected_files_changed", "external_symlink", "nested_repository", "workspace_tampered",
                 "scope_violation", "writes_refused", "index_incomplete")
_VERDICT_OUTCOME = {"pass": "ok", "repair": "warn", "escalate": "warn"}


# ----------------------------------------------------------------------------- small helpers


def seconds_text(seconds: float | None, precise: bool = False) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``; '' for None. ``precise``: to the tenth of a second
    whatever the length (``0.4 s``, ``1 min 3.2 s``, ``2 h 0 min 4.5 s``), as the record pages show a
    duration (controlpanel/readable.py ``duration_text``)."""
    if seconds is None:
        return ""
    if precise:
        return duration_text(seconds)
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
    if usage.get("simulated_cost_usd") is not None:  # a simulated run's cost is no money (engine/answers.py totals)
        shown["cost_usd"] = f"${usage['simulated_cost_usd']:,.4f} simulated, not money"
    shown["spend"] = answers.spend_sentence(usage) if "caps" in usage else ""
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


#: Shown per file of a tamper report at most (the rest is in the stored report).
TAMPER_DIFF_SHOWN = 64 * 1024


def tamper_rows(run: Run) -> list[dict]:
    """The run's tamper report as table rows, when it stopped ``protected_files_changed``: per file
    ``path, change, to, old_mode, new_mode, sha256_before, sha256_after, why, diff_html`` (the
    diff from the stored ``.json`` report, cut at TAMPER_DIFF_SHOWN characters). [] otherwise."""
    evidence = run.stop_evidence or {}
    if run.stop_reason != "protected_files_changed" or not isinstance(evidence.get("changes"), list):
        return []
    diffs = {}
    found = stored_file(run, evidence.get("files") or "")
    if found is not None:
        try:
            diffs = {(item.get("path"), item.get("to")): item.get("diff") or ""
                     for item in json.loads(found.read_text(encoding="utf-8")) if isinstance(item, dict)}
        except (ValueError, OSError):
            diffs = {}
    rows = []
    for change in evidence["changes"]:
        if not isinstance(change, dict):
            continue
        diff = diffs.get((change.get("path"), change.get("to")), "")
        if len(diff) > TAMPER_DIFF_SHOWN:
            diff = diff[:TAMPER_DIFF_SHOWN] + "\n[... cut: the whole diff is in the stored report]\n"
        rows.append({**{k: change.get(k) for k in ("path", "change", "to", "old_mode", "new_mode", "sha256_before",
                                                    "sha256_after", "why")},
                     "diff_html": mark_safe(render_diff(diff)) if diff else ""})
    return rows


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


class ManifestUnreadable(Exception):
    """A manifest's record does not hold a readable list of changes where it should (the message says why)."""


def manifest_changes(path: Path, limit: int = MANIFEST_CHANGES_SHOWN,
                     max_bytes: int = MANIFEST_READ_BYTES) -> list[dict]:
    """The first ``limit`` changes (``{"path", "status", ...}``) of a manifest's JSON record.

    The record is written by ``engine.steps.save_manifest`` with sorted keys: ``"changes"``
    comes right after ``"base"`` and before the long ``"entries"`` (every file of the tree), so
    it is read from its start, one change at a time, and no further than the ``limit``-th change
    (at most ``max_bytes``). Raises ManifestUnreadable when the changes are not there or not JSON.
    """
    decoder, text = json.JSONDecoder(), ""
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    changes: list[dict] = []
    pos, read, eof = None, 0, False
    with open(path, "rb") as fh:
        def more() -> None:
            nonlocal text, read, eof
            if eof or read >= max_bytes:
                raise ManifestUnreadable(f"no complete list of changes in its first {read} bytes")
            data = fh.read(min(64 * 1024, max_bytes - read))
            read += len(data)
            eof = not data
            text += utf8.decode(data, final=eof)

        while len(changes) < limit:
            if pos is None:  # find the list
                found = re.search(r'"changes"\s*:\s*\[', text)
                if found is None:
                    more()
                    continue
                pos = found.end()
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text):
                more()
                continue
            if text[pos] == "]":
                break
            try:
                change, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                more()  # the change goes on past what was read (or the record is broken: more() says so at its end)
                continue
            if not isinstance(change, dict) or not isinstance(change.get("path"), str):
                raise ManifestUnreadable("a change without a path")
            changes.append(change)
    return changes


def digest_link(digest: str, href: str = "") -> str:
    """A digest as the page shows it: its first 12 characters (the whole in the title), linked to ``href``
    (a manifest's entry) when there is one; '—' for none. HTML, escaped."""
    if not digest:
        return mark_safe("—")
    code = format_html('<code title="{}">{}</code>', digest, digest[:12])
    if not href:
        return code
    return format_html('<a class="cp-digest" href="{}" title="the files {}: see the manifest">{}</a>', href, digest,
                       code)


def applicable_actions(run: Run, decisions: list[Decision]) -> dict[str, dict]:
    """The actions that apply to ``run`` now, each with the initial values of its form
    (engine/answers.py ``actions`` decides, for the page, the API and the commands)."""
    return answers.applicable(run, decisions)


def state_version(run: Run) -> str:
    """What the page of an unfinished run compares to know that it changed: ``status:last event id:open
    attempts`` (an attempt that ends changes it, even before an event says so)."""
    last = run.events.order_by("-id").values_list("id", flat=True).first() or 0
    open_ids = run.attempts.filter(status__in=ATTEMPT_OPEN).order_by("id").values_list("id", flat=True)
    return _version(run.status, last, open_ids)


def _version(status: str, last_event: int, open_attempts) -> str:
    return f"{status}:{last_event}:" + ".".join(str(pk) for pk in open_attempts)


# ----------------------------------------------------------------------------- the page's rows


@dataclass
class Box:
    """One step of the timeline: an attempt or a check, coloured by ``outcome`` (ok, bad, warn, off, live)."""

    label: str
    outcome: str
    duration: str
    anchor: str
    title: str
    start: float
    end: float = float("nan")
    kind: str = "step"  # step, wait (a person's decision), final (the final verification)
    left: str = "0"  # position on the stage's time axis: percent of the run's span
    width: str = "0"


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
    log_bytes: int = 0
    manifest_html: str = ""
    findings: list = field(default_factory=list)
    refused: bool = False
    tool_outcomes: str = ""  # "1 command not found, 2 failed, 1 refused" of its refusals (engine/tool_outcomes.py)
    tool_calls: list = field(default_factory=list)  # the first five as (tool, outcome in words, message)


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
    manifest_html: str = ""


@dataclass
class ManifestRow:
    """A manifest of the run as its entry shows it (``anchor`` is its element id on the page): ``changes``
    the first MANIFEST_CHANGES_SHOWN of its changed paths as ``(status, path)``, ``more`` how many others,
    ``problem`` why they could not be read ('' when they could)."""

    obj: Manifest
    anchor: str
    stage_key: str
    admin_url: str
    changes: list = field(default_factory=list)
    more: int = 0
    problem: str = ""

    @property
    def changes_html(self) -> str:
        """The changed paths as a list (HTML, escaped); '' for none."""
        if not self.changes:
            return ""
        quote = html.escape  # the standard library's: thousands of paths, Django's lazy-aware escape is slow here
        items = (f'<li><span class="cp-change cp-change-{quote(status)}">{quote(status)}</span> '
                 f'<code>{quote(path)}</code></li>' for status, path in self.changes)
        return mark_safe('<ul class="cp-changes">' + "".join(items) + "</ul>")


@dataclass
class StageBlock:
    """A stage's part of the page (``obj`` None: the checks of no stage): its rows, timeline boxes and usage."""

    obj: object
    repair_allowance: int
    human_gate: bool
    duration: str
    #: what a block of no stage holds: "setup" (the run's setup step, first) or "" (the checks of no stage)
    part: str = ""
    title: str = ""
    requirement: str = ""
    requirement_folded: bool = False
    requirement_head: str = ""
    usage: dict = field(default_factory=empty_usage)
    attempts: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    boxes: list = field(default_factory=list)


def _moment(*stamps) -> float:
    for stamp in stamps:
        if stamp is not None:
            return stamp.timestamp()
    return float("inf")


def attempt_row(run: Run, attempt: Attempt, manifest_hrefs: dict | None = None) -> AttemptRow:
    """An attempt as the page shows it (no query: ``attempt.run`` is ``run``, ``attempt.result_manifest``
    selected with it). ``manifest_hrefs``: manifest id -> its entry's link on the page."""
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
    refused = attempt.failure_kind in REFUSED_KINDS
    if refused:
        outcome = "bad"  # the process ended well, but what it did was refused
    if attempt.late:
        outcome = "off"
    files, log_bytes = {}, 0
    for kind in ("prompt", "log", "raw", "stderr", "patch"):
        found = attempt_file(attempt, kind)
        if found is not None:
            files[kind] = reverse("admin:engine_attempt_file", args=[attempt.pk, kind])
            if kind == "log":  # the log's real size: output_bytes is not set when an attempt is interrupted
                log_bytes = found.stat().st_size
    row = AttemptRow(obj=attempt, outcome=outcome, elapsed=seconds_text(seconds), live=live, verdict=verdict,
                     usage=usage_text(add_usage(empty_usage(), attempt.usage)), files=files,
                     exit=exit_text(attempt.exit_code, attempt.signal), log_bytes=log_bytes, refused=refused,
                     tool_outcomes=tool_outcomes.sentence(tool_outcomes.counts(attempt.refusals)))
    if isinstance(attempt.refusals, list):
        row.tool_calls = [(r.get("tool") or "?", tool_outcomes.WORDS[tool_outcomes.outcome_of(r)],
                           r.get("message") or "") for r in attempt.refusals[:5] if isinstance(r, dict)]
    if isinstance(attempt.verdict, dict):
        row.findings = [f for f in attempt.verdict.get("findings") or [] if isinstance(f, dict)]
    if attempt.result_manifest_id:
        row.manifest_html = digest_link(attempt.result_manifest.digest,
                                        (manifest_hrefs or {}).get(attempt.result_manifest_id, ""))
    if "log" in files:
        row.tail_url = reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])
    if "patch" in files:
        row.diff_url = reverse("admin:engine_run_attempt_diff", args=[run.pk, attempt.pk])
    return row


def check_row(run: Run, check: Check, manifest_href: str = "") -> CheckRow:
    """A check as the page shows it; ``manifest_href`` links its files' digest to their manifest's entry."""
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
                    exit=exit_text(check.exit_code, check.signal), verdict=verdict,
                    manifest_html=digest_link(check.manifest_digest, manifest_href))


def check_facts(run: Run, check: Check, detail_url: str) -> list[tuple[str, str]]:
    """What a check's page says of it, ``[(label, HTML)]``: name and kind, outcome, exit status, the
    command (whole) and what was executed, the directory it ran in, its duration and times (with
    seconds), its run and stage (links to the run's page), the files it tested and its network."""
    running = check.ended_at is None and check.exit_code is None and check.signal is None and not check.failure_kind
    if running:
        outcome = mark_safe('<span class="cp-outcome cp-outcome-live">running</span>')
    else:
        word = "passed" if check.passed else "failed"
        outcome = format_html('<span class="cp-outcome cp-outcome-{}">{}</span>{}', word, word,
                              f" ({check.failure_kind})" if check.failure_kind else "")
    if check.stale:
        outcome = format_html("{} · <b>stale</b>: the files changed after it ran; it no longer counts", outcome)
    if check.cwd and check.cwd == run.worktree and check.kind == Check.Kind.FINAL:
        where = format_html("<code>{}</code> (the run's worktree, reset to the final commit before this check: "
                            "its files exactly, nothing beside them)", check.cwd)
    elif check.cwd and check.cwd == run.worktree:
        where = format_html("<code>{}</code> (the run's worktree)", check.cwd)
    elif check.kind == Check.Kind.FINAL:
        where = format_html("<code>{}</code> (a fresh checkout of the run's final commit, not its worktree "
                            "<code>{}</code>)", check.cwd, run.worktree or "—")
    elif check.kind == Check.Kind.SETUP and check.cwd:
        where = format_html("<code>{}</code> (a checkout of the run's commit of the setup's own, removed after it: "
                            "nothing of it is kept but the environment)", check.cwd)
    else:
        where = format_html("<code>{}</code>", check.cwd or "—")
    if running:
        duration = format_html("running for {}", duration_text(_span(check.started_at, None)))
    else:
        duration = duration_text(check.elapsed_seconds)
    if check.stage_id:
        stage = format_html('<a href="{}#stage-{}">stage {} ‘{}’</a>', detail_url, check.stage_id,
                            check.stage.order + 1, check.stage.key)
    elif check.kind == Check.Kind.SETUP:
        stage = "none (the run's setup step, before its first stage)"
    else:
        stage = "none (a check of the whole run)"
    if check.manifest_id:
        files = format_html('<a href="{}#manifest-{}"><code>{}</code></a> (<a href="{}">its record</a>)', detail_url,
                            check.manifest_id, check.manifest_digest or check.manifest.digest,
                            reverse("admin:engine_manifest_change", args=[check.manifest_id]))
    else:
        files = format_html("<code>{}</code>", check.manifest_digest) if check.manifest_digest else "—"
    argv = [str(arg) for arg in check.argv] if isinstance(check.argv, list) else []
    if argv[:4] == ["bash", "-eo", "pipefail", "-c"] and argv[4:] == [check.command]:  # engine/steps/gates.py
        executed = mark_safe("<code>bash -eo pipefail -c</code> with the command above as its one argument")
    else:
        executed = format_html('<pre class="cp-command-text">{}</pre>', shlex.join(argv)) if argv else ""
    facts = [
        ("check", format_html("<b>{}</b> · {}", check.name, check.get_kind_display())),
        ("outcome", outcome),
        ("exit status", exit_text(check.exit_code, check.signal)),
    ]
    if not running:  # what the test runner itself recorded (engine/test_reports), or that only the status decided
        tests = test_reports.sentence(check.tests)
        agreed = (check.tests or {}).get("agreed")
        if agreed:
            tests += (f" All {agreed['count']} agreed tests (from {agreed['from']}) passed again." if not agreed["missing"]
                      else f" {agreed['missing']} of the {agreed['count']} agreed tests (from {agreed['from']}) did "
                           f"not pass again.")
        if (check.tests or {}).get("why"):
            tests += f" The gate failed: {check.tests['why']}."
        record = ""
        if (check.tests or {}).get("record_path"):
            record = format_html(' <a href="{}">Its record</a>.',
                                 reverse("admin:engine_run_check_log", args=[run.pk, check.pk]) + "?tests=1")
        facts.append(("tests", format_html("{}{}", tests, record)))
    facts.append(("command", format_html('<pre class="cp-command-text">{}</pre>', check.command)))
    if executed:
        facts.append(("executed as", executed))
    facts += [
        ("directory", where),
        ("duration", duration),
        ("started", moment_html(check.started_at)),
        ("ended", moment_html(check.ended_at)),
        ("run", format_html('<a href="{}">run {} of {}</a>{}', detail_url, run.pk, run.pipeline_name,
                            " (simulated)" if run.simulated else "")),
        ("stage", stage),
        ("files tested", files),
    ]
    if check.setup:
        facts.append(("environment", _environment_html(check.setup)))
    if check.network:
        facts.append(("network", yaml_block(check.network)))
    return facts


def _environment_html(info: dict):
    """A setup check's environment (engine/environments.py): its key, who made it, its size and folder."""
    made_by = info.get("made_by") or {}
    size = info.get("size_bytes")
    how = (format_html("reused: made by run {}'s setup (check {}); nothing ran", made_by.get("run", "?"),
                       made_by.get("check", "?")) if info.get("reused") else "made by this check")
    return format_html("<code>{}</code> · {}{} · <code>{}</code>", str(info.get("key") or "")[:12], how,
                       f" · {size / 1e6:.1f} MB" if isinstance(size, int) else "", info.get("folder") or "—")


def manifest_rows(run: Run, manifests: list[Manifest], stage_keys: dict) -> list[ManifestRow]:
    """The run's manifests as their entries show them, each with its first changed paths (read from its record)."""
    rows = []
    for manifest in manifests:
        row = ManifestRow(obj=manifest, anchor=f"manifest-{manifest.pk}",
                          stage_key=stage_keys.get(manifest.stage_id, ""),
                          admin_url=reverse("admin:engine_manifest_change", args=[manifest.pk]))
        total = manifest.added + manifest.modified + manifest.deleted
        found = stored_file(run, manifest.path)
        if found is None:
            row.problem = "its record is not in the run's control records"
        elif total:
            try:
                changes = manifest_changes(found)
            except (OSError, ManifestUnreadable) as exc:
                row.problem = f"its record could not be read: {exc}"
            else:
                row.changes = [(str(c.get("status", "changed")), c["path"]) for c in changes]
                row.more = max(0, total - len(row.changes))
        rows.append(row)
    return rows


def _requirement(block: StageBlock, own: dict) -> None:
    title, text = str(own.get("title") or ""), str(own.get("requirement") or "")
    block.title = title if title and title != own.get("key") else ""
    block.requirement = text
    block.requirement_folded = len(text) > REQUIREMENT_FOLD or text.count("\n") >= REQUIREMENT_LINES
    first = text.strip().splitlines()[0] if text.strip() else ""
    block.requirement_head = first if len(first) <= 120 else first[:117].rstrip() + "…"


def build_page(run: Run) -> dict:
    """Everything the detail page shows, in a fixed number of queries (see the module's docstring)."""
    stages = list(run.stages.order_by("order"))
    attempts = list(run.attempts.select_related("result_manifest").order_by("stage__order", "number"))
    checks = list(run.checks.order_by("id"))
    manifests = list(run.manifests.order_by("id"))
    decisions = list(run.decisions.order_by("id"))
    event_count = run.events.count()
    events = list(run.events.order_by("-id")[:EVENT_LIMIT])[::-1]

    stage_keys = {s.pk: s.key for s in stages}
    by_pk = {m.pk: f"#manifest-{m.pk}" for m in manifests}
    by_digest: dict[str, str] = {}
    for manifest in manifests:
        by_digest.setdefault(manifest.digest, f"#manifest-{manifest.pk}")
    spec = {s["key"]: s for s in run.definition.get("pipeline", {}).get("stages", [])}
    blocks, by_id = [], {}
    for stage in stages:
        stage.run = run
        own = spec.get(stage.key, {})
        block = StageBlock(obj=stage, repair_allowance=own.get("repair_allowance", 0),
                           human_gate=bool(own.get("human_gate")),
                           duration=seconds_text(_span(stage.started_at, stage.finished_at)
                                                 if stage.finished_at or stage.status == "running" else None))
        _requirement(block, own)
        stage.accepted_html = digest_link(stage.accepted_manifest, by_digest.get(stage.accepted_manifest, ""))
        blocks.append(block)
        by_id[stage.pk] = block
    loose = StageBlock(obj=None, repair_allowance=0, human_gate=False, duration="")  # checks of no stage
    setup = StageBlock(obj=None, repair_allowance=0, human_gate=False, duration="", part="setup")  # the setup step
    step_seconds = 0.0
    for attempt in attempts:
        attempt.run = run
        row = attempt_row(run, attempt, by_pk)
        block = by_id.get(attempt.stage_id, loose)
        block.attempts.append(row)
        add_usage(block.usage, attempt.usage)
        step_seconds += attempt.elapsed_seconds or (_span(attempt.started_at, None) if row.live else 0) or 0
        label = f"{attempt.operation} {attempt.number}" + (f" · {row.verdict}" if row.verdict else "")
        title = f"attempt {attempt.number}: {attempt.operation}, {attempt.status}" + (
            f" ({attempt.failure_kind})" if attempt.failure_kind else "")
        block.boxes.append(Box(label=label, outcome=row.outcome, duration=row.elapsed or attempt.status,
                               anchor=f"attempt-{attempt.pk}", title=title,
                               start=_moment(attempt.started_at, attempt.created_at),
                               end=_moment(attempt.ended_at) if attempt.ended_at else float("nan")))
    for check in checks:
        check.run = run
        href = by_pk.get(check.manifest_id) or by_digest.get(check.manifest_digest, "")
        row = check_row(run, check, href)
        block = setup if check.kind == Check.Kind.SETUP else by_id.get(check.stage_id, loose)
        block.checks.append(row)
        step_seconds += check.elapsed_seconds or (_span(check.started_at, None) if row.running else 0) or 0
        block.boxes.append(Box(label=f"{check.kind} · {check.name}", outcome=row.outcome,
                               duration=row.elapsed or row.verdict, anchor=f"check-{check.pk}",
                               title=f"{check.get_kind_display()} '{check.name}': {row.verdict}"
                                     + (f" ({check.failure_kind})" if check.failure_kind else ""),
                               start=_moment(check.started_at, check.ended_at),
                               end=_moment(check.ended_at) if check.ended_at else float("nan"),
                               kind="final" if check.kind == Check.Kind.FINAL else "step"))
    for block in blocks + [loose, setup]:
        block.boxes.sort(key=lambda box: box.start)
        patched = [row for row in block.attempts if row.diff_url and row.obj.operation != "review"]
        if patched:
            patched[-1].patch_open = True  # the stage's latest change of files is shown open
    if loose.boxes:
        blocks.append(loose)
    if setup.boxes:  # before the stages: the environment every agent and gate of the run sees
        blocks.insert(0, setup)
    for block in blocks:
        block.usage = usage_text(block.usage)

    entries = manifest_rows(run, manifests, stage_keys)
    pending = [d for d in decisions if d.state == Decision.State.PENDING]
    for decision in decisions:
        decision.stage_key = stage_keys.get(decision.stage_id, "")
        candidates = [row for row in entries if decision.artifact and row.obj.digest == decision.artifact]
        decision.manifest_entry = next((row for row in candidates if row.obj.stage_id == decision.stage_id),
                                       candidates[0] if candidates else None)
        decision.artifact_html = digest_link(decision.artifact,
                                             f"#{decision.manifest_entry.anchor}" if decision.manifest_entry else "")
    for decision in decisions:
        block = by_id.get(decision.stage_id)
        if block is None:
            continue
        waited = decision.state == Decision.State.PENDING
        block.boxes.append(Box(label=f"{decision.get_kind_display()} · {decision.state}",
                               outcome="live" if waited else ("bad" if decision.action == "fail" else "ok"),
                               duration=seconds_text(_span(decision.created_at, decision.decided_at)) or "",
                               anchor=f"decision-{decision.pk}", kind="wait",
                               title=f"decision {decision.pk} ({decision.get_kind_display()}): {decision.state}"
                                     + (f" by {decision.decided_by}" if decision.decided_by else ""),
                               start=_moment(decision.created_at),
                               end=_moment(decision.decided_at) if decision.decided_at else float("nan")))
    axis = place_on_axis(run, blocks)
    header = build_header(run, pending)
    active = float(header["active_seconds"])
    return {
        "run": run, "roles": role_rows(run), "stages": blocks, "decisions": decisions, "manifests": entries,
        "events": event_rows(events, attempts, checks, stage_keys), "event_count": event_count,
        "events_cut": event_count > len(events), "usage": usage_text(answers.totals(run, attempts)),
        "step_time": seconds_text(step_seconds),
        "steps_over_active": step_seconds > active + 1.0, "has_steps": bool(attempts or checks),
        "tamper": tamper_rows(run), "notifications": notification_rows(run), "axis": axis,
        "stop_card": stop_card(run, checks, attempts, by_digest),
        "open_attempts": [row for block in blocks for row in block.attempts if row.live and row.tail_url],
        "approval_entry": _approval_entry(run, pending), "live": run.status in RUN_ACTIVE, **header,
        "version": _version(run.status, events[-1].pk if events else 0,
                            sorted(a.pk for a in attempts if a.status in ATTEMPT_OPEN)),
    }


#: Ticks of a timeline's time axis (fractions of the run's span).
AXIS_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)


#: An idle stretch of the timeline (no attempt or check running: a person deciding, a queue) longer
#: than this share of the busy time (at least IDLE_MIN_SECONDS) is drawn at that length, marked as cut.
IDLE_SHARE = 0.08
IDLE_MIN_SECONDS = 3.0


def place_on_axis(run: Run, blocks: list) -> dict:
    """Put every box of ``blocks`` on one time axis: the run's span from its first step (or its start)
    to its end (or now). Each box gets ``left`` and ``width`` in percent (a box still open runs to
    the end; at least 0.8 % wide so it can be seen). Idle stretches longer than IDLE_SHARE of the busy
    time are shortened to that (a wait of ten minutes for a person does not squash the work into a
    sliver) and returned as ``cuts``. Returns ``{"seconds": span, "ticks": [(percent, label)],
    "cuts": [(percent, label)]}``; ``seconds`` is 0 when nothing has a time yet. Labels are real
    times since the start."""
    starts = [box.start for block in blocks for box in block.boxes if math.isfinite(box.start)]
    if run.started_at:
        starts.append(run.started_at.timestamp())
    if not starts:
        return {"seconds": 0, "ticks": [], "cuts": []}
    first = min(starts)
    last = run.finished_at.timestamp() if run.finished_at else timezone.now().timestamp()
    ends = [box.end for block in blocks for box in block.boxes if math.isfinite(box.end)]
    last = max([last, first + 0.001] + ends)
    busy = sorted((box.start, box.end if math.isfinite(box.end) else last) for block in blocks for box in block.boxes
                  if box.kind != "wait" and math.isfinite(box.start))
    merged: list[list[float]] = []
    for start, end in busy:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    worked = sum(end - start for start, end in merged)
    limit = max(IDLE_MIN_SECONDS, IDLE_SHARE * worked)
    gaps, cursor = [], first  # idle stretches (start, end) longer than the limit
    for start, end in merged + [[last, last]]:
        if start - cursor > limit:
            gaps.append((cursor, start))
        cursor = max(cursor, end)

    def mapped(moment: float) -> float:
        out = moment - first
        for start, end in gaps:
            if moment > start:
                out -= min(moment, end) - start - min(limit, min(moment, end) - start)
        return out

    span = mapped(last) or 0.001

    def percent(moment: float) -> float:
        return mapped(moment) / span * 100

    for block in blocks:
        for box in block.boxes:
            if not math.isfinite(box.start):
                box.left, box.width = "0", "0"
                continue
            end = box.end if math.isfinite(box.end) else last
            left = percent(box.start)
            width = max(0.8, percent(max(end, box.start)) - left)
            left = min(left, 100 - width)
            box.left, box.width = f"{max(0.0, left):.2f}", f"{width:.2f}"

    def real(fraction: float) -> float:  # the real seconds since ``first`` at a place on the axis
        low, high = first, last
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (middle, high) if percent(middle) < fraction * 100 else (low, middle)
        return low - first

    ticks = [(f"{tick * 100:.0f}", seconds_text(real(tick)) or "0 s") for tick in AXIS_TICKS]
    cuts = [(f"{percent(start) + limit / span * 50:.2f}", f"{seconds_text(end - start)} idle, shortened")
            for start, end in gaps]
    return {"seconds": last - first, "ticks": ticks, "cuts": cuts}


#: Bytes of the failing check's log shown inline on the stop card (its end).
STOP_LOG_BYTES = 4 * 1024


def stop_card(run: Run, checks: list, attempts: list, by_digest: dict) -> dict | None:
    """Why the run stopped (or waits), on top of the page: ``{"reason", "message", "check": {"obj",
    "tail", "log_url", "exit"} | None, "links": [(href, text)], "facts": [(key, text)]}``; None when the
    run has no stop reason. The failing check is the one the evidence names, else the stage's latest
    failed check; the evidence's ids become links (check, attempt with its prompt and diff, manifest,
    decision) and the rest readable ``key: value`` lines."""
    if not (run.stop_reason or run.stop_message):
        return None
    evidence = run.stop_evidence if isinstance(run.stop_evidence, dict) else {}
    checks_by_pk = {c.pk: c for c in checks}
    attempts_by_pk = {a.pk: a for a in attempts}
    links, facts, named = [], [], []
    for key, value in evidence.items():
        if key == "check" and value in checks_by_pk:
            named.append(checks_by_pk[value])
        elif key == "checks" and isinstance(value, list):
            named += [checks_by_pk[pk] for pk in value if pk in checks_by_pk]
        elif key == "attempt" and value in attempts_by_pk:
            attempt = attempts_by_pk[value]
            links.append((f"#attempt-{attempt.pk}", f"attempt {attempt.number} ({attempt.operation})"))
            for kind, text in (("prompt", "its prompt"), ("patch", "its patch")):
                if attempt_file(attempt, kind) is not None:
                    links.append((reverse("admin:engine_attempt_file", args=[attempt.pk, kind]), text))
            if attempt_file(attempt, "patch") is not None:
                links.append((reverse("admin:engine_run_attempt_diff", args=[run.pk, attempt.pk]), "its diff"))
        elif key == "manifest" and isinstance(value, str) and value:
            links.append((by_digest.get(value, "#manifests"), f"manifest {value[:12]}"))
        elif key == "decision" and isinstance(value, int):
            links.append((f"#decision-{value}", f"decision {value}"))
        elif key in ("report", "changes") and run.stop_reason == "protected_files_changed":
            continue  # the tamper table below shows them
        elif not _empty(value) and _fact_text(value):
            facts.append((key, _fact_text(value)))
    if not named and run.stop_reason in ("gate_failed", "repair_exhausted", "unchanged_failure",
                                         "final_verification_failed"):
        failed = [c for c in checks if not c.passed and not c.stale and c.ended_at is not None]
        named = failed[-1:]
    if "attempt" not in evidence:  # the change the checks failed on: the stage's latest attempt with a patch
        stage_id = next((c.stage_id for c in named), None)
        changed = [a for a in attempts if a.operation != "review" and attempt_file(a, "patch") is not None
                   and (stage_id is None or a.stage_id == stage_id)]
        if named and changed:
            attempt = changed[-1]
            links.append((f"#attempt-{attempt.pk}", f"attempt {attempt.number} ({attempt.operation})"))
            if attempt_file(attempt, "prompt") is not None:
                links.append((reverse("admin:engine_attempt_file", args=[attempt.pk, "prompt"]), "its prompt"))
            links.append((reverse("admin:engine_run_attempt_diff", args=[run.pk, attempt.pk]), "its diff"))
    check = None
    for found in named:
        links.append((f"#check-{found.pk}", f"check '{found.name}'"))
        if stored_file(run, found.log_path) is not None:
            links.append((reverse("admin:engine_run_check_log", args=[run.pk, found.pk]), f"the log of '{found.name}'"))
    if named:
        first = next((c for c in named if not c.passed), named[0])
        path = stored_file(run, first.log_path)
        check = {"obj": first, "exit": exit_text(first.exit_code, first.signal),
                 "tail": process.tail_text(path, STOP_LOG_BYTES) if path is not None else "",
                 "log_url": reverse("admin:engine_run_check_log", args=[run.pk, first.pk]) if path else ""}
    return {"reason": run.stop_reason, "message": run.stop_message, "check": check, "links": links, "facts": facts}


#: Keys of nested evidence that hold database ids (the links above name those records).
_ID_KEYS = ("attempt", "check", "decision", "journal", "id")


def _empty(value) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _fact_text(value) -> str:
    """A value of the stop evidence as one readable line: lists joined, mappings as ``k: v`` without
    empty values and database ids, git object ids cut to 12 characters."""
    if isinstance(value, list):
        shown = ", ".join(_fact_text(item) for item in value[:20] if not _empty(item))
        return shown + (f" … and {len(value) - 20} more" if len(value) > 20 else "")
    if isinstance(value, dict):
        parts = [f"{k}: {_fact_text(v)}" for k, v in list(value.items())[:20] if not _empty(v) and k not in _ID_KEYS]
        return "(" + "; ".join(parts) + ")" if parts else ""
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", text) else text


def notification_rows(run: Run) -> list:
    """The run's notification deliveries (engine/models.py ``Notification``), oldest first, in one
    query: each with ``event`` (run.waiting / run.ended) and ``outcome`` (the last HTTP status or
    error, "—" before a try)."""
    rows = list(run.notifications.order_by("id"))
    for row in rows:
        row.event = (row.payload or {}).get("event", row.kind)
        parts = [str(row.last_status) if row.last_status is not None else "", row.last_error]
        row.outcome = " ".join(part for part in parts if part) or "—"
    return rows


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


def _approval_entry(run: Run, pending: list[Decision]):
    """The manifest entry of the files waiting for approval (the last pending approval's), or None."""
    if run.status != RunStatus.WAITING_APPROVAL:
        return None
    approval = next((d for d in reversed(pending) if d.kind == Decision.Kind.APPROVAL), None)
    return approval.manifest_entry if approval else None


def _waiting_for(run: Run, pending: list[Decision]) -> str:
    return answers.waiting_sentence(run, pending)


def approval_diff_url(page: dict) -> str:
    """The diff URL of the change waiting for approval: the latest patch of the stage whose approval is
    pending (its latest implement or repair attempt with a patch), '' when none is stored."""
    entry = page.get("approval_entry")
    stage_id = entry.obj.stage_id if entry is not None else None
    for block in page["stages"]:
        if block.obj is not None and (stage_id is None or block.obj.pk == stage_id):
            rows = [row for row in block.attempts if row.diff_url and row.obj.operation != "review"]
            if rows and (stage_id is not None or block.obj.status == "waiting_approval"):
                return rows[-1].diff_url
    return ""


def _epoch(moment) -> str:
    """A datetime as seconds since the epoch for the page's clocks (run.js), '' for None."""
    return f"{moment.timestamp():.3f}" if moment else ""


def build_header(run: Run, pending: list[Decision] | None = None) -> dict:
    """What the run page's header shows (its own fragment, refreshed every HEADER_POLL_SECONDS while
    the run is not ended; run.js ticks its clocks every second in between): ``now`` (the step in
    progress: a sentence and the epoch it started), the epochs of created/started/finished and of
    the last heartbeat, the active seconds counted so far, whether the heartbeat is stale, and for a
    queued run the sentence of engine/workers.py when no worker is alive. A fixed number of queries."""
    if pending is None:
        pending = list(run.decisions.filter(state=Decision.State.PENDING).order_by("id"))
    open_attempt = (run.attempts.select_related("stage").filter(status__in=ATTEMPT_OPEN).order_by("-id").first()
                    if run.status == RunStatus.RUNNING else None)
    open_check = (run.checks.select_related("stage").filter(ended_at=None, exit_code=None, signal=None,
                                                            failure_kind="").order_by("-id").first()
                  if run.status == RunStatus.RUNNING else None)
    now = None
    if open_attempt is not None:
        where = f"stage '{open_attempt.stage.key}': " if open_attempt.stage_id else ""
        now = {"text": f"{where}{open_attempt.operation} attempt {open_attempt.number} ({open_attempt.profile_name}, "
                       f"{open_attempt.adapter}) {open_attempt.status}",
               "since": _epoch(open_attempt.started_at or open_attempt.created_at),
               "anchor": f"attempt-{open_attempt.pk}"}
    elif open_check is not None:
        where = f"stage '{open_check.stage.key}': " if open_check.stage_id else ""
        now = {"text": f"{where}{open_check.get_kind_display()} '{open_check.name}' running",
               "since": _epoch(open_check.started_at), "anchor": f"check-{open_check.pk}"}
    heartbeat_age = _span(run.heartbeat_at, None) if run.heartbeat_at and run.status == RunStatus.RUNNING else None
    stale = heartbeat_age is not None and heartbeat_age > settings.CP_HEARTBEAT_STALE
    active = run.active_seconds
    counting = heartbeat_age is not None and bool(run.lease_owner) and not stale
    if counting:
        active += heartbeat_age  # the step in progress, since its worker's last heartbeat counted its time
    queued = ""
    if run.status == RunStatus.QUEUED:
        queued = workers.queued_without_worker(run)
    return {"run": run, "now": now, "server_now": f"{timezone.now().timestamp():.3f}",
            "created_epoch": _epoch(run.created_at), "started_epoch": _epoch(run.started_at),
            "finished_epoch": _epoch(run.finished_at), "heartbeat_epoch": _epoch(run.heartbeat_at),
            "heartbeat_age": seconds_text(heartbeat_age), "heartbeat_stale": stale,
            "active_seconds": f"{active:.1f}", "active_time": seconds_text(active), "active_counting": counting,
            "active_base": f"{run.active_seconds:.3f}", "queued_without_worker_html": code_spans(queued),
            "elapsed_time": seconds_text(_span(run.started_at, run.finished_at)) if run.started_at else "",
            "stale_limit": f"{settings.CP_HEARTBEAT_STALE:.0f}", "reconcile_period": f"{settings.CP_RECONCILE_PERIOD:.0f}",
            "waiting_for": _waiting_for(run, pending), "queued_without_worker": queued,
            "host": hosts.run_host_facts(run),
            "follows": run.status not in RUN_TERMINAL, "header_poll": HEADER_POLL_SECONDS,
            "header_url": reverse("admin:engine_run_header", args=[run.pk])}


def role_rows(run: Run) -> list[tuple[str, str, bool]]:
    """``[(role, its profiles or what leaving it out means, configured)]`` of the run's frozen roles, in
    ``operations.ROLES`` order: a role the pipeline leaves out (``null``) reads "not configured"."""
    roles = run.definition.get("roles") or {}
    rows = []
    for role in operations.ROLES:
        names = operations.role_profiles(roles.get(role))
        if names:
            rows.append((role, ", ".join(names), True))
        else:
            rows.append((role, {"reviewer": "not configured: no review step (only the gates decide)",
                                "documenter": "not configured: no documentation step"}.get(role, "not configured"),
                         False))
    return rows


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
        account beside it, one click away), or the CLI's account (engine/transcript.py); with ``wire``, the
        CLI's account is checked against it: a tool call the model never asked for is flagged."""
        size = found.stat().st_size
        if live and request.GET.get("size") == str(size) and request.GET.get("status") == attempt.status:
            return HttpResponse(status=204)
        entries, last = transcript.read_tail(found, TRANSCRIPT_ENTRIES, TRANSCRIPT_WINDOW)
        tail_url = reverse("admin:engine_run_attempt_tail", args=[attempt.run_id, attempt.pk])
        refused = attempt.failure_kind in REFUSED_KINDS
        shown = [conversation_entry(entry) for entry in entries]
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
                   "count": last, "shown": len(entries), "size": size, "live": live, "tail_poll": TAIL_POLL_SECONDS,
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
        (engine/test_reports), as text, the same way."""
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
            raw_url=reverse("admin:engine_run_check_log", args=[run.pk, check.pk]) + "?raw=1")
        return TemplateResponse(request, "admin/engine/run/check_log.html", context)

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


def conversation_entry(entry: dict) -> dict:
    """A transcript entry (engine/transcript.py) as the conversation box shows it: ``look`` (CSS class
    suffix), ``mark``, ``when`` (an aware datetime, or None), ``outcome`` (ok/bad/'' for results)."""
    look, mark = _ENTRY_LOOK.get(entry.get("kind"), ("output", ""))
    when = entry.get("t")
    ok = entry.get("ok")
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
