"""Continue a run its budget stopped, with a raised budget (engine/runs_again.py ``continue_run``).

With the scripted test adapter: a two-stage run whose attempt budget runs out before the second stage
is continued; the new run carries the first stage over as passed (its commits kept), starts from its
checkpoint, does only the second stage, and ends. What may not be continued, or with what budget, is
refused with the field named, and nothing is created. (The four real CLIs stopped at a spend cap by
their model gateway and continued: tests/security/test_model_gateway_runs.py.)
"""
from __future__ import annotations

import pytest

from engine import operations
from engine.models import Run
from engine.operations import OperationError

from .conftest import ANSWER_STEP
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

SECOND = {"write": {"app/more.py": "MORE = 1\n"}, "usage": {"input_tokens": 10, "output_tokens": 5}}
STAGES = [{"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
           "gates": [{"name": "unit", "command": "true"}]},
          {"key": "more", "requirement": "Add app/more.py.", "scope": ["app/**"],
           "gates": [{"name": "unit", "command": "test -f app/more.py"}]}]


def stopped_run(make_pipeline, repo, sent) -> Run:
    pipeline = make_pipeline(name="two", stages=STAGES, reviews=False,
                             roles={"implementer": "scripted", "reviewer": None, "documenter": None},
                             scenario={"stages": {"answer": {"implement": [ANSWER_STEP]},
                                                  "more": {"implement": [SECOND]}}},
                             budgets={"max_attempts": 1, "max_tokens": 100000})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "waiting_review" and run.stop_reason == "budget_exhausted", run.stop_message
    return run


@pytest.mark.pipeline
def test_a_run_stopped_at_its_budget_continues_from_its_last_checkpoint(make_pipeline, repo, sent):
    run = stopped_run(make_pipeline, repo, sent)
    first = run.stages.get(key="answer")
    assert first.status == "passed" and first.checkpoint_commit
    later = operations.continue_run(run, {"max_attempts": 3, "max_tokens": 100000}, requested_by="ann",
                                    source="test")
    assert later.status == "queued" and later.rerun_of_id == run.pk and later.commit == first.checkpoint_commit
    assert later.carried["run"] == run.pk and later.carried["stage"] == "more" and later.carried["stages"] == ["answer"]
    assert later.carried["spent"]["tokens"] == 15  # the first run's spend counts against the raised caps
    carried = later.stages.get(key="answer")
    assert carried.status == "passed" and carried.checkpoint_commit == first.checkpoint_commit
    later = drive(later.pk, sent)
    assert later.status == "succeeded", later.stop_message
    assert [a.stage.key for a in later.attempts.all()] == ["more"]  # the passed stage was not done again
    run.refresh_from_db()
    assert run.status == "failed" and f"Continued as run {later.pk} with a raised budget" in run.stop_message
    assert run.reruns.get() == later
    assert later.events.filter(kind="continued").exists() and run.events.filter(kind="rerun").exists()


@pytest.mark.parametrize("budgets, code, says", [
    ({"max_attempts": 1, "max_tokens": 100000}, "budget_not_raised", "No cap of the budgets was raised"),
    ({"max_attempts": 5, "max_tokens": 10}, "budget_not_raised", "budgets.max_tokens would be lowered"),
    ({"max_tokens": 100000}, "budget_not_raised", "No cap of the budgets was raised"),  # the rest stays as it was
    ({"max_attempts": 0}, "invalid_budgets", "budgets.max_attempts"),
    ({"max_attempts": 5, "stage": {"max_tokenz": 1}}, "invalid_budgets", "budgets.stage.max_tokenz"),
    ("more please", "invalid_budgets", "budgets must be a mapping"),
])
@pytest.mark.pipeline
def test_a_budget_that_is_not_raised_is_refused_and_nothing_is_made(make_pipeline, repo, sent, budgets, code, says):
    run = stopped_run(make_pipeline, repo, sent)
    before = Run.objects.count()
    with pytest.raises(OperationError) as info:
        operations.continue_run(run, budgets)
    assert info.value.code == code and info.value.field == "budgets" and says in info.value.message, info.value.message
    run.refresh_from_db()
    assert Run.objects.count() == before and run.status == "waiting_review"


@pytest.mark.pipeline
def test_only_a_run_its_budget_stopped_is_continued_and_only_once(make_pipeline, repo, sent):
    run = stopped_run(make_pipeline, repo, sent)
    operations.continue_run(run, {"max_attempts": 3}, start=False)
    with pytest.raises(OperationError) as info:  # a second click: the run has failed, continued
        operations.continue_run(run, {"max_attempts": 3})
    assert info.value.code == "not_budget_stopped" and info.value.field == "run"
    assert Run.objects.filter(rerun_of=run).count() == 1


@pytest.mark.pipeline
def test_the_api_the_run_page_and_the_command_continue_a_run(make_pipeline, repo, sent, admin_client):
    from django.core.management import call_command
    from django.urls import reverse
    from rest_framework.test import APIClient

    # the API: a bad body names the field; a good one makes the new run (201, its record)
    run = stopped_run(make_pipeline, repo, sent)
    from django.contrib.auth import get_user_model

    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="admin"))
    answer = client.post(f"/api/runs/{run.pk}/continue/", {"budgets": {"max_attempts": 1, "max_tokens": 100000}},
                         format="json")
    assert answer.status_code == 400 and answer.json()["error"] == "budget_not_raised"
    assert answer.json()["field"] == "budgets"
    answer = client.post(f"/api/runs/{run.pk}/continue/", {"budgets": {"max_attempts": 4}, "start": False},
                         format="json")
    assert answer.status_code == 201 and answer.json()["status"] == "pending", answer.json()
    assert Run.objects.get(pk=answer.json()["id"]).rerun_of_id == run.pk
    # the run page: the action is offered with the run's budgets as YAML, and leads to the new run
    run = stopped_run(make_pipeline, repo, sent)
    page = admin_client.get(reverse("admin:engine_run_detail", args=[run.pk])).content.decode()
    assert "Continue with a raised budget" in page and "max_attempts: 1" in page
    answer = admin_client.post(reverse("admin:engine_run_action", args=[run.pk, "continue"]),
                               {"budgets": "max_attempts: 3\nmax_tokens: 100000", "start": "on", "seen": "0"})
    later = Run.objects.get(rerun_of=run)
    assert answer.status_code == 302 and answer.url.endswith(f"/{later.pk}/detail/") and later.status == "queued"
    # the command
    run = stopped_run(make_pipeline, repo, sent)
    call_command("continue_run", str(run.pk), "--budgets", "{max_attempts: 2}", "--no-start", "--by", "ops")
    assert Run.objects.get(rerun_of=run).status == "pending"


@pytest.mark.pipeline
def test_caps_not_given_stay_and_a_null_removes_one(make_pipeline, repo, sent):
    run = stopped_run(make_pipeline, repo, sent)
    later = operations.continue_run(run, {"max_attempts": 2}, start=False)
    assert later.definition["pipeline"]["budgets"]["max_tokens"] == 100000  # kept, not dropped
    run = stopped_run(make_pipeline, repo, sent)
    later = operations.continue_run(run, {"max_attempts": 2, "max_tokens": None}, start=False)
    assert later.definition["pipeline"]["budgets"]["max_tokens"] is None
