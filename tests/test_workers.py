"""Worker records (engine/workers.py), the Workers admin list and the home page (controlpanel/home.py).

The fast tests build ``Worker`` rows and runs as fixture data (no process): who counts as alive,
which runs a worker holds (a run's lease owner joined with the worker's pool pids), what a queued
run without a worker says, the beat thread riding out a database error, and the home page: each
kind of run with its sentence and button, in a fixed number of queries. The slow ones start real
``celery -A controlpanel worker`` processes (tests/support/workers.py ``Solo``, on a queue of their
own, against the test database): the row appears, beats, holds a run, and is marked stopped by a
clean shutdown; a ``kill -9`` leaves a row whose beat goes stale. The last one looks at the home
page in headless Chromium 390 px wide (skipped without Chromium, as tests/browser/ is).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from engine import answers, operations, workers
from engine.models import Attempt, Decision, Manifest, Run, Worker

from .conftest import ANSWER_STEP, navigate_by, wait_for, wait_until
from .support.workers import Solo
from .support.runs import QUICK

#: An implementer that waits (at most 60 s) until the test writes $CP_DATA_DIR/release.
WAIT_FOR_RELEASE = {**ANSWER_STEP, "run": [
    "sh", "-c", 'i=0; while [ ! -f "$CP_DATA_DIR/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done']}
HOST = socket.gethostname()


def worker_row(name="w1@h", host="h", pid=100, queues=None, beat_ago=1.0, stopped=False, pool_pids=(101,),
               concurrency=1) -> Worker:
    """A Worker row as a worker's beat writes it, its last beat ``beat_ago`` seconds ago."""
    now = timezone.now()
    return Worker.objects.create(name=name, host=host, pid=pid, queues=list(queues or [settings.CELERY_TASK_DEFAULT_QUEUE]),
                                 concurrency=concurrency, pool_pids=list(pool_pids),
                                 started_at=now - timedelta(seconds=beat_ago + 60),
                                 beat_at=now - timedelta(seconds=beat_ago),
                                 stopped_at=now - timedelta(seconds=beat_ago) if stopped else None)


@pytest.fixture(autouse=True)
def _no_other_workers(request):
    """A fast test sees only the Worker rows it makes: rows the session's real workers wrote (tests/conftest.py
    ``worker_pool``, tests/support/workers.py ``Solo``) are deleted in the test's transaction, and come back
    with its rollback."""
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and not marker.kwargs.get("transaction"):
        request.getfixturevalue("db")
        Worker.objects.all().delete()


@pytest.fixture
def staff(client, django_user_model):
    """A client logged in as a superuser."""
    client.force_login(django_user_model.objects.create_superuser("admin", "admin@example.invalid", "pw-for-tests"))
    return client


# ----------------------------------------------------------------------------- reading the records


@pytest.mark.django_db
def test_it_counts_a_worker_alive_while_it_beats_and_has_not_stopped(settings):
    settings.CP_WORKER_STALE = 15.0
    worker_row("fresh@h", beat_ago=2)
    worker_row("silent@h", pid=200, beat_ago=40)
    worker_row("gone@h", pid=300, beat_ago=1, stopped=True)
    rows = {row["name"]: row for row in workers.worker_rows()}
    assert {name: (row["alive"], row["liveness"]) for name, row in rows.items()} == {
        "fresh@h": (True, "alive"), "silent@h": (False, "lost"), "gone@h": (False, "stopped")}
    assert 1.5 < rows["fresh@h"]["beat_age_seconds"] < 10 and rows["fresh@h"]["queues"] == [
        settings.CELERY_TASK_DEFAULT_QUEUE]
    assert [row["name"] for row in workers.live_workers()] == ["fresh@h"]
    settings.CP_WORKER_STALE = 60.0
    assert {row["name"] for row in workers.live_workers()} == {"fresh@h", "silent@h"}


def test_the_stale_default_is_three_beats_and_at_least_15_s(tmp_path):
    code = "from django.conf import settings; print(settings.CP_WORKER_BEAT, settings.CP_WORKER_STALE)"
    seen = {}
    for beat in ("5", "10", "1"):
        env = {**os.environ, "CP_WORKER_BEAT": beat, "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
               "CP_VAR_DIR": str(tmp_path)}
        env.pop("CP_WORKER_STALE", None)
        out = subprocess.run([sys.executable, "-c", "import django; django.setup(); " + code], env=env,
                             cwd=settings.BASE_DIR, capture_output=True, text=True, check=True).stdout.split()
        seen[beat] = tuple(float(x) for x in out)
    assert seen == {"5": (5.0, 15.0), "10": (10.0, 30.0), "1": (1.0, 15.0)}


@pytest.mark.django_db
def test_a_run_is_in_the_hands_of_the_worker_whose_pool_process_holds_its_lease(run_row):
    held = run_row(status="running", stage_statuses=("running",), lease_owner="h:101", heartbeat_at=timezone.now())
    elsewhere = run_row(status="running", stage_statuses=("running",), lease_owner="other:101")
    between = run_row(status="running", stage_statuses=("running",), lease_owner="")
    worker_row("w1@h", pid=100, pool_pids=[101, 102])
    worker_row("w2@h", pid=200, pool_pids=[201])
    rows = {row["name"]: row for row in workers.worker_rows()}
    assert [(r["id"], r["stage"], r["phase"], r["pool_pid"]) for r in rows["w1@h"]["runs"]] == [
        (held.pk, "answer", "implement", 101)]
    assert rows["w2@h"]["runs"] == []
    assert {elsewhere.pk, between.pk}.isdisjoint(r["id"] for row in rows.values() for r in row["runs"])
    # a stale row of an earlier worker whose pool pid was reused: the one that beat last holds it
    worker_row("old@h", pid=90, pool_pids=[101], beat_ago=500)
    rows = {row["name"]: row for row in workers.worker_rows()}
    assert [r["id"] for r in rows["w1@h"]["runs"]] == [held.pk] and rows["old@h"]["runs"] == []


@pytest.mark.django_db
def test_a_queued_run_says_why_no_worker_takes_it(run_row, settings):
    settings.CP_WORKER_STALE = 15.0
    queued = run_row(status="queued")
    assert workers.queued_without_worker(run_row(status="running")) == ""
    said = workers.queued_without_worker(queued)
    assert said == ("No worker is alive: no worker has beaten in the last 15 s (none has ever beaten here). "
                    "Start one with `make worker` (README.md, \"Processes\").")
    worker_row("dead@h", beat_ago=85)
    said = workers.queued_without_worker(queued)
    assert said.startswith("No worker is alive: no worker has beaten in the last 15 s (the last one, dead@h on h, "
                           "beat 1 min 25 s ago).") and "`make worker`" in said
    other = worker_row("other@h", pid=300, queues=["elsewhere"], pool_pids=[301])
    said = workers.queued_without_worker(queued)
    assert said.startswith(f"No live worker consumes queue '{settings.CELERY_TASK_DEFAULT_QUEUE}'") and \
        "other@h (elsewhere)" in said
    worker_row("busy@h", pid=400, pool_pids=[401])
    run_row(status="running", stage_statuses=("running",), lease_owner="h:401", heartbeat_at=timezone.now())
    assert workers.queued_without_worker(queued).startswith(
        f"Every live worker of queue '{settings.CELERY_TASK_DEFAULT_QUEUE}' is busy: 1 run(s)")
    Worker.objects.filter(pk=other.pk).update(queues=["elsewhere", settings.CELERY_TASK_DEFAULT_QUEUE])
    assert workers.queued_without_worker(queued) == ""  # other@h has a free pool process


def test_a_worker_describes_itself_from_celerys_consumer():
    app = SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(consume_from={"runs": 1, "b": 2})))
    prefork = SimpleNamespace(hostname="n@h", app=app, pool=SimpleNamespace(info={"processes": [11, 12]}),
                              controller=SimpleNamespace(concurrency=2))
    assert workers.describe_consumer(prefork) == {"name": "n@h", "queues": ["b", "runs"], "concurrency": 2,
                                                  "pool_pids": [11, 12]}
    solo = SimpleNamespace(hostname="s@h", app=app, pool=SimpleNamespace(info={"max-concurrency": 1}),
                           controller=SimpleNamespace(concurrency=1))
    assert workers.describe_consumer(solo)["pool_pids"] == [os.getpid()]  # tasks run in the main process


@pytest.mark.django_db(transaction=True)
def test_the_beat_rides_out_a_database_error_and_marks_the_row_stopped(monkeypatch, caplog):
    real = Worker.objects.update_or_create
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(Worker.objects, "update_or_create", flaky)
    facts = {"name": "beat-test@h", "queues": ["q"], "concurrency": 3, "pool_pids": [7, 8]}
    beat = workers.WorkerBeat(lambda: facts, 0.05)
    beat.start()
    deadline = time.monotonic() + 10
    while len(calls) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert beat.is_alive() and len(calls) >= 4 and beat.failures == 0  # the failed beat was tried again
    row = Worker.objects.get(name="beat-test@h")
    assert (row.host, row.pid, row.queues, row.concurrency, row.pool_pids, row.stopped_at) == (
        socket.gethostname(), os.getpid(), ["q"], 3, [7, 8], None)
    assert "worker beat failed (1 in a row)" in caplog.text
    beat.stop()
    assert not beat.is_alive()
    row.refresh_from_db()
    assert row.stopped_at is not None and row.pool_pids == [] and not workers.is_alive(row)


@pytest.mark.django_db
def test_two_live_workers_with_one_node_name_get_a_row_each():
    facts = {"name": "celery@twice", "queues": ["q"], "concurrency": 1, "pool_pids": [1]}
    worker_row("celery@twice", host=HOST, pid=os.getppid())  # a live process of this host holds the name
    beat = workers.WorkerBeat(lambda: facts, 5)
    beat.beat()
    assert beat.name == f"celery@twice (pid {os.getpid()})"
    assert Worker.objects.get(name="celery@twice").pid == os.getppid()
    assert Worker.objects.get(name=beat.name).pid == os.getpid()
    # a restart after a kill -9: the name's row is still fresh, but its process is gone: the name is taken over
    dead = subprocess.Popen(["true"])
    dead.wait()
    Worker.objects.filter(name="celery@twice").update(pid=dead.pid)
    again = workers.WorkerBeat(lambda: facts, 5)
    again.beat()
    assert again.name == "celery@twice" and Worker.objects.get(name="celery@twice").pid == os.getpid()


# ----------------------------------------------------------------------------- the home page


def approval_run(run_row):
    run = run_row(status="waiting_approval", stage_statuses=("waiting_approval",), stop_reason="human_gate",
                  stop_message="Stage answer passed its checks and review; it waits for approval.")
    Decision.objects.create(run=run, stage=run.stages.get(), kind="approval", artifact="ab12" * 10, reason="human_gate")
    return run


def review_run(run_row):
    run = run_row(status="waiting_review", stage_statuses=("waiting_review",), stop_reason="review_escalated",
                  stop_message="The reviewer asked a person to decide.",
                  pipeline_kwargs={"budgets": {"max_attempts": 5, "max_cost_usd": 3}})
    stage = run.stages.get()
    Decision.objects.create(run=run, stage=stage, kind="review", reason="review_escalated")
    files = Manifest.objects.create(run=run, stage=stage, digest="d" * 40, base_commit="0" * 40, path="m.json",
                                    sha256="0" * 64)
    Attempt.objects.create(run=run, stage=stage, operation="implement", number=1, role="implementer",
                           profile_name="scripted", adapter="scripted", status="failed", deadline_seconds=60,
                           usage={"cost_usd": 0.5}, start_manifest="e" * 40, result_manifest=files)
    return run


def failed_run(run_row, n=0):
    return run_row(status="failed", stage_statuses=("failed",), stop_reason="gate_failed",
                   stop_message=f"Gate 'unit' exited 1 on the stage's files ({n}).", finished_at=timezone.now())


def queued_run(run_row):
    return run_row(status="queued", queued_at=timezone.now() - timedelta(seconds=85))


def running_run(run_row, pool_pid):
    return run_row(status="running", stage_statuses=("running",), lease_owner=f"h:{pool_pid}",
                   heartbeat_at=timezone.now())


def home(client) -> str:
    response = client.get("/admin/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_the_home_page_lists_a_run_waiting_for_approval_with_its_button(staff, run_row):
    run = approval_run(run_row)
    text = home(staff)
    waiting = text.split('id="cp-home-waiting"')[1].split("</section>")[0]
    assert f'data-run="{run.pk}"' in waiting
    assert answers.waiting_sentence(run) in waiting  # the sentence of engine/answers.py
    link = reverse("admin:engine_run_detail", args=[run.pk]) + "#actions"
    assert f'<a class="button cp-home-button" href="{link}">Approve or request changes</a>' in waiting
    assert "SIMULATED" in waiting
    assert 'id="content-main"' in text and "app-engine" in text  # the stock app list stays below
    assert text.index('id="cp-home"') < text.index("app-engine")


@pytest.mark.django_db
def test_the_home_page_lists_a_run_waiting_for_review_with_its_sentence(staff, run_row):
    run = review_run(run_row)
    waiting = home(staff).split('id="cp-home-waiting"')[1].split("</section>")[0]
    assert "Waiting for a person: recover it (retry or verify), recheck it, or fail it." in waiting
    assert answers.waiting_sentence(run) in waiting and "review_escalated" in waiting
    assert "Recover or fail</a>" in waiting


def recent(client) -> str:
    return home(client).split('id="cp-home-recent"')[1].split("</section>")[0]


@pytest.mark.django_db
def test_the_home_page_lists_a_failed_run_among_the_recent_runs(staff, run_row):
    run = failed_run(run_row)
    listed = recent(staff)
    assert f'data-run="{run.pk}"' in listed and "<code>gate_failed</code>" in listed
    assert "Gate &#x27;unit&#x27; exited 1 on the stage&#x27;s files (0)." in listed


@pytest.mark.django_db
def test_the_home_page_lists_recent_runs_of_every_outcome_a_succeeded_one_too(staff, run_row):
    """Right after `make demo` its succeeded run is on the home page, newest first, with how long it took."""
    now = timezone.now()
    failed = failed_run(run_row)
    succeeded = run_row(status="succeeded", stage_statuses=("passed",), started_at=now - timedelta(seconds=95),
                        finished_at=now)
    pending = run_row()  # neither ended nor stopped: not a recent run
    listed = recent(staff)
    assert f'data-run="{pending.pk}"' not in listed
    assert listed.index(f'data-run="{succeeded.pk}"') < listed.index(f'data-run="{failed.pk}"')
    item = listed.split(f'data-run="{succeeded.pk}"')[1].split("</li>")[0]
    assert "succeeded" in item and "took 1 min 35 s" in item and succeeded.repo_path in item
    assert "<code>" not in item  # no stop reason for a success


@pytest.mark.django_db
def test_a_queued_run_with_no_live_worker_says_so_on_the_home_page(staff, run_row, settings):
    settings.CP_WORKER_STALE = 15.0
    run = queued_run(run_row)
    worker_row("dead@h", beat_ago=125)
    active = home(staff).split('id="cp-home-active"')[1].split("</section>")[0]
    assert f'data-run="{run.pk}"' in active and "queued 1 min 25 s ago" in active
    assert "No worker is alive: no worker has beaten in the last 15 s (the last one, dead@h on h, beat 2 min 05 s " \
           "ago)." \
        in active and "<code>make worker</code>" in active  # the command, shown as code
    listed = home(staff).split('id="cp-home-workers"')[1]
    assert 'data-worker="dead@h"' in listed and "not alive" in listed
    worker_row("live@h", pid=300, pool_pids=[301])
    active = home(staff).split('id="cp-home-active"')[1].split("</section>")[0]
    assert "No worker is alive" not in active


@pytest.mark.django_db
def test_a_running_run_shows_its_stage_heartbeat_and_worker(staff, run_row):
    worker_row("w1@h", pid=100, pool_pids=[101])
    run = running_run(run_row, 101)
    text = home(staff)
    active = text.split('id="cp-home-active"')[1].split("</section>")[0]
    assert "stage answer &middot; implement" in active and "heartbeat 0 s ago" in active
    assert "held by w1@h (pool process 101)" in active
    listed = text.split('id="cp-home-workers"')[1]
    detail = reverse("admin:engine_run_detail", args=[run.pk])
    assert f'<a href="{detail}">run {run.pk}</a> (answer, implement)' in listed and "alive" in listed


def _every_kind(run_row, count: int, first: int = 0) -> None:
    for n in range(first, first + count):
        approval_run(run_row)
        review_run(run_row)
        failed_run(run_row, n)
        queued_run(run_row)
        worker_row(f"w{n}@h", pid=1000 + n, pool_pids=[2000 + n])
        running_run(run_row, 2000 + n)


@pytest.mark.django_db
def test_the_home_page_asks_a_fixed_number_of_queries(staff, run_row):
    _every_kind(run_row, 1)
    home(staff)  # the session, the user: warm
    with CaptureQueriesContext(connection) as few:
        text = home(staff)
    # six run items (the review run is a recent run too) and the test's worker; the session's real workers
    # (tests/conftest.py worker_pool) may list their own host and worker rows beside them
    assert text.count("data-run=") == 6 and text.count('data-worker="w0@h"') == 1
    with CaptureQueriesContext(connection) as fragment:
        assert staff.get("/admin/home/").status_code == 200
    _every_kind(run_row, 19, first=1)
    with CaptureQueriesContext(connection) as many:
        text = home(staff)
    assert text.count("Approve or request changes</a>") == 20 and text.count("Recover or fail</a>") == 20
    assert text.count("held by w") == 20
    assert text.split('id="cp-home-recent"')[1].split("</section>")[0].count('class="cp-home-item') == 10
    assert len(many.captured_queries) == len(few.captured_queries), [q["sql"] for q in many.captured_queries]
    with CaptureQueriesContext(connection) as fragment_many:
        assert staff.get("/admin/home/").status_code == 200
    assert len(fragment_many.captured_queries) == len(fragment.captured_queries) <= 16


@pytest.mark.django_db
def test_the_dashboard_fragment_refreshes_only_itself(staff, run_row):
    approval_run(run_row)
    page = home(staff)
    assert 'src="/static/vendor/htmx.min.js"' in page and "controlpanel/home.css" in page
    assert 'hx-get="/admin/home/" hx-trigger="every 5s" hx-swap="outerHTML"' in page
    response = staff.get("/admin/home/")
    fragment = response.content.decode()
    assert response["X-CP-Home"] == "1"
    assert fragment.lstrip().startswith('<div id="cp-home"') and "app-engine" not in fragment
    assert "Approve or request changes" in fragment
    anonymous = Client().get("/admin/home/")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]


@pytest.mark.django_db
def test_staff_without_the_view_permissions_get_the_page_without_the_lists(client, django_user_model, run_row):
    approval_run(run_row)
    user = django_user_model.objects.create_user("viewer", "v@example.invalid", "pw", is_staff=True)
    client.force_login(user)
    text = home(client)
    assert 'id="cp-home"' in text and "cp-home-waiting" not in text and "cp-home-workers" not in text


@pytest.mark.django_db
def test_the_workers_admin_list_shows_each_worker_and_its_runs(staff, run_row):
    worker_row("w1@h", pid=100, pool_pids=[101])
    worker_row("old@h", pid=50, pool_pids=[51], beat_ago=900, stopped=True)
    run = running_run(run_row, 101)
    text = staff.get(reverse("admin:engine_worker_changelist")).content.decode()
    detail = reverse("admin:engine_run_detail", args=[run.pk])
    assert "w1@h" in text and "old@h" in text and f'<a href="{detail}">run {run.pk}</a> (answer, implement)' in text
    assert text.count('alt="True"') == 1 and text.count('alt="False"') == 1
    assert staff.get(reverse("admin:engine_worker_add")).status_code == 403
    row = Worker.objects.get(name="w1@h")
    change = staff.get(reverse("admin:engine_worker_change", args=[row.pk])).content.decode()
    assert f'<a href="{detail}">run {run.pk}</a>' in change


# ----------------------------------------------------------------------------- real worker processes




def row_of(solo: Solo) -> Worker | None:
    return Worker.objects.filter(host=HOST, pid=solo.proc.pid).first()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_records_itself_beats_holds_a_run_and_stops_cleanly(tmp_path, make_pipeline, repo, route,
                                                                         django_user_model):
    queue = f"workers-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    solo = Solo(tmp_path, queue, CP_WORKER_BEAT="0.5").start()
    try:
        row = wait_until(lambda: row_of(solo), what="the worker's row")
        pool = [child.pid for child in psutil.Process(solo.proc.pid).children()]
        assert (row.host, row.queues, row.concurrency, row.stopped_at) == (HOST, [queue, f"{queue}.host.{HOST}"], 1, None)
        assert row.name.startswith("solo-") and row.pool_pids and set(row.pool_pids) <= set(pool)
        first = row.beat_at
        wait_until(lambda: Worker.objects.get(pk=row.pk).beat_at > first, what="a second beat")
        assert row.name in [w["name"] for w in workers.live_workers()]

        pipeline = make_pipeline(name="held", stages=QUICK,
                                 scenario={"stages": {"answer": {"implement": [WAIT_FOR_RELEASE]}}})
        run = operations.create_run(pipeline, str(repo), "main")
        route(queue)
        operations.request_start(run, requested_by="test", source="test")
        wait_until(lambda: Attempt.objects.filter(run=run, status="running").exists(), 60, "the held attempt")
        mine = next(w for w in workers.worker_rows(limit=None) if w["name"] == row.name)
        assert [(r["id"], r["stage"], r["phase"]) for r in mine["runs"]] == [(run.pk, "answer", "implement")]
        assert Run.objects.get(pk=run.pk).lease_owner == f"{HOST}:{mine['runs'][0]['pool_pid']}"
        client = Client()
        client.force_login(django_user_model.objects.create_superuser("admin", "a@example.invalid", "pw"))
        assert f"held by {row.name} (pool process {mine['runs'][0]['pool_pid']})" in home(client)

        flag = Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}" / "data" / "release"
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.write_text("go\n")
        assert wait_for(run.pk, timeout=120).status == "succeeded"
        mine = next(w for w in workers.worker_rows(limit=None) if w["name"] == row.name)
        assert mine["runs"] == [] and mine["alive"]
    finally:
        solo.stop()
    row.refresh_from_db()
    assert row.stopped_at is not None and row.pool_pids == []
    assert row.name not in [w["name"] for w in workers.live_workers()]
    assert next(w for w in workers.worker_rows(limit=None) if w["name"] == row.name)["liveness"] == "stopped"
    assert "worker beat failed" not in solo.text()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_leaves_a_row_whose_beat_goes_stale(tmp_path, settings, run_row):
    settings.CP_WORKER_STALE = 2.0
    queue = f"workers-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    solo = Solo(tmp_path, queue, CP_WORKER_BEAT="0.5").start()
    try:
        row = wait_until(lambda: row_of(solo), what="the worker's row")
        wait_until(lambda: row.name in [w["name"] for w in workers.live_workers()], what="the worker alive")
    finally:
        solo.kill()  # SIGKILL to its process group: no shutdown signal, no last write
    killed_at = timezone.now()
    time.sleep(2.5)
    row.refresh_from_db()
    assert row.stopped_at is None and row.beat_at <= killed_at
    assert row.name not in [w["name"] for w in workers.live_workers()]
    mine = [w for w in workers.worker_rows(limit=None) if w["name"] == row.name]
    assert mine[0]["liveness"] == "lost" and mine[0]["beat_age_seconds"] >= 2.0
    said = workers.queued_without_worker(run_row(status="queued"), rows=mine)
    assert said.startswith(f"No worker is alive: no worker has beaten in the last 2 s (the last one, {row.name} "
                           f"on {HOST}, beat ")


# ----------------------------------------------------------------------------- the page in a browser


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_home_page_at_390_px_has_no_sideways_scroll_and_refreshes_itself(narrow_page, run_row,
                                                                             django_user_model):
    django_user_model.objects.create_superuser("admin", "admin@example.invalid", "pw-for-browser-tests")
    approval_run(run_row)
    review_run(run_row)
    run_row(status="failed", stage_statuses=("failed",), stop_reason="gate_failed",
            stop_message="x" * 400 + " /a/very/long/path/" + "segment/" * 40, finished_at=timezone.now())
    queued_run(run_row)
    worker_row("a-very-long-worker-node-name-for-a-narrow-screen@some-long-host-name.example", pid=100,
               pool_pids=[101])
    running_run(run_row, 101)
    tab = narrow_page
    tab.goto("/admin/")
    tab.fill("#id_username", "admin")
    tab.fill("#id_password", "pw-for-browser-tests")
    navigate_by(tab, lambda: tab.click("#login-form input[type=submit]"))
    tab.wait_for_selector("#cp-home-waiting")
    widths = tab.evaluate("[document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]")
    assert max(widths) <= 390, widths  # nothing sticks out sideways
    tab.screenshot(path=str(Path(settings.BASE_DIR) / "test-artifacts" / "home-390.png"), full_page=True)
    tab.evaluate("window.cpMark = 1")
    later = approval_run(run_row)
    tab.wait_for_selector(f'#cp-home-waiting [data-run="{later.pk}"]', timeout=15_000)  # the fragment, swapped in
    assert tab.evaluate("window.cpMark") == 1  # without a reload
    assert tab.locator("#cp-home").count() == 1


def test_the_home_page_shows_each_host_its_runs_and_whether_it_is_gone(staff, run_row, settings):
    from engine.models import Host

    settings.CP_HOST_STALE = 15.0
    now = timezone.now()
    Host.objects.create(name="host-a", queue="runs.host.host-a", repo_roots=["/repos"], started_at=now, beat_at=now)
    Host.objects.create(name="host-b", queue="runs.host.host-b", started_at=now - timedelta(minutes=5),
                        beat_at=now - timedelta(seconds=95))
    pinned = run_row(status="waiting_review", stage_statuses=("waiting_review",), stop_reason="interrupted",
                     stop_evidence={"host": "host-b", "host_confirmed": False})
    Run.objects.filter(pk=pinned.pk).update(host="host-b")
    listed = home(staff).split('id="cp-home-hosts"')[1].split("</ul>")[0]
    a, b = listed.split('data-host="host-a"')[1].split("</li>")[0], listed.split('data-host="host-b"')[1]
    assert ">alive<" in a and "reaches /repos" in a and "0 unfinished runs pinned here" in a
    assert ">gone<" in b and "any repository path" in b and "last beat 1 min 35 s ago" in b
    assert "1 unfinished run pinned here" in b and "1 waits for this host to confirm their old processes gone" in b
