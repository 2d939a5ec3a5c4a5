"""The Control Panel in a real browser, what its tests share (tests/test_browser_*.py): headless
Chromium (Playwright) against pytest-django's ``live_server`` on loopback, each test with its own browser
context (cookies) and its own users, the page's last requests kept for a failure's message.

Chromium is Debian's (``make browser``, scripts/install-chromium.sh; ``CP_CHROMIUM`` names
another); without it the tests skip. Playwright's own browser download is never used. Screenshots of
the run page (full page) are kept under ``test-artifacts/`` (conftest.ARTIFACTS).

A test module imports the fixtures ``browser``, ``open_tab`` and ``_sync_orm_beside_playwright`` (one
browser per module) and sets ``pytestmark = BROWSER_MARKS``.
"""
from __future__ import annotations

import collections
import contextlib
import os
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission

from engine import operations, runner

from tests.conftest import ARTIFACTS, ANSWER_STEP, CHROMIUM, NO_CHROMIUM, has_chromium, navigate_by


#: CI runs them in its SQLite job only (backend): what they check is the page a person sees and
#: drives, the same on either database; Chromium is the heaviest load a CI job has
BROWSER_MARKS = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.backend("sqlite"),
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
#: An implementer that waits (at most five minutes) until the test writes $CP_DATA_DIR/release; its pipeline
#: needs ``deadlines=HELD_DEADLINES`` (under CI's load a test took more than the default 60 s to release it).
WAIT_FOR_RELEASE = {**ANSWER_STEP, "run": [
    "sh", "-c", 'echo "waiting for release"; i=0; '
    'while [ ! -f "$CP_DATA_DIR/release" ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done']}
HELD_DEADLINES = {"implement": 400, "gate": 120}
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
def browser(live_server):
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
    the callers then wait for what they look for. A press that led to no new page fails, saying what
    the page sent and last asked and was answered (``seen``)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    pressed = time.monotonic()
    try:
        navigate_by(tab, lambda: tab.click(selector))
    except PlaywrightTimeout as exc:
        sent = [what for at, what in SEEN.get(id(tab), ()) if at >= pressed and what.startswith("sent ")]
        raise AssertionError(f"pressing {selector} led to no new page within 30 s (sent: {sent})"
                             + seen(tab)) from exc


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




# ----------------------------------------------------------------------------- every page, at every width

#: The elements that make a page scroll sideways at its width: any element whose box reaches past the viewport's
#: right edge, any that scrolls sideways inside itself (an overflowing box with a sideways scroll bar), and any that
#: cuts what it holds (overflow hidden: a diff's line cut at its edge; the timeline's track and an ellipsis cut on
#: purpose, as is a visually hidden label of 1 px). [] when nothing does. Elements with no box (a closed <details>' content, display: none) are not drawn and not counted.
SIDEWAYS = """() => {
  const width = document.documentElement.clientWidth, found = [];
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
                    (typeof e.className === 'string' && e.className ? '.' + e.className.trim().split(/\\s+/).join('.') : '');
  if (document.documentElement.scrollWidth > width + 1) found.push('the page: ' + document.documentElement.scrollWidth + ' px');
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (!r.width && !r.height) continue;
    const style = getComputedStyle(e);
    if (style.visibility === 'hidden' || style.position === 'fixed') continue;
    if (r.right > width + 1) found.push(name(e) + ' reaches ' + Math.round(r.right) + ' px');
    else if (['auto', 'scroll'].includes(style.overflowX) && e.scrollWidth > e.clientWidth + 1)
      found.push(name(e) + ' scrolls sideways (' + e.scrollWidth + ' in ' + e.clientWidth + ' px)');
    else if (['hidden', 'clip'].includes(style.overflowX) && e.scrollWidth > e.clientWidth + 1
             && e.clientWidth > 1 && style.textOverflow !== 'ellipsis' && !e.closest('.cp-track'))
      found.push(name(e) + ' cuts what it holds (' + e.scrollWidth + ' in ' + e.clientWidth + ' px: ' +
                 [...e.querySelectorAll('*')].filter(c => c.getBoundingClientRect().right > r.right + 1)
                   .slice(0, 3).map(name).join(', ') + ')');
    if (found.length > 12) break;
  }
  return found;
}"""

#: True once every conversation box and every patch box of the run page is open and has loaded what it shows.
LOADED = """() => [...document.querySelectorAll('details.cp-lazy-box')].every(
  box => box.open && box.querySelector('.cp-tail, .cp-diff-box, .cp-none'))"""


def run_pages(run, around: bool = True) -> list[str]:
    """The pages a person reads of ``run`` (read from the database before a browser opens them): its page, each
    check's page, each patch's page, an attempt's record; with ``around``, its events, the run list, the home page
    and its pipeline too."""
    from engine.models import Attempt, Check

    base = f"/admin/engine/run/{run.pk}"
    pages = [detail_path(run)]
    if around:
        pages += ["/admin/", "/admin/engine/run/", f"/admin/engine/runevent/?run__id__exact={run.pk}",
                  f"/admin/engine/pipeline/{run.pipeline_id}/change/"]
    pages += [f"{base}/check/{pk}/log/" for pk in Check.objects.filter(run=run).values_list("pk", flat=True)[:4]]
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    pages += [f"{base}/attempt/{a.pk}/diff/" for a in attempts if a.patch_path][:3]
    pages += [f"/admin/engine/attempt/{a.pk}/change/" for a in attempts[:1]]
    return pages


def fits_every_width(tab, pages: list[str], name: str, shots: bool = True) -> None:
    """Each of ``pages`` at 1280 and 390 px: no element scrolls sideways or reaches past the right edge (SIDEWAYS);
    on the run page every conversation and patch is open and loaded first (the diffs and conversations are where
    long lines are), each finished conversation at its start. With ``shots``, a screenshot of each run page is kept
    (and of any page that fails, always)."""
    for width in (1280, 390):
        tab.set_viewport_size({"width": width, "height": 900})
        for path in pages:
            tab.goto(path)
            if path.endswith("/detail/"):
                closed = tab.locator(".cp-conversation-box:not([open])").count()
                assert not closed, (path, f"{closed} conversation(s) not open by default")
                tab.evaluate("() => document.querySelectorAll('details.cp-lazy-box:not([open])')"
                             ".forEach(box => { box.open = true; })")
                tab.wait_for_function(LOADED, timeout=WAIT_MS)
                for box in tab.locator(".cp-conversation-box .cp-tail[data-cp-tail=ended]").all():
                    assert box.get_attribute("data-cp-from") == "start", (path, "a finished conversation opens at "
                                                                                "its start")
                    assert box.locator(".cp-tail-scroll").evaluate("e => e.scrollTop") == 0, path
                if shots:
                    screenshot(tab, f"{name}-{width}px")
            found = tab.evaluate(SIDEWAYS)
            if found:
                screenshot(tab, f"{name}-{width}px-sideways")
            assert not found, (path, f"{width} px", found)


@contextlib.contextmanager
def standalone_tab(base_url: str):
    """A headless Chromium page on ``base_url`` for a test that is not a browser module (its runs made first, the
    browser opened after): Django's async-safety check is off while it is open (the ``browser`` fixture's reason).
    Fails, naming ``make browser``, without Chromium."""
    from playwright.sync_api import sync_playwright

    assert has_chromium(), NO_CHROMIUM
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            context = chromium.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
            context.set_default_timeout(20_000)
            page = context.new_page()
            watch(page)
            try:
                yield page
            finally:
                chromium.close()
                SEEN.pop(id(page), None)
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before
