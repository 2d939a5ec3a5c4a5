"""Following a run live in a real browser (tests/support/browser.py): the live output box follows the
end of the output, keeps a reader's place and a selection (its attempt a recorded one whose log the test
writes, no worker); a person typing is told that the run changed instead of losing the text, and an
attempt whose end the output box sees brings the page up to date; the conversation of a real ``claude``
grows on the open page; a killed worker turns the page to "no heartbeat".
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine import operations
from engine.models import Attempt

from ..conftest import ANSWER_STEP, navigate_by
from ..support.browser import (
    BROWSER_MARKS, HELD_DEADLINES, WAIT_FOR_RELEASE, WAIT_MS, detail_path, log_in, release, screenshot, stage, status_of,
    user, wait_status)

pytestmark = BROWSER_MARKS


# ----------------------------------------------------------------------------- 4. the live output and the page's state

#: ``[selector, "top" | "bottom"]`` -> the line of text shown at the top or bottom edge of a scroll box (what a
#: person reads there), whatever the box's scroll coordinates mean.
LINE_AT_EDGE = """([selector, edge]) => {
    const box = document.querySelector(selector);
    const r = box.getBoundingClientRect();
    const caret = document.caretRangeFromPoint(r.left + 14, edge === "top" ? r.top + 8 : r.bottom - 9);
    if (!caret || caret.startContainer.nodeType !== Node.TEXT_NODE) return null;
    const text = caret.startContainer.textContent, at = caret.startOffset;
    const start = text.lastIndexOf("\\n", at - 1) + 1;
    const end = text.indexOf("\\n", at);
    return text.slice(start, end < 0 ? text.length : end);
}"""


def append(log: Path, text: str) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(text)


def test_the_live_output_follows_its_end_keeps_a_reader_s_place_and_a_selection(open_tab, make_pipeline, repo,
                                                                                django_user_model):
    from ..support.pages import live_attempt

    user(django_user_model, "admin", superuser=True)
    run = operations.create_run(make_pipeline(name="browser-tail"), str(repo), "main")
    attempt, log = live_attempt(run, "".join(f"early line {n:03d}\n" for n in range(300)))
    tab = open_tab()
    log_in(tab, "admin")
    polls = []
    tab.on("response", lambda r: polls.append(r.status) if f"/attempt/{attempt.pk}/tail/" in r.url else None)

    tab.goto(detail_path(run))
    box, pre = f"#tail-{attempt.pk} .cp-tail-scroll", f"#tail-{attempt.pk} pre"
    tab.wait_for_selector(box)
    tab.evaluate("s => document.querySelector(s).scrollIntoView({block: 'center'})", box)
    edge = lambda where: tab.evaluate(LINE_AT_EDGE, [box, where])  # noqa: E731
    assert edge("bottom") == "early line 299", "the output opens at its end"
    # new output while the person reads the end: the box follows it
    append(log, "new line A\n")
    tab.locator(pre).filter(has_text="new line A").wait_for(timeout=10_000)
    assert edge("bottom") == "new line A"
    # the person scrolls up: new output keeps their place
    tab.evaluate("s => document.querySelector(s).scrollBy(0, -250)", box)
    reading = edge("top")
    assert reading and reading.startswith("early line") and edge("bottom") != "new line A"
    append(log, "new line B\n")
    tab.locator(pre).filter(has_text="new line B").wait_for(timeout=10_000)
    assert edge("top") == reading
    # nothing new: the box is not replaced, so a selection survives the polls
    tab.evaluate("""s => { const pre = document.querySelector(s); pre.cpMark = "the same element";
                           const range = document.createRange(); range.selectNodeContents(pre);
                           getSelection().removeAllRanges(); getSelection().addRange(range); }""", pre)
    before = len(polls)
    with tab.expect_response(lambda r: f"/attempt/{attempt.pk}/tail/" in r.url and r.status == 204, timeout=5_000):
        pass  # the next poll: nothing new
    assert set(polls[before:]) == {204}, polls
    assert tab.evaluate("s => document.querySelector(s).cpMark", pre) == "the same element"
    assert "new line B" in tab.evaluate("() => String(getSelection())")


def test_a_person_typing_is_told_the_run_changed_and_an_ended_attempt_refreshes_the_page(open_tab, make_pipeline,
                                                                                        repo, django_user_model):
    from django.utils import timezone

    from ..support.pages import live_attempt

    user(django_user_model, "admin", superuser=True)
    pipeline = make_pipeline(name="browser-notice")
    run = operations.create_run(pipeline, str(repo), "main")
    tab = open_tab()
    log_in(tab, "admin")
    tab.goto(detail_path(run))
    tab.evaluate("window.cpMarker = 'typed before'")
    reason = "form.cp-action-fail textarea[name=reason]"
    tab.fill(reason, "a reason half written")
    tab.locator("#content-main").click(position={"x": 5, "y": 5})  # the focus leaves the form; the text stays
    operations.fail_run(run, "failed in another tab", "someone")
    notice = tab.locator("#cp-changed")
    notice.wait_for(state="visible", timeout=10_000)
    said = notice.inner_text()
    assert "This run changed: it is now failed." in said and "what you typed is kept until you reload" in said
    assert tab.evaluate("window.cpMarker") == "typed before" and tab.input_value(reason) == "a reason half written"
    assert status_of(tab) == "failed"  # the rest of the page follows the run, without a reload
    assert tab.locator("form.cp-action-fail").count() == 1  # the forms stay as they were, with the typed text
    screenshot(tab, "5-run-changed-while-typing")
    navigate_by(tab, lambda: notice.get_by_role("button", name="Reload").click())
    assert status_of(tab) == "failed" and tab.locator("#cp-changed").count() == 0
    # nothing typed: an attempt whose end the live output sees brings the whole page up to date
    other = operations.create_run(pipeline, str(repo), "main")
    attempt, _ = live_attempt(other, "working\n")
    tab.goto(detail_path(other))
    tab.locator('.cp-tail[data-cp-tail="live"]').filter(has_text="working").wait_for()
    tab.evaluate("window.cpMarker = 'before the end'")
    Attempt.objects.filter(pk=attempt.pk).update(status="succeeded", exit_code=0, ended_at=timezone.now())
    tab.wait_for_function(f"() => (document.querySelector('#attempt-{attempt.pk}') || {{}}).innerText"
                          f"?.includes('succeeded')", timeout=10_000)
    assert tab.evaluate("window.cpMarker") == "before the end"  # brought up to date in place, not reloaded
    assert tab.locator('.cp-tail[data-cp-tail="live"]').count() == 0


# ----------------------------------------------------------------------------- 6. watching an agent work

#: A real ``claude`` implementer against the scripted endpoint, one tool call every few seconds:
#: the conversation grows on the open page while the test watches.
SLOW_CLAUDE = {"turns": [
    {"text": "Let me read the code first.", "tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}]},
    {"delay": 4, "tools": [{"tool": "Bash", "input": {"command": "python -m pytest -q", "description": "Run the tests"}}]},
    {"delay": 4, "tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app/core.py",
                                                     "content": ANSWER_STEP["write"]["app/core.py"]}}]},
    {"delay": 2, "text": "Done: answer() returns 42."}]}
CLAUDE_PASSES = {"turns": [{"text": 'Reviewed.\n```json\n{"verdict": "pass", "summary": "fine", "findings": []}\n```'}]}


def conversation(tab):
    return tab.locator('#live .cp-tail[data-cp-tail="live"]')


def test_the_conversation_of_a_real_claude_grows_on_the_page_and_the_header_ticks(open_tab, workers, make_pipeline,
                                                                                  repo, django_user_model):
    from engine.agents.cli_adapter import find_executable

    if find_executable("claude") is None:
        pytest.skip("run `make agents` to install the pinned claude CLI")
    user(django_user_model, "admin", superuser=True)
    pipeline = make_pipeline(
        name="browser-claude", stages=stage(), roles={"implementer": "claude", "reviewer": "claude",
                                                      "documenter": "claude"},
        profiles={"claude": {"adapter": "claude-code", "max_turns": 8, "scripted_endpoint": {
            "stages": {"answer": {"implement": SLOW_CLAUDE, "review": CLAUDE_PASSES}}}}})
    run = operations.create_run(pipeline, str(repo), "main")
    tab = open_tab()
    log_in(tab, "admin")
    operations.request_start(run, requested_by="admin", source="test")
    tab.goto(detail_path(run))
    calls = conversation(tab).locator('[data-kind="tool_call"]')
    calls.filter(has_text="Reads app/core.py").wait_for(timeout=2 * WAIT_MS)
    # the conversation is the model gateway's record of what the model was sent and answered; the CLI's own
    # account (its stream-json) is one click away
    assert conversation(tab).locator('[data-kind="start"]').filter(has_text="The model gateway's record").count()
    assert conversation(tab).get_by_role("link", name="The CLI's own account").count() == 1
    assert conversation(tab).locator('[data-kind="text"]').filter(has_text="Let me read the code first.").count()
    assert calls.filter(has_text="Writes app/core.py").count() == 0
    tab.evaluate("window.cpMarker = 'watching'")
    loads = []
    tab.on("load", lambda _: loads.append(1))
    # the header ticks by itself between two looks at the server
    clock = tab.locator("#run-header .cp-elapsed")
    first = clock.inner_text()
    time.sleep(2.2)
    assert clock.inner_text() != first, "the elapsed time stood still"
    assert "heartbeat" in tab.inner_text("#run-header .cp-heartbeat") and "ago from" in tab.inner_text(
        "#run-header .cp-heartbeat")
    assert "Now:" in tab.inner_text("#run-header .cp-now")
    # the next calls come into the same box, without a reload
    calls.filter(has_text="Runs `python -m pytest -q`").wait_for(timeout=WAIT_MS)
    calls.filter(has_text="Writes app/core.py (5 lines)").wait_for(timeout=WAIT_MS)
    assert tab.evaluate("window.cpMarker") == "watching" and loads == [], "the page was reloaded"
    results = conversation(tab).locator('[data-kind="tool_result"]')
    assert results.filter(has_text="read").count() >= 1
    screenshot(tab, "6-claude-conversation")
    wait_status(tab, run, "succeeded", timeout=2 * WAIT_MS)
    implement = Attempt.objects.get(run=run, operation="implement")
    # the finished conversation is open at its start, once the page shows the run succeeded
    ended = tab.locator(f'#tail-{implement.pk}[data-cp-tail="ended"]')
    ended.locator('[data-kind="result"]').filter(has_text="Finished").wait_for()
    assert ended.locator('[data-kind="tool_call"]').count() == 3


def test_killing_the_worker_turns_the_page_to_no_heartbeat(open_tab, route, make_pipeline, repo, django_user_model,
                                                          settings, tmp_path):
    import uuid

    from ..support.workers import Beat
    from ..support.workers import Solo

    stale, period = 3.0, 4.0
    settings.CP_HEARTBEAT_STALE = stale  # the live server's pages judge the heartbeat as the workers do
    settings.CP_RECONCILE_PERIOD = period
    queue = f"browser-kill-{uuid.uuid4().hex[:8]}"
    route(queue)
    worker = Solo(tmp_path, queue, CP_HEARTBEAT_STALE=stale).start()
    beat = run = None
    try:
        user(django_user_model, "admin", superuser=True)
        run = operations.create_run(make_pipeline(name="browser-kill", stages=stage(), deadlines=HELD_DEADLINES, scenario={
            "stages": {"answer": {"implement": [WAIT_FOR_RELEASE]}}}), str(repo), "main")
        tab = open_tab()
        log_in(tab, "admin")
        operations.request_start(run, requested_by="admin", source="test")
        tab.goto(detail_path(run))
        conversation(tab).filter(has_text="waiting for release").wait_for(timeout=2 * WAIT_MS)
        heartbeat = tab.locator("#run-header .cp-heartbeat")
        heartbeat.wait_for()
        assert "heartbeat" in heartbeat.inner_text() and "no heartbeat" not in heartbeat.inner_text()
        tab.evaluate("window.cpMarker = 'before the kill'")
        beat = Beat(tmp_path, queue, settings.CELERY_BROKER_URL, CP_HEARTBEAT_STALE=stale,
                    CP_RECONCILE_PERIOD=period).start()
        worker.kill()
        killed = time.monotonic()
        # read at the moment it turns: the reconciler may interrupt the run (and the header change) soon after
        found = tab.wait_for_function(
            "() => { const h = document.getElementById('run-header'); const b = h && h.querySelector("
            "'.cp-heartbeat.cp-stale'); return b ? {text: b.textContent, header: h.className} : null; }",
            timeout=int((period + 5) * 1000)).json_value()
        took = time.monotonic() - killed
        assert took <= period + 5, took
        said = found["text"]
        assert said.startswith("no heartbeat for") and "its worker may be gone" in said, said
        assert "cp-no-heartbeat" in found["header"]
        # the age goes on ticking every second between the header's looks at the server (unless the box was
        # replaced meanwhile: then there is nothing to compare)
        ticked = tab.evaluate(
            "() => new Promise(done => { const b = document.querySelector('#run-header .cp-heartbeat.cp-stale');"
            " if (!b) { done(null); return; } const before = b.textContent;"
            " setTimeout(() => done(b.isConnected ? b.textContent !== before : null), 1100); })")
        assert ticked is not False, "the heartbeat's age stood still"
        screenshot(tab, "7-no-heartbeat")
        # the reconciler interrupts the run; the page follows without a reload
        wait_status(tab, run, "waiting_review", timeout=WAIT_MS)
        assert "interrupted" in tab.inner_text("#stop") and tab.evaluate("window.cpMarker") == "before the kill"
    finally:
        if run is not None:
            release(run)
        if beat is not None:
            beat.stop()
        worker.kill()


