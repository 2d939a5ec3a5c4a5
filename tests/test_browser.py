"""The Control Panel in a real browser: headless Chromium (Playwright) against the live server.

Everything is real: the admin site served by pytest-django's ``live_server`` on loopback, the
session's two Celery worker processes (``workers``, tests/conftest.py) taking the runs' steps
against the same database, the scripted test adapter's processes, the gates. A person's part
is played through the page only: the login form, the pipeline's "Create a run" form, the
Start, Approve and Fail buttons, the live tail of an attempt's output and the page reloading
itself when the run changes. Two quick tests need no worker (their attempt is a recorded one whose
log the test writes): the live output box follows the end of the output, keeps a reader's place
and a selection; a person typing is told that the run changed instead of losing the text, and an
attempt whose end the output box sees brings the page up to date.

Screenshots of the run page (full page) are kept under ``test-artifacts/`` (conftest.ARTIFACTS).

Chromium is Debian's (``make browser``, scripts/install-chromium.sh; ``CP_CHROMIUM`` names
another); without it these tests skip. Playwright's own browser download is never used.

One browser for the module; each test has its own browser context (cookies) and its own users.
"""
from __future__ import annotations

import collections
import os
import re
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission

from engine import operations, runner
from engine.models import Attempt, Check, Run

from .conftest import ARTIFACTS, ANSWER_STEP, CHROMIUM, NO_CHROMIUM, has_chromium, navigate_by, wait_for, wait_until


#: CI runs them in its SQLite job only (backend): what they check is the page a person sees and
#: drives, the same on either database; Chromium is the heaviest load a CI job has
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.backend("sqlite"),
              pytest.mark.skipif(not has_chromium(), reason=NO_CHROMIUM)]

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PASSWORD = "pw-for-browser-tests-only"
#: Milliseconds a look at the page may wait for something that a worker does.
WAIT_MS = 60_000

#: The implementer writes the answer, waits 2 s (the page has reloaded itself onto the running attempt by the
#: time line-2 comes), then prints six lines one second apart: "running" for ~8 s, its output growing.
#: Twelve lines a second apart: however late the page's first view comes, later lines still arrive after it.
TWELVE_LINES = {**ANSWER_STEP, "run": ["sh", "-c", "sleep 2; for i in $(seq 1 12); do echo line-$i; sleep 1; done"]}
#: An implementer that waits (at most 60 s) until the test writes $CP_DATA_DIR/release.
WAIT_FOR_RELEASE = {**ANSWER_STEP, "run": [
    "sh", "-c", 'echo "waiting for release"; i=0; '
    'while [ ! -f "$CP_DATA_DIR/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done']}
ESCALATE = {"verdict": {"verdict": "escalate", "findings": [
    {"file": "app/core.py", "line": 4, "severity": "major", "text": "Is 42 the right answer?"}]}}
#: A repair session's answer to a request for changes: the same answer, with a docstring.
REWORKED = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    """From the guide."""\n    return 42\n'}}
#: The repository's own tests (tests/test_core.py): a real check of the answer, in about a second.
GATE = {"name": "unit", "command": "python -m pytest -q"}


def stage(**extra) -> list[dict]:
    """One quick stage: the answer, a one-line gate, no repair."""
    return [{"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
             "gates": [GATE], "repair_allowance": 0, **extra}]


# ----------------------------------------------------------------------------- the browser


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the module (skips, naming ``make browser``, when it is not installed)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module", autouse=True)
def _sync_orm_beside_playwright(worker_pool):
    """Playwright's sync API keeps an asyncio loop in this thread (in a greenlet of its own) for the
    module's browser, which Django's async-safety check takes for an async context: the tests, and
    the database flush after each, are synchronous code, so the check is turned off for this module.
    The session's workers are started first, so that they do not inherit the setting."""
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if before is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def open_tab(browser, live_server):
    """``open_tab()``: a new page in a browser context of its own (its own cookies), on the live server."""
    contexts = []

    def make():
        context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
        context.set_default_timeout(20_000)
        contexts.append(context)
        page = context.new_page()
        watch(page)
        return page
    yield make
    for context in contexts:
        context.close()
    SEEN.clear()


def user(django_user_model, name: str, *codenames: str, superuser: bool = False):
    """A staff user ``name`` (password PASSWORD) with only the engine permissions ``codenames``."""
    if superuser:
        return django_user_model.objects.create_superuser(name, f"{name}@example.invalid", PASSWORD)
    made = django_user_model.objects.create_user(name, f"{name}@example.invalid", PASSWORD, is_staff=True)
    made.user_permissions.add(*Permission.objects.filter(content_type__app_label="engine", codename__in=codenames))
    assert made.user_permissions.count() == len(codenames)
    return made


def submit(tab, selector: str) -> None:
    """Press the submit button ``selector`` and wait for the page the form leads to (after its redirect):
    the callers then wait for what they look for.

    A press that sent nothing (the page replaced its parts under the pointer: run.js) is pressed once
    more, as a person would; one that sent its form and got no page back fails, saying what the page
    last asked and was answered (``seen``)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for press in (1, 2):
        pressed = time.monotonic()
        try:
            navigate_by(tab, lambda: tab.click(selector))
            return
        except PlaywrightTimeout as exc:
            sent = [what for at, what in SEEN.get(id(tab), ()) if at >= pressed and what.startswith("sent ")]
            if sent or press == 2:
                raise AssertionError(f"pressing {selector} led to no new page within 30 s (press {press}; "
                                     f"sent: {sent})" + seen(tab)) from exc


def log_in(tab, name: str) -> None:
    """Log in through the admin's login form, as a person does."""
    tab.goto("/admin/")
    assert "/admin/login/" in tab.url
    tab.fill("#id_username", name)
    tab.fill("#id_password", PASSWORD)
    submit(tab, "#login-form input[type=submit]")
    tab.wait_for_selector("#user-tools")
    assert tab.text_content("#user-tools strong") == name and "/admin/login/" not in tab.url


def detail_path(run) -> str:
    return f"/admin/engine/run/{run.pk}/detail/"


#: A button whose label is not its verb capitalized.
LABELS = {"rerun": "Re-run", "request_changes": "Request changes"}


def buttons(tab) -> set[str]:
    """The actions whose forms (with a visible submit button labelled as the action) the page shows."""
    found = set()
    for form in tab.locator("form.cp-action").all():
        verb = form.get_attribute("data-cp-action")
        submit = form.locator("input[type=submit]")
        assert submit.is_visible() and submit.get_attribute("value") == LABELS.get(verb, verb.capitalize()), verb
        found.add(verb)
    return found


def status_of(tab) -> str:
    return tab.get_attribute(".cp-status", "data-cp-status")


#: id(page) -> what its page asked the server and was answered, and its console's errors, last first
SEEN: dict[int, collections.deque] = {}


def watch(page) -> None:
    """Keep the last requests of ``page`` (answered, or failed) and its console errors, for a failure's
    message (``seen``): a page that stops following its run says whether the server answered it."""
    log = SEEN.setdefault(id(page), collections.deque(maxlen=40))
    page.on("response", lambda r: "/static/" in r.url or log.append((time.monotonic(),
                                                                     f"{r.status} {r.request.method} {r.url}")))
    page.on("request", lambda r: r.method == "GET" or log.append((time.monotonic(), f"sent {r.method} {r.url}")))
    page.on("requestfailed", lambda r: log.append((time.monotonic(), f"failed ({r.failure}) {r.method} {r.url}")))
    page.on("console", lambda m: m.type == "error" and log.append((time.monotonic(), f"console: {m.text}")))
    page.on("pageerror", lambda e: log.append((time.monotonic(), f"page error: {e}")))


def seen(tab) -> str:
    now = time.monotonic()
    lines = [f"  {now - at:6.1f} s ago: {what}" for at, what in SEEN.get(id(tab), ())]
    try:
        hidden = tab.evaluate("document.hidden")
    except Exception as exc:  # noqa: BLE001 (a diagnostic: the page may be gone)
        hidden = f"? ({exc})"
    return f"\nthe page's last requests (document.hidden: {hidden}):\n" + "\n".join(lines)


def wait_status(tab, run, status: str, timeout: int = 3 * WAIT_MS) -> None:
    """Wait until the page of the active ``run`` (updating itself while the run is queued or running)
    shows it stopped, in its header and in the rest of the page (#content-main's data-cp-status says which
    state its parts were built for: run.js), and assert that it stopped in ``status``.
    Three minutes by default: the run's gates, review and documentation run in between, and CI's
    jobs share two cores (its run stayed 'running' for more than 60 s there once, its page with it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    stopped = ':not([data-cp-status="queued"]):not([data-cp-status="running"])'
    try:
        tab.wait_for_selector(f".cp-status[data-cp-status]{stopped}", timeout=timeout)
        tab.wait_for_selector(f"#content-main[data-cp-status]{stopped}", timeout=WAIT_MS)
    except PlaywrightTimeout:
        pass
    if tab.get_attribute("#content-main", "data-cp-status") != status_of(tab):
        raise AssertionError(f"the header of run {run.pk}'s page says {status_of(tab)!r}, the rest of the page "
                             f"{tab.get_attribute('#content-main', 'data-cp-status')!r}" + seen(tab))
    if status_of(tab) != status:
        run.refresh_from_db()
        raise AssertionError(f"the page of run {run.pk} shows {status_of(tab)!r}, not {status!r}; the run is "
                             f"{run.status} ({run.stop_reason}: {run.stop_message})" + seen(tab))


def messages(tab, level: str) -> list[str]:
    return [m.strip() for m in tab.locator(f"ul.messagelist li.{level}").all_inner_texts()]


def screenshot(tab, name: str) -> Path:
    """A full-page PNG of the current page under test-artifacts/ (kept after the session)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"browser-{name}.png"
    tab.evaluate("window.scrollTo(0, 0)")  # the admin's sticky sidebar is drawn where the page is scrolled to
    tab.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


def release(run) -> None:
    """Let a WAIT_FOR_RELEASE implementer of ``run`` finish."""
    flag = Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}" / "data" / "release"
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.write_text("go\n")




def start_quietly(run, monkeypatch) -> None:
    """Request Start with the wake-up message sent to a queue no worker listens to: the run stays queued."""
    from controlpanel.celery import app
    from engine.tasks import advance_run

    idle = f"idle-{os.getpid()}-{run.pk}"
    with monkeypatch.context() as patch:
        patch.setattr(runner, "enqueue", lambda run_id, token: advance_run.apply_async(args=[run_id, token],
                                                                                       queue=idle))
        operations.request_start(run, requested_by="test", source="test")
    with app.connection_for_write() as conn:  # nobody will read it: drop it
        conn.default_channel.queue_purge(idle)


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
    assert done.count() == 0  # a finished attempt's output loads on demand
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
    # a box a person opened stays open while the page updates its parts around it (run.js keepFolds)
    implement = Attempt.objects.get(run=run, operation="implement")
    tab.click(f"#output-box-{implement.pk} > summary")
    tab.locator(f"#output-box-{implement.pk} .cp-tail").wait_for()
    wait_until(lambda: run.decisions.filter(state="pending", kind="approval").exclude(pk=decision.pk).exists(),
               timeout=2 * WAIT_MS / 1000, what="a new decision after the repair")
    wait_status(tab, run, "waiting_approval")
    assert tab.get_attribute(f"#output-box-{implement.pk}", "open") is not None, "the opened box was closed"
    tab.locator(f"#output-box-{implement.pk} .cp-tail").wait_for()
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
    tab.click(f"#attempt-{implement.pk} + tr summary:has-text('the end of the output')")
    shown = tab.locator('.cp-tail[data-cp-tail="ended"]').first
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
    held = make_pipeline(name="browser-held", stages=stage(),
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
    from .test_run_page import live_attempt

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

    from .test_run_page import live_attempt

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
    tab.click(f"#attempt-{implement.pk} + tr summary:has-text('the end of the output')")
    ended = tab.locator(f'#tail-{implement.pk}[data-cp-tail="ended"]')
    ended.locator('[data-kind="result"]').filter(has_text="Finished").wait_for()
    assert ended.locator('[data-kind="tool_call"]').count() == 3


def test_killing_the_worker_turns_the_page_to_no_heartbeat(open_tab, route, make_pipeline, repo, django_user_model,
                                                          settings, tmp_path):
    import uuid

    from .test_crash_recovery import Beat
    from .test_run_records import Solo

    stale, period = 3.0, 4.0
    settings.CP_HEARTBEAT_STALE = stale  # the live server's pages judge the heartbeat as the workers do
    settings.CP_RECONCILE_PERIOD = period
    queue = f"browser-kill-{uuid.uuid4().hex[:8]}"
    route(queue)
    worker = Solo(tmp_path, queue, CP_HEARTBEAT_STALE=stale).start()
    beat = run = None
    try:
        user(django_user_model, "admin", superuser=True)
        run = operations.create_run(make_pipeline(name="browser-kill", stages=stage(), scenario={
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


def _tampered_run(make_pipeline, repo, sent):
    from .test_steps import drive

    cheat = {"write": {**ANSWER_STEP["write"], "tests/test_core.py": "def test_answer():\n    pass\n"}}
    pipeline = make_pipeline(name="browser-tamper", stages=stage(scope=["app/**", "tests/**"]),
                             protected_paths=["tests/test_*.py"],
                             scenario={"stages": {"answer": {"implement": [cheat]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert run.stop_reason == "protected_files_changed", (run.status, run.stop_reason, run.stop_message)
    return run


def no_sideways_scroll(tab) -> dict:
    """The widths that matter at a narrow viewport: the page's and the main column's scroll widths."""
    return tab.evaluate("""() => ({viewport: window.innerWidth,
        page: document.documentElement.scrollWidth,
        main: (document.getElementById('content-main') || document.body).scrollWidth})""")


def test_the_tampering_attempt_is_red_and_the_pages_fit_390_px(open_tab, make_pipeline, repo, sent,
                                                              django_user_model):
    user(django_user_model, "admin", superuser=True)
    run = _tampered_run(make_pipeline, repo, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    tab = open_tab()
    log_in(tab, "admin")
    tab.goto(detail_path(run))
    box = tab.locator(f'#timeline a.cp-step[href="#attempt-{attempt.pk}"]')
    assert box.get_attribute("data-outcome") == "bad"
    assert box.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(239, 68, 68)"  # red
    assert "cp-row-bad" in tab.get_attribute(f"#attempt-{attempt.pk}", "class")
    card = tab.locator("#stop")
    assert card.is_visible() and "protected_files_changed" in card.inner_text() and "tests/test_core.py" in (
        card.inner_text())
    assert card.bounding_box()["y"] < tab.locator("#timeline").bounding_box()["y"]  # why it stopped, on top
    screenshot(tab, "8-tampered")
    tab.set_viewport_size({"width": 390, "height": 844})
    for path, name in ((detail_path(run), "run-page"), ("/admin/engine/run/", "run-list")):
        tab.goto(path)
        widths = no_sideways_scroll(tab)
        assert widths["page"] <= widths["viewport"] and widths["main"] <= widths["viewport"], (name, widths, tab.evaluate(
            "() => Array.from(document.querySelectorAll('body *')).filter(e => e.getBoundingClientRect().right > "
            "window.innerWidth + 0.5).slice(0, 10).map(e => e.tagName + '.' + e.className)"))
        screenshot(tab, f"9-390px-{name}")
