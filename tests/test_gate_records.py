"""A gate is judged by its test runner's own record as well as its exit status (engine/checks/test_reports,
engine/steps/gates.py): a stage whose new test ends pytest with 0 before the agreed test runs stops
``gate_failed`` with the check's failure ``runner_incomplete``, and the check page, ``run_status``
and the run's record say what pytest recorded. Real runs (the scripted implementer, the real
sandbox, real pytest), driven step by step.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.urls import reverse

from engine import operations
from engine.models import Check

from .conftest import ANSWER_STEP, PYTEST_ADDOPTS
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = {"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**", "tests/**"],
         "gates": [{"name": "unit", "command": "python -m pytest -q"}], "repair_allowance": 0}
#: the code under test ends pytest with status 0 when the agreed test imports it, before it runs
EXIT_FIRST = {"write": {"app/core.py": '"""Core."""\nimport os\n\nos._exit(0)\n'}}


def status_text(run) -> str:
    out = io.StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    return out.getvalue()


@pytest.mark.pipeline
def test_code_under_test_that_ends_pytest_with_0_fails_the_gate_from_the_runner_s_record(make_pipeline, repo, sent,
                                                                                        admin_client):
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [EXIT_FIRST]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    check = Check.objects.get(run=run, name="unit", kind="gate")
    assert check.exit_code == 0 and not check.passed and check.failure_kind == "runner_incomplete"
    assert check.tests["unfinished"] == 1 and check.tests["collected"] == 0  # it ended during collection
    assert "runner_incomplete" in run.stop_message and "never finished" in run.stop_message
    log = (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert "[control panel] The gate failed (runner_incomplete)" in log
    record = (Path(settings.VAR_DIR) / check.tests["record_path"]).read_text()
    assert '"e":"start"' in record and '"e":"finish"' not in record
    page = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, check.pk])).content.decode()
    assert "pytest recorded 0 collected test(s)" in page and "never finished" in page and "?tests=1" in page
    raw = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, check.pk]) + "?tests=1")
    assert raw.status_code == 200 and b'"e":"start"' in b"".join(raw.streaming_content)
    assert "FAIL (runner_incomplete: exit 0, not what its test runner recorded)" in status_text(run)
    checks = operations.run_status(run)["stages"][0]["checks"]
    assert [c["kind"] for c in checks] == ["gate"]
    shown = checks[0]["tests"]
    assert shown["unfinished"] == 1 and shown["record"] and "record_path" not in shown


@pytest.mark.pipeline
def test_an_honest_stage_passes_with_the_counts_shown_and_an_exit_status_gate_says_so(make_pipeline, repo, sent,
                                                                                     admin_client):
    stage = {**STAGE, "gates": [{"name": "unit", "command": "python -m pytest -q"},
                                {"name": "lint", "command": "python -m compileall -q app"}]}
    pipeline = make_pipeline(stages=[stage], scenario={"stages": {"answer": {"implement": [ANSWER_STEP]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    unit = Check.objects.filter(run=run, name="unit", kind="gate").first()
    lint = Check.objects.filter(run=run, name="lint", kind="gate").first()
    assert unit.passed and unit.tests["counts"]["passed"] == 1 and unit.tests["finished"] == 1
    assert lint.passed and lint.tests is None
    # the agreed test, collected at the starting commit (where it failed: answer() was not written), passed again
    ledger = run.stages.get().agreed_tests
    assert ledger["unit"]["ids"] == ["tests/test_core.py::test_answer"] and unit.tests["agreed"] == {
        "count": 1, "from": f"the starting commit {run.commit[:12]}", "missing": 0, "missing_ids": [], "how": {}}
    assert '"e":"collected"' in (Path(settings.VAR_DIR) / ledger["unit"]["record"]).read_text()
    assert "1 test collected" in (Path(settings.VAR_DIR) / ledger["unit"]["log"]).read_text()
    assert ledger["lint"] == {"ids": [], "from": "none: the gate's command names no pytest or python -m unittest",
                              "log": None, "record": None}
    assert [c.kind for c in Check.objects.filter(run=run).order_by("id")] == ["gate", "gate", "final", "final"]
    page = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, unit.pk])).content.decode()
    assert "pytest recorded 1 collected test(s): 1 passed; 1 session(s), finished, status 0." in page
    assert "All 1 agreed tests (from the starting commit" in page
    page = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, lint.pk])).content.decode()
    assert "an exit-status gate" in page


SKIPPING_CORE = ('"""Core."""\nimport pytest\n\n\ndef answer():\n    pytest.skip("later")\n')


@pytest.mark.pipeline
def test_code_under_test_that_skips_an_agreed_test_stops_with_its_id(make_pipeline, repo, sent):
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [
        {"write": {"app/core.py": SKIPPING_CORE}}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    check = Check.objects.get(run=run, name="unit", kind="gate")
    assert check.exit_code == 0 and check.failure_kind == "tests_missing"  # pytest itself exits 0: one skipped
    assert check.tests["agreed"]["how"] == {"tests/test_core.py::test_answer": "skipped"}
    assert "tests/test_core.py::test_answer (skipped)" in run.stop_message and "tests_missing" in run.stop_message
    shown = status_text(run)
    assert "FAIL (tests_missing: exit 0, not what its test runner recorded)" in shown
    assert "[pytest: 1 skipped; agreed 0 of 1 passed again]" in shown


@pytest.mark.pipeline
def test_a_test_that_skips_itself_at_the_starting_commit_too_is_not_held_against_the_stage(make_pipeline, repo, sent):
    """An optional dependency missing (``pytest.importorskip``) skips a test at run time, which collecting
    cannot tell: the gate runs once at the stage's starting commit, where it skipped too, so it is excused;
    the test the stage had to make pass is not (it failed there), nor one code under test makes skip."""
    from .conftest import git

    (Path(repo) / "tests" / "test_optional.py").write_text(
        "import pytest\n\n\ndef test_with_numpy_pandas():\n    pytest.importorskip('a_module_nobody_installed')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "an optional test")
    run = operations.create_run(make_pipeline(stages=[STAGE]), str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    check = Check.objects.filter(run=run, name="unit", kind="gate").order_by("-id").first()
    assert check.passed and check.tests["agreed"]["skipped_at_start"] == 1 and check.tests["agreed"]["missing"] == 0
    ledger = run.stages.get().agreed_tests["unit"]
    assert ledger["skipped_at_start"] == ["tests/test_optional.py::test_with_numpy_pandas"]
    assert "1 skipped" in (Path(settings.VAR_DIR) / ledger["skipped_log"]).read_text()
    final = Check.objects.get(run=run, name="unit", kind="final")
    assert final.passed and final.tests["agreed"]["skipped_at_start"] == 1


@pytest.mark.pipeline
def test_code_an_earlier_stage_wrote_that_skips_an_agreed_test_later_is_not_excused(make_pipeline, repo, sent):
    """A time bomb: stage 1's code passes its tests, and skips them from stage 2 on. The skip is judged
    against the run's starting commit (where the test ran), not stage 2's start (stage 1's checkpoint,
    whose code an agent wrote and where the test would skip too)."""
    bomb = ('"""Core."""\nimport os\n\nimport pytest\n\n\ndef answer():\n'
            '    if os.environ.get("CP_STAGE") == "second":\n        pytest.skip("later")\n    return 42\n')
    stages = [STAGE, {**STAGE, "key": "second", "requirement": "Add a docstring.", "depends_on": ["answer"]}]
    pipeline = make_pipeline(stages=stages, scenario={"stages": {
        "answer": {"implement": [{"write": {"app/core.py": bomb}}]},
        "second": {"implement": [{"write": {"app/notes.py": '"""Notes."""\n'}}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    check = Check.objects.filter(run=run, name="unit", kind="gate", stage__key="second").order_by("-id").first()
    assert check.failure_kind == "tests_missing" and check.tests["agreed"]["how"] == {
        "tests/test_core.py::test_answer": "skipped"}
    assert run.stages.get(key="second").agreed_tests["unit"]["skipped_at_start"] == []


@pytest.mark.pipeline
def test_a_test_an_earlier_stage_made_pass_is_agreed_for_the_next_stage(make_pipeline, repo, sent):
    core = '"""Core."""\n\n\ndef answer():\n    return 42\n\n\ndef bonus():\n    return 43\n'
    more = "from app import core\n\n\ndef test_bonus():\n    assert core.bonus() == 43\n"
    skipping = core.replace("    return 43\n", "    import pytest\n    pytest.skip('later')\n")
    stages = [{**STAGE, "key": "one"}, {**STAGE, "key": "two", "requirement": "Keep bonus()."}]
    pipeline = make_pipeline(stages=stages, scenario={"stages": {
        "one": {"implement": [{"write": {"app/core.py": core, "tests/test_more.py": more}}]},
        "two": {"implement": [{"write": {"app/core.py": skipping}}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    ledger = run.stages.get(key="two").agreed_tests["unit"]
    assert ledger["ids"] == ["tests/test_core.py::test_answer", "tests/test_more.py::test_bonus"]
    assert ledger["from"] == "stage 'one'"  # the first stage's ledger and what passed at its accepted check
    # nothing collected again: the evidence is still stage one's collection at the run's commit
    assert ledger["log"] == run.stages.get(key="one").agreed_tests["unit"]["log"]
    check = Check.objects.filter(run=run, name="unit", kind="gate", stage__key="two").last()
    assert check.failure_kind == "tests_missing" and check.tests["agreed"]["missing_ids"] == [
        "tests/test_more.py::test_bonus"]


@pytest.mark.pipeline
def test_the_reviewer_is_told_the_tests_added_and_the_lines_that_change_how_tests_run(make_pipeline, repo, sent):
    more = ("import atexit\n\nimport pytest\n\nfrom app import core\n\natexit.register(print, 'bye')\n\n\n"
            "def test_more():\n    assert core.answer() == 42\n\n\n@pytest.mark.skip(reason='later')\n"
            "def test_later():\n    assert core.answer() == 43\n")
    step = {**ANSWER_STEP, "write": {**ANSWER_STEP["write"], "tests/test_more.py": more}}
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [step]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    review = run.attempts.get(operation="review")
    prompt = (Path(settings.VAR_DIR) / review.prompt_path).read_text()
    # the agreed test ran apart from the new one: two checks of the gate, each with its part
    assert "-> exit 0 (passed); pytest recorded 1 passed; all 1 agreed tests passed again" in prompt
    parts = [c.tests["apart"] for c in Check.objects.filter(run=run, name="unit", kind="gate").order_by("id")]
    assert parts == ["only", "except"]
    assert "## Tests the patch adds (passed, not among the agreed tests)\n- tests/test_more.py::test_more" in prompt
    assert "## Changes how tests run" in prompt and "tests/test_more.py:7: atexit.register(print, 'bye')" in prompt
    # a test it adds and skips is named as one that proves nothing
    assert "## Tests not among the agreed tests that did not pass" in prompt
    assert "- tests/test_more.py::test_later (skipped)" in prompt


@pytest.mark.pipeline
def test_a_new_test_module_that_patches_what_the_agreed_test_calls_fails_when_they_run_apart(make_pipeline, repo,
                                                                                            sent):
    patching = "from app import core\n\ncore.answer = lambda: 42\n\n\ndef test_setup():\n    pass\n"
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [
        {"write": {"tests/test_aaa_setup.py": patching}}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    check = Check.objects.get(run=run, name="unit", kind="gate")  # the agreed part failed: the new part never ran
    assert check.exit_code == 1 and check.tests["apart"] == "only"
    assert check.tests["failed_ids"] == ["tests/test_core.py::test_answer"]
    # in one process, the patch would have made it pass
    log = (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert "test_aaa_setup" not in log


@pytest.mark.pipeline
def test_deleting_an_agreed_test_module_stops_naming_its_tests(make_pipeline, repo, sent):
    pipeline = make_pipeline(stages=[STAGE], protected_paths=["tests/test_*.py"], scenario={"stages": {"answer": {
        "implement": [{**ANSWER_STEP, "delete": ["tests/test_core.py"]}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "protected_files_changed"), run.stop_message
    assert "tests/test_core.py deleted (its tests: tests/test_core.py::test_answer)" in run.stop_message
    assert run.stop_evidence["changes"][0]["tests"] == ["tests/test_core.py::test_answer"]


@pytest.mark.parametrize("files", [
    {"pytest.ini": f"[pytest]\naddopts = {PYTEST_ADDOPTS} --deselect tests/test_core.py::test_answer\n"},
    {"pytest.ini": f"[pytest]\naddopts = {PYTEST_ADDOPTS} -k 'not answer'\n"},
    {"tests/conftest.py": "collect_ignore = ['test_core.py']\n"},
    {"conftest.py": "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n    for item in items:\n"
                    "        item.add_marker(pytest.mark.skip(reason='later'))\n"},
], ids=["deselect", "keyword", "collect-ignore", "skip-marks"])
@pytest.mark.pipeline
def test_a_runner_configuration_that_deselects_an_agreed_test_stops_naming_it(make_pipeline, repo, sent, files):
    """The change is refused as tampering before any gate runs (a configuration the agent wrote decides
    nothing); the stop names the agreed test it took away, from pytest's --collect-only on a checkout of
    the agent's files."""
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [{"write": files}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "protected_files_changed"), run.stop_message
    said = "would no longer run these agreed tests: gate 'unit': tests/test_core.py::test_answer."
    assert "the test runner (listing its tests, running none, on a checkout of them)" in run.stop_message
    if said not in run.stop_message:
        pytest.fail(f"the stop does not name the agreed test: {run.stop_message}", pytrace=False)
    dropped = run.stop_evidence["dropped"]["unit"]
    assert dropped["count"] == 1 and dropped["ids"] == ["tests/test_core.py::test_answer"]
    log = (Path(settings.VAR_DIR) / dropped["log"]).read_text()  # the collection's own log, kept: its summary line
    assert re.search(r"(collected|selected).* in [0-9.]+s\n", log), log
    assert not Check.objects.filter(run=run).exists()  # no gate ran on the refused files
    assert run.stages.get().agreed_tests["unit"]["ids"] == ["tests/test_core.py::test_answer"]


@pytest.mark.parametrize("files, exit_code, kind, apart", [
    # a new test module that ends pytest with 0 at collection, in a test's body, from a fixture: the agreed
    # test runs apart from it (only its own file) and fails on the unwritten answer()
    ({"tests/test_aaa_setup.py": "import os\nos._exit(0)\n"}, 1, "nonzero_exit", "only"),
    ({"tests/test_aaa.py": "import os\n\n\ndef test_first():\n    os._exit(0)\n"}, 1, "nonzero_exit", "only"),
    ({"tests/test_aaa.py": "import sys\n\nimport pytest\n\n\n@pytest.fixture(autouse=True)\ndef stop():\n"
                           "    sys.exit(0)\n\n\ndef test_first():\n    pass\n"}, 1, "nonzero_exit", "only"),
    # the code under test: a wrong answer() and an atexit handler that turns pytest's status 1 into 0
    ({"app/core.py": '"""Core."""\nimport atexit\nimport os\n\natexit.register(os._exit, 0)\n\n\n'
                     "def answer():\n    return 0\n"}, 0, "tests_failed", None),
], ids=["exit-at-collection", "exit-in-test-body", "sys-exit-from-fixture", "atexit-rewrite"])
@pytest.mark.pipeline
def test_each_way_to_end_pytest_early_stops_the_run(make_pipeline, repo, sent, files, exit_code, kind, apart):
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [{"write": files}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "gate_failed"), run.stop_message
    check = Check.objects.get(run=run, name="unit", kind="gate")
    seen = (check.exit_code, check.failure_kind, (check.tests or {}).get("apart"))
    if seen != (exit_code, kind, apart):
        pytest.fail(f"the gate's check: {seen}, expected {(exit_code, kind, apart)}; {check.tests}", pytrace=False)
    assert "tests/test_core.py::test_answer" in (check.tests["failed_ids"] + check.tests["agreed"]["missing_ids"])


@pytest.mark.pipeline
def test_new_test_data_and_helpers_are_welcome_and_protected_from_the_next_stage_on(make_pipeline, repo, sent):
    """protected_paths [tests/**]: stage one adds tests/data/cases.json and tests/helpers.py with the new test
    that uses them, and succeeds; stage two changes that data file and stops, naming it."""
    test = ("import json, pathlib\n\nfrom helpers import same\n\nfrom app import core\n\n\ndef test_cases():\n"
            "    for want in json.loads((pathlib.Path(__file__).parent / 'data' / 'cases.json').read_text()):\n"
            "        same(core.answer(), want)\n")
    one = {**ANSWER_STEP, "write": {**ANSWER_STEP["write"], "tests/data/cases.json": "[42]\n",
                                    "tests/helpers.py": "def same(a, b):\n    assert a == b, (a, b)\n",
                                    "tests/test_cases.py": test}}
    two = {"write": {"tests/data/cases.json": "[]\n"}}
    stages = [{**STAGE, "key": "one"}, {**STAGE, "key": "two", "requirement": "Keep answer()."}]
    pipeline = make_pipeline(stages=stages, protected_paths=["tests/**"], scenario={"stages": {
        "one": {"implement": [one]}, "two": {"implement": [two]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    first = run.stages.get(key="one")
    assert first.status == "passed", run.stop_message
    assert (run.status, run.stop_reason) == ("waiting_review", "protected_files_changed"), run.stop_message
    assert run.stages.get(key="two").status != "passed"
    assert "tests/data/cases.json modified" in run.stop_message
    # the new test joined the agreed tests of stage two; the changed data would have emptied it
    assert "tests/test_cases.py::test_cases" in run.stages.get(key="two").agreed_tests["unit"]["ids"]


UT_REPO = {"app/__init__.py": "", "app/core.py": '"""Core."""\n', "tests/__init__.py": "",
           "tests/test_core.py": "import unittest\n\nfrom app import core\n\n\nclass TestCore(unittest.TestCase):\n"
                                 "    def test_answer(self):\n        self.assertEqual(core.answer(), 42)\n",
           "docs/PLAN.md": "# Plan\nOne stage: answer.\n", "docs/INDEX.md": "# Index\n- docs/PLAN.md\n"}
UT_STAGE = {**STAGE, "gates": [{"name": "unit", "command": "python -m unittest discover -s tests -t ."}]}


@pytest.mark.parametrize("write, status, kind", [
    (ANSWER_STEP["write"], "succeeded", ""),
    ({"app/core.py": '"""Core."""\nimport os\n\nos._exit(0)\n'}, "waiting_review", "runner_incomplete"),
    ({"app/core.py": '"""Core."""\nimport unittest\n\n\ndef answer():\n    raise unittest.SkipTest("later")\n'},
     "waiting_review", "tests_missing"),
], ids=["honest", "exit-at-import", "skip-from-code"])
@pytest.mark.pipeline
def test_a_python_m_unittest_gate_is_judged_by_unittest_s_own_record(make_pipeline, tmp_path, sent, write, status,
                                                                      kind):
    from .conftest import make_repo

    origin = make_repo(tmp_path / "origin", UT_REPO)
    pipeline = make_pipeline(stages=[UT_STAGE], scenario={"stages": {"answer": {"implement": [{"write": write}]}}})
    run = operations.create_run(pipeline, str(origin), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert run.status == status, run.stop_message
    ledger = run.stages.get().agreed_tests["unit"]
    assert ledger["ids"] == ["tests/test_core.py::TestCore::test_answer"], ledger  # collected at the start, run none
    check = Check.objects.filter(run=run, name="unit", kind="gate").first()
    assert check.exit_code == 0 and check.failure_kind == kind and check.tests["runner"] == "unittest", check.tests
    if status == "succeeded":
        assert check.tests["agreed"]["missing"] == 0 and check.tests["counts"]["passed"] == 1
        assert "[unittest: 1 passed; agreed 1 of 1 passed again]" in status_text(run)
