"""The Control Panel's home page: the admin index (``/admin/``) with a dashboard above the app list.

The dashboard says, in this order: the runs that wait for a person (each with the sentence of what
it waits for, engine/answers.py ``waiting_sentence``, and a button to the run page's actions), the
runs that are queued or running (stage, phase, heartbeat age, which worker holds them; a queued run
that no live worker will take says why: engine/workers.py ``queued_without_worker``), the recent
runs of every outcome (succeeded, failed, stopped for review: with the stop reason and message and how
long the run took), and the workers (engine/workers.py ``worker_rows``).

Routes (controlpanel/urls.py puts them before the admin's own, both through ``admin_view``):

=================  ===================  ==============================================================
``/admin/``        ``cp-home``          the admin's index (templates/admin/index.html) with the dashboard
``/admin/home/``   ``cp-home-fragment`` the dashboard alone (header ``X-CP-Home: 1``), which the page
                                        fetches every ``HOME_POLL_SECONDS`` seconds (htmx) to swap it in
=================  ===================  ==============================================================

Runs are shown to staff with ``engine.view_run``, workers to staff with ``engine.view_worker``.
Cost: a fixed number of queries whatever the number of runs and workers (the lists are read once
each, with their stages, decisions and attempts; nothing is asked per run).
"""
from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.contrib import admin
from django.db.models import Prefetch
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from engine import answers, hosts, workers
from engine.budgets import spent_by
from engine.workers import age_text
from engine.models import RUN_ACTIVE, RUN_WAITING, Attempt, Run, RunStatus

from .readable import code_spans

#: Seconds between two refreshes of the dashboard (htmx polls the fragment route).
HOME_POLL_SECONDS = 5
#: Runs listed at most in each of the waiting and active lists (the rest: the run list, one link away).
LIST_LIMIT = 50
#: Recent runs listed (the rest: the run list).
RECENT_SHOWN = 10
#: Workers listed (most recent beat first; the rest: the Workers list).
WORKERS_SHOWN = 50
#: A waiting run's button, by status: it leads to the run page's actions (``#actions``).
WAITING_BUTTONS = {RunStatus.WAITING_APPROVAL: "Approve or request changes",
                   RunStatus.WAITING_REVIEW: "Recover or fail"}
#: The statuses of a recent run: it succeeded, failed, or stopped for review.
RECENT_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.WAITING_REVIEW)
#: Run columns a list here never reads (large JSON): left out of its query.
_UNREAD = ("protected_files", "not_included", "profile_override")


def _since(moment: datetime | None, now: datetime) -> float | None:
    return max(0.0, (now - moment).total_seconds()) if moment else None


def _detail(run_id: int) -> str:
    return reverse("admin:engine_run_detail", args=[run_id])


def _waiting(now: datetime) -> tuple[list[dict], bool]:
    """The runs waiting for a person (RUN_WAITING), the longest waiting first: ``([{"id", "url",
    "actions_url", "pipeline", "status", "status_label", "simulated", "stage", "sentence", "button",
    "stop_reason", "stop_message", "waiting_seconds", "waiting_text"}], more)``. Four queries."""
    attempts = Attempt.objects.select_related("result_manifest").only(
        "id", "run", "stage", "operation", "number", "status", "start_manifest", "usage", "spend", "simulated",
        "result_manifest",
        "result_manifest__digest")
    rows = list(Run.objects.filter(status__in=RUN_WAITING).defer(*_UNREAD).order_by("updated_at", "id")
                .prefetch_related("stages", "decisions", Prefetch("attempts", queryset=attempts))[:LIST_LIMIT + 1])
    found = []
    for run in rows[:LIST_LIMIT]:
        stages = sorted(run.stages.all(), key=lambda s: s.order)
        decisions = sorted(run.decisions.all(), key=lambda d: d.pk)
        pending = answers.pending_decisions(run, decisions)
        since = max((d.created_at for d in pending.values()), default=None) or run.updated_at
        stage = answers.waiting_stage(run, stages)
        found.append({
            "id": run.pk, "url": _detail(run.pk), "actions_url": _detail(run.pk) + "#actions",
            "pipeline": run.pipeline_name, "status": run.status, "status_label": run.get_status_display(),
            "simulated": run.simulated, "stage": stage.key if stage else None,
            "sentence": answers.waiting_sentence(run, decisions, stages, list(run.attempts.all())),
            "button": ("Wait for its host, or fail" if answers.waits_for_host(run)
                       else WAITING_BUTTONS.get(run.status, "Open its actions")),
            "stop_reason": run.stop_reason, "stop_message": run.stop_message,
            "waiting_seconds": _since(since, now), "waiting_text": age_text(_since(since, now))})
    return found, len(rows) > LIST_LIMIT


def _active(now: datetime, worker_rows: list[dict]) -> tuple[list[dict], bool]:
    """The queued and running runs (RUN_ACTIVE), oldest first: ``([{"id", "url", "pipeline", "status",
    "simulated", "stage", "phase", "heartbeat_seconds", "heartbeat_text", "stale", "held_by" (a
    worker's name, or ""), "pool_pid", "between_steps", "queued_text", "no_worker" (the sentence of
    ``queued_without_worker``, or ""), "spend_text" (``spend_text``)}], more)``. Four queries (``worker_rows`` are the caller's; the live
    hosts only when a run is queued)."""
    held = {run["id"]: (row, run) for row in worker_rows for run in row["runs"]}
    spends = Attempt.objects.only("id", "run", "spend", "usage", "simulated")
    rows = list(Run.objects.filter(status__in=RUN_ACTIVE).defer(*_UNREAD, "definition").order_by("id")
                .prefetch_related("stages", Prefetch("attempts", queryset=spends))[:LIST_LIMIT + 1])
    live = hosts.live_hosts(now) if any(run.status == RunStatus.QUEUED for run in rows) else []
    found = []
    for run in rows[:LIST_LIMIT]:
        stage = answers.current_stage(run, sorted(run.stages.all(), key=lambda s: s.order))
        age = _since(run.heartbeat_at, now) if run.status == RunStatus.RUNNING else None
        owner, in_hand = held.get(run.pk, (None, None))
        found.append({
            "id": run.pk, "url": _detail(run.pk), "pipeline": run.pipeline_name, "status": run.status,
            "simulated": run.simulated, "stage": stage.key if stage else None,
            "phase": stage.phase if stage else ("final verification" if run.status == RunStatus.RUNNING else None),
            "heartbeat_seconds": age, "heartbeat_text": age_text(age),
            "stale": age is not None and age > settings.CP_HEARTBEAT_STALE,
            "held_by": owner["name"] if owner else "", "holder_alive": bool(owner and owner["alive"]),
            "lease_owner": run.lease_owner, "pool_pid": in_hand["pool_pid"] if in_hand else None,
            "between_steps": run.status == RunStatus.RUNNING and not run.lease_owner,
            "queued_text": age_text(_since(run.queued_at, now)) if run.status == RunStatus.QUEUED else "",
            "no_worker": code_spans(workers.queued_without_worker(run, worker_rows, now, live)),
            "spend_text": spend_text(run, list(run.attempts.all()))})
    return found, len(rows) > LIST_LIMIT


def spend_text(run: Run, attempts: list) -> str:
    """What a run's model calls have spent so far, live (``Attempt.spend``, engine/budgets.py ``spent_by``):
    ``4,100 tokens · $0.0135`` (no money for a simulated run, none said when unknown); '' before any."""
    spends = [spent_by(attempt) for attempt in attempts]
    tokens = sum(found["tokens"] for found in spends)
    if not tokens:
        return ""
    known = not run.simulated and not any(found["unpriced_calls"] for found in spends)
    cost = f" · ${sum(found['cost_usd'] for found in spends):.4f}" if known else ""
    return f"{tokens:,} tokens{cost}"


def _recent(now: datetime) -> list[dict]:
    """The ``RECENT_SHOWN`` runs that ended or stopped for review most recently, newest first:
    ``[{"id", "url", "pipeline", "repo", "status", "status_label", "simulated", "stop_reason", "stop_message",
    "when_text", "took_text"}]`` (``took_text``: from its start to its end or stop, '' when it never started).
    One query."""
    rows = (Run.objects.filter(status__in=RECENT_STATUSES).exclude(status=RunStatus.WAITING_REVIEW, stop_reason="")
            .defer(*_UNREAD, "definition").order_by("-updated_at", "-id")[:RECENT_SHOWN])
    found = []
    for run in rows:
        ended = run.finished_at or run.updated_at
        found.append({"id": run.pk, "url": _detail(run.pk), "pipeline": run.pipeline_name, "repo": run.repo_path,
                      "status": run.status, "status_label": run.get_status_display(), "simulated": run.simulated,
                      "stop_reason": run.stop_reason, "stop_message": run.stop_message,
                      "when_text": age_text(_since(ended, now)),
                      "took_text": age_text(_since(run.started_at, ended)) if run.started_at else ""})
    return found


def dashboard(request, now: datetime | None = None) -> dict:
    """The dashboard's context: ``{"url" (the fragment route), "poll" (seconds), "updated" (now),
    "can_runs", "can_workers", "waiting", "waiting_more", "active", "active_more", "recent", "workers"
    (``worker_rows`` with ``beat_text`` and each run's ``url`` added), "hosts" (engine/hosts.py
    ``host_rows`` with ``beat_text``), "host_stale" (seconds), "worker_stale" (seconds),
    "worker_beat" (seconds), "links" (the run and worker lists)}``. A fixed number of queries (about
    ten) whatever the number of runs and workers."""
    now = now or timezone.now()
    can_runs = request.user.has_perm("engine.view_run")
    can_workers = request.user.has_perm("engine.view_worker")
    rows = workers.worker_rows(limit=WORKERS_SHOWN, now=now) if (can_runs or can_workers) else []
    for row in rows:
        row["beat_text"] = age_text(row["beat_age_seconds"])
        for run in row["runs"]:
            run["url"] = _detail(run["id"])
    host_list = hosts.host_rows(now) if can_workers else []
    for row in host_list:
        row["beat_text"] = age_text(row["beat_age_seconds"])
    context = {"url": reverse("cp-home-fragment"), "poll": HOME_POLL_SECONDS, "updated": now,
               "can_runs": can_runs, "can_workers": can_workers, "workers": rows if can_workers else [],
               "hosts": host_list, "host_stale": hosts.stale_seconds(),
               "worker_stale": workers.stale_seconds(), "worker_beat": settings.CP_WORKER_BEAT,
               "waiting": [], "waiting_more": False, "active": [], "active_more": False, "recent": [],
               "links": {"runs": reverse("admin:engine_run_changelist"),
                         "workers": reverse("admin:engine_worker_changelist")}}
    if can_runs:
        context["waiting"], context["waiting_more"] = _waiting(now)
        context["active"], context["active_more"] = _active(now, rows)
        context["recent"] = _recent(now)
    return context


def index(request):
    """``/admin/``: the admin's own index (its app list and recent actions) with the dashboard above."""
    return admin.site.index(request, extra_context={"cp_home": dashboard(request)})


def fragment(request):
    """``/admin/home/``: the dashboard alone, for the page's refresh (``X-CP-Home: 1`` tells the page
    it got the dashboard and not, say, the login page after the session ended)."""
    response = TemplateResponse(request, "admin/cp_home/_dashboard.html", {"home": dashboard(request)})
    response["X-CP-Home"] = "1"
    return response
