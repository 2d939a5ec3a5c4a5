"""The rows of the run page: stages, attempts, checks and manifests as a person reads them (``Box`` and its
kinds), and the facts of a check's page."""
from __future__ import annotations

import html
import shlex
from dataclasses import dataclass, field

from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from engine import environments
from engine.text import tool_outcomes
from engine.checks import test_reports
from engine.models import ATTEMPT_OPEN, Attempt, Check, Manifest, Run

from ..attempt_files import attempt_file
from ..readable import duration_text, moment_html, yaml_block
from .common import (
    _ATTEMPT_OUTCOME,
    _VERDICT_OUTCOME,
    REFUSED_KINDS,
    REQUIREMENT_FOLD,
    REQUIREMENT_LINES,
    ManifestUnreadable,
    _span,
    add_usage,
    digest_link,
    empty_usage,
    exit_text,
    manifest_changes,
    seconds_text,
    stored_file,
    usage_text,
)

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
    tool_outcomes: str = ""  # "1 command not found, 2 failed, 1 refused" of its refusals (engine/text/tool_outcomes.py)
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
                     usage=usage_text(add_usage(empty_usage(), attempt.usage), attempt.simulated), files=files,
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


def check_running(check: Check) -> bool:
    """Whether ``check`` is still running: no end, no exit status, no signal, no failure recorded."""
    return check.ended_at is None and check.exit_code is None and check.signal is None and not check.failure_kind


def check_row(run: Run, check: Check, manifest_href: str = "") -> CheckRow:
    """A check as the page shows it; ``manifest_href`` links its files' digest to their manifest's entry."""
    running = check_running(check)
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
    running = check_running(check)
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
    if not running:  # what the test runner itself recorded (engine/checks/test_reports), or that only the status decided
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
    return format_html("<code>{}</code> · {}{} · <code>{}</code>", environments.short(info.get("key")), how,
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
