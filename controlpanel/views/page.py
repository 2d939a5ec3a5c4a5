"""The run page as data: ``build_page`` (every part, from a fixed number of queries), the timeline's axis, the
stop card, the events and the header (``build_header``)."""
from __future__ import annotations

import math
import re

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from engine import answers, diff_comments, hosts, operations, workers
from engine.processes import process
from engine.models import ATTEMPT_OPEN, RUN_ACTIVE, RUN_TERMINAL, Check, Decision, Run, RunStatus

from ..attempt_files import attempt_file
from ..readable import code_spans
from .common import (
    EVENT_LIMIT,
    HEADER_POLL_SECONDS,
    _span,
    _version,
    add_usage,
    digest_link,
    exit_text,
    seconds_text,
    stored_file,
    tamper_rows,
    usage_text,
)
from .rows import Box, StageBlock, _moment, _requirement, attempt_row, check_row, manifest_rows


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
        block.usage = usage_text(block.usage, run.simulated)

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
        "notifications": notification_rows(run), "axis": axis,
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
    "tail", "log_url", "exit"} | None, "links": [(href, text)], "facts": [(key, text)], "tamper": rows,
    "led_here": the same for the stop a person failed or recovered the run from | None}``; None when the
    run has no stop and none led here (engine/machine.py ``led_here``). The failing check is the one the
    evidence names, else the stage's latest failed check; the evidence's ids become links (check, attempt
    with its prompt and diff, manifest, decision) and the rest readable ``key: value`` lines."""
    evidence = run.stop_evidence if isinstance(run.stop_evidence, dict) else {}
    earlier = evidence.get("led_here") if isinstance(evidence.get("led_here"), dict) else None
    before = None
    if earlier is not None:
        before = _card(run, str(earlier.get("reason") or ""), str(earlier.get("message") or ""),
                       earlier.get("evidence") if isinstance(earlier.get("evidence"), dict) else {},
                       checks, attempts, by_digest)
    if not (run.stop_reason or run.stop_message):
        return before and {**before, "only_earlier": True}
    card = _card(run, run.stop_reason, run.stop_message, evidence, checks, attempts, by_digest)
    return {**card, "led_here": before}


def _card(run: Run, reason: str, message: str, evidence: dict, checks: list, attempts: list,
          by_digest: dict) -> dict:
    """One stop's card (``stop_card``) from its reason, message and evidence."""
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
        elif key in ("report", "changes") and reason == "protected_files_changed":
            continue  # the tamper table below shows them
        elif key == "led_here":
            continue  # a card of its own
        elif not _empty(value) and _fact_text(value):
            facts.append((key, _fact_text(value)))
    if not named and reason in ("gate_failed", "repair_exhausted", "unchanged_failure",
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
    return {"reason": reason, "message": message, "check": check, "links": links, "facts": facts,
            "tamper": tamper_rows(run, reason, evidence)}


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


def earlier_comments(run: Run, decisions: list[Decision]) -> dict | None:
    """The comments a person sent with the last request for changes of the stage whose approval is pending,
    each said against the files now waiting (engine/diff_comments.py ``against``: what git says the repair
    changed near each line): ``{"decision", "rows"}``, or None (no approval pending, no such comments)."""
    pending = next((d for d in reversed(decisions) if d.state == Decision.State.PENDING
                    and d.kind == Decision.Kind.APPROVAL and d.artifact), None)
    if pending is None:
        return None
    asked = next((d for d in reversed(decisions) if d.stage_id == pending.stage_id and d.pk < pending.pk
                  and d.state == Decision.State.CHANGES_REQUESTED and d.comments and d.artifact), None)
    if asked is None:
        return None
    return {"decision": asked, "rows": diff_comments.against(run, asked.artifact, pending.artifact, asked.comments)}


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
