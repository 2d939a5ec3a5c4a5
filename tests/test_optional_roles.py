"""Roles a pipeline leaves out (issue 19): ``roles.reviewer: null`` runs no review step and
``roles.documenter: null`` no documentation step; a missing key is still an error; a run cannot be
given a profile for a role its pipeline leaves out; the run page says "not configured". And a
scripted attempt that only answers costs no process."""
import pytest
from django.urls import reverse

from engine import operations
from engine.models import Attempt, RunEvent
from engine.pipeline.format import PipelineFormatError

from .conftest import ANSWER_STEP, pipeline_definition
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

NO_REVIEW_NO_DOCS = {"implementer": "scripted", "reviewer": None, "documenter": None}


def test_a_role_written_as_null_is_left_out_and_a_missing_one_is_still_an_error():
    doc = pipeline_definition(roles=NO_REVIEW_NO_DOCS)
    assert doc["roles"] == NO_REVIEW_NO_DOCS
    with pytest.raises(PipelineFormatError) as missing:
        pipeline_definition(roles={"implementer": "scripted", "documenter": None})
    assert "roles.reviewer: is required" in str(missing.value) and "null for no review" in str(missing.value)
    with pytest.raises(PipelineFormatError) as wrong:
        pipeline_definition(roles={"implementer": "scripted", "reviewer": 5, "documenter": None})
    assert "roles.reviewer: must be a string, a list of strings or null (no review)" in str(wrong.value)
    for blank, said in (("", "roles.reviewer: is blank: name the profile that reviews"),
                        ("  ", "roles.reviewer: is blank: name the profile that reviews"),
                        ([], "roles.reviewer: is an empty list: name at least one profile")):
        with pytest.raises(PipelineFormatError) as empty:
            pipeline_definition(roles={"implementer": "scripted", "reviewer": blank, "documenter": None})
        assert said in str(empty.value) and "null for no review" in str(empty.value), str(empty.value)
    with pytest.raises(PipelineFormatError) as implementer:
        pipeline_definition(roles={"implementer": None, "reviewer": None, "documenter": None})
    assert "roles.implementer" in str(implementer.value)


@pytest.mark.pipeline
def test_without_reviewer_and_documenter_a_stage_goes_implement_verify_checkpoint(make_pipeline, repo, sent):
    pipeline = make_pipeline(roles=NO_REVIEW_NO_DOCS, reviews=False)
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert list(Attempt.objects.filter(run=run).values_list("operation", flat=True)) == ["implement"]
    kinds = list(RunEvent.objects.filter(run=run).order_by("pk").values_list("kind", flat=True))
    assert "review_skipped" in kinds and "docs_skipped" in kinds
    assert "review_passed" not in kinds and "documented" not in kinds
    ended = RunEvent.objects.get(run=run, kind="succeeded").message
    assert "no reviewer configured" in ended and "its review" not in ended, ended
    # implement, verify, checkpoint, finish: three hand-offs
    assert run.steps == 3, run.steps


@pytest.mark.pipeline
def test_without_reviewer_a_failed_gate_still_stops_the_stage(make_pipeline, repo, sent):
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"], "repair_allowance": 0,
               "gates": [{"name": "unit", "command": "python -m pytest -q"}]}]
    scenario = {"stages": {"answer": {"implement": [{"write": {"app/core.py": "def answer():\n    return 41\n"}}]}}}
    pipeline = make_pipeline(stages=stages, scenario=scenario, roles=NO_REVIEW_NO_DOCS, reviews=False)
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status != "succeeded" and run.stop_reason in ("gate_failed", "repair_allowance_exhausted"), \
        (run.status, run.stop_reason)
    assert not RunEvent.objects.filter(run=run, kind="review_skipped").exists()


@pytest.mark.pipeline
def test_only_the_documenter_left_out_still_reviews(make_pipeline, repo, sent):
    roles = {"implementer": "scripted", "reviewer": "scripted", "documenter": None}
    run = operations.create_run(make_pipeline(roles=roles), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert list(Attempt.objects.filter(run=run).order_by("pk").values_list("operation", flat=True)) == \
        ["implement", "review"]


def test_a_profile_for_a_role_the_pipeline_leaves_out_is_refused_and_nothing_is_created(make_pipeline, repo):
    pipeline = make_pipeline(roles=NO_REVIEW_NO_DOCS, reviews=False)
    with pytest.raises(operations.OperationError) as refused:
        operations.create_run(pipeline, str(repo), "main", {"reviewer": "scripted"})
    assert refused.value.code == "role_not_configured" and refused.value.field == "profile"
    assert "roles.reviewer: null" in refused.value.message
    assert not pipeline.runs.exists()


def test_the_run_page_says_a_left_out_role_is_not_configured(make_pipeline, repo, sent, admin_client):
    run = operations.create_run(make_pipeline(roles=NO_REVIEW_NO_DOCS, reviews=False), str(repo), "main")
    page = admin_client.get(reverse("admin:engine_run_detail", args=[run.pk])).content.decode()
    assert "reviewer: <i>not configured: no review step (only the gates decide)</i>" in page
    assert "documenter: <i>not configured: no documentation step</i>" in page
    assert "implementer: <code>scripted</code>" in page
    form = admin_client.get(reverse("admin:engine_pipeline_create_run", args=[run.pipeline_id])).content.decode()
    assert "not configured (roles.reviewer: null)" in form and "not configured (roles.documenter: null)" in form


@pytest.mark.pipeline
def test_a_scripted_step_that_only_answers_runs_no_process(make_pipeline, repo, sent):
    scenario = {"stages": {"answer": {"implement": [ANSWER_STEP],
                                      "review": [{"verdict": {"verdict": "pass", "findings": []},
                                                  "final_message": "fine sk-ant-api03-" + "A" * 40}]}}}
    roles = {"implementer": "scripted", "reviewer": "scripted", "documenter": None}
    run = operations.create_run(make_pipeline(scenario=scenario, roles=roles, reviews=False), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    implement, review = Attempt.objects.filter(run=run).order_by("pk")
    assert implement.pid is not None  # it writes files: a real sandboxed process
    assert review.pid is None and review.status == "succeeded" and review.verdict["verdict"] == "pass"
    assert review.elapsed_seconds < 1.0
    from engine.steps.paths import var_path
    log = var_path(review.log_path).read_text()
    assert "answered without a process" in log and "sk-ant-api03-AAAA" not in log and "[REDACTED]" in log
    assert "sk-ant-api03-AAAA" not in review.final_message
