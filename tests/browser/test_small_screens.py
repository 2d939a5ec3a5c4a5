"""The run page on a phone in a real browser (tests/support/browser.py): a tampering attempt is shown
red, and the pages fit 390 px without scrolling sideways.
"""
from __future__ import annotations

from engine import operations
from engine.models import Attempt

from ..conftest import ANSWER_STEP
from ..support.browser import (
    BROWSER_MARKS, detail_path, fits_every_width, log_in, screenshot, stage, user)

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
    fits_every_width(tab, [detail_path(run), "/admin/engine/run/"], "9-tampered")
