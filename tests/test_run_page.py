"""The run detail page of the Control Panel (controlpanel.views), through the Django test client.

Runs are real: created with engine.operations and driven step by step in this process
(``drive``: real worktrees, real gate commands, the scripted test adapter's real processes).
The page is read as a person would read its HTML: the badge, the stop reason, the timeline,
the checks, the events and exactly the buttons that apply; the buttons are pressed by posting
their forms, with the values the page prefilled.
"""
from __future__ import annotations

import html
import io
import json
import re
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.template.defaultfilters import filesizeformat
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.core.management import call_command
from django.urls import reverse

from controlpanel.views import TAIL_BYTES
from controlpanel.readable import refusals_html
from engine import operations
from engine.models import Attempt, Check, Decision, Run, RunEvent, StartRequest

from .conftest import ANSWER_STEP
from .support.pages import action_url, buttons, detail_url, messages_of, page, prefilled, press
from .support.runs import drive, gated_run, run_with
from .support.pages import live_attempt, pending_run

pytestmark = pytest.mark.django_db(transaction=True)

PASS = {"verdict": {"verdict": "pass", "findings": []}}
ESCALATE = {"verdict": {"verdict": "escalate", "findings": [
    {"file": "app/core.py", "line": 4, "severity": "major", "text": "Is 42 the right answer?"}]}}
ALL_ACTIONS = {"start", "approve", "recheck", "recover", "fail"}


# ----------------------------------------------------------------------------- helpers


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


@pytest.mark.pipeline
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
    steps = re.findall(r'<a class="cp-step cp-(\w+) cp-box-(\w+)" href="#([\w-]+)"', timeline)
    decision = run.decisions.get(state="pending")
    assert steps == [("ok", "step", f"attempt-{implement.pk}"), ("ok", "step", f"check-{check.pk}"),
                     ("warn", "step", f"attempt-{review.pk}"), ("live", "wait", f"decision-{decision.pk}")]
    # on a time axis: each box placed by its start and duration (percent of the run's span)
    places = re.findall(r'href="#[\w-]+" title="[^"]*" data-outcome="\w+" style="left: ([\d.]+)%; width: ([\d.]+)%"',
                        timeline)
    assert len(places) == 4 and all(0 <= float(left) <= 100 and 0 < float(width) <= 100 for left, width in places)
    assert [float(left) for left, _ in places] == sorted(float(left) for left, _ in places)
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
    log = staff.get(log_url + "?raw=1")  # the check's page; ?raw=1 is its whole log as text
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


@pytest.mark.pipeline
def test_the_patch_is_a_readable_diff(staff, make_pipeline, repo, sent):
    run = succeeded_run(make_pipeline, repo, sent)
    implement = Attempt.objects.get(run=run, operation="implement")
    url = reverse("admin:engine_run_attempt_diff", args=[run.pk, implement.pk])
    fragment = staff.get(url, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200
    body = fragment.content.decode()
    assert re.search(r'<span class="cp-dadd" data-cp-file="app/core.py" data-cp-line="\d+">\+    return 42</span>', body)
    assert '<span class="cp-dfile">+++ b/app/core.py</span>' in body and '<span class="cp-dhunk">@@' in body
    assert "<html" not in body  # a fragment for htmx
    whole = staff.get(url).content.decode()
    assert "<html" in whole and "Control Panel" in whole and 'data-cp-file="app/core.py"' in whole and "+    return 42</span>" in whole
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


@pytest.mark.pipeline
def test_a_run_waiting_for_review_offers_recover_recheck_and_fail(staff, make_pipeline, repo, sent):
    run = review_run(make_pipeline, repo, sent)
    text = page(staff, run)
    assert buttons(text) == {"recover", "recheck", "fail"}
    decision = run.decisions.get(state="pending", kind="review")
    assert prefilled(text, "recover", "decision") == str(decision.pk)
    assert re.search(r'name="action" value="retry"[^>]*checked', text)


@pytest.mark.pipeline
def test_a_run_at_a_human_gate_offers_approve_request_changes_recheck_and_fail(staff, make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    text = page(staff, run)
    assert buttons(text) == {"approve", "request_changes", "recheck", "fail"}
    decision = run.decisions.get(state="pending", kind="approval")
    for verb in ("approve", "request_changes"):
        assert prefilled(text, verb, "decision") == str(decision.pk)
        assert prefilled(text, verb, "artifact") == decision.artifact
    assert f"approve files {decision.artifact[:12]}" in text


@pytest.mark.pipeline
def test_a_finished_run_offers_nothing(staff, make_pipeline, repo, sent):
    done = succeeded_run(make_pipeline, repo, sent)
    text = page(staff, done)
    assert buttons(text) == {"rerun"}  # an ended run is only re-run (tests/test_rerun.py)
    failed = operations.fail_run(pending_run(make_pipeline, repo), "not needed", "admin")
    text = page(staff, failed)
    assert buttons(text) == {"rerun"} and "failed_by_operator" in text


# ----------------------------------------------------------------------------- permissions


@pytest.mark.pipeline
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


@pytest.mark.pipeline
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
    assert buttons(page(staff, run)) == {"rerun"}


@pytest.mark.pipeline
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


@pytest.mark.pipeline
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
    # the stop the run was recovered from stays on top, with its evidence
    assert run.stop_evidence["led_here"]["reason"] == "review_escalated"
    text = page(staff, run)
    card = text[text.index('id="stop"'):text.index('id="facts"')]
    assert "What led here: the run was recovered from" in card and "review_escalated" in card
    assert "Is 42 the right answer?" in card, card[:3000]


@pytest.mark.pipeline
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
    assert buttons(text) == {"rerun"} and "<code class=\"cp-stop-reason\">failed_by_operator</code>" in text
    card = text[text.index('id="stop"'):text.index('id="facts"')]  # the stop that led there stays on top
    assert 'id="led-here"' in card and "review_escalated" in card
    out = io.StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    assert "  what led here: review_escalated: " in out.getvalue()
    refused = messages_of(press(staff, run, "fail", reason="again"), "error")
    assert len(refused) == 1 and "already_finished" in refused[0]


# ----------------------------------------------------------------------------- live output


#: An implementer that prints, then waits (at most 60 s) until the test releases it: "running" for as long as needed.
WAIT_FOR_RELEASE = ['sh', '-c', 'echo "working on it"; i=0; '
                    'while [ ! -f "$CP_DATA_DIR/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done']


@pytest.mark.pipeline
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
        until = time.monotonic() + 5  # the conversation follows the raw log a fraction of a second behind
        while "working on it" not in live and time.monotonic() < until:
            time.sleep(0.1)
            live = staff.get(tail_url).content.decode()
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


@pytest.mark.pipeline
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
    response = staff.get(reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk]) + "?view=log")
    assert response.status_code == 200
    body = response.content.decode()
    shown = html.unescape(re.search(r'<pre class="cp-pre">(.*?)</pre>', body, re.S).group(1))
    assert shown.endswith("THE-VERY-LAST-LINE\n") and "FIRST-LINE-OF-THE-BIG-PART" not in shown
    assert len(shown.encode()) <= TAIL_BYTES and len(shown.encode()) > TAIL_BYTES - 200
    assert shown.startswith("line ")  # from a line's start, not mid-line
    shown_size = filesizeformat(len(shown.encode()))  # from a line's start: a little less than TAIL_BYTES
    assert f"{size} bytes" in body and f"the last {shown_size} shown, from the start of a line" in body
    assert len(body) < TAIL_BYTES + 4096
    other = Attempt.objects.get(run=run, operation="review")
    assert staff.get(reverse("admin:engine_run_attempt_tail", args=[run.pk + 1, other.pk])).status_code == 404


# ----------------------------------------------------------------------------- bounded cost


def _grow(run, attempts: int, log_bytes: int) -> None:
    """Give a run's stage ``attempts`` more recorded attempts (each with a sparse log of ``log_bytes`` and the
    manifest of the files after it), two checks of those files per attempt and five events per attempt:
    evidence as a long run leaves it."""
    from engine.steps import save_manifest

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
        digest = f"{n:040x}"
        change = {"path": f"app/m{n}.py", "status": "added", "old_mode": None, "new_mode": "100644", "old_blob": None,
                  "new_blob": "e" * 40}
        manifest = save_manifest(run, stage, {"digest": digest, "base": run.commit, "tree": digest, "changes": [change],
                                              "entries": [{"path": change["path"], "mode": "100644", "blob": "e" * 40}],
                                              "excluded": []})
        attempt = Attempt.objects.create(
            run=run, stage=stage, operation="repair", number=n, role="implementer", profile_name="scripted",
            adapter="scripted", simulated=True, deadline_seconds=60, status="failed", failure_kind="crashed",
            exit_code=1, elapsed_seconds=float(n), log_path=f"{folder}/output.log", result_manifest=manifest,
            patch_path=f"{folder}/patch.diff", usage={"input_tokens": 100, "output_tokens": 7, "cached_tokens": 3,
                                                      "cost_usd": 0.01})
        for name in ("unit", "lint"):
            check = Check.objects.create(run=run, stage=stage, name=name, command="true", cwd=run.worktree,
                                         exit_code=0, passed=True, elapsed_seconds=0.5, manifest=manifest,
                                         manifest_digest=digest)
            RunEvent.objects.create(run=run, kind="check_passed", message=f"gate {name} passed", stage=stage,
                                    gate_check=check)
        for _ in range(3):
            RunEvent.objects.create(run=run, kind="attempt_done", message=f"attempt {n} ended", stage=stage,
                                    attempt=attempt)


def test_the_page_costs_a_fixed_number_of_queries_and_reads_logs_by_reference(staff, make_pipeline, repo):
    run = pending_run(make_pipeline, repo)
    _grow(run, 5, 1024)
    staff.get(detail_url(run))  # the session, the user: warm
    with CaptureQueriesContext(connection) as few:
        text = page(staff, run)
    assert text.count('class="cp-step cp-bad cp-box-step" href') == 5
    _grow(run, 45, 4 * 1024 * 1024)  # 50 attempts, 180 MB of (sparse) logs
    with CaptureQueriesContext(connection) as many:
        text = page(staff, run)
    assert text.count('class="cp-step cp-bad cp-box-step" href') == 50 and text.count('class="cp-step cp-ok cp-box-step" href') == 100
    assert text.count('class="cp-manifest"') == 50 and "<code>app/m50.py</code>" in text
    assert len(many.captured_queries) == len(few.captured_queries), [q["sql"] for q in many.captured_queries]
    assert "50" in text and "5,000 in · 350 out · 150 cached · cost $0.5000 simulated, not money" in text
    assert len(text) < 2_000_000  # the logs are links, not content
    # its time is measured in bench/run_page.py (the 300 ms target), never in a unit test


# ----------------------------------------------------------------------------- creating a run from a pipeline


@pytest.mark.pipeline
def test_every_field_of_the_page_has_an_id_of_its_own(staff, make_pipeline, repo, sent):
    """Recheck and Recover both ask for a note: a label must lead to its own form's field."""
    run = review_run(make_pipeline, repo, sent)
    text = page(staff, run)
    assert {"recheck", "recover", "fail"} <= buttons(text)
    ids = re.findall(r'\sid="(id_[^"]+)"', text)
    assert ids and len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert 'for="id_recover_note"' in text and 'for="id_recheck_note"' in text


def test_an_attempt_says_what_happened_to_each_tool_call(staff, make_pipeline, repo):
    """A missing program is not a refusal: the attempt's row counts each outcome and names it for each call;
    a record written before outcomes existed still shows, as what it meant then."""
    run = pending_run(make_pipeline, repo)
    attempt, _ = live_attempt(run, "done\n", status="succeeded", exit_code=0, refusals=[
        {"tool": "exec_command", "command": "python -m pytest", "exit_code": 127, "sandbox_denied": False,
         "message": "bash: python: command not found", "outcome": "command_not_found"},
        {"tool": "Bash", "message": "Exit code 1", "exit_code": 1, "outcome": "failed"},
        {"tool": "bash", "message": "bash: /etc/x: Read-only file system", "outcome": "refused"},
        {"tool": "Write", "message": "File has not been read yet."}])
    text = page(staff, run)
    more = text[text.index(f'id="attempt-{attempt.pk}"'):]
    said = re.search(r'<p class="cp-failure cp-tool-outcomes">(.*?)</p>', more, re.S).group(1)
    assert said.startswith("Tool calls: 1 command not found, 1 failed, 1 refused, 1 tool call refused or failed: ")
    assert "<code>exec_command</code> <b>command not found</b> bash: python: command not found" in said
    assert "<code>bash</code> <b>refused</b>" in said and "<code>Write</code> <b>refused or failed</b>" in said
    assert "4 tool calls refused" not in text
    shown = refusals_html(attempt.refusals)  # the attempt's record page
    assert "<b>exec_command</b> <span class=\"cp-outcome\">[command not found]</span>" in shown
    assert shown.startswith("<p>1 command not found, 1 failed, 1 refused, 1 tool call refused or failed</p>")
    attempt.refusals = [{"tool": "exec_command", "exit_code": 127, "message": "bash: python: command not found",
                         "outcome": "command_not_found"}]
    attempt.save(update_fields=["refusals"])
    said = re.search(r'class="cp-failure cp-tool-outcomes">(.*?)</p>', page(staff, run), re.S).group(1)
    assert said.startswith("Tool calls: 1 command not found: ") and "refused" not in said


# ----------------------------------------------------------------------------- fixes from a fresh-eyes test


def next_poll(fragment: str) -> tuple[str, dict]:
    """The URL and the parameters (hx-vals, sent as the query of a GET) a tail fragment asks htmx to fetch next."""
    found = re.search(r'hx-get="([^"]+)" hx-trigger="every [^"]+" hx-vals=\'([^\']+)\'', fragment)
    assert found, "the fragment does not poll"
    return html.unescape(found.group(1)), json.loads(html.unescape(found.group(2)))


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


def test_the_live_tail_answers_204_while_nothing_changed_and_tells_the_page_when_the_attempt_ended(
        staff, make_pipeline, repo):
    from django.utils import timezone

    run = pending_run(make_pipeline, repo)
    attempt, log = live_attempt(run, "one\ntwo\n")
    tail_url = reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])
    # the page asks as one that saw it live
    assert f'hx-get="{tail_url}" hx-trigger="load" hx-vals=\'{{"live": "1"}}\'' in page(staff, run)
    first = staff.get(tail_url, {"live": "1"})
    body = first.content.decode()
    assert first.status_code == 200 and "two" in body and 'data-cp-tail="live"' in body
    url, params = next_poll(body)
    # the size and the status it shows go back with the poll
    assert url == tail_url and params == {"live": "1", "size": str(log.stat().st_size), "status": "running"}
    nothing_new = staff.get(url, params)
    assert nothing_new.status_code == 204 and nothing_new.content == b""  # htmx 2 swaps nothing on a 204
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("three\n")
    grown = staff.get(url, params)
    assert grown.status_code == 200 and "three" in grown.content.decode() and "HX-Trigger" not in grown
    # the attempt ends with its log unchanged: the box says so, and asks the page to look at the run's state
    Attempt.objects.filter(pk=attempt.pk).update(status="succeeded", exit_code=0, ended_at=timezone.now())
    ended = staff.get(*next_poll(grown.content.decode()))
    assert ended.status_code == 200 and 'data-cp-tail="ended"' in ended.content.decode()
    assert "cp-attempt-ended" in ended["HX-Trigger"]
    # a finished attempt's output opened on demand asks for nothing
    assert "HX-Trigger" not in staff.get(tail_url)


@pytest.mark.pipeline
def test_the_page_of_a_stopped_run_follows_its_state_and_the_state_says_what_it_became(staff, make_pipeline, repo,
                                                                                         sent):
    from django.utils import timezone

    run = review_run(make_pipeline, repo, sent)
    text = page(staff, run)
    found = re.search(r'data-cp-live="1" hx-get="([^"]+)" hx-trigger="([^"]+)"', text) or re.search(
        r'hx-get="([^"]+)" hx-trigger="([^"]+)" hx-swap="none" data-cp-live="1"', text)
    assert found, "the page of a run waiting for a person follows its state (another tab may act on it)"
    poll, trigger = html.unescape(found.group(1)), found.group(2)
    assert "cpIdle" not in trigger  # it looks while a person types; the page says what changed (run.js)
    assert staff.get(poll).status_code == 204
    operations.fail_run(run, "failed in another tab", "someone")
    changed = staff.get(poll)
    assert changed.status_code == 200 and changed["HX-Refresh"] == "true"
    assert changed.json() == {"status": "failed", "label": "failed"}
    assert "data-cp-live" not in page(staff, run)  # a finished run no longer changes
    # an attempt that ends changes the state the page follows, even before any event says so
    other = pending_run(make_pipeline, repo)
    attempt, _ = live_attempt(other, "working\n")
    text = page(staff, other)
    poll = html.unescape(re.search(r'hx-get="([^"]+\?v=[^"]+)"', text).group(1))
    assert staff.get(poll).status_code == 204
    Attempt.objects.filter(pk=attempt.pk).update(status="succeeded", exit_code=0, ended_at=timezone.now())
    assert staff.get(poll).status_code == 200


@pytest.mark.pipeline
def test_a_refused_action_keeps_what_was_typed_once(staff, make_pipeline, repo, sent):
    run = review_run(make_pipeline, repo, sent)
    decision = run.decisions.get(state="pending", kind="review")
    stale = decision.pk + 1000
    text = press(staff, run, "recover", decision=stale, note="the requirement <is> clear now", action="verify")
    refused = messages_of(text, "error")
    assert len(refused) == 1 and "unknown_decision" in refused[0] and "field “decision”" in refused[0]
    form = re.search(r'(<form[^>]*data-cp-action="recover">.*?</form>)', text, re.S).group(1)
    assert "cp-action-kept" in form
    assert re.search(r"<textarea[^>]*>\s*the requirement &lt;is&gt; clear now</textarea>", form)
    assert prefilled(text, "recover", "decision") == str(stale)
    assert re.search(r'name="decision"[^>]*autofocus', form)  # the field the refusal names
    assert re.search(r'name="action" value="verify"[^>]*checked', form)
    assert f"the pending decision is {decision.pk}" in form
    # once: the next look at the page shows the form as the run offers it
    again = page(staff, run)
    assert prefilled(again, "recover", "decision") == str(decision.pk) and "clear now" not in again
    assert "cp-action-kept" not in again
    # a form that does not validate keeps what was typed too, and only its own form is filled
    text = press(staff, run, "recover", decision="many", note="kept as well", action="retry")
    assert "field “decision”" in messages_of(text, "error")[0]
    assert "kept as well" in section(text, 'data-cp-action="recover"', "</form>")
    assert "kept as well" not in section(text, 'data-cp-action="fail"', "</form>")
    assert Decision.objects.get(pk=decision.pk).state == "pending"


def _changes_of(manifest) -> list[str]:
    data = json.loads((Path(settings.VAR_DIR) / manifest.path).read_text())
    return [c["path"] for c in data["changes"]]


@pytest.mark.pipeline
def test_manifests_are_shown_and_every_digest_leads_to_its_manifest(staff, make_pipeline, repo, sent):
    from engine.models import Manifest
    from engine.steps import save_manifest

    run = gated_run(make_pipeline, repo, sent)
    text = page(staff, run)
    manifests = list(Manifest.objects.filter(run=run))
    assert manifests
    listed = section(text, 'id="manifests"', 'id="decisions"')
    for manifest in manifests:
        entry = section(listed, f'id="manifest-{manifest.pk}"', "</tr>")
        assert manifest.digest in entry and manifest.base_commit[:12] in entry
        assert f"{manifest.files} files" in entry
        assert f"+{manifest.added} ~{manifest.modified} −{manifest.deleted}" in entry
        assert reverse("admin:engine_manifest_change", args=[manifest.pk]) in entry
        details = section(listed, f'id="manifest-{manifest.pk}"', "</details>")
        for changed in _changes_of(manifest):
            assert f"<code>{html.escape(changed)}</code>" in details
    assert "app/core.py" in listed
    # every digest on the page leads to its manifest
    anchors = {m.digest: f'href="#manifest-{m.pk}"' for m in manifests}
    for check in Check.objects.filter(run=run).exclude(manifest_digest=""):
        row = section(text, f'id="check-{check.pk}"', "</tr>")
        assert anchors[check.manifest_digest] in row, check.name
    for attempt in Attempt.objects.filter(run=run).exclude(result_manifest=None):
        more = section(text[text.index(f'id="attempt-{attempt.pk}"'):], 'class="cp-attempt-more"', "</tr>")
        assert f'href="#manifest-{attempt.result_manifest_id}"' in more
    decision = run.decisions.get(state="pending", kind="approval")
    assert anchors[decision.artifact] in section(text, f'id="decision-{decision.pk}"', "</tr>")
    assert anchors[decision.artifact] in section(text, 'id="stop"', "</div>")  # the stop evidence
    # the Approve panel lists the files being approved
    approve = section(text, 'data-cp-action="approve"', "</form>")
    assert anchors[decision.artifact] in approve and "<code>app/core.py</code>" in approve
    # a long manifest: the first 200 changes, and how many more
    stage = run.stages.get()
    changes = [{"path": f"app/gen/m{n:03d}.py", "status": "added", "old_mode": None, "new_mode": "100644",
                "old_blob": None, "new_blob": "e" * 40} for n in range(250)]
    big = save_manifest(run, stage, {"digest": "f" * 40, "base": run.commit, "tree": "f" * 40,
                                     "entries": [{"path": c["path"], "mode": "100644", "blob": "e" * 40}
                                                 for c in changes], "changes": changes, "excluded": []})
    text = page(staff, run)
    details = section(text, f'id="manifest-{big.pk}"', "</details>")
    assert "<code>app/gen/m199.py</code>" in details and "m200.py" not in details and "and 50 more" in details


@pytest.mark.pipeline
def test_each_stage_shows_its_requirement_and_a_review_its_verdict(staff, make_pipeline, repo, sent):
    requirement = "Make app.core.answer() return 42 <script>alert(1)</script>.\n" + "Say why, in detail. " * 60
    stages = [{"key": "answer", "title": "The <answer> stage", "requirement": requirement, "scope": ["app/**"],
               "gates": [{"name": "unit", "command": "python -m pytest -q"}]}]
    escalate = {"verdict": {"verdict": "escalate", "summary": "Unclear: is <42> the answer?", "findings": [
        {"file": None, "line": None, "severity": "major", "text": "The requirement names no source."}]}}
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [escalate]}, stages=stages)
    assert run.status == "waiting_review", run.stop_message
    text = page(staff, run)
    assert "<script>alert(1)</script>" not in text
    stage_part = section(text, f'id="stage-{run.stages.get().pk}"', "</section>")
    assert "The &lt;answer&gt; stage" in stage_part
    assert "Make app.core.answer() return 42 &lt;script&gt;alert(1)&lt;/script&gt;." in stage_part
    assert re.search(r'<details class="cp-requirement"[^>]*>\s*<summary>', stage_part)  # a long one folds
    review = Attempt.objects.get(run=run, operation="review")
    more = section(text[text.index(f'id="attempt-{review.pk}"'):], 'class="cp-attempt-more"', "</tr>")
    assert "escalate" in more and "Unclear: is &lt;42&gt; the answer?" in more
    assert "The requirement names no source." in more and "None" not in more


def test_an_interrupted_attempt_shows_the_real_size_of_its_log(staff, make_pipeline, repo):
    run = pending_run(make_pipeline, repo)
    attempt, log = live_attempt(run, "x" * 300 + "\n" + "partial output\n" + "y" * 18 + "\n",
                                status="interrupted", output_bytes=0)
    assert log.stat().st_size == 335
    assert "the end of the output (335 bytes)" in page(staff, run)


def test_the_tail_says_truthfully_how_much_it_shows(staff, make_pipeline, repo):
    run = pending_run(make_pipeline, repo)
    short = "".join(f"short line {n}\n" for n in range(30))
    attempt, log = live_attempt(run, "z" * 200_000 + "\n" + short, status="succeeded")
    size = log.stat().st_size
    body = staff.get(reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])).content.decode()
    shown = html.unescape(re.search(r'<pre class="cp-pre">(.*?)</pre>', body, re.S).group(1))
    assert shown == short
    head = html.unescape(re.sub(r"<[^>]+>", "", section(body, 'class="cp-tail-head"', "</div>"))).replace("\xa0", " ")
    assert f"the last {len(short.encode())} bytes shown, from the start of a line" in head
    assert f"the whole log: {size} bytes" in head and "64.0" not in head


@pytest.mark.pipeline
def test_the_header_says_active_time_without_steps_and_agrees_with_the_timeline(staff, make_pipeline, repo, sent):
    from controlpanel.views import seconds_text

    run = succeeded_run(make_pipeline, repo, sent)
    text = page(staff, run)
    times = re.sub(r"<[^>]+>", "", section(text, '<p class="cp-times">', "</p>"))
    assert f"active {seconds_text(run.active_seconds)}" in times and "step" not in times
    steps = sum(a.elapsed_seconds or 0 for a in Attempt.objects.filter(run=run)) + sum(
        c.elapsed_seconds or 0 for c in Check.objects.filter(run=run))
    timeline = section(text, 'id="timeline"', "</section>")
    assert f"{seconds_text(steps)} in the attempts and checks shown" in timeline
    assert f"of the run's {seconds_text(run.active_seconds)} of active time" in timeline


def test_the_run_list_filter_names_stages_in_the_right_number(staff, make_pipeline, repo):
    pending_run(make_pipeline, repo)
    two = [{"key": key, "requirement": "r", "scope": ["app/**"], "gates": [{"name": "unit", "command": "true"}]}
           for key in ("one", "two")]
    # the filter is shown when there are two pipelines to choose from
    make_pipeline(name="two-stages", stages=two, scenario={"stages": {"one": {}, "two": {}}})
    listing = staff.get(reverse("admin:engine_run_changelist")).content.decode()
    assert "p (v1, 1 stage)" in listing and "1 stages" not in listing and "two-stages (v1, 2 stages)" in listing


# ----------------------------------------------------------------------------- why it stopped, on top


@pytest.mark.pipeline
def test_the_stop_card_shows_the_failing_check_s_log_and_the_evidence_as_links(staff, make_pipeline, repo, sent):
    from .support.runs import stage as one_stage

    wrong = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 41\n'}}
    gate = [{"name": "unit", "command": "python -m pytest -q"}]
    run = run_with(make_pipeline, repo, sent, {"implement": [wrong]},
                   stages=one_stage(gates=gate, repair_allowance=0))
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    check = Check.objects.filter(run=run, kind="gate", passed=False).get()
    attempt = Attempt.objects.get(run=run, operation="implement")
    text = page(staff, run)
    card = section(text, 'id="stop"', "</section>")
    assert text.index('id="stop"') < text.index('id="actions"') < text.index('id="timeline"')
    assert "Why it stopped" in card and '<code class="cp-stop-reason">gate_failed</code>' in card
    assert html.escape(run.stop_message) in card
    # the failing check's log, its end inline: pytest's own failure lines
    shown = html.unescape(section(card, '<pre class="cp-pre cp-stop-log">', "</pre>"))
    assert "assert 41 == 42" in shown or "1 failed" in shown, shown
    # the evidence as links: the check, its log page, the manifest; no JSON with bare ids
    for href in (f"#check-{check.pk}", reverse("admin:engine_run_check_log", args=[run.pk, check.pk])):
        assert f'href="{href}"' in card, href
    assert re.search(r'href="#manifest-\d+">manifest ' + check.manifest_digest[:12], card)
    assert '"check":' not in card and "{" not in re.sub(r"<[^>]+>", "", card.split("cp-stop-log")[0])
    # only the buttons that apply, as jumps to their forms
    jumps = set(re.findall(r'href="#action-(\w+)"', card))
    assert jumps == buttons(text) == {"recheck", "recover", "fail"}
    assert f"attempt-{attempt.pk}" in text


def test_a_queued_run_with_no_live_worker_says_so_in_the_header(staff, make_pipeline, repo, sent):
    from django.db import connection, transaction

    from engine.models import Worker

    run = pending_run(make_pipeline, repo)  # git runs, and a verb commits, outside any transaction
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # real workers of the session (tests/conftest.py ``worker_pool``) may beat into this database:
            # held off until the block ends, so that none beats between the delete and the pages
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {Worker._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
        Worker.objects.all().delete()  # no worker has ever beaten here
        operations.request_start(run, requested_by="t", source="test")
        header = section(page(staff, run), 'id="run-header"', "</section>")
        assert "No worker is alive" in header and "make worker" in header
        fragment = staff.get(reverse("admin:engine_run_header", args=[run.pk])).content.decode()
        assert "No worker is alive" in fragment and 'hx-trigger="every' in fragment  # it keeps looking


def test_a_long_wait_for_a_person_is_shortened_on_the_timeline():
    import datetime as dt
    from types import SimpleNamespace

    from controlpanel.views import Box, place_on_axis

    t0 = dt.datetime(2026, 12, 1, 8, 0, 0, tzinfo=dt.timezone.utc)

    def box(kind, start, end):
        return Box(label=kind, outcome="ok", duration="", anchor="x", title="", kind=kind,
                   start=(t0 + dt.timedelta(seconds=start)).timestamp(), end=(t0 + dt.timedelta(seconds=end)).timestamp())

    work, wait, final = box("step", 0, 30), box("wait", 30, 630), box("final", 630, 640)
    run = SimpleNamespace(started_at=t0, finished_at=t0 + dt.timedelta(seconds=640))
    axis = place_on_axis(run, [SimpleNamespace(boxes=[work, wait, final])])
    # 40 s of work and a 10-minute wait: the wait is drawn as 3.2 s (8 % of the work), not 94 % of the axis
    assert float(work.width) > 50 and float(final.width) > 15, (work.width, final.width)
    assert float(wait.width) < 10 and float(final.left) + float(final.width) <= 100.0
    assert axis["cuts"] and "10 min" in axis["cuts"][0][1] and axis["seconds"] == 640
    assert axis["ticks"][-1][1] == "10 min 40 s" and axis["ticks"][0][1] == "0.0 s"
