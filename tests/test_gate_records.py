"""A gate is judged by its test runner's own record as well as its exit status (engine/test_reports,
engine/steps/gates.py): a stage whose new test ends pytest with 0 before the agreed test runs stops
``gate_failed`` with the check's failure ``runner_incomplete``, and the check page, ``run_status``
and the run's record say what pytest recorded. Real runs (the scripted implementer, the real
sandbox, real pytest), driven step by step.
"""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.urls import reverse

from engine import operations
from engine.models import Check

from .conftest import ANSWER_STEP
from .test_steps import drive

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = {"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**", "tests/**"],
         "gates": [{"name": "unit", "command": "python -m pytest -q"}], "repair_allowance": 0}
#: collected before tests/test_core.py, it ends pytest with status 0 before the agreed test runs
EXIT_FIRST = {"write": {"tests/test_aaa.py": "import os\n\n\ndef test_first():\n    os._exit(0)\n"}}


def status_text(run) -> str:
    out = io.StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    return out.getvalue()


def test_a_new_test_that_ends_pytest_with_0_fails_the_gate_from_the_runner_s_record(make_pipeline, repo, sent,
                                                                                    admin_client):
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [EXIT_FIRST]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    check = Check.objects.get(run=run, name="unit")
    assert check.exit_code == 0 and not check.passed and check.failure_kind == "runner_incomplete"
    assert check.tests["unfinished"] == 1 and "tests/test_core.py::test_answer" in check.tests["unreported_ids"]
    assert "runner_incomplete" in run.stop_message and "never finished" in run.stop_message
    log = (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert "[control panel] The gate failed (runner_incomplete)" in log
    record = (Path(settings.VAR_DIR) / check.tests["record_path"]).read_text()
    assert '"e":"start"' in record and '"e":"finish"' not in record
    page = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, check.pk])).content.decode()
    assert "pytest recorded 2 collected test(s)" in page and "never finished" in page and "?tests=1" in page
    raw = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, check.pk]) + "?tests=1")
    assert raw.status_code == 200 and b'"e":"collected"' in b"".join(raw.streaming_content)
    assert "FAIL (runner_incomplete: exit 0, not what its test runner recorded)" in status_text(run)
    shown = operations.run_status(run)["stages"][0]["checks"][0]["tests"]
    assert shown["unfinished"] == 1 and shown["record"] and "record_path" not in shown


def test_an_honest_stage_passes_with_the_counts_shown_and_an_exit_status_gate_says_so(make_pipeline, repo, sent,
                                                                                     admin_client):
    stage = {**STAGE, "gates": [{"name": "unit", "command": "python -m pytest -q"},
                                {"name": "lint", "command": "python -m compileall -q app"}]}
    pipeline = make_pipeline(stages=[stage], scenario={"stages": {"answer": {"implement": [ANSWER_STEP]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    unit = Check.objects.filter(run=run, name="unit").first()
    lint = Check.objects.filter(run=run, name="lint").first()
    assert unit.passed and unit.tests["counts"]["passed"] == 1 and unit.tests["finished"] == 1
    assert lint.passed and lint.tests is None
    page = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, unit.pk])).content.decode()
    assert "pytest recorded 1 collected test(s): 1 passed; 1 session(s), finished, status 0." in page
    page = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, lint.pk])).content.decode()
    assert "an exit-status gate" in page
