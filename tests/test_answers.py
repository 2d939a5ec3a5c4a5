"""Answers computed once (engine/answers.py): the page, the API, run_status and the profile list
agree because they ask the same function. Factory-built rows: no git, no process."""
from __future__ import annotations

import pytest
from django.utils import timezone

from controlpanel import views
from engine import answers, operations
from engine.models import Attempt, Decision, Manifest, Profile


def test_a_claude_profile_against_a_scripted_endpoint_is_simulated_everywhere(db):
    profile = Profile(name="c", adapter="claude-code", settings={"adapter": "claude-code",
                                                                  "scripted_endpoint": "endpoint.yaml"})
    assert profile.simulated is True
    assert answers.simulation("claude-code", profile.settings) == "scripted model endpoint"
    assert answers.simulation("scripted") == "scripted test adapter"
    assert answers.simulation("codex", {"adapter": "codex"}) == ""
    assert answers.run_simulation({"a": {"adapter": "scripted"}, "b": {"adapter": "codex", "scripted_endpoint": "e"},
                                   "c": {"adapter": "codex"}}, {"a", "b", "c"}) == \
        "scripted model endpoint, scripted test adapter"


def test_the_current_stage_is_the_first_that_has_not_passed(run_row):
    run = run_row(status="running", stage_statuses=("passed", "running", "pending"))
    assert answers.current_stage(run).order == 1
    assert operations.run_status(run)["current_stage"] == answers.current_stage(run).key
    done = run_row(status="succeeded", stage_statuses=("passed",))
    assert answers.current_stage(done) is None
    assert operations.run_status(done)["current_stage"] is None


@pytest.mark.parametrize("status, applies", [
    ("pending", {"start", "fail"}),
    ("queued", {"fail"}),
    ("running", {"fail"}),
    ("waiting_review", {"recheck", "recover", "fail"}),
    ("waiting_approval", {"approve", "request_changes", "recheck", "fail"}),
    ("succeeded", {"rerun"}),
    ("failed", {"rerun"}),
])
def test_every_action_says_whether_it_applies_and_why_not(run_row, status, applies):
    run = run_row(status=status, stage_statuses=("running",))
    stage = run.stages.get()
    if status in ("waiting_review", "waiting_approval"):  # the stage produced a result: Recheck applies
        manifest = Manifest.objects.create(run=run, stage=stage, digest="b" * 40, base_commit="0" * 40,
                                           path="m.json", sha256="0" * 64)
        Attempt.objects.create(run=run, stage=stage, operation="implement", number=1, role="implementer",
                               profile_name="scripted", adapter="scripted", deadline_seconds=60,
                               status="succeeded", start_manifest="a" * 40, result_manifest=manifest)
    if status == "waiting_review":
        Decision.objects.create(run=run, stage=stage, kind=Decision.Kind.REVIEW, reason="gate_failed")
    if status == "waiting_approval":
        Decision.objects.create(run=run, stage=stage, kind=Decision.Kind.APPROVAL, reason="human_gate",
                                artifact="a" * 64)
    found = answers.actions(run)
    assert list(found) == list(answers.ACTION_NAMES)
    assert {name for name, action in found.items() if action.applies} == applies
    for name, action in found.items():
        assert bool(action.why) != action.applies, (name, action)
    # the page, the API and run_status show exactly these
    decisions = list(run.decisions.order_by("id"))
    assert set(views.applicable_actions(run, decisions)) == applies
    record = operations.run_status(run)
    assert {a["action"] for a in record["actions"] if a["applies"]} == applies
    assert record["waiting_for"] == answers.waiting_for(run)
    assert (record["waiting_sentence"] or "") == answers.waiting_sentence(run)


def test_an_approval_without_a_pending_decision_says_so(run_row):
    run = run_row(status="waiting_approval", stage_statuses=("waiting_approval",))
    assert answers.actions(run)["approve"].why == "no approval decision is pending"
    assert answers.actions(run)["approve"].applies is False


def test_an_exhausted_budget_stops_recover_and_recheck_with_the_reason(run_row):
    run = run_row(status="waiting_review", stage_statuses=("waiting_review",),
                  pipeline_kwargs={"budgets": {"max_attempts": 1}})
    stage = run.stages.get()
    Attempt.objects.create(run=run, stage=stage, operation="implement", number=1, role="implementer",
                           profile_name="scripted", adapter="scripted", deadline_seconds=60)
    Decision.objects.create(run=run, stage=stage, kind=Decision.Kind.REVIEW, reason="budget_exhausted")
    found = answers.actions(run)
    assert not found["recover"].applies and "budget is exhausted" in found["recover"].why
    assert not found["recheck"].applies and "max_attempts" in found["recheck"].why
    assert found["fail"].applies


def test_totals_sum_usage_cost_and_time_once_for_every_view(run_row):
    run = run_row(status="running", stage_statuses=("running",))
    run.started_at = timezone.now() - timezone.timedelta(seconds=30)
    run.active_seconds = 12.5
    run.save()
    stage = run.stages.get()
    for number, usage in enumerate([{"input_tokens": 100, "output_tokens": 7, "cost_usd": 0.25},
                                    {"input_tokens": 5, "cost_usd": 0.5}, None], start=1):
        Attempt.objects.create(run=run, stage=stage, operation="implement", number=number, role="implementer",
                               profile_name="scripted", adapter="scripted", deadline_seconds=60, usage=usage)
    found = answers.totals(run)
    assert found["input_tokens"] == 105 and found["output_tokens"] == 7 and found["cached_tokens"] is None
    # a simulated run's cost is never money: kept apart as simulated (the scripted adapter's own numbers)
    assert run.simulated and found["cost_usd"] is None and found["simulated_cost_usd"] == pytest.approx(0.75)
    assert found["attempts"] == 3 and found["active_seconds"] == 12.5
    assert 29 <= found["elapsed_seconds"] < 120
    assert operations.run_status(run)["totals"]["simulated_cost_usd"] == pytest.approx(0.75)
    assert views.build_page(run)["usage"]["input_tokens"] == "105"


def test_the_totals_line_of_the_commands_says_what_was_not_reported():
    line = answers.totals_sentence({"input_tokens": 1234, "output_tokens": None, "cached_tokens": None,
                                    "cost_usd": None, "attempts": 2, "active_seconds": 3.4, "elapsed_seconds": 9.6})
    assert line == ("2 agent attempt(s), 1,234 input / unreported output tokens, cost unknown, active 3 s, "
                    "elapsed 10 s")
    line = answers.totals_sentence({"input_tokens": 5, "output_tokens": 1, "cached_tokens": None, "cost_usd": None,
                                    "simulated_cost_usd": 0.75, "attempts": 1, "active_seconds": 1, "elapsed_seconds": 1})
    assert "cost $0.7500 simulated (not money)" in line
