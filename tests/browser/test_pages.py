"""Issue 22, the run page as people read it, in a real browser (tests/support/browser.py): the demo's run (the
real claude CLI against the scripted model endpoint, pipelines/example.yaml on the demo repository) read on every
page at 1280 and 390 px with its conversations open at their start and nothing scrolling sideways; a gate's log
growing on the run page and on the check's page while the gate runs; a comment made on a line of the diff at the
human gate reaching the repair attempt's prompt with its file, line and the code around it, and the next decision
saying whether the repair changed that line.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib import admin
from django.core.management import call_command
from django.urls import reverse

from engine import operations
from engine.demo import make_demo_repo
from engine.models import Attempt, Check, Run
from engine.pipeline.format import load_file

from ..conftest import ANSWER_STEP, wait_until
from ..support.browser import (
    BROWSER_MARKS, REWORKED, WAIT_MS, buttons, detail_path, fits_every_width, log_in, messages, run_pages, screenshot,
    stage, submit, user, wait_status)

pytestmark = BROWSER_MARKS

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_demo_run_reads_from_its_start_on_every_page_at_1280_and_390_px(open_tab, workers, tmp_path,
                                                                              django_user_model):
    from engine.agents.cli_adapter import find_executable

    if find_executable("claude") is None:
        pytest.skip("run `make agents` to install the pinned claude CLI")
    user(django_user_model, "admin", superuser=True)
    repo = make_demo_repo(str(tmp_path / "textstats"))
    call_command("load_pipelines", str(ROOT / "pipelines" / "example.yaml"))
    name = load_file(str(ROOT / "pipelines" / "example.yaml"))["name"]
    run = operations.create_run(name, repo["path"], "v0", {role: "claude-scripted" for role in operations.ROLES})
    operations.request_start(run, requested_by="admin", source="test")
    wait_until(lambda: Run.objects.get(pk=run.pk).status in ("succeeded", "failed", "waiting_review"),
               timeout=6 * WAIT_MS / 1000, what="the demo's run to end")
    run.refresh_from_db()
    assert run.status == "succeeded", (run.stop_reason, run.stop_message)
    tab = open_tab()
    log_in(tab, "admin")
    # the order a person reads, at either width: status, the facts, what can be done, the timeline, the stages
    # with their conversations
    for width in (1280, 390):
        tab.set_viewport_size({"width": width, "height": 900})
        tab.goto(detail_path(run))
        tops = [tab.locator(selector).first.bounding_box()["y"] for selector in
                ("#run-header", "#facts", "#actions", "#timeline", ".cp-stage", "#manifests")]
        assert tops == sorted(tops), (width, tops)
    tab.set_viewport_size({"width": 1280, "height": 900})
    implement = Attempt.objects.filter(run=run, operation="implement").order_by("number").first()
    box = tab.locator(f"#output-box-{implement.pk}")
    assert box.get_attribute("open") is not None, "a finished attempt's conversation is open"
    first = box.locator(".cp-entry").first
    first.wait_for()
    assert first.get_attribute("data-kind") == "start", first.inner_text()
    # no amount of a simulated run reads as money: each is labelled simulated, or is the budget's cap
    assert "SIMULATED" in tab.inner_text("#run-header")
    amounts = re.findall(r"\$[\d,.]+[^\n$]{0,26}", tab.inner_text("#content-main"))
    assert amounts and all(re.match(r"\$[\d,.]+ (\(?simulated, not money|\(budgets\.max_cost_usd\))", amount)
                           for amount in amounts), amounts
    # and every other page of the Control Panel: each list, a pipeline's Create a run and Edit pages
    lists = [reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
             for model in admin.site._registry]
    forms = [reverse(f"admin:engine_pipeline_{name}", args=[run.pipeline_id])
             for name in ("create_run", "edit_definition")]
    fits_every_width(tab, run_pages(run) + lists + forms, "22-demo")


#: A gate that prints a line a second for 14 s, then passes: long enough to watch its log grow.
SLOW_GATE = {"name": "slow", "command": "for i in $(seq 1 14); do echo gate-line-$i; sleep 1; done"}


def test_a_gate_s_log_grows_on_the_run_page_and_on_its_check_page(open_tab, workers, make_pipeline, repo,
                                                                 django_user_model):
    user(django_user_model, "admin", superuser=True)
    pipeline = make_pipeline(name="browser-gate-log", stages=stage(gates=[SLOW_GATE]),
                             scenario={"stages": {"answer": {"implement": [ANSWER_STEP]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    tab, check_tab = open_tab(), None
    log_in(tab, "admin")
    tab.goto(detail_path(run))
    operations.request_start(run, requested_by="admin", source="test")
    live = tab.locator('.cp-check-tail[data-cp-tail="live"]').first
    live.filter(has_text="gate-line-2").wait_for(timeout=3 * WAIT_MS)
    shown = max(int(n) for n in re.findall(r"gate-line-(\d+)", live.inner_text()))
    assert shown < 12, "the whole log arrived in one view: nothing left to watch grow"
    tab.evaluate("window.cpMarker = 'before the next line'")
    live.filter(has_text=f"gate-line-{shown + 1}").wait_for(timeout=15_000)
    assert tab.evaluate("window.cpMarker") == "before the next line", "the page was reloaded"
    screenshot(tab, "22-gate-log-live")
    # the check's own page follows the same log
    check = Check.objects.filter(run=run, name="slow", ended_at=None).order_by("-id").first()
    if check is not None:
        check_tab = open_tab()
        log_in(check_tab, "admin")
        check_tab.goto(f"/admin/engine/run/{run.pk}/check/{check.pk}/log/")
        follow = check_tab.locator(f'#check-tail-{check.pk}')
        follow.locator("pre").filter(has_text="gate-line-").wait_for(timeout=WAIT_MS)
        seen = max(int(n) for n in re.findall(r"gate-line-(\d+)", follow.inner_text()))
        if seen < 14:
            follow.locator("pre").filter(has_text=f"gate-line-{seen + 1}").wait_for(timeout=15_000)
    wait_status(tab, run, "succeeded")
    assert check_tab is not None, "no gate was seen running from its page"


def test_a_comment_on_a_diff_line_reaches_the_repair_prompt_and_the_next_decision_says_what_changed(
        open_tab, workers, make_pipeline, repo, django_user_model):
    user(django_user_model, "admin", superuser=True)
    pipeline = make_pipeline(name="browser-comment", stages=stage(human_gate=True, repair_allowance=1),
                             scenario={"stages": {"answer": {"implement": [ANSWER_STEP], "repair": [REWORKED]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="admin", source="test")
    tab = open_tab()
    log_in(tab, "admin")
    tab.goto(detail_path(run))
    wait_status(tab, run, "waiting_approval")
    decision = run.decisions.get(state="pending", kind="approval")
    # a click on the line "return 42" of app/core.py in the diff waiting for approval
    line = tab.locator('#approval .cp-diff span[data-cp-file="app/core.py"]').filter(has_text="return 42").first
    line.wait_for()
    number = int(line.get_attribute("data-cp-line"))
    line.click()
    tab.fill(".cp-line-comment textarea", "Say where 42 comes from,\nin a docstring.")
    tab.click(".cp-line-comment-add")
    assert tab.input_value("form.cp-action-request_changes textarea[name=comments]") == (
        f"app/core.py:{number}: Say where 42 comes from, in a docstring.")
    assert "cp-commented" in line.get_attribute("class")
    tab.fill("form.cp-action-request_changes textarea[name=note]", "See my comment on the diff.")
    submit(tab, "form.cp-action-request_changes input[type=submit]")
    assert messages(tab, "success")[0].startswith(f"Changes requested by admin on decision {decision.pk}")
    wait_until(lambda: run.decisions.filter(state="pending", kind="approval").exclude(pk=decision.pk).exists(),
               timeout=2 * WAIT_MS / 1000, what="a new decision after the repair")
    decision.refresh_from_db()
    assert decision.comments == [{"file": "app/core.py", "line": number,
                                  "text": "Say where 42 comes from, in a docstring."}]
    repair = Attempt.objects.get(run=run, operation="repair")
    prompt = (Path(settings.VAR_DIR) / repair.prompt_path).read_text()
    assert f"- app/core.py:{number}: Say where 42 comes from, in a docstring." in prompt
    assert re.search(rf">\s*{number}\| +return 42", prompt), prompt[-1500:]
    # the new decision's page: the earlier comment, said against the repair's files by git
    tab.goto(detail_path(run))
    wait_status(tab, run, "waiting_approval")
    earlier = tab.locator("#earlier-comments")
    assert f"app/core.py:{number}" in earlier.inner_text() and "the repair changed line" in earlier.inner_text()
    assert "Say where 42 comes from" in tab.inner_text(f"#decision-{decision.pk}")
    assert buttons(tab) >= {"approve", "request_changes"}
    screenshot(tab, "22-comment-addressed")
