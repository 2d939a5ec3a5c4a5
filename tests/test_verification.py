"""Verification: protected checks, the independent review, bounded repair and budgets.

Runs are driven step by step in this process (``drive``), with real git worktrees, real gate
commands and the scripted test adapter's real child processes for controlled behaviour.
"""
import hashlib
import json
import os
import shlex
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.checks import protected
from engine.models import Attempt, Check

from .conftest import ANSWER_STEP, PYTEST_INI, git, make_repo
from .support.runs import PASS, QUICK_GATE, drive, gated_run, operations_of, run_with, stage, var

pytestmark = pytest.mark.django_db(transaction=True)

WRONG = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 41\n'}}
WRONG_40 = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 40\n'}}
WRONG_39 = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 39\n'}}


def brief(changes: list[dict]) -> list[dict]:
    """The changes of a tamper report without their hashes and the tests a changed test module held
    (tests/test_gate_records.py checks those)."""
    return [{k: v for k, v in c.items() if not k.startswith("sha256") and k != "tests"} for c in changes]


# ----------------------------------------------------------------------------- protected checks


PROTECT = {"protected_paths": ["tests/**", "pytest.ini"]}


@pytest.mark.parametrize("how, change", [
    ({"write": {**ANSWER_STEP["write"], "tests/test_core.py": "def test_answer():\n    assert True\n"}},
     {"path": "tests/test_core.py", "change": "modified", "old_mode": "100644", "new_mode": "100644"}),
    ({**ANSWER_STEP, "delete": ["tests/test_core.py"]},
     {"path": "tests/test_core.py", "change": "deleted", "old_mode": "100644"}),
    ({**ANSWER_STEP, "run": ["mv", "tests/test_core.py", "tests/test_renamed.py"]},
     {"path": "tests/test_core.py", "change": "renamed", "to": "tests/test_renamed.py", "old_mode": "100644",
      "new_mode": "100644"}),
    ({**ANSWER_STEP, "run": ["chmod", "+x", "tests/test_core.py"]},
     {"path": "tests/test_core.py", "change": "mode_changed", "old_mode": "100644", "new_mode": "100755"}),
], ids=["edited", "deleted", "renamed", "chmodded"])
def test_a_weakened_protected_test_stops_the_run_with_the_diff(make_pipeline, repo, sent, how, change):
    run = run_with(make_pipeline, repo, sent, {"implement": [how]}, **PROTECT)
    assert (run.status, run.stop_reason) == ("waiting_review", "protected_files_changed"), run.stop_message
    assert brief(run.stop_evidence["changes"]) == [change]
    # the report gives both hashes: of the protected copy, and of what the worktree holds now
    original = git(repo, "show", "main:tests/test_core.py").encode()
    [found] = run.stop_evidence["changes"]
    assert found["sha256_before"] == hashlib.sha256(original).hexdigest()
    now = Path(run.worktree, change.get("to", change["path"]))
    assert found["sha256_after"] == (None if change["change"] == "deleted"
                                     else hashlib.sha256(now.read_bytes()).hexdigest())
    [item] = json.loads(var(run.stop_evidence["files"]).read_text())
    assert item["sha256_before"] == found["sha256_before"] and "diff" in item
    assert "tests/test_core.py" in run.stop_message
    report = var(run.stop_evidence["report"]).read_text()
    assert "tests/test_core.py" in report
    if change["change"] == "modified":
        assert "-    assert core.answer() == 42" in report and "+    assert True" in report
    assert not Check.objects.filter(run=run).exists()  # a weakened check never runs
    assert not run.stages.get().checkpoint_commit
    # the protected copy in the control records is the original, byte for byte
    copy = var(f"{run.control_dir}/protected/files/tests/test_core.py")
    assert copy.read_bytes() == git(repo, "show", "main:tests/test_core.py").encode()


def test_an_agent_may_add_a_new_test_file(make_pipeline, repo, sent):
    step = {"write": {**ANSWER_STEP["write"], "tests/test_more.py": "from app import core\n\n\n"
                                                                   "def test_more():\n    assert core.answer() > 0\n"}}
    run = run_with(make_pipeline, repo, sent, {"implement": [step]}, **PROTECT)
    assert run.status == "succeeded", run.stop_message
    assert "tests/test_more.py" in git(repo, "show", "--name-only", "--format=", run.branch)
    # once accepted, the new test is protected for the rest of the run (a later stage cannot weaken it)
    whys = {p["path"]: p["why"] for p in run.protected_files}
    assert set(whys) == {"tests/test_core.py", "pytest.ini", "tests/test_more.py"}
    assert whys["tests/test_more.py"].startswith("added by stage 'answer', accepted at checkpoint ")


def test_the_files_a_gate_names_are_protected_even_without_protected_paths(make_pipeline, repo, sent):
    stages = stage(gates=[{"name": "core", "command": "python -m pytest -q tests/test_core.py"}])
    step = {"write": {**ANSWER_STEP["write"], "tests/test_core.py": "def test_answer():\n    pass\n"}}
    run = run_with(make_pipeline, repo, sent, {"implement": [step]}, stages=stages)
    assert run.stop_reason == "protected_files_changed"
    assert {p["path"]: p["why"] for p in run.protected_files} == {
        "tests/test_core.py": "named by the gate command `python -m pytest -q tests/test_core.py`",
        "pytest.ini": "read by `pytest` in the gate command `python -m pytest -q tests/test_core.py`"}


C22_MAKEFILE = "test:\n\tpython -m pytest -q tests\n"


def test_c22_narrowing_the_makefile_and_adding_a_skipping_conftest_is_not_accepted(make_pipeline, sent, tmp_path):
    repo = make_repo(tmp_path / "c22", {
        "Makefile": C22_MAKEFILE, "pytest.ini": PYTEST_INI,
        "app/__init__.py": "", "app/core.py": "def answer():\n    return 41\n",
        "tests/test_a.py": "def test_a():\n    assert True\n",
        "tests/test_b.py": "from app import core\n\n\ndef test_b():\n    assert core.answer() == 42\n",
        "docs/PLAN.md": "plan\n"})
    narrowed = {"write": {"Makefile": "test:\n\tpython -m pytest -q tests/test_a.py\n",
                          "tests/conftest.py": "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
                                               "    for item in items:\n"
                                               "        item.add_marker(pytest.mark.skip('weakened'))\n"}}
    stages = [{"key": "answer", "requirement": "Make the tests pass.", "scope": ["**"],
               "gates": [{"name": "make-test", "command": "make test"}]}]
    pipeline = make_pipeline(stages=stages, scenario={"stages": {"answer": {"implement": [narrowed]}}},
                             protected_paths=["tests/**", "Makefile", "pytest.ini", "conftest.py"])
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "waiting_review" and run.stop_reason == "protected_files_changed"
    assert brief(run.stop_evidence["changes"]) == [
        {"path": "Makefile", "change": "modified", "old_mode": "100644", "new_mode": "100644"},
        {"path": "tests/conftest.py", "change": "added", "new_mode": "100644", "why": "a test runner loads it by itself"}]
    assert not run.stages.get().checkpoint_commit
    assert git(repo, "rev-list", "--count", f"{run.commit}..{run.branch}").strip() == "0"
    # the narrowed gate would have passed: that is exactly why it must not be trusted
    report = var(run.stop_evidence["report"]).read_text()
    assert "+\tpython -m pytest -q tests/test_a.py" in report and "item.add_marker" in report


def test_compare_unit_cases():
    snap = [{"path": "tests/test_a.py", "mode": "100644", "blob": "a" * 40},
            {"path": "pytest.ini", "mode": "100644", "blob": "b" * 40}]
    same = [{"path": "tests/test_a.py", "mode": "100644", "blob": "a" * 40},
            {"path": "pytest.ini", "mode": "100644", "blob": "b" * 40}]
    globs = ["tests/**", "pytest.ini"]
    assert protected.compare(snap, globs, same) == []
    assert protected.compare(snap, globs, same + [{"path": "tests/test_new.py", "mode": "100644",
                                                   "blob": "c" * 40}]) == []
    assert protected.compare(snap, globs, same + [{"path": "tests/helpers/conftest.py", "mode": "100644",
                                                   "blob": "c" * 40}], gates=True) == [
        {"path": "tests/helpers/conftest.py", "change": "added", "new_mode": "100644",
         "why": "a test runner loads it by itself"}]
    # a new data file or helper under a protected pattern is an honest addition (protected from the next stage on)
    assert protected.compare(snap, globs, same + [{"path": "tests/data/cases.json", "mode": "100644", "blob": "e" * 40},
                                                  {"path": "tests/helpers.py", "mode": "100644", "blob": "f" * 40}],
                             gates=True) == []
    # a file that was already there at the stage's start is not "added" again
    assert protected.compare(snap, globs, same + [{"path": "tests/util.py", "mode": "100644", "blob": "d" * 40}],
                             base_entries={"tests/util.py"}) == []


# ----------------------------------------------------------------------------- review


def test_a_pass_never_overrides_a_failed_gate(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [WRONG], "review": [PASS]},
                   stages=stage(repair_allowance=0))
    assert run.stop_reason == "gate_failed"
    assert "review" not in operations_of(run)  # the reviewer's pass was never asked for, never counted
    assert not run.stages.get().checkpoint_commit


@pytest.mark.parametrize("answer, problem", [
    ({"final_message": 'Looks fine.\n```json\n{"verdict": "pass", "findings": [\n```'}, "not valid JSON"),
    ({"final_message": "I approve of this change."}, "no JSON object"),
    ({"verdict": {"verdict": "maybe", "findings": []}}, "'maybe' is not one of"),
    ({"verdict": {"verdict": "repair", "findings": []}}, "findings"),
    ({"verdict": {"verdict": "pass", "findings": [{"severity": "high", "text": "x"}]}}, "findings/0/severity"),
], ids=["cut-json", "prose", "unknown-verdict", "repair-without-findings", "bad-severity"])
def test_an_invalid_review_stops_the_run(make_pipeline, repo, sent, answer, problem):
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [answer]})
    assert (run.status, run.stop_reason) == ("waiting_review", "invalid_review"), run.stop_message
    review = Attempt.objects.get(run=run, operation="review")
    assert problem in review.verdict_problem and problem in run.stop_message
    assert review.verdict is None and not run.stages.get().checkpoint_commit


def test_an_escalation_waits_for_a_person_with_its_findings(make_pipeline, repo, sent):
    finding = {"file": "app/core.py", "line": 4, "severity": "major",
               "text": "The requirement does not say what answer() returns for negative input."}
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP],
                                               "review": [{"verdict": {"verdict": "escalate", "findings": [finding]}}]})
    assert (run.status, run.stop_reason) == ("waiting_review", "review_escalated")
    assert run.stop_evidence["findings"] == [finding]
    assert "app/core.py:4" in run.stop_message and "negative input" in run.stop_message
    assert run.decisions.get(state="pending").reason == "review_escalated"
    data = operations.run_status(run)
    assert data["pending_decision"] is not None


def test_an_unavailable_reviewer_stops_the_run(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [{"exit": 2}]})
    assert run.stop_reason == "reviewer_unavailable" and "crashed" in run.stop_message


def test_a_reviewer_cannot_write_the_worktree(make_pipeline, repo, sent):
    """The reviewer's sandbox binds the worktree read-only: its write fails, nothing of it reaches
    the files, and a reviewer that fails gives no verdict (the run stops for a person)."""
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP],
                                               "review": [{**PASS, "write": {"app/extra.py": "x = 1\n"}}]})
    assert run.stop_reason == "reviewer_unavailable", run.stop_message
    assert not Path(run.worktree, "app", "extra.py").exists()
    review = Attempt.objects.get(run=run, operation="review")
    assert "Read-only file system" in var(review.log_path).read_text()


def test_a_reviewers_repair_finds_its_way_into_a_repair_session(make_pipeline, repo, sent):
    finding = {"file": "app/core.py", "line": 5, "severity": "minor", "text": "Add a docstring to answer()."}
    fixed = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    """The answer."""\n    return 42\n'}}
    run = run_with(make_pipeline, repo, sent, {
        "implement": [ANSWER_STEP], "repair": [fixed],
        "review": [{"verdict": {"verdict": "repair", "findings": [finding]}}, PASS]})
    assert run.status == "succeeded", run.stop_message
    assert operations_of(run) == ["implement", "review", "repair", "review", "document"]
    repair = Attempt.objects.get(run=run, operation="repair")
    prompt = var(repair.prompt_path).read_text()
    assert "Add a docstring to answer()." in prompt and "Repair 1 of 2" in prompt
    assert "return 42" in prompt  # the current patch
    assert '"""The answer."""' in git(repo, "show", f"{run.branch}:app/core.py")


def test_several_reviewers_must_all_pass(make_pipeline, repo, sent):
    scenario_second = {"stages": {"answer": {"review": [{"verdict": {"verdict": "escalate", "findings": [
        {"severity": "critical", "file": None, "line": None, "text": "second reviewer disagrees"}]}}]}}}
    pipeline = make_pipeline(
        stages=stage(), scenario={"stages": {"answer": {"implement": [ANSWER_STEP], "review": [PASS]}}},
        roles={"implementer": "scripted", "reviewer": ["scripted", "second"], "documenter": "scripted"},
        profiles={"scripted": {"adapter": "scripted", "scenario": {"stages": {"answer": {
            "implement": [ANSWER_STEP], "review": [PASS]}}}},
                  "second": {"adapter": "scripted", "scenario": scenario_second}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.stop_reason == "review_escalated" and "second reviewer disagrees" in run.stop_message
    assert [(a.operation, a.profile_name) for a in Attempt.objects.filter(run=run)] == [
        ("implement", "scripted"), ("review", "scripted"), ("review", "second")]


# ----------------------------------------------------------------------------- repair


def test_fail_then_fix_continues_from_verification(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [WRONG], "repair": [ANSWER_STEP], "review": [PASS]})
    assert run.status == "succeeded", run.stop_message
    assert operations_of(run) == ["implement", "repair", "review", "document"]  # never implemented twice
    checks = list(Check.objects.filter(run=run).order_by("id"))
    assert [(c.name, c.kind, c.passed) for c in checks] == [("unit", "gate", False), ("unit", "gate", True),
                                                            ("unit", "final", True)]
    stage_row = run.stages.get()
    assert stage_row.repairs_used == 1 and stage_row.last_defect["kind"] == "gate"
    prompt = var(Attempt.objects.get(run=run, operation="repair").prompt_path).read_text()
    assert "Gate 'unit' failed" in prompt and "AssertionError: 41" in prompt  # the failure evidence
    assert "return 41" in prompt  # the current patch
    assert "return 42" in git(repo, "show", f"{run.branch}:app/core.py")


def test_three_failures_with_an_allowance_of_two_exhaust_the_repairs(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [WRONG], "repair": [WRONG_40, WRONG_39]})
    assert (run.status, run.stop_reason) == ("waiting_review", "repair_exhausted"), run.stop_message
    assert operations_of(run) == ["implement", "repair", "repair"]
    assert run.stages.get().repairs_used == 2 and "allowance (2)" in run.stop_message
    assert Check.objects.filter(run=run, passed=False).count() == 3


def test_the_same_failure_on_unchanged_files_stops_at_once(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [WRONG], "repair": [{"print": "I changed nothing"}]})
    assert (run.status, run.stop_reason) == ("waiting_review", "unchanged_failure"), run.stop_message
    assert operations_of(run) == ["implement", "repair"]
    checks = list(Check.objects.filter(run=run).order_by("id"))
    assert len(checks) == 2 and checks[0].manifest_digest == checks[1].manifest_digest


def test_a_recheck_never_resets_the_repair_counters(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [WRONG], "repair": [WRONG_40, WRONG_39]})
    assert run.stop_reason == "repair_exhausted"
    operations.recover(run, run.decisions.get(state="pending").pk, "check again", "verify", reviewer="t")
    run = drive(run.pk, sent)
    assert run.stop_reason == "repair_exhausted" and run.stages.get().repairs_used == 2
    operations.recover(run, run.decisions.get(state="pending").pk, "one more try", "retry", reviewer="t")
    run = drive(run.pk, sent)
    # a fresh implementation fails again; the allowance is still used up: no repair session started
    assert run.stop_reason == "repair_exhausted" and run.stages.get().repairs_used == 2
    assert operations_of(run) == ["implement", "repair", "repair", "implement"]
    assert Check.objects.filter(run=run, passed=False).count() == 5


def test_a_gate_that_writes_into_the_worktree_gets_results_for_the_new_files(make_pipeline, repo, sent):
    stages = stage(gates=[{"name": "writer", "command": "python -m pytest -q && echo built > app/built.txt"}])
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP]}, stages=stages)
    checks = list(Check.objects.filter(run=run, kind="gate").order_by("id"))
    assert [c.stale for c in checks] == [True, False] and checks[0].manifest_digest != checks[1].manifest_digest
    assert run.status == "succeeded", run.stop_message
    assert run.stages.get().accepted_manifest == checks[1].manifest_digest


# ----------------------------------------------------------------------------- budgets


def test_an_exhausted_attempt_budget_stops_the_run(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [WRONG], "repair": [ANSWER_STEP]},
                   budgets={"max_attempts": 2})
    assert (run.status, run.stop_reason) == ("waiting_review", "budget_exhausted"), run.stop_message
    assert operations_of(run) == ["implement", "repair"] and "max_attempts" in run.stop_message


def test_an_exhausted_cost_budget_stops_the_run(make_pipeline, repo, sent):
    costly = {**ANSWER_STEP, "usage": {"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.75}}
    run = run_with(make_pipeline, repo, sent, {"implement": [costly]}, budgets={"max_cost_usd": 0.5})
    assert run.stop_reason == "budget_exhausted" and "$0.7500" in run.stop_message
    assert operations_of(run) == ["implement"]


def test_an_exhausted_time_budget_stops_the_run(make_pipeline, repo, sent):
    slow = {**ANSWER_STEP, "sleep": 1.5}
    run = run_with(make_pipeline, repo, sent, {"implement": [slow]}, budgets={"max_active_seconds": 1})
    assert run.stop_reason == "budget_exhausted" and run.active_seconds >= 1
    assert "max_active_seconds" in run.stop_message
    data = json.loads(json.dumps(operations.run_status(run)))
    assert data["stop_reason"] == "budget_exhausted"


# ----------------------------------------------------------------------------- manifests of whole runs


def test_c26_a_run_whose_agent_only_adds_files_keeps_and_commits_them(make_pipeline, sent, tmp_path):
    repo = make_repo(tmp_path / "c26", {"src/__init__.py": "", "tests/__init__.py": "", "docs/PLAN.md": "plan\n",
                                        "pytest.ini": PYTEST_INI})
    only_new = {"write": {"src/new_mod.py": "def f():\n    return 1\n",
                          "tests/test_new.py": "from src.new_mod import f\n\n\ndef test_f():\n    assert f() == 1\n",
                          "build/out.bin": "\x01\x02binary build output", ".pytest_cache/x": "cache"}}
    stages = [{"key": "answer", "requirement": "Add src/new_mod.py with a test.", "scope": ["src/**", "tests/**"],
               "gates": [{"name": "tests", "command": "python -m pytest -q tests"}]}]
    pipeline = make_pipeline(stages=stages, scenario={"stages": {"answer": {"implement": [only_new]}}},
                             exclude=["build/"])
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    attempt = Attempt.objects.get(run=run, operation="implement")
    manifest = json.loads(var(attempt.result_manifest.path).read_text())
    added = {c["path"]: c for c in manifest["changes"]}
    assert set(added) == {"src/new_mod.py", "tests/test_new.py"}
    assert all(c["status"] == "added" and len(c["new_blob"]) == 40 for c in added.values())
    assert not any(p.startswith(("build/", ".pytest_cache/")) for p in (e["path"] for e in manifest["entries"]))
    assert {"build/", ".pytest_cache/"} <= set(manifest["excluded"])
    patch = var(attempt.patch_path).read_text()
    assert "src/new_mod.py" in patch and "tests/test_new.py" in patch and "build/out.bin" not in patch
    committed = git(repo, "show", "--name-only", "--format=", run.branch).split()
    assert sorted(committed) == ["src/new_mod.py", "tests/test_new.py"]
    assert Path(run.worktree, "src", "new_mod.py").exists()  # the worktree is kept


def test_c27_an_env_file_never_reaches_the_checkpoint_or_the_patch(make_pipeline, sent, tmp_path):
    body = "sk-" + "".join(__import__("secrets").choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(48))
    repo = make_repo(tmp_path / "c27", {"src/__init__.py": "", "docs/PLAN.md": "plan\n"})
    step = {"write": {".env": f"OPENAI_API_KEY={body}\n", ".env.local": f"OPENAI_API_KEY={body}\n",
                      ".env.example": "OPENAI_API_KEY=\n", "id_ed25519": "key", "server.pem": "pem",
                      "src/app.py": "print('app')\n"}}
    stages = [{"key": "answer", "requirement": "Write src/app.py.", "scope": ["**"],
               "gates": [{"name": "runs", "command": "python src/app.py"}]}]
    pipeline = make_pipeline(stages=stages, scenario={"stages": {"answer": {"implement": [step]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    attempt = Attempt.objects.get(run=run, operation="implement")
    manifest = json.loads(var(attempt.result_manifest.path).read_text())
    assert [c["path"] for c in manifest["changes"]] == [".env.example", "src/app.py"]
    assert {".env", ".env.local", "id_ed25519", "server.pem"} <= set(manifest["excluded"])
    assert body not in var(attempt.patch_path).read_text() and "src/app.py" in var(attempt.patch_path).read_text()
    assert body not in git(repo, "log", "-p", "--all")
    assert sorted(git(repo, "show", "--name-only", "--format=", run.branch).split()) == [".env.example", "src/app.py"]


# ----------------------------------------------------------------------------- documentation and final verification


def test_the_documentation_agent_updates_docs_and_the_checks_and_review_run_again(make_pipeline, repo, sent):
    doc = {"write": {"docs/answer.md": "# answer\n\n`app.core.answer()` returns 42. Verified by `python -m pytest -q`.\n",
                     "docs/INDEX.md": "# Index\n- docs/PLAN.md\n- docs/answer.md\n"}}
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [PASS], "document": [doc]},
                   stages=stage(scope=["app/**"]))
    assert run.status == "succeeded", run.stop_message
    assert operations_of(run) == ["implement", "review", "document", "review"]
    document = Attempt.objects.get(run=run, operation="document")
    assert document.role == "documenter"
    prompt = var(document.prompt_path).read_text()
    assert "update the documentation" in prompt and "docs/**" in prompt and "return 42" in prompt
    gates = [c.manifest_digest for c in Check.objects.filter(run=run, kind="gate").order_by("id")]
    assert len(set(gates)) == 2  # the gates ran again on the documented files
    index = git(repo, "show", f"{run.branch}:docs/INDEX.md")
    assert "docs/answer.md" in index and "returns 42" in git(repo, "show", f"{run.branch}:docs/answer.md")


def test_a_documentation_agent_that_edits_code_is_rejected(make_pipeline, repo, sent):
    sneaky = {"write": {"docs/answer.md": "# answer\n", "app/core.py": "def answer():\n    return 0\n"}}
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "document": [sneaky]})
    assert (run.status, run.stop_reason) == ("waiting_review", "scope_violation"), run.stop_message
    assert run.stop_evidence["outside"] == ["app/core.py"]
    assert "return 0" in var(Attempt.objects.get(run=run, operation="document").patch_path).read_text()
    assert not run.stages.get().checkpoint_commit


def test_a_failed_documentation_agent_stops_the_run(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "document": [{"exit": 3}]})
    assert (run.status, run.stop_reason) == ("waiting_review", "docs_failed"), run.stop_message


def test_a_later_stage_that_breaks_an_earlier_gate_fails_the_final_verification(make_pipeline, repo, sent):
    stages = [
        {"key": "answer", "requirement": "Make answer() return 42.", "scope": ["app/**"],
         "gates": [{"name": "answer-test", "command": "python -m pytest -q tests/test_core.py"}]},
        {"key": "breaker", "requirement": "Add breaker.txt.", "scope": ["app/**", "breaker.txt"],
         "gates": [{"name": "has-file", "command": "test -f breaker.txt"}]},
    ]
    breaks = {"write": {"breaker.txt": "x\n", "app/core.py": "def answer():\n    return 0\n"}}
    pipeline = make_pipeline(stages=stages, scenario={"stages": {"answer": {"implement": [ANSWER_STEP]},
                                                                 "breaker": {"implement": [breaks]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent, limit=30)
    assert (run.status, run.stop_reason) == ("waiting_review", "final_verification_failed"), run.stop_message
    final = run.stages.order_by("-order").first().checkpoint_commit
    assert "'answer-test' of stage 'answer'" in run.stop_message and final[:12] in run.stop_message
    assert run.stop_evidence["checkpoint"] == final and run.stop_evidence["failed"] == ["answer-test"]
    assert [(c.name, c.passed) for c in Check.objects.filter(run=run, kind="final").order_by("id")] == [
        ("answer-test", False), ("has-file", True)]


# ----------------------------------------------------------------------------- human gates and rechecks


def test_a_human_gate_waits_then_an_approval_checkpoints_once(make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    stage_row = run.stages.get()
    decision = run.decisions.get(state="pending")
    assert decision.kind == "approval" and decision.artifact == stage_row.accepted_manifest
    assert not stage_row.checkpoint_commit and stage_row.status == "waiting_approval"
    assert operations.run_status(run)["waiting_for"] == "approval"
    operations.approve(run, decision.pk, decision.artifact[:12], reviewer="pat")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    decision.refresh_from_db()
    assert (decision.state, decision.decided_by) == ("approved", "pat")
    # approving twice: refused, and nothing moves
    with pytest.raises(operations.OperationError) as info:
        operations.approve(run, decision.pk, decision.artifact, reviewer="pat")
    assert info.value.code == "stale_decision" and info.value.field == "decision"
    assert git(repo, "rev-list", "--count", f"{run.commit}..{run.branch}").strip() == "1"


def test_an_approval_for_other_files_or_an_unknown_decision_is_refused(make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    decision = run.decisions.get(state="pending")
    for artifact in ("0" * 40, decision.artifact[:6], ""):
        with pytest.raises(operations.OperationError) as info:
            operations.approve(run, decision.pk, artifact, reviewer="pat")
        assert info.value.code == "artifact_mismatch" and info.value.field == "artifact"
    with pytest.raises(operations.OperationError) as info:
        operations.approve(run, 99999, decision.artifact, reviewer="pat")
    assert info.value.code == "unknown_decision"
    with pytest.raises(operations.OperationError) as info:
        operations.approve(run, decision.pk, decision.artifact, reviewer=" ")
    assert info.value.code == "reviewer_required"
    run.refresh_from_db()
    assert run.status == "waiting_approval" and run.decisions.get(pk=decision.pk).state == "pending"


def test_an_old_artifact_after_a_recheck_that_changed_files_is_refused(make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    old = run.decisions.get(state="pending")
    # a person corrects the files in the worktree, then asks for a recheck
    Path(run.worktree, "app", "core.py").write_text('"""Core, corrected."""\n\n\ndef answer():\n    return 42\n')
    operations.recheck(run, "added a better docstring", requested_by="pat")
    run = drive(run.pk, sent)
    assert run.status == "waiting_approval", run.stop_message
    new = run.decisions.get(state="pending")
    assert new.pk != old.pk and new.artifact != old.artifact
    assert run.decisions.get(pk=old.pk).state == "superseded"
    for decision_id, artifact in ((old.pk, old.artifact), (new.pk, old.artifact)):
        with pytest.raises(operations.OperationError) as info:
            operations.approve(run, decision_id, artifact, reviewer="pat")
        assert info.value.code in ("stale_decision", "artifact_mismatch")
    operations.approve(run, new.pk, new.artifact, reviewer="pat")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert "corrected" in git(repo, "show", f"{run.branch}:app/core.py")


def test_an_approval_cannot_pass_a_failed_check(make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    decision = run.decisions.get(state="pending")
    Check.objects.filter(run=run, manifest_digest=decision.artifact).update(passed=False, exit_code=1)
    with pytest.raises(operations.OperationError) as info:
        operations.approve(run, decision.pk, decision.artifact, reviewer="pat")
    assert info.value.code == "checks_missing" and "unit" in info.value.message
    assert run.decisions.get(pk=decision.pk).state == "pending"


def test_a_recheck_needs_a_result_and_a_note(make_pipeline, repo, sent):
    stages = stage(docs=["docs/MISSING.md"])
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP]}, stages=stages)
    assert run.stop_reason == "missing_file"
    with pytest.raises(operations.OperationError) as info:
        operations.recheck(run, "try", requested_by="pat")
    assert info.value.code == "nothing_to_verify"
    with pytest.raises(operations.OperationError) as info:
        operations.recheck(run, "  ", requested_by="pat")
    assert info.value.code == "note_required" and info.value.field == "note"


def test_a_recheck_after_exhausted_repairs_keeps_the_counters(make_pipeline, repo, sent):
    run = run_with(make_pipeline, repo, sent, {"implement": [WRONG], "repair": [WRONG_40, WRONG_39]})
    assert run.stop_reason == "repair_exhausted"
    operations.recheck(run, "looked again", requested_by="pat")
    run = drive(run.pk, sent)
    assert run.stop_reason == "repair_exhausted" and run.stages.get().repairs_used == 2
    assert operations_of(run) == ["implement", "repair", "repair"]


def test_the_next_stage_receives_the_accepted_output_and_the_documentation(make_pipeline, repo, sent):
    stages = [
        {"key": "answer", "requirement": "Make answer() return 42.", "scope": ["app/**"],
         "gates": [{"name": "unit", "command": QUICK_GATE}]},
        {"key": "double", "requirement": "Add double().", "scope": ["app/**"], "depends_on": ["answer"],
         "gates": [{"name": "unit", "command": QUICK_GATE}]},
    ]
    doc = {"write": {"docs/answer.md": "# answer\n\nanswer() returns 42 (documented by the scripted documenter).\n",
                     "docs/INDEX.md": "# Index\n- docs/PLAN.md\n- docs/answer.md\n"}}
    double = {"write": {"app/extra.py": "def double():\n    return 84\n"}}
    pipeline = make_pipeline(stages=stages, scenario={"stages": {
        "answer": {"implement": [{**ANSWER_STEP, "final_message": "answer() now returns 42"}], "document": [doc]},
        "double": {"implement": [double]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent, limit=40)
    assert run.status == "succeeded", run.stop_message
    second = Attempt.objects.get(run=run, stage__key="double", operation="implement")
    prompt = var(second.prompt_path).read_text()
    first = run.stages.get(key="answer")
    assert first.checkpoint_commit in prompt and "app/core.py" in prompt
    assert "answer() now returns 42" in prompt  # the implementer's message, not the reviewer's
    assert "Documentation docs/answer.md" in prompt and "documented by the scripted documenter" in prompt


def test_a_stage_with_nothing_changed_checkpoints_to_the_same_commit(make_pipeline, repo, sent):
    stages = [{"key": "answer", "requirement": "Change nothing; the tests already pass.", "scope": ["app/**"],
               "gates": [{"name": "noop", "command": "true"}]}]
    run = run_with(make_pipeline, repo, sent, {"implement": [{"print": "nothing to do"}]}, stages=stages)
    assert run.status == "succeeded", run.stop_message
    assert run.stages.get().checkpoint_commit == run.commit
    assert git(repo, "rev-parse", run.branch).strip() == run.commit  # no empty commit was made
    assert run.events.filter(kind="checkpoint", message__contains="unchanged; reusing").exists()


def test_a_nul_character_in_a_pipeline_is_refused_with_its_field():
    from engine.pipeline.format import PipelineFormatError
    from .conftest import pipeline_definition

    with pytest.raises(PipelineFormatError) as info:
        pipeline_definition(scenario={"stages": {"answer": {"implement": [{"write": {"a.bin": "\x00"}}]}}})
    assert any("NUL" in problem and "a.bin" in field for _, field, problem in info.value.errors), info.value.errors


def test_what_an_agent_says_is_made_storable_before_it_is_saved():
    from engine.steps import storable

    assert storable({"a\x00": ["x\x00y", 3, None]}) == {"a\ufffd": ["x\ufffdy", 3, None]}


@pytest.mark.parametrize("path, text", [
    ("tests/pytest.ini", "[pytest]\naddopts = --collect-only\n"),
    ("app/conftest.py", "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
                        "    for item in items:\n        item.add_marker(pytest.mark.skip('x'))\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '--collect-only'\n"),
    ("setup.cfg", "[tool:pytest]\naddopts = --collect-only\n"),
])
def test_configuring_the_test_runner_anywhere_is_tampering(make_pipeline, repo, sent, path, text):
    """With a pytest gate, files that configure pytest are guarded at any depth, protected_paths or not."""
    stages = stage(gates=[{"name": "unit", "command": "python -m pytest -q"}], scope=["**"])
    run = run_with(make_pipeline, repo, sent, {"implement": [{"write": {path: text}}]}, stages=stages)
    assert (run.status, run.stop_reason) == ("waiting_review", "protected_files_changed"), run.stop_message
    assert brief(run.stop_evidence["changes"]) == [{"path": path, "change": "added", "new_mode": "100644",
                                                   "why": "a test runner loads it by itself"}]
    assert not Check.objects.filter(run=run).exists()


def test_a_result_that_passes_only_with_files_left_out_of_the_checkpoint_does_not_succeed(make_pipeline, repo,
                                                                                         sent):
    """The gates pass in the agent's worktree thanks to a file git ignores; the final verification
    runs on the run's worktree reset to what was committed, where it is missing."""
    step = {"write": {".gitignore": "app/hidden_impl.py\n",
                      "app/hidden_impl.py": "def answer():\n    return 42\n",
                      "app/core.py": "from app.hidden_impl import answer  # noqa: F401\n"}}
    run = run_with(make_pipeline, repo, sent, {"implement": [step]}, stages=stage(scope=["app/**", ".gitignore"]))
    assert (run.status, run.stop_reason) == ("waiting_review", "final_verification_failed"), run.stop_message
    gate = Check.objects.filter(run=run, kind="gate").last()
    final = Check.objects.get(run=run, kind="final")
    assert gate.passed and not final.passed and final.cwd == run.worktree
    assert "hidden_impl" in var(final.log_path).read_text()
    assert not (Path(run.worktree) / "app" / "hidden_impl.py").exists()  # removed before the check ran


@pytest.mark.parametrize("message", [
    'Format: {"verdict": "pass", "findings": []}.\n```json\n{"verdict": "repair", "findings": [{"severity": '
    '"critical", "text": "wrong for negatives"},]}\n```',
    '{"verdict": "pass", "findings": []} but actually I am not sure',
])
def test_only_the_answer_at_the_end_counts_never_an_earlier_quoted_pass(message):
    from engine.checks import review

    with pytest.raises(review.InvalidVerdict):
        review.parse(message)


def test_a_gate_runs_the_agents_code_in_the_sandbox(make_pipeline, repo, sent):
    """Code an agent wrote runs when a gate runs it: it must not see the database, the control
    records or the worker's HOME, nor write anything outside the worktree."""
    var_dir = Path(settings.VAR_DIR).resolve()
    home = Path(os.path.expanduser("~")).resolve()
    snoop = (
        "import os, sys, pathlib\n"
        f"var, home = pathlib.Path({str(var_dir)!r}), pathlib.Path({str(home)!r})\n"
        "seen = [str(p) for p in var.iterdir()] if var.exists() else []\n"
        "seen = [p for p in seen if not os.environ['CP_WORKTREE'].startswith(p)\n"
        "        and not os.environ['TMPDIR'].startswith(p)]\n"
        "leaks = [p for p in seen if p.endswith(('runs', 'sqlite3', 'broker'))]\n"
        "try:\n    (var / 'written-by-a-gate').write_text('x'); leaks.append('wrote into var')\n"
        "except OSError:\n    pass\n"
        "if (home / '.bashrc').exists() or (home / '.profile').exists():\n    leaks.append('worker home')\n"
        "print('leaks:', leaks); sys.exit(1 if leaks else 0)\n")
    step = {"write": {**ANSWER_STEP["write"], "app/snoop.py": snoop}}
    stages = stage(gates=[{"name": "snoop", "command": "python app/snoop.py"}])
    run = run_with(make_pipeline, repo, sent, {"implement": [step]}, stages=stages)
    check = Check.objects.filter(run=run, kind="gate").first()
    assert check.passed, var(check.log_path).read_text()
    assert run.status == "succeeded", run.stop_message
    assert not (var_dir / "written-by-a-gate").exists()


def test_an_attempt_never_runs_past_the_active_time_budget(make_pipeline, repo, sent):
    slow = {**ANSWER_STEP, "sleep": 30}
    run = run_with(make_pipeline, repo, sent, {"implement": [slow]}, budgets={"max_active_seconds": 3})
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert attempt.deadline_seconds <= 3 and attempt.status == "timeout"
    assert attempt.elapsed_seconds < 15


def test_pytest_in_a_repository_without_its_own_configuration_never_takes_the_control_panels(make_pipeline, sent,
                                                                                              tmp_path):
    """The default var directory lies inside this project, so a worktree does too: pytest looking
    upwards from a repository with no configuration must not find the Control Panel's pyproject.toml
    (with its DJANGO_SETTINGS_MODULE) and fail the repository's tests."""
    assert Path(settings.VAR_DIR).resolve().is_relative_to(Path(settings.BASE_DIR).resolve())  # the case at hand
    repo = make_repo(tmp_path / "bare", {
        "app/__init__.py": "", "app/core.py": '"""Core."""\n',
        "tests/test_core.py": "from app import core\n\n\ndef test_answer():\n    assert core.answer() == 42\n",
        "docs/PLAN.md": "# Plan\n"})
    probe = ("import pathlib, sys\n"  # inline: the gate's sandbox sees nothing of tmp_path but the worktree
             f"try:\n    text = pathlib.Path({str(Path(settings.BASE_DIR) / 'pyproject.toml')!r}).read_text()\n"
             "except OSError:\n    text = ''\n"
             "sys.exit('the project configuration is visible' if 'DJANGO_SETTINGS_MODULE' in text else 0)\n")
    gate = f"python -m pytest -q -p no:cacheprovider tests && python -c {shlex.quote(probe)}"
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP]},
                   stages=stage(gates=[{"name": "unit", "command": gate}]))
    check = Check.objects.filter(run=run, kind="gate").first()
    assert check.passed, var(check.log_path).read_text()
    assert "1 passed" in var(check.log_path).read_text()
    assert run.status == "succeeded", run.stop_message


@pytest.mark.parametrize("added, mode", [
    ("tests/helpers/__init__.py", "100644"), ("tests/helpers/__init__.cpython-311-x86_64-linux-gnu.so", "100644"),
    ("tests/helpers.cpython-311-x86_64-linux-gnu.so", "100644"), ("tests/helpers.abi3.so", "100644"),
    ("tests/helpers", "120000"), ("tests/test_a/__init__.py", "100644")])
def test_what_python_imports_instead_of_a_protected_module_beside_it_is_tampering(added, mode):
    """In any layout: a package, a compiled module or a linked folder named like a protected x.py comes first."""
    snap = [{"path": "tests/test_a.py", "mode": "100644", "blob": "a" * 40},
            {"path": "tests/helpers.py", "mode": "100644", "blob": "b" * 40}]
    current = snap + [{"path": added, "mode": mode, "blob": "c" * 40}]
    module = "tests/test_a.py" if added.startswith("tests/test_a") else "tests/helpers.py"
    assert protected.compare(snap, ["tests/test_*.py"], current) == [
        {"path": added, "change": "added", "new_mode": mode,
         "why": f"is imported instead of the protected module {module} beside it"}]


def test_a_package_or_folder_beside_no_protected_module_is_welcome():
    snap = [{"path": "tests/test_a.py", "mode": "100644", "blob": "a" * 40}]
    current = snap + [{"path": path, "mode": "100644", "blob": "c" * 40} for path in (
        "tests/unit/__init__.py", "tests/unit/test_b.py", "app/core/__init__.py", "tests/data/a.json")]
    current.append({"path": "tests/fixtures", "mode": "120000", "blob": "d" * 40})
    assert protected.compare(snap, ["tests/test_*.py"], current) == []
