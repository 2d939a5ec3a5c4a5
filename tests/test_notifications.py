"""Notifications (engine/notifications.py, docs/notifications.md): one signed delivery per waiting
decision and one per end, through a webhook receiver on 127.0.0.1 and Django's test outbox;
retries with backoff, failure when the tries are used up, shown on the run page and in the admin;
and once per key across a worker restart (a real worker)."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import threading
import uuid
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from engine import machine, notifications, operations, reconcile, runner
from engine.models import Notification, Run

from .conftest import wait_for, wait_until, Workers
from .support.runs import drive, gated_run

SECRET = "test-secret-not-a-real-one"
#: committed transactions: the outbox is sent after commit, as in production
pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    """A webhook receiver on 127.0.0.1 in a thread: records each POST (headers, body) and answers
    the statuses of ``answers`` in turn (then 200)."""

    def __init__(self):
        self.got: list[dict] = []
        self.answers: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.got.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def events(self) -> list[tuple[str, dict]]:
        """``[(X-CP-Event, payload)]`` of every POST, after checking its signature."""
        found = []
        for item in self.got:
            expected = "sha256=" + hmac.new(SECRET.encode(), item["body"], hashlib.sha256).hexdigest()
            assert hmac.compare_digest(item["headers"]["x-cp-signature"], expected), "bad signature"
            data = json.loads(item["body"])
            assert item["headers"]["x-cp-delivery"] == data["delivery"]
            found.append((item["headers"]["x-cp-event"], data))
        return found


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def outbox_sent(monkeypatch):
    """The ``engine.notify`` messages (``(ids, countdown)``) instead of sending them: the test delivers."""
    messages = []
    monkeypatch.setattr(notifications, "enqueue", lambda ids, countdown=None: messages.append((list(ids), countdown)))
    return messages


@pytest.fixture
def configured(settings, receiver):
    """Both channels configured (webhook to the receiver, email to two addresses), quick backoff."""
    settings.CP_NOTIFY_WEBHOOK_URL = receiver.url
    settings.CP_NOTIFY_WEBHOOK_SECRET = SECRET
    settings.CP_NOTIFY_EMAIL_TO = ["pat@example.invalid", "sam@example.invalid"]
    settings.CP_NOTIFY_BACKOFF = 5.0
    settings.CP_NOTIFY_TRIES = 3
    settings.CP_PUBLIC_URL = "https://cp.example.invalid"
    return settings


def deliver_sent(outbox_sent) -> dict:
    """Deliver what was sent so far, as the worker taking each ``engine.notify`` would; what those
    deliveries send (a retry) stays in ``outbox_sent``."""
    outcomes, messages = {}, list(outbox_sent)
    outbox_sent.clear()
    for ids, _ in messages:
        outcomes.update(notifications.deliver_all(ids))
    return outcomes


def ended_run(run_row, status="succeeded") -> Run:
    """A finished run (rows only) with its end notice written as machine.succeed/fail write it."""
    run = run_row(status=status, stage_statuses=("passed",))
    with transaction.atomic():
        machine.notify(run, "ended")
    return run


@pytest.mark.pipeline
def test_a_gated_run_gets_one_signed_delivery_per_waiting_decision_and_one_per_end(
        configured, receiver, outbox_sent, make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    decision = run.decisions.get(state="pending")
    rows = list(Notification.objects.filter(run=run))
    assert {(r.key, r.channel, r.kind, r.state) for r in rows} == {
        (f"decision:{decision.pk}", "email", "waiting", "pending"),
        (f"decision:{decision.pk}", "webhook", "waiting", "pending")}
    assert sorted(outbox_sent[0][0]) == sorted(r.pk for r in rows)  # sent after commit
    assert set(deliver_sent(outbox_sent).values()) == {"delivered"}

    [(event, data)] = receiver.events()
    webhook = Notification.objects.get(run=run, channel="webhook")
    assert event == "run.waiting" and data["delivery"] == str(webhook.uid)
    assert data["decision"] == {"id": decision.pk, "kind": "approval", "reason": "human_gate",
                                "artifact": decision.artifact}
    assert data["run"]["status"] == "waiting_approval" and data["run"]["stop_reason"] == "human_gate"
    assert data["run"]["link"] == f"https://cp.example.invalid/admin/engine/run/{run.pk}/detail/"
    assert data["actions"]["approve"] == {"decision": decision.pk, "artifact": decision.artifact}
    assert data["waiting"].startswith("Waiting for a person to approve")
    assert SECRET not in receiver.got[0]["body"].decode()
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["pat@example.invalid", "sam@example.invalid"]
    assert f"Run {run.pk}" in mail.outbox[0].subject and "waits for a person" in mail.outbox[0].subject
    assert data["run"]["link"] in mail.outbox[0].body

    operations.approve(run, decision.pk, decision.artifact, reviewer="pat")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert set(deliver_sent(outbox_sent).values()) == {"delivered"}
    # a duplicated message, a reconciliation pass: nothing is sent again
    assert set(notifications.deliver_all(list(Notification.objects.values_list("pk", flat=True))).values()) == {None}
    assert reconcile.reconcile()["notified"] == 0
    events = receiver.events()
    assert [e for e, _ in events] == ["run.waiting", "run.ended"]
    assert events[1][1]["run"]["status"] == "succeeded" and events[1][1]["decision"] is None
    assert len({d["delivery"] for _, d in events}) == 2
    assert Notification.objects.get(run=run, channel="webhook", kind="ended").key == f"end:{run.uid}"
    assert len(mail.outbox) == 2 and "ended: succeeded" in mail.outbox[1].subject
    assert set(Notification.objects.values_list("state", "tries", "last_status")) == {
        ("delivered", 1, 200), ("delivered", 1, None)}
    # the notice is written once per key: writing it again makes no row
    with transaction.atomic():
        machine.notify(run, "ended")
    assert Notification.objects.filter(run=run).count() == 4 and not outbox_sent


def test_a_500_is_retried_with_backoff_and_every_try_is_recorded(configured, receiver, outbox_sent, run_row):
    configured.CP_NOTIFY_EMAIL_TO = []
    receiver.answers = [500]
    run = ended_run(run_row, "failed")
    [row] = Notification.objects.filter(run=run)
    assert deliver_sent(outbox_sent) == {row.pk: "retry"}
    row.refresh_from_db()
    assert (row.state, row.tries, row.last_status, row.last_error) == ("pending", 1, 500,
                                                                       "HTTP 500 Internal Server Error")
    assert 4.0 < (row.next_attempt_at - timezone.now()).total_seconds() <= 5.0
    assert outbox_sent == [([row.pk], 5.0)]  # the retry is sent for when it is due
    assert notifications.deliver(row.pk) is None and reconcile.reconcile()["notified"] == 0  # not due yet
    assert [notifications.backoff(n) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]
    Notification.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert reconcile.reconcile()["notified"] == 1  # the sweep delivers what is due
    row.refresh_from_db()
    assert (row.state, row.tries, row.last_status, row.last_error) == ("delivered", 2, 200, "")
    assert [(entry["try"], entry["status"]) for entry in row.log] == [(1, 500), (2, 200)]
    assert len(receiver.got) == 2 and len({item["headers"]["x-cp-delivery"] for item in receiver.got}) == 1


def test_tries_used_up_fail_the_delivery_and_the_run_page_and_admin_show_it(configured, receiver, outbox_sent,
                                                                              run_row, admin_client):
    configured.CP_NOTIFY_EMAIL_TO = []
    configured.CP_NOTIFY_TRIES = 2
    receiver.answers = [503, 502]
    run = ended_run(run_row)
    [row] = Notification.objects.filter(run=run)
    assert notifications.deliver(row.pk) == "retry"
    Notification.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
    assert notifications.deliver(row.pk) == "failed"
    row.refresh_from_db()
    assert (row.state, row.tries, row.last_status, row.next_attempt_at) == ("failed", 2, 502, None)
    assert [entry["status"] for entry in row.log] == [503, 502]
    assert notifications.deliver(row.pk) is None and reconcile.reconcile()["notified"] == 0  # failed stays failed
    page = admin_client.get(reverse("admin:engine_run_detail", args=[run.pk])).content.decode()
    section = page.split('<section id="notifications" data-cp-part="notifications">', 1)[1].split("</section>", 1)[0]
    assert str(row.uid) in section and "<b>failed</b>" in section and "502 HTTP 502 Bad Gateway" in section
    assert "run.ended" in section and "webhook" in section
    listing = admin_client.get(reverse("admin:engine_notification_changelist"))
    assert listing.status_code == 200 and str(row.uid) in listing.content.decode()
    assert admin_client.get(reverse("admin:engine_notification_add")).status_code == 403


def test_a_delivery_stuck_in_sending_is_claimed_again_and_the_late_try_changes_nothing(configured, receiver,
                                                                                       outbox_sent, run_row):
    configured.CP_NOTIFY_EMAIL_TO = []
    configured.CP_NOTIFY_STALE = 60.0
    run = ended_run(run_row)
    [row] = Notification.objects.filter(run=run)
    first = machine.notification_claim(row.pk, timezone.now() - timedelta(seconds=120))  # a worker that died
    assert first is not None
    assert machine.notification_claim(row.pk, timezone.now()) is None  # sending: not claimed twice
    assert reconcile.reconcile()["notified"] == 1
    row.refresh_from_db()
    assert (row.state, row.tries) == ("delivered", 2)
    assert not machine.notification_delivered(row.pk, first, {"try": 1}, 200)  # the dead try's late answer
    assert [item["headers"]["x-cp-delivery"] for item in receiver.got] == [str(row.uid)]


def test_no_channel_configured_writes_no_row(settings, outbox_sent, run_row):
    settings.CP_NOTIFY_EMAIL_TO = []
    settings.CP_NOTIFY_WEBHOOK_URL = ""
    ended_run(run_row)
    settings.CP_NOTIFY_WEBHOOK_URL = "http://127.0.0.1:9/hook"  # a webhook without a secret is not used
    settings.CP_NOTIFY_WEBHOOK_SECRET = ""
    ended_run(run_row, "failed")
    assert Notification.objects.count() == 0 and outbox_sent == [] and mail.outbox == []
    settings.CP_NOTIFY_WEBHOOK_SECRET = SECRET  # nor one whose URL is not http(s): no local file is read
    for url in ("file:///etc/hostname", "ftp://127.0.0.1/x", "127.0.0.1:9/hook", "http://"):
        settings.CP_NOTIFY_WEBHOOK_URL = url
        ended_run(run_row, "failed")
    assert Notification.objects.count() == 0 and outbox_sent == []


def test_an_unreachable_webhook_and_a_broken_mail_server_are_retried_not_raised(configured, outbox_sent, run_row):
    configured.CP_NOTIFY_WEBHOOK_URL = "http://127.0.0.1:9/hook"  # nothing listens on the discard port
    configured.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    configured.EMAIL_HOST, configured.EMAIL_PORT, configured.EMAIL_TIMEOUT = "127.0.0.1", 9, 2
    ended_run(run_row)
    assert set(deliver_sent(outbox_sent).values()) == {"retry"}
    for row in Notification.objects.all():
        assert row.state == "pending" and row.last_status is None and row.last_error and len(row.log) == 1


def test_the_notification_table_is_complete_and_a_finished_delivery_is_not_claimed(configured, outbox_sent,
                                                                                   run_row):
    table = machine.NOTIFICATION_TRANSITIONS
    assert set(table) == set(Notification.State.values)
    assert all(set(targets) <= set(Notification.State.values) for targets in table.values())
    assert table["delivered"] == table["failed"] == frozenset()
    configured.CP_NOTIFY_WEBHOOK_URL = ""
    run = ended_run(run_row)
    [row] = Notification.objects.filter(run=run)
    assert row.channel == "email" and notifications.deliver(row.pk) == "delivered"
    assert machine.notification_claim(row.pk, timezone.now(), stale_before=timezone.now()) is None


# ----------------------------------------------------------------------------- a real worker, restarted


GATED_QUICK = [{"key": "answer", "requirement": "say hello", "scope": ["**"], "human_gate": True,
                "gates": [{"name": "ok", "command": "test -f hello.txt"}]}]
GATED_SCENARIO = {"stages": {"answer": {"implement": [{"write": {"hello.txt": "hi\n"}}]}}}


@pytest.mark.slow
def test_a_worker_restarted_between_the_waiting_notice_and_the_end_delivers_once_per_key(
        make_pipeline, repo, receiver, tmp_path, monkeypatch):
    from celery import current_app

    queue = f"notify-{uuid.uuid4().hex[:8]}"  # a worker of our own, configured for notices
    monkeypatch.setattr(runner, "enqueue", lambda run_id, token: current_app.send_task(
        runner.ADVANCE_TASK, args=[run_id, token], queue=queue))
    env = {"CP_QUEUE": queue, "CP_NOTIFY_WEBHOOK_URL": receiver.url, "CP_NOTIFY_WEBHOOK_SECRET": SECRET,
           "CP_NOTIFY_BACKOFF": "1"}
    monkeypatch.setenv("CP_QUEUE", queue)  # the queue the worker's command line consumes (worker_argv)
    worker = Workers(1, tmp_path)
    worker.start(env)
    try:
        run = operations.create_run(make_pipeline(stages=GATED_QUICK, scenario=GATED_SCENARIO), str(repo), "main")
        operations.request_start(run, requested_by="t", source="test")
        run = wait_for(run.pk, timeout=90)
        assert run.status == "waiting_approval", (run.stop_message, worker.log_text()[-3000:])
        wait_until(lambda: len(receiver.got) >= 1, 30, "the waiting notice", logs=[])
        # the receiver has it a moment before the worker records it delivered: the restart comes after that
        # (a worker killed in between leaves it "sending" until its claim is stale, then sends it again)
        wait_until(lambda: Notification.objects.filter(run=run, state="delivered").exists(), 30,
                   "the waiting notice recorded as delivered", logs=[])
        for proc in worker.procs:  # the worker dies (kill -9) and another one starts: its start's
            os.killpg(proc.pid, signal.SIGKILL)  # reconciliation finds nothing to send again
            proc.wait(timeout=10)
        worker.procs = []
        worker.start(env)
        decision = run.decisions.get(state="pending")
        operations.approve(run, decision.pk, decision.artifact, reviewer="pat")
        run = wait_for(run.pk, ("succeeded", "failed", "waiting_review"), timeout=90)
        assert run.status == "succeeded", run.stop_message
        wait_until(lambda: len(receiver.got) >= 2, 30, "the end notice", logs=[])
        wait_until(lambda: Notification.objects.filter(run=run, state="delivered").count() == 2, 30,
                   "both notices recorded as delivered", logs=[])
        wait_until(lambda: re.search(r"engine\.reconcile\[[^\]]+\] succeeded", worker.log_text().split(" ready.")[-1]),
                   30, "the new worker's start reconciliation")
    finally:
        worker.stop()
    events = receiver.events()
    assert [(e, d["decision"]["id"] if d["decision"] else None) for e, d in events] == [
        ("run.waiting", decision.pk), ("run.ended", None)], worker.log_text()[-3000:]
    rows = {r.key: r for r in Notification.objects.filter(run=run)}
    assert set(rows) == {f"decision:{decision.pk}", f"end:{run.uid}"}
    assert [d["delivery"] for _, d in events] == [str(rows[f"decision:{decision.pk}"].uid),
                                                  str(rows[f"end:{run.uid}"].uid)]
    assert {(r.state, r.tries) for r in rows.values()} == {("delivered", 1)}
