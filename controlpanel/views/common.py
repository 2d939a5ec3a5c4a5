"""What the run page's parts share: its limits and poll periods, the actions and their permissions, and
small helpers (times, usage, exit statuses, stored files, diffs, manifests, the state version)."""
from __future__ import annotations

import codecs
import json
import os
import re
from pathlib import Path

from django.conf import settings
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from engine import answers
from engine.models import ATTEMPT_OPEN, Decision, Run

from ..forms import (
    ApproveForm,
    ContinueForm,
    FailForm,
    RecheckForm,
    RecoverForm,
    RequestChangesForm,
    RerunForm,
    StartForm,
)
from ..readable import duration_text

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


def usage_text(usage: dict, simulated: bool = False) -> dict:
    """USAGE_SHOWN keys formatted for a person: ``12,345`` tokens, ``$0.0123``; '—' when not reported.
    ``simulated`` (a simulated run's attempt or stage): the cost reads "simulated, not money"."""
    if simulated and usage.get("cost_usd") is not None:
        usage = {**usage, "simulated_cost_usd": usage["cost_usd"], "cost_usd": None}
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


def tamper_rows(run: Run, reason: str, evidence: dict) -> list[dict]:
    """A stop's tamper report as table rows, when it was ``protected_files_changed`` (``reason``, its
    ``evidence``: the run's stop, or the one kept as ``led_here``): per file ``path, change, to, old_mode,
    new_mode, sha256_before, sha256_after, why, diff_html`` (the diff from the stored ``.json`` report, cut
    at TAMPER_DIFF_SHOWN characters). [] otherwise."""
    if reason != "protected_files_changed" or not isinstance(evidence.get("changes"), list):
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


#: A hunk's header: where its lines start in the old and the new file.
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def render_diff(text: str) -> str:
    """A unified diff as HTML: a ``<pre class="cp-diff">`` whose lines are spans classed by their kind
    (``cp-dhead`` git headers, ``cp-dfile`` ---/+++ lines, ``cp-dhunk`` hunk headers, ``cp-dadd`` added,
    ``cp-ddel`` removed, ``cp-dctx`` context). Escaped. An added or context line carries its file and its
    line in the new file (``data-cp-file``, ``data-cp-line``): a person comments on it (diff_comments.js)."""
    out = []
    path, line = "", 0
    # git ends a line at "\n" only: a form feed, a lone "\r" or "\u2028" inside an agent's file stays in its line
    # (str.splitlines would cut there, and a line of the file could pass for a header or a removed line)
    for raw in text.rstrip("\n").split("\n") if text else []:
        raw = raw.removesuffix("\r")
        where = ""
        if raw.startswith(("diff --git", "index ", "new file", "deleted file", "old mode", "new mode",
                           "similarity", "rename ", "Binary files")):
            cls = "cp-dhead"
        elif raw.startswith(("+++ ", "--- ")):
            cls = "cp-dfile"
            if raw.startswith("+++ "):
                named = raw[4:].split("\t")[0]
                path = named[2:] if named.startswith("b/") else ("" if named == "/dev/null" else named)
        elif raw.startswith("@@"):
            cls = "cp-dhunk"
            found = _HUNK.match(raw)
            line = int(found.group(2)) if found else 0
        elif raw.startswith("+") or raw.startswith(" ") or raw == "":
            cls = "cp-dadd" if raw.startswith("+") else "cp-dctx"
            if path and line:
                where = format_html(' data-cp-file="{}" data-cp-line="{}"', path, line)
                line += 1
        elif raw.startswith("-"):
            cls = "cp-ddel"
        else:
            cls = "cp-dctx"
        out.append(f'<span class="{cls}"{where}>{escape(raw)}</span>')
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
