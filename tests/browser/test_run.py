"""A person's run in a real browser (tests/support/browser.py): headless Chromium against the live
server and the session's two Celery worker processes (``workers``, tests/conftest.py) taking the runs'
steps against the same database, the scripted test adapter's processes, the gates. A person's part is
played through the page only: the login form, the pipeline's "Create a run" form, the Start, Approve
and Fail buttons; a viewer sees no button; each state shows exactly the buttons that apply.
"""
from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

from engine import operations
from engine.models import Attempt, Check, Run

from ..conftest import ANSWER_STEP, navigate_by, wait_for, wait_until
from ..support.browser import (
    BROWSER_MARKS, ESCALATE, GATE, HELD_DEADLINES, REWORKED, TWELVE_LINES, WAIT_FOR_RELEASE, WAIT_MS, buttons, detail_path,
    log_in, messages, release, screenshot, stage, start_quietly, status_of, submit, user, wait_status)

pytestmark = BROWSER_MARKS


# ----------------------------------------------------------------------------- 1. a person's whole run


def test_a_person_creates_starts_watches_and_approves_a_run(open_tab, workers, make_pipeline, repo,
                                                             django_user_model):
    user(django_user_model, "admin", superuser=True)
    pipeline = make_pipeline(name="browser-demo", stages=stage(human_gate=True, repair_allowance=1),
                             scenario={"stages": {"answer": {"implement": [TWELVE_LINES], "repair": [REWORKED]}}})
    tab = open_tab()
    log_in(tab, "admin")

    # the saved pipeline's page, then its "Create a run" form
    tab.get_by_role("link", name="Pipelines", exact=True).first.click()
    tab.click(f"#result_list a:text-is('{pipeline.name}')")
    tab.click("a.cp-create-run")
    tab.fill("#id_repo", str(repo / "missing"))
    submit(tab, "#create-run-form input[name=_create]")
    refused = messages(tab, "error")
    assert len(refused) == 1 and "path_not_found" in refused[0] and "field “repo”" in refused[0], refused
    assert not Run.objects.exists() and tab.input_value("#id_repo") == str(repo / "missing")
    screenshot(tab, "0-create-run-refused")
    tab.fill("#id_repo", str(repo))
    tab.fill("#id_rev", "main")
    submit(tab, "#create-run-form input[name=_create]")
    run = Run.objects.get()
    assert tab.url.endswith(detail_path(run)) and run.status == "pending"
    assert messages(tab, "success")[0].startswith(f"Run {run.pk} created from pipeline browser-demo at commit "
                                                   f"{run.commit[:12]} by admin.")
    assert status_of(tab) == "pending" and buttons(tab) == {"start", "fail"}
    assert tab.locator(".cp-badge.cp-simulated").first.is_visible()

    # Start; the page follows the run by itself, and the attempt's output grows in place
    submit(tab, "form.cp-action-start input[type=submit]")
    assert messages(tab, "success") == [f"Start requested by admin: run {run.pk} is queued for a worker."]
    tail = tab.locator('.cp-tail[data-cp-tail="live"]')
    # the first step makes the worktree and runs the baseline checks first: on a loaded CI host
    # (two suites on two cores) that alone has taken most of a minute
    tail.filter(has_text="line-2").wait_for(timeout=2 * WAIT_MS)
    # a loaded host may show several lines in the first view: the page must then grow past the last of them
    shown = max(int(n) for n in re.findall(r"line-(\d+)", tail.inner_text()))
    assert shown < 12, "the whole output arrived in one view: nothing left to watch grow"
    later = f"line-{shown + 1}"
    tab.evaluate("window.cpMarker = 'set before the next line'")
    loads = []
    tab.on("load", lambda _: loads.append(1))
    tail.filter(has_text=later).wait_for(timeout=15_000)
    assert tab.evaluate("window.cpMarker") == "set before the next line" and loads == [], "the page was reloaded"
    assert status_of(tab) == "running" and buttons(tab) == {"fail"}
    assert re.search(r"line-1\n.*line-2\n.*" + later, tail.inner_text(), re.S)
    # the conversation, not the raw bytes: the scripted agent's write and command as sentences
    assert tail.locator('[data-kind="tool_call"]').filter(has_text="Wrote app/core.py").count() == 1
    assert tail.locator('[data-kind="tool_call"]').filter(has_text="Runs `sh -c").count() == 1
    screenshot(tab, "1-running-live-output")

    # the human gate: the checks and the review passed, the page reloaded to say so and offers Approve
    wait_status(tab, run, "waiting_approval")
    assert buttons(tab) == {"approve", "request_changes", "recheck", "fail"}
    check = Check.objects.filter(run=run, kind="gate", name=GATE["name"], stale=False).order_by("id").last()
    row = tab.locator(f"#check-{check.pk}")
    assert GATE["command"] in row.inner_text() and "pass" in row.inner_text() and "exit 0" in row.inner_text()
    assert tab.locator(f"#check-{check.pk} .cp-dot.cp-ok").is_visible()
    decision = run.decisions.get(state="pending", kind="approval")
    assert tab.input_value("form.cp-action-approve input[name=artifact]") == decision.artifact
    assert f"approve files {decision.artifact[:12]}" in tab.inner_text(".cp-waiting")
    done = tab.locator('.cp-tail[data-cp-tail="ended"]')
    done.first.wait_for()  # each finished attempt's conversation is open, from its start
    assert all(box.get_attribute("data-cp-from") == "start" for box in done.all())
    # the approval view: the diff of the waiting files beside Approve and Request changes
    tab.locator("#approval .cp-approval-diff .cp-diff").wait_for()
    assert "return 42" in tab.inner_text("#approval .cp-approval-diff")
    screenshot(tab, "2-waiting-approval")
    # the home page lists the run among those waiting for a person, with the button that leads to the action
    tab.goto("/admin/")
    item = tab.locator(f'#cp-home-waiting [data-run="{run.pk}"]')
    item.wait_for()
    assert "waiting for approval" in item.inner_text().lower()
    screenshot(tab, "2b-home-waiting")
    navigate_by(tab, lambda: item.get_by_role("link", name="Approve or request changes").click())
    assert tab.url.endswith(f"{detail_path(run)}#actions") and buttons(tab) >= {"approve", "request_changes"}

    # Request changes: the files go back to a repair session with the note, then the gate asks again
    assert buttons(tab) >= {"request_changes"}
    assert tab.input_value("form.cp-action-request_changes input[name=artifact]") == decision.artifact
    tab.fill("form.cp-action-request_changes textarea[name=note]", "Say where 42 comes from.")
    tab.fill("form.cp-action-request_changes textarea[name=comments]", "app/core.py:4: a docstring here")
    submit(tab, "form.cp-action-request_changes input[type=submit]")
    assert messages(tab, "success")[0].startswith(f"Changes requested by admin on decision {decision.pk}")
    # a finished attempt's conversation is open at its start; a box a person closed stays closed while the
    # page updates its parts around it (run.js keepFolds)
    implement = Attempt.objects.get(run=run, operation="implement")
    tab.locator(f"#output-box-{implement.pk} .cp-tail[data-cp-from=start]").wait_for()
    tab.click(f"#output-box-{implement.pk} > summary")
    assert tab.get_attribute(f"#output-box-{implement.pk}", "open") is None
    wait_until(lambda: run.decisions.filter(state="pending", kind="approval").exclude(pk=decision.pk).exists(),
               timeout=2 * WAIT_MS / 1000, what="a new decision after the repair")
    wait_status(tab, run, "waiting_approval")
    assert tab.get_attribute(f"#output-box-{implement.pk}", "open") is None, "the closed box was opened"
    repair = Attempt.objects.get(run=run, operation="repair")
    prompt = (Path(settings.VAR_DIR) / repair.prompt_path).read_text()
    assert "Say where 42 comes from." in prompt and "app/core.py:4: a docstring here" in prompt
    old, decision = decision, run.decisions.get(state="pending", kind="approval")
    assert decision.artifact != old.artifact
    assert tab.input_value("form.cp-action-approve input[name=artifact]") == decision.artifact
    assert "changes_requested" in tab.inner_text(f"#decision-{old.pk}")

    submit(tab, "form.cp-action-approve input[type=submit]")
    assert messages(tab, "success") == [f"Decision {decision.pk} approved by admin for files {decision.artifact[:12]}: "
                                        "the run continues."]
    wait_status(tab, run, "succeeded")
    run.refresh_from_db()
    assert run.status == "succeeded" and run.stages.get().checkpoint_commit, run.stop_message
    assert buttons(tab) == {"rerun"}  # an ended run is only re-run
    final = list(Check.objects.filter(run=run, kind="final"))
    assert final and all(c.passed for c in final)
    for c in Check.objects.filter(run=run, stale=False):
        assert "pass" in tab.inner_text(f"#check-{c.pk}")
    # the implementer's whole output, on demand, once the attempt is over
    implement = Attempt.objects.get(run=run, operation="implement")
    shown = tab.locator(f'#output-box-{implement.pk} .cp-tail[data-cp-tail="ended"]')
    shown.filter(has_text="line-12").wait_for()
    screenshot(tab, "3-succeeded")


# ----------------------------------------------------------------------------- 2. a viewer


def test_a_viewer_sees_no_button(open_tab, workers, make_pipeline, repo, django_user_model):
    user(django_user_model, "viewer", "view_run")
    gated = make_pipeline(name="browser-gated", stages=stage(human_gate=True))
    waiting = operations.create_run(gated, str(repo), "main")
    operations.request_start(waiting, requested_by="test", source="test")
    pending = operations.create_run(gated, str(repo), "main")
    tab = open_tab()
    log_in(tab, "viewer")
    tab.goto(detail_path(pending))
    assert status_of(tab) == "pending" and buttons(tab) == set()
    assert "No action that applies now is permitted to you." in tab.inner_text("#actions")
    assert wait_for(waiting.pk).status == "waiting_approval"
    tab.goto(detail_path(waiting))
    assert status_of(tab) == "waiting_approval" and buttons(tab) == set()
    assert "No action that applies now is permitted to you." in tab.inner_text("#actions")
    # and the server refuses what the page does not offer, even posted from the viewer's own session
    token = next(c["value"] for c in tab.context.cookies() if c["name"] == "csrftoken")
    answer = tab.evaluate("""([url, token]) => fetch(url, {method: "POST", headers: {"X-CSRFToken": token},
                                                           body: new URLSearchParams({reason: "not mine"})})
                             .then(r => r.status)""", [f"/admin/engine/run/{pending.pk}/action/fail/", token])
    assert answer == 403
    assert Run.objects.get(pk=pending.pk).status == "pending"


# ----------------------------------------------------------------------------- 3. each state, its buttons


def test_each_state_shows_exactly_the_buttons_that_apply(open_tab, workers, make_pipeline, repo, django_user_model,
                                                         monkeypatch):
    user(django_user_model, "admin", superuser=True)
    gated = make_pipeline(name="browser-gated", stages=stage(human_gate=True))
    held = make_pipeline(name="browser-held", stages=stage(), deadlines=HELD_DEADLINES,
                         scenario={"stages": {"answer": {"implement": [WAIT_FOR_RELEASE]}}})
    escalated = make_pipeline(name="browser-escalated", stages=stage(),
                              scenario={"stages": {"answer": {"implement": [ANSWER_STEP], "review": [ESCALATE]}}})
    running, review, approval = (operations.create_run(p, str(repo), "main") for p in (held, escalated, gated))
    for run in (running, review, approval):
        operations.request_start(run, requested_by="test", source="test")
    pending = operations.create_run(gated, str(repo), "main")
    queued = operations.create_run(gated, str(repo), "main")
    start_quietly(queued, monkeypatch)
    tab = open_tab()
    log_in(tab, "admin")
    try:
        expected = {"pending": (pending, {"start", "fail"}), "queued": (queued, {"fail"})}
        for status, (run, verbs) in expected.items():
            tab.goto(detail_path(run))
            assert (status_of(tab), buttons(tab)) == (status, verbs)
        wait_until(lambda: Attempt.objects.filter(run=running, status="running").exists(), what="the held attempt")
        tab.goto(detail_path(running))
        assert (status_of(tab), buttons(tab)) == ("running", {"fail"})
        tab.locator('.cp-tail[data-cp-tail="live"]').filter(has_text="waiting for release").wait_for()
        assert wait_for(review.pk).status == "waiting_review"
        tab.goto(detail_path(review))
        assert (status_of(tab), buttons(tab)) == ("waiting_review", {"recover", "recheck", "fail"})
        assert tab.input_value("form.cp-action-recover input[name=decision]") == str(
            review.decisions.get(state="pending", kind="review").pk)
        assert "Is 42 the right answer?" in tab.inner_text(".cp-findings")
        assert wait_for(approval.pk).status == "waiting_approval"
        tab.goto(detail_path(approval))
        assert (status_of(tab), buttons(tab)) == ("waiting_approval", {"approve", "request_changes", "recheck",
                                                                       "fail"})
    finally:
        release(running)
    # failed: pressing Fail on the run waiting for review, with a reason
    tab.goto(detail_path(review))
    tab.fill("form.cp-action-fail textarea[name=reason]", "the requirement was wrong")
    submit(tab, "form.cp-action-fail input[type=submit]")
    assert messages(tab, "success")[0].startswith(f"Run {review.pk} failed.")
    assert (status_of(tab), buttons(tab)) == ("failed", {"rerun"})
    assert "failed_by_operator" in tab.inner_text(".cp-stop-reason")
    screenshot(tab, "4-failed")
    # succeeded: the held run, released; its page follows it to the end by itself
    tab.goto(detail_path(running))
    wait_status(tab, running, "succeeded")
    assert buttons(tab) == {"rerun"} and Run.objects.get(pk=running.pk).status == "succeeded"
    # a queued run that is failed ends too
    tab.goto(detail_path(queued))
    tab.fill("form.cp-action-fail textarea[name=reason]", "never mind")
    submit(tab, "form.cp-action-fail input[type=submit]")
    assert (status_of(tab), buttons(tab)) == ("failed", {"rerun"})


