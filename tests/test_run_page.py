"""The run detail page of the Control Panel (controlpanel.views), through the Django test client.

Runs are real: created with engine.operations and driven step by step in this process
(``drive``: real worktrees, real gate commands, the scripted test adapter's real processes).
The page is read as a person would read its HTML: the badge, the stop reason, the timeline,
the checks, the events and exactly the buttons that apply; the buttons are pressed by posting
their forms, with the values the page prefilled.
"""
from __future__ import annotations

import html
import re
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from controlpanel.views import TAIL_BYTES
from engine import operations
from engine.models import Attempt, Check, Decision, Run, RunEvent, StartRequest

from .conftest import ANSWER_STEP
from .test_steps import drive
from .test_verification import gated_run, run_with

pytestmark = pytest.mark.django_db(transaction=True)

PASS = {"verdict": {"verdict": "pass", "findings": []}}
ESCALATE = {"verdict": {"verdict": "escalate", "findings": [
    {"file": "app/core.py", "line": 4, "severity": "major", "text": "Is 42 the right answer?"}]}}
ALL_ACTIONS = {"start", "approve", "recheck", "recover", "fail"}


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def staff(client, django_user_model):
    """A client logged in as a superuser (every permission), user name ``admin``."""
    user = django_user_model.objects.create_superuser("admin", "admin@example.invalid", "pw-for-tests-only")
    client.force_login(user)
    return client


@pytest.fixture
def staff_with(django_user_model):
    """``make(name, *codenames)``: a client of a staff user holding only those engine permissions."""
    def make(name, *codenames):
        user = django_user_model.objects.create_user(name, f"{name}@example.invalid", "pw-for-tests-only",
                                                     is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="engine",
                                                              codename__in=codenames))
        client = Client()
        client.force_login(user)
        return client
    return make


def detail_url(run) -> str:
    return reverse("admin:engine_run_detail", args=[run.pk])


def action_url(run, verb) -> str:
    return reverse("admin:engine_run_action", args=[run.pk, verb])


def page(client, run) -> str:
    response = client.get(detail_url(run))
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def buttons(text: str) -> set[str]:
    """The actions whose forms the page shows."""
    return set(re.findall(r'<form method="post" action="[^"]+" class="cp-action[^"]*" data-cp-action="(\w+)"', text))


def press(client, run, verb, **fields) -> str:
    """Post an action's form and follow the redirect back to the page; returns the page's HTML."""
    response = client.post(action_url(run, verb), fields, follow=True)
    assert response.redirect_chain == [(detail_url(run), 302)], response.redirect_chain
    return response.content.decode()


def messages_of(text: str, level: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", m)).strip()
            for m in re.findall(rf'<li class="{level}">(.*?)</li>', text, re.S)]


def prefilled(text: str, verb: str, name: str) -> str:
    """The value the page put in field ``name`` of the ``verb`` form."""
    form = re.search(rf'data-cp-action="{verb}">(.*?)</form>', text, re.S)
    assert form, f"no {verb} form"
    found = re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', form.group(1))
    assert found, f"no prefilled {name} in the {verb} form"
    return html.unescape(found.group(1))


def pending_run(make_pipeline, repo):
    return operations.create_run(make_pipeline(scenario={"stages": {"answer": {"implement": [ANSWER_STEP]}}}),
                                 str(repo), "main")


def review_run(make_pipeline, repo, sent):
    """A run stopped for review: the reviewer escalated (a pending review decision); a second review passes."""
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [ESCALATE, PASS]})
    assert (run.status, run.stop_reason) == ("waiting_review", "review_escalated"), run.stop_message
    return run


def succeeded_run(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [PASS]})
    assert run.status == "succeeded", run.stop_message
    return run


# ----------------------------------------------------------------------------- what the page shows


def test_the_page_of_a_simulated_run_shows_its_story(staff, make_pipeline, repo, sent):
    run = review_run(make_pipeline, repo, sent)
    text = page(staff, run)
    assert "Control Panel" in text and f"Run {run.pk} of {run.pipeline_name} (simulated)" in text
    # header: status, badge with its reason, pipeline, commit, branch, worktree, stop reason and message
    assert 'data-cp-status="waiting_review"' in text and "waiting for review" in text
    assert 'class="cp-badge cp-simulated"' in text and "SIMULATED" in text and run.simulated_reason in text
    for value in (run.pipeline_name, run.commit, run.branch, run.worktree):
        assert html.escape(value) in text, value
    assert '<code class="cp-stop-reason">review_escalated</code>' in text
    assert html.escape(run.stop_message) in text
    # the timeline: the stage, then its steps in order, coloured by outcome, each linked to its row
    timeline = text[text.index('class="cp-timeline"'):text.index('id="usage"')]
    implement, review = Attempt.objects.filter(run=run).order_by("number")
    check = Check.objects.get(run=run)
    assert f'href="#stage-{run.stages.get().pk}"' in timeline and "answer" in timeline
    steps = re.findall(r'<a class="cp-step cp-(\w+)" href="#([\w-]+)"', timeline)
    assert steps == [("ok", f"attempt-{implement.pk}"), ("ok", f"check-{check.pk}"),
                     ("warn", f"attempt-{review.pk}")]
    assert "review 2 · escalate" in timeline
    for anchor in (f"attempt-{implement.pk}", f"check-{check.pk}", f"attempt-{review.pk}"):
        assert f'id="{anchor}"' in text  # the box leads to the evidence
    # an attempt: its files, exit status, usage (ANSWER_STEP reports 10 in / 5 out), the reviewer's finding
    row = text[text.index(f'id="attempt-{implement.pk}"'):text.index(f'id="attempt-{review.pk}"')]
    for kind in ("prompt", "log", "patch"):
        assert reverse("admin:engine_attempt_file", args=[implement.pk, kind]) in row
    assert "exit 0" in row and "10 / 5 / —" in row
    assert reverse("admin:engine_run_attempt_diff", args=[run.pk, implement.pk]) in row
    assert "Is 42 the right answer?" in text
    # the check: command, result, exit code, manifest, a log link that serves its log
    check_row = text[text.index(f'id="check-{check.pk}"'):]
    check_row = check_row[:check_row.index("</tr>")]
    assert html.escape(check.command) in check_row and "pass" in check_row and "exit 0" in check_row
    assert check.manifest_digest[:12] in check_row and check.manifest_digest
    log_url = reverse("admin:engine_run_check_log", args=[run.pk, check.pk])
    assert log_url in check_row
    log = staff.get(log_url)
    assert log.status_code == 200
    assert b"".join(log.streaming_content) == (Path(settings.VAR_DIR) / check.log_path).read_bytes()
    # usage per stage and for the run
    assert "10 in · 5 out · — cached · cost —" in text
    # decisions and events: every sentence, linked to the evidence it names
    decision = run.decisions.get(state="pending")
    assert f'id="decision-{decision.pk}"' in text and "review_escalated" in text
    events = list(RunEvent.objects.filter(run=run))
    assert events
    for event in events:
        item = re.search(rf'<li id="event-{event.pk}"[^>]*>(.*?)</li>', text, re.S)
        assert item and html.escape(event.message) in item.group(1), event.message
        if event.attempt_id:
            assert f'href="#attempt-{event.attempt_id}"' in item.group(1)
        if event.gate_check_id:
            assert f'href="#check-{event.gate_check_id}"' in item.group(1)
        if event.decision_id:
            assert f'href="#decision-{event.decision_id}"' in item.group(1)
    assert any(e.attempt_id for e in events) and any(e.gate_check_id for e in events)
    assert any(e.decision_id for e in events)


def test_the_patch_is_a_readable_diff(staff, make_pipeline, repo, sent):
    run = succeeded_run(make_pipeline, repo, sent)
    implement = Attempt.objects.get(run=run, operation="implement")
    url = reverse("admin:engine_run_attempt_diff", args=[run.pk, implement.pk])
    fragment = staff.get(url, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200
    body = fragment.content.decode()
    assert '<span class="cp-dadd">+    return 42</span>' in body
    assert '<span class="cp-dfile">+++ b/app/core.py</span>' in body and '<span class="cp-dhunk">@@' in body
    assert "<html" not in body  # a fragment for htmx
    whole = staff.get(url).content.decode()
    assert "<html" in whole and "Control Panel" in whole and '<span class="cp-dadd">+    return 42</span>' in whole
    # the page loads the stage's latest patch open, the others on demand
    # the page loads the stage's latest change of files (here the documentation's) open, the others on demand
    latest = Attempt.objects.filter(run=run).exclude(operation="review").order_by("number").last()
    assert latest.operation == "document"
    text = page(staff, run)
    latest_url = reverse("admin:engine_run_attempt_diff", args=[run.pk, latest.pk])
    assert f'open hx-get="{latest_url}" hx-trigger="load"' in text
    assert f'hx-get="{url}" hx-trigger="toggle once"' in text


def test_the_run_list_and_the_record_page_lead_to_the_detail_page(staff, make_pipeline, repo):
    run = pending_run(make_pipeline, repo)
    listing = staff.get(reverse("admin:engine_run_changelist")).content.decode()
    assert f'href="{detail_url(run)}"' in listing
    record = staff.get(reverse("admin:engine_run_change", args=[run.pk]))
    assert record.status_code == 200 and run.commit in record.content.decode()
    assert f'href="{detail_url(run)}"' in record.content.decode()
    assert staff.get(reverse("admin:engine_run_detail", args=[424242])).status_code == 404


# ----------------------------------------------------------------------------- exactly the buttons that apply


def test_a_pending_run_offers_start_and_fail(staff, make_pipeline, repo):
    run = pending_run(make_pipeline, repo)
    assert buttons(page(staff, run)) == {"start", "fail"}


def test_a_run_waiting_for_review_offers_recover_recheck_and_fail(staff, make_pipeline, repo, sent):
    run = review_run(make_pipeline, repo, sent)
    text = page(staff, run)
    assert buttons(text) == {"recover", "recheck", "fail"}
    decision = run.decisions.get(state="pending", kind="review")
    assert prefilled(text, "recover", "decision") == str(decision.pk)
    assert re.search(r'name="action" value="retry"[^>]*checked', text)


def test_a_run_at_a_human_gate_offers_approve_recheck_and_fail(staff, make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    text = page(staff, run)
    assert buttons(text) == {"approve", "recheck", "fail"}
    decision = run.decisions.get(state="pending", kind="approval")
    assert prefilled(text, "approve", "decision") == str(decision.pk)
    assert prefilled(text, "approve", "artifact") == decision.artifact
    assert f"approve files {decision.artifact[:12]}" in text


def test_a_finished_run_offers_nothing(staff, make_pipeline, repo, sent):
    done = succeeded_run(make_pipeline, repo, sent)
    text = page(staff, done)
    assert buttons(text) == set() and "This run has ended: no action applies." in text
    failed = operations.fail_run(pending_run(make_pipeline, repo), "not needed", "admin")
    text = page(staff, failed)
    assert buttons(text) == set() and "failed_by_operator" in text


# ----------------------------------------------------------------------------- permissions


def test_a_viewer_sees_no_button_and_every_action_is_refused(staff_with, make_pipeline, repo, sent,
                                                               django_user_model):
    run = review_run(make_pipeline, repo, sent)
    viewer = staff_with("viewer", "view_run")
    text = page(viewer, run)
    assert buttons(text) == set() and "No action that applies now is permitted to you." in text
    decision = run.decisions.get(state="pending")
    bodies = {"start": {}, "approve": {"decision": decision.pk, "artifact": "0" * 40},
              "recheck": {"note": "fixed"}, "recover": {"decision": decision.pk, "note": "why", "action": "retry"},
              "fail": {"reason": "not needed"}}
    for verb, body in bodies.items():
        assert viewer.post(action_url(run, verb), body).status_code == 403, verb
    run.refresh_from_db()
    assert run.status == "waiting_review" and run.decisions.get(pk=decision.pk).state == "pending" and sent == []
    # one permission, one button (of those that apply)
    assert buttons(page(staff_with("recoverer", "view_run", "recover_run"), run)) == {"recover"}
    # and a user who is not staff does not reach the page at all
    outsider = staff_with("outsider", "view_run", "fail_run")
    django_user_model.objects.filter(username="outsider").update(is_staff=False)
    assert outsider.get(detail_url(run)).status_code == 302  # to the login page
    assert outsider.post(action_url(run, "fail"), {"reason": "x"}).status_code == 302
    assert Run.objects.get(pk=run.pk).status == "waiting_review"


def test_actions_need_post_and_a_csrf_token(staff, make_pipeline, repo, django_user_model):
    run = pending_run(make_pipeline, repo)
    assert staff.get(action_url(run, "start")).status_code == 405
    assert staff.post(action_url(run, "launch"), {}).status_code == 404
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(django_user_model.objects.get(username="admin"))
    assert strict.post(action_url(run, "start"), {}).status_code == 403
    assert Run.objects.get(pk=run.pk).status == "pending" and not StartRequest.objects.filter(run=run).exists()


# ----------------------------------------------------------------------------- pressing the buttons


def test_start_queues_the_run_and_a_second_start_is_refused(staff, make_pipeline, repo, sent):
    run = pending_run(make_pipeline, repo)
    text = press(staff, run, "start")
    assert messages_of(text, "success") == [f"Start requested by admin: run {run.pk} is queued for a worker."]
    run.refresh_from_db()
    assert run.status == "queued" and sent == [(run.pk, None)]
    start = StartRequest.objects.get(run=run)
    assert (start.requested_by, start.source) == ("admin", "admin")
    assert buttons(text) == {"fail"}
    refused = messages_of(press(staff, run, "start"), "error")
    assert len(refused) == 1 and "already_started" in refused[0] and "field “run”" in refused[0]
    assert len(sent) == 1


def test_approve_continues_a_human_gate(staff, make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    text = page(staff, run)
    decision, artifact = prefilled(text, "approve", "decision"), prefilled(text, "approve", "artifact")
    # files other than those waiting: refused, naming the field, and nothing moves
    refused = messages_of(press(staff, run, "approve", decision=decision, artifact="0" * 40), "error")
    assert len(refused) == 1 and "artifact_mismatch" in refused[0] and "field “artifact”" in refused[0]
    assert Run.objects.get(pk=run.pk).status == "waiting_approval"
    refused = messages_of(press(staff, run, "approve", decision="many", artifact=artifact), "error")
    assert len(refused) == 1 and "field “decision”" in refused[0]
    text = press(staff, run, "approve", decision=decision, artifact=artifact)
    assert messages_of(text, "success") == [f"Decision {decision} approved by admin for files {artifact[:12]}: "
                                            "the run continues."]
    approved = Decision.objects.get(pk=decision)
    assert (approved.state, approved.decided_by) == ("approved", "admin")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert buttons(page(staff, run)) == set()


def test_recheck_asks_for_a_new_approval(staff, make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    old = run.decisions.get(state="pending")
    refused = messages_of(press(staff, run, "recheck", note="  "), "error")
    assert len(refused) == 1 and "note_required" in refused[0] and "field “note”" in refused[0]
    text = press(staff, run, "recheck", note="looked again")
    assert messages_of(text, "success") == ["Recheck of stage 'answer' requested by admin: its gates and reviews run "
                                            "again."]
    assert Decision.objects.get(pk=old.pk).state == "superseded"
    run = drive(run.pk, sent)
    assert run.status == "waiting_approval" and run.decisions.get(state="pending").pk != old.pk


def test_recover_retry_through_the_page(staff, make_pipeline, repo, sent):
    run = review_run(make_pipeline, repo, sent)
    decision = prefilled(page(staff, run), "recover", "decision")
    refused = messages_of(press(staff, run, "recover", decision=decision, note="", action="retry"), "error")
    assert len(refused) == 1 and "note_required" in refused[0] and "field “note”" in refused[0]
    refused = messages_of(press(staff, run, "recover", decision=decision, note="x", action="redo"), "error")
    assert len(refused) == 1 and "field “action”" in refused[0]
    text = press(staff, run, "recover", decision=decision, note="the requirement is clear", action="retry")
    assert messages_of(text, "success") == [f"Recovery by admin (retry) on decision {decision}: the run continues."]
    recovered = Decision.objects.get(pk=decision)
    assert (recovered.state, recovered.action, recovered.decided_by) == ("recovered", "retry", "admin")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert Attempt.objects.filter(run=run, operation="implement").count() == 2  # retry: a new attempt


def test_fail_through_the_page(staff, make_pipeline, repo, sent):
    run = review_run(make_pipeline, repo, sent)
    refused = messages_of(press(staff, run, "fail", reason=" "), "error")
    assert len(refused) == 1 and "reason_required" in refused[0] and "field “reason”" in refused[0]
    assert Run.objects.get(pk=run.pk).status == "waiting_review"
    text = press(staff, run, "fail", reason="the requirement was wrong")
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("failed", "failed_by_operator")
    assert messages_of(text, "success") == [f"Run {run.pk} failed. {run.stop_message}"]
    assert "the requirement was wrong" in run.stop_message
    assert buttons(text) == set() and "<code class=\"cp-stop-reason\">failed_by_operator</code>" in text
    refused = messages_of(press(staff, run, "fail", reason="again"), "error")
    assert len(refused) == 1 and "already_finished" in refused[0]


# ----------------------------------------------------------------------------- live output


#: An implementer that prints, then waits (at most 60 s) until the test releases it: "running" for as long as needed.
WAIT_FOR_RELEASE = ['sh', '-c', 'echo "working on it"; i=0; '
                    'while [ ! -f "$CP_DATA_DIR/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done']


def test_a_running_attempt_is_tailed_live_until_it_ends(staff, make_pipeline, repo, sent, settings):
    waits = {**ANSWER_STEP, "run": WAIT_FOR_RELEASE}
    pipeline = make_pipeline(scenario={"stages": {"answer": {"implement": [waits], "review": [PASS]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    errors = []

    def work():
        try:
            drive(run.pk, sent)
        except Exception as exc:  # reported by the test below
            errors.append(exc)
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        attempt = None
        while time.monotonic() < deadline:
            attempt = Attempt.objects.filter(run=run, status="running").exclude(pid=None).first()
            if attempt is not None and "working on it" in (Path(settings.VAR_DIR) / attempt.log_path).read_text():
                break
            time.sleep(0.1)
        assert attempt is not None, "the attempt never ran"
        settings.CP_HEARTBEAT_STALE = -1  # every heartbeat counts as old: the header must say so
        text = page(staff, run)
        assert "running: no heartbeat for" in text
        assert buttons(text) == {"fail"}
        tail_url = reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])
        assert f'hx-get="{tail_url}" hx-trigger="load"' in text
        version = re.search(r'data-cp-live="1"', text) and re.search(r'\?v=([^"]+)" hx-trigger="every', text)
        assert version, "the page of a running run polls its state"
        poll = f"{reverse('admin:engine_run_state', args=[run.pk])}?v={html.unescape(version.group(1))}"  # as htmx
        assert staff.get(poll).status_code == 204
        live = staff.get(tail_url).content.decode()
        assert 'data-cp-tail="live"' in live and f'hx-get="{tail_url}" hx-trigger="every' in live
        assert "working on it" in live
    finally:
        release = Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}" / "data" / "release"
        release.parent.mkdir(parents=True, exist_ok=True)
        release.write_text("go\n")
        worker.join(90)
    assert not errors and not worker.is_alive()
    assert Run.objects.get(pk=run.pk).status == "succeeded", Run.objects.get(pk=run.pk).stop_message
    ended = staff.get(tail_url).content.decode()
    assert 'data-cp-tail="ended"' in ended and "hx-trigger" not in ended and "working on it" in ended
    changed = staff.get(poll)
    assert changed.status_code == 200 and changed["HX-Refresh"] == "true"


def test_the_tail_endpoint_returns_only_the_end_of_a_large_log(staff, make_pipeline, repo, sent):
    run = succeeded_run(make_pipeline, repo, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    log = Path(settings.VAR_DIR) / attempt.log_path
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("FIRST-LINE-OF-THE-BIG-PART\n")
        for n in range(40000):
            fh.write(f"line {n:06d} of a long agent session, with some text to make it longer\n")
        fh.write("THE-VERY-LAST-LINE\n")
    size = log.stat().st_size
    assert size > 2_000_000
    response = staff.get(reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    shown = html.unescape(re.search(r'<pre class="cp-pre">(.*?)</pre>', body, re.S).group(1))
    assert shown.endswith("THE-VERY-LAST-LINE\n") and "FIRST-LINE-OF-THE-BIG-PART" not in shown
    assert len(shown.encode()) <= TAIL_BYTES and len(shown.encode()) > TAIL_BYTES - 200
    assert shown.startswith("line ")  # from a line's start, not mid-line
    assert f"{size} bytes" in body and "the last 64.0\xa0KB shown" in body
    assert len(body) < TAIL_BYTES + 4096
    other = Attempt.objects.get(run=run, operation="review")
    assert staff.get(reverse("admin:engine_run_attempt_tail", args=[run.pk + 1, other.pk])).status_code == 404


# ----------------------------------------------------------------------------- bounded cost


def _grow(run, attempts: int, log_bytes: int) -> None:
    """Give a run's stage ``attempts`` more recorded attempts (each with a sparse log of ``log_bytes``),
    two checks per attempt and five events per attempt: evidence as a long run leaves it."""
    stage = run.stages.get()
    base = Path(settings.VAR_DIR)
    start = Attempt.objects.filter(stage=stage).count()
    for n in range(start + 1, start + attempts + 1):
        folder = f"{run.control_dir}/stages/01-{stage.key}/attempts/{n:03d}-repair"
        (base / folder).mkdir(parents=True, exist_ok=True)
        with open(base / folder / "output.log", "wb") as fh:
            fh.truncate(log_bytes)
            fh.seek(log_bytes - 6)
            fh.write(b"\nlast\n")
        (base / folder / "patch.diff").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
        attempt = Attempt.objects.create(
            run=run, stage=stage, operation="repair", number=n, role="implementer", profile_name="scripted",
            adapter="scripted", simulated=True, deadline_seconds=60, status="failed", failure_kind="crashed",
            exit_code=1, elapsed_seconds=float(n), log_path=f"{folder}/output.log",
            patch_path=f"{folder}/patch.diff", usage={"input_tokens": 100, "output_tokens": 7, "cached_tokens": 3,
                                                      "cost_usd": 0.01})
        for name in ("unit", "lint"):
            check = Check.objects.create(run=run, stage=stage, name=name, command="true", cwd=run.worktree,
                                         exit_code=0, passed=True, elapsed_seconds=0.5, manifest_digest="ab" * 20)
            RunEvent.objects.create(run=run, kind="gate", message=f"gate {name} passed", stage=stage,
                                    gate_check=check)
        for _ in range(3):
            RunEvent.objects.create(run=run, kind="attempt", message=f"attempt {n} ended", stage=stage,
                                    attempt=attempt)


def test_the_page_costs_a_fixed_number_of_queries_and_reads_logs_by_reference(staff, make_pipeline, repo):
    run = pending_run(make_pipeline, repo)
    _grow(run, 5, 1024)
    staff.get(detail_url(run))  # the session, the user: warm
    with CaptureQueriesContext(connection) as few:
        text = page(staff, run)
    assert text.count('class="cp-step cp-bad" href') == 5
    _grow(run, 45, 4 * 1024 * 1024)  # 50 attempts, 180 MB of (sparse) logs
    with CaptureQueriesContext(connection) as many:
        text = page(staff, run)
    assert text.count('class="cp-step cp-bad" href') == 50 and text.count('class="cp-step cp-ok" href') == 100
    assert len(many.captured_queries) == len(few.captured_queries), [q["sql"] for q in many.captured_queries]
    assert "50" in text and "5,000 in · 350 out · 150 cached · cost $0.5000" in text
    assert len(text) < 2_000_000  # the logs are links, not content
    # its time is measured in bench/run_page.py (the 300 ms target), never in a unit test


# ----------------------------------------------------------------------------- creating a run from a pipeline


def test_create_a_run_from_a_pipeline_page(staff, staff_with, make_pipeline, repo):
    pipeline = make_pipeline()
    create_url = reverse("admin:engine_pipeline_create_run", args=[pipeline.pk])
    pipeline_page = staff.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert f'href="{create_url}" class="cp-create-run">Create a run</a>' in pipeline_page
    form = staff.get(create_url).content.decode()
    assert 'name="repo"' in form and 'name="rev"' in form and 'value="main"' in form
    for role in ("implementer", "reviewer", "documenter"):
        assert f'name="profile_{role}"' in form and f"the pipeline&#x27;s: scripted" in form

    def create(**fields) -> tuple[int, str]:
        response = staff.post(create_url, {"repo": str(repo), "rev": "main", **fields}, follow=True)
        return response.status_code, response.content.decode()

    # refusals: an error message naming the field, the form again with what was typed, and no run
    for fields, code, field in (({"repo": ""}, "path_not_found", "repo"),
                                ({"repo": str(repo / "missing")}, "path_not_found", "repo"),
                                ({"rev": "no-such-branch"}, "unknown_revision", "rev")):
        status, text = create(**fields)
        refused = messages_of(text, "error")
        assert status == 200 and len(refused) == 1, (fields, refused)
        assert code in refused[0] and f"field “{field}”" in refused[0], refused
        assert 'id="create-run-form"' in text and html.escape(fields.get("rev", "main")) in text
    status, text = create(profile_implementer="nobody")
    refused = messages_of(text, "error")
    assert len(refused) == 1 and "field “profile_implementer”" in refused[0] and "nobody" in refused[0]
    assert not Run.objects.exists()
    # success: a pending run with the profile chosen, and its page with a success message
    response = staff.post(create_url, {"repo": str(repo), "rev": "main", "profile_reviewer": "scripted"},
                          follow=True)
    run = Run.objects.get()
    assert response.redirect_chain == [(detail_url(run), 302)]
    assert (run.status, run.pipeline_id, run.revision, run.profile_override) == (
        "pending", pipeline.pk, "main", {"reviewer": "scripted"})
    done = messages_of(response.content.decode(), "success")
    assert done == [f"Run {run.pk} created from pipeline {pipeline.name} at commit {run.commit[:12]} by admin. "
                    f"It is simulated ({run.simulated_reason}). Press Start to run it."]
    assert buttons(response.content.decode()) == {"start", "fail"}
    # without engine.add_run: no button, and the form is refused (view or post)
    viewer = staff_with("pipeline-viewer", "view_pipeline", "view_run")
    assert "cp-create-run" not in viewer.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert viewer.get(create_url).status_code == 403
    assert viewer.post(create_url, {"repo": str(repo), "rev": "main"}).status_code == 403
    assert Run.objects.count() == 1
    assert staff.get(reverse("admin:engine_pipeline_create_run", args=[424242])).status_code == 404


# ----------------------------------------------------------------------------- editing a pipeline


def test_a_pipeline_definition_is_edited_with_validation_and_saved_as_a_new_version(staff, staff_with, make_pipeline,
                                                                                    repo):
    import yaml

    from engine.models import Pipeline

    pipeline = make_pipeline()
    run_before = operations.create_run(pipeline, str(repo), "main")
    url = reverse("admin:engine_pipeline_edit_definition", args=[pipeline.pk])
    page_text = staff.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert url in page_text  # the button, for a user with engine.change_pipeline
    form_text = staff.get(url).content.decode()
    shown = html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", form_text, re.S).group(1))
    document = yaml.safe_load(shown)
    assert document["name"] == pipeline.name and document["stages"][0]["key"] == "answer"

    # a bad definition: every problem named with its field, nothing saved
    bad = dict(document, stages=[dict(document["stages"][0], gates=[{"name": "unit"}])], budgets={"max_attempts": -1})
    response = staff.post(url, {"definition": yaml.safe_dump(bad)})
    assert response.status_code == 200
    text = html.unescape(response.content.decode())
    assert "stages[0].gates[0].command" in text and "budgets.max_attempts" in text and "was not saved" in text
    assert staff.post(url, {"definition": "name: [unclosed"}).status_code == 200
    renamed = staff.post(url, {"definition": yaml.safe_dump(dict(document, name="another"))})
    assert "cannot change here" in html.unescape(renamed.content.decode())
    assert Pipeline.objects.get(pk=pipeline.pk).version == 1

    # a good change: a new version; the run created before keeps the definition it froze
    better = dict(document, stages=[dict(document["stages"][0], requirement="Make answer() return 42, documented.")])
    response = staff.post(url, {"definition": yaml.safe_dump(better)}, follow=True)
    assert "saved as version 2" in response.content.decode()
    pipeline.refresh_from_db()
    assert pipeline.version == 2 and pipeline.definition["stages"][0]["requirement"].endswith("documented.")
    run_before.refresh_from_db()
    assert run_before.definition["pipeline"]["stages"][0]["requirement"] == "Make app.core.answer() return 42."
    assert operations.create_run(pipeline, str(repo), "main").definition["pipeline_version"] == 2
    # the same again changes nothing
    response = staff.post(url, {"definition": yaml.safe_dump(better)}, follow=True)
    assert "nothing changed" in response.content.decode() and Pipeline.objects.get(pk=pipeline.pk).version == 2

    viewer = staff_with("viewer", "view_pipeline")
    assert url not in viewer.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert viewer.get(url).status_code == 403
    assert viewer.post(url, {"definition": yaml.safe_dump(better)}).status_code == 403
