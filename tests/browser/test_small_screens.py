"""The run page on a phone in a real browser (tests/support/browser.py): a tampering attempt is shown
red, and the pages fit 390 px without scrolling sideways.
"""
from __future__ import annotations



from engine import operations
from engine.models import Attempt

from ..conftest import ANSWER_STEP
from ..support.browser import (
    BROWSER_MARKS, detail_path, log_in, screenshot, stage, user)

pytestmark = BROWSER_MARKS


def _tampered_run(make_pipeline, repo, sent):
    from ..support.runs import drive

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
