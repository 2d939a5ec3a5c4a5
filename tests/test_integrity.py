"""No way to weaken an agreed check: carried-forward tests, the test tree, runner files anywhere,
shadowing modules, names any byte can make, outward symlinks, and the tamper report.

Runs are driven step by step in this process (``drive``) with real git worktrees, real gate
commands and the scripted test adapter's real child processes.
"""
import hashlib
import json
import re
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.models import Attempt, RunEvent

from .conftest import make_repo
from .support.runs import drive

#: Every test here but the last drives a run with real subprocesses (gates, the sandboxed scripted
#: adapter): slow, run by `make test` (make test-fast keeps to what needs no subprocess).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CORE = '"""Core."""\n\n\ndef answer():\n    return 42\n\n\ndef double(x):\n    return 2 * x\n'
QUICK_GATE = "python -c 'from app import core; assert core.answer() == 42'"
NEW_TEST = ("from app import core\n\n\ndef test_double():\n    assert core.double(2) == 4\n"
            "    assert core.double(0) == 0\n")
WEAKENED = "from app import core\n\n\ndef test_double():\n    pass\n"


def var(rel: str) -> Path:
    return Path(settings.VAR_DIR) / rel


def start(make_pipeline, repo, stages, scenario, **extra):
    pipeline = make_pipeline(stages=stages, scenario={"stages": scenario}, **extra)
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    return run


def one_stage(scope=("app/**", "tests/**"), gate=QUICK_GATE):
    return [{"key": "answer", "requirement": "r", "scope": list(scope), "gates": [{"name": "unit", "command": gate}]}]


def test_a_test_an_earlier_stage_added_cannot_be_weakened_by_a_later_one(make_pipeline, repo, sent):
    stages = [{"key": "one", "requirement": "add double", "scope": ["app/**", "tests/**"],
               "gates": [{"name": "unit", "command": QUICK_GATE}]},
              {"key": "two", "requirement": "more", "scope": ["app/**", "tests/**"],
               "gates": [{"name": "unit", "command": QUICK_GATE}]}]
    scenario = {"one": {"implement": [{"write": {"app/core.py": CORE, "tests/test_double.py": NEW_TEST}}]},
                "two": {"implement": [{"write": {"tests/test_double.py": WEAKENED}}]}}
    run = drive(start(make_pipeline, repo, stages, scenario, protected_paths=["tests/test_*.py"]).pk, sent, 60)
    assert (run.status, run.stop_reason) == ("waiting_review", "protected_files_changed"), run.stop_message
    [change] = run.stop_evidence["changes"]
    assert (change["path"], change["change"]) == ("tests/test_double.py", "modified")
    assert change["sha256_before"] == hashlib.sha256(NEW_TEST.encode()).hexdigest()
    assert change["sha256_after"] == hashlib.sha256(WEAKENED.encode()).hexdigest()
    one, two = run.stages.order_by("order")
    assert one.checkpoint_commit and not two.checkpoint_commit
    carried = RunEvent.objects.get(run=run, kind="protected_carried")
    assert carried.data["paths"] == ["tests/test_double.py"] and carried.stage_id == one.pk
    record = next(r for r in run.protected_files if r["path"] == "tests/test_double.py")
    assert record["why"].startswith("added by stage 'one', accepted at checkpoint " + one.checkpoint_commit[:12])
    copy = var(f"{run.control_dir}/protected/files/tests/test_double.py")
    assert copy.read_text() == NEW_TEST
    index = json.loads(var(f"{run.control_dir}/protected/index.json").read_text())
    assert "tests/test_double.py" in {r["path"] for r in index}


@pytest.mark.parametrize("how", ["delete", "chmod", "rename"])
def test_nor_deleted_chmodded_or_renamed(make_pipeline, repo, sent, how):
    step = {"delete": {"delete": ["tests/test_double.py"]},
            "chmod": {"run": ["chmod", "+x", "tests/test_double.py"]},
            "rename": {"run": ["mv", "tests/test_double.py", "tests/test_other.py"]}}[how]
    stages = [{"key": "one", "requirement": "r", "scope": ["app/**", "tests/**"], "gates": [QUICK_GATE]},
              {"key": "two", "requirement": "r", "scope": ["app/**", "tests/**"], "gates": [QUICK_GATE]}]
    scenario = {"one": {"implement": [{"write": {"app/core.py": CORE, "tests/test_double.py": NEW_TEST}}]},
                "two": {"implement": [step]}}
    run = drive(start(make_pipeline, repo, stages, scenario, protected_paths=["tests/test_*.py"]).pk, sent, 60)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    [change] = run.stop_evidence["changes"]
    assert change["path"] == "tests/test_double.py"
    assert change["change"] == {"delete": "deleted", "chmod": "mode_changed", "rename": "renamed"}[how]


def tree_repo(tmp_path):
    return make_repo(tmp_path / "tree", {
        "app/__init__.py": "", "app/core.py": '"""Core."""\n',
        "tests/__init__.py": "import unittest\n\n\nclass Base(unittest.TestCase):\n"
                             "    def check(self, got, want):\n        self.assertEqual(got, want)\n",
        "tests/data/cases.json": '[[1, 2], [2, 4]]\n',
        "tests/test_core.py": "from tests import Base\nfrom app import core\n\n\nclass T(Base):\n"
                              "    def test_answer(self):\n        self.check(core.answer(), 42)\n",
        "docs/PLAN.md": "plan\n"})


def test_the_test_tree_is_protected_not_only_the_matching_names(make_pipeline, sent, tmp_path):
    """protected_paths: [tests/test_*.py] protects tests/__init__.py (the base class every test uses)."""
    repo = tree_repo(tmp_path)
    cheat = {"write": {"app/core.py": CORE, "tests/__init__.py": "import unittest\n\n\nclass Base(unittest.TestCase):\n"
                       "    def check(self, got, want):\n        pass\n"}}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [cheat]}},
                      protected_paths=["tests/test_*.py"]).pk, sent)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    assert [(c["path"], c["change"]) for c in run.stop_evidence["changes"]] == [("tests/__init__.py", "modified")]
    whys = {r["path"]: r["why"] for r in run.protected_files}
    assert whys["tests/__init__.py"] == whys["tests/data/cases.json"] == "in the protected folder tests/"
    assert whys["tests/test_core.py"] == "matches protected_paths"


def test_new_test_data_and_a_new_test_module_are_allowed(make_pipeline, sent, tmp_path):
    repo = tree_repo(tmp_path)
    honest = {"write": {"app/core.py": CORE, "tests/data/more.json": "[[3, 6]]\n",
                        "tests/test_more.py": "from app import core\n\n\ndef test_double():\n"
                                              "    assert core.double(3) == 6\n"}}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [honest]}},
                      protected_paths=["tests/test_*.py"]).pk, sent)
    assert run.status == "succeeded", run.stop_message


def test_a_negation_narrows_the_protected_tree(make_pipeline, sent, tmp_path):
    repo = tree_repo(tmp_path)
    step = {"write": {"app/core.py": CORE, "tests/data/cases.json": "[]\n"}}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [step]}},
                      protected_paths=["tests/test_*.py", "!tests/data/"]).pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert "tests/data/cases.json" not in {r["path"] for r in run.protected_files}


@pytest.mark.parametrize("path", ["tests/app.py", "unittest.py", "tests/pluggy/__init__.py", "iniconfig.py",
                                  "tests/app.cpython-311-x86_64-linux-gnu.so"])
def test_a_module_that_shadows_one_the_tests_import_stops_the_run(make_pipeline, sent, tmp_path, repo, path):
    """tests/ of ``repo`` is no package, so pytest puts it on sys.path: tests/app.py would be
    imported as ``app``; a top-level unittest, pluggy or iniconfig would replace what the tests or
    the runner import (the tree repository's tests/ is a package, its root is on sys.path)."""
    repo = repo if path.startswith("tests/") else tree_repo(tmp_path)
    step = {"write": {"app/core.py": CORE, path: "def answer():\n    return 42\n"}}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [step]}},
                      protected_paths=["tests/test_*.py"]).pk, sent)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    [change] = run.stop_evidence["changes"]
    assert change["path"] == path and change["change"] == "added" and "shadows the module" in change["why"]


def test_a_newline_in_a_protected_name_does_not_hide_it(make_pipeline, sent, tmp_path):
    name = "data/x\ny.txt"
    repo = make_repo(tmp_path / "nl", {"app/__init__.py": "", "app/core.py": '"""Core."""\n', name: "1\n2\n",
                                       "docs/PLAN.md": "plan\n"})
    step = {"write": {"app/core.py": CORE}, "run": ["python3", "-c", f"open({name!r}, 'w').write('1\\n')"]}
    run = drive(start(make_pipeline, repo, one_stage(scope=["**"]), {"answer": {"implement": [step]}},
                      protected_paths=["data/**"]).pk, sent)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    assert [(c["path"], c["change"]) for c in run.stop_evidence["changes"]] == [(name, "modified")]


def test_a_new_name_with_a_newline_is_inside_a_scope_of_everything(make_pipeline, repo, sent):
    step = {"write": {"app/core.py": CORE},
            "run": ["python3", "-c", "import os; os.mkdir('notes'); open('notes/a\\nb.txt', 'w').write('n')"]}
    run = drive(start(make_pipeline, repo, one_stage(scope=["**"]), {"answer": {"implement": [step]}}).pk, sent)
    assert run.status == "succeeded", (run.stop_reason, run.stop_message)


@pytest.mark.parametrize("target", ["/etc/passwd", "../../../outside", "../.git/config"])
def test_a_symlink_out_of_the_worktree_stops_the_run(make_pipeline, repo, sent, target):
    step = {"write": {"app/core.py": CORE}, "run": ["ln", "-s", target, "app/link"]}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [step]}}).pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "external_symlink"), run.stop_message
    [link] = run.stop_evidence["links"]
    assert link["path"] == "app/link" and link["target"] == target
    assert "app/link -> " + target in run.stop_message
    attempt = Attempt.objects.get(pk=run.stop_evidence["attempt"])
    assert attempt.failure_kind == "external_symlink"
    assert not run.stages.get().checkpoint_commit


def test_a_symlink_inside_the_worktree_is_fine(make_pipeline, repo, sent):
    step = {"write": {"app/core.py": CORE}, "run": ["ln", "-s", "core.py", "app/alias.py"]}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [step]}}).pk, sent)
    assert run.status == "succeeded", run.stop_message


def test_the_run_page_shows_the_tamper_report_and_the_attempt_in_red(make_pipeline, repo, sent, admin_client):
    step = {"write": {"app/core.py": CORE, "tests/test_core.py": "def test_answer():\n    pass\n"}}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [step]}},
                      protected_paths=["tests/test_*.py"]).pk, sent)
    assert run.stop_reason == "protected_files_changed"
    [change] = run.stop_evidence["changes"]
    attempt = Attempt.objects.get(pk=run.stop_evidence["attempt"])
    assert attempt.status == "succeeded" and attempt.failure_kind == "protected_files_changed"
    page = admin_client.get(f"/admin/engine/run/{run.pk}/detail/").content.decode()
    _assert_tamper_shown(page, "tamper", change)
    # red on the timeline too: its box links to the attempt's row
    assert f'<a class="cp-step cp-bad cp-box-step" href="#attempt-{attempt.pk}"' in page
    row = page[page.index(f'<tr id="attempt-{attempt.pk}"'):]
    assert row.startswith(f'<tr id="attempt-{attempt.pk}" class="cp-row-bad">')
    assert "<code>protected_files_changed</code>" in row[:2000]
    # a person fails the run: the card says why it failed and keeps the tampering that led there on top
    operations.fail_run(run, "the agent weakened the test", requested_by="reviewer")
    page = admin_client.get(f"/admin/engine/run/{run.pk}/detail/").content.decode()
    card = page[page.index('id="stop"'):page.index('id="facts"')]
    assert "failed_by_operator" in card and 'id="led-here"' in card
    _assert_tamper_shown(card, "tamper-led-here", change)


def _assert_tamper_shown(page: str, table_id: str, change: dict) -> None:
    """The tamper report (its file, change, digests and diff) in the element ``table_id`` of ``page``."""
    table = page[page.index(f'<div class="cp-tamper" id="{table_id}"'):]
    table = table[:table.index('class="cp-stop-links"')]
    assert "tests/test_core.py" in table and "modified" in table
    assert change["sha256_before"][:16] in table and change["sha256_after"][:16] in table
    assert '<span class="cp-ddel">-    assert core.answer() == 42</span>' in table
    assert re.search(r'<span class="cp-dadd"[^>]*>\+    pass</span>', table)


def test_a_new_test_module_that_loads_plugins_is_told_apart():
    from engine.checks.protected import loads_plugins

    assert loads_plugins(b"pytest_plugins = ['app.skipper']\n")
    assert loads_plugins(b"pytest_plugins: list = ['x']\n") and loads_plugins(b"pytest_plugins += ['x']\n")
    assert loads_plugins(b"from app.plugins import pytest_plugins\n")
    assert not loads_plugins(b"def test_x():\n    pytest_plugins = ['x']\n")  # a local name: pytest never sees it
    assert not loads_plugins(b"def test_x(:\n")


def test_gates_never_run_bytecode_an_agent_left(make_pipeline, repo, sent):
    """Bytecode is excluded from manifests, so no tamper check sees it: before each gate the
    engine removes every __pycache__ folder and .pyc file of the worktree."""
    plant = ("import os; os.makedirs('tests/__pycache__'); open('tests/__pycache__/x.cpython-311.pyc', 'wb').write(b'1');"
             " open('app/core.pyc', 'wb').write(b'2')")
    gate = "test ! -e tests/__pycache__ && test ! -e app/core.pyc && " + QUICK_GATE
    step = {"write": {"app/core.py": CORE}, "run": ["python3", "-c", plant]}
    run = drive(start(make_pipeline, repo, one_stage(gate=gate), {"answer": {"implement": [step]}}).pk, sent)
    assert run.status == "succeeded", run.stop_message


NOT_UTF8 = "import os; os.makedirs(b'{folder}', exist_ok=True); open(b'{folder}/\\xff.json', 'wb').write(b'1')"


def test_a_name_that_is_not_utf8_outside_the_scope_stops_the_run_cleanly(make_pipeline, repo, sent):
    step = {"write": {"app/core.py": CORE}, "run": ["python3", "-c", NOT_UTF8.format(folder="notes")]}
    run = drive(start(make_pipeline, repo, one_stage(scope=["app/**"]), {"answer": {"implement": [step]}}).pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "scope_violation"), run.stop_message
    assert "notes/\\xff.json" in run.stop_message


def test_a_name_that_is_not_utf8_under_the_protected_tree_is_carried_and_then_protected(make_pipeline, repo, sent):
    stages = [{"key": "one", "requirement": "r", "scope": ["app/**", "tests/**"], "gates": [QUICK_GATE]},
              {"key": "two", "requirement": "r", "scope": ["app/**", "tests/**"], "gates": [QUICK_GATE]}]
    scenario = {"one": {"implement": [{"write": {"app/core.py": CORE},
                                       "run": ["python3", "-c", NOT_UTF8.format(folder="tests/data")]}]},
                "two": {"implement": [{"run": ["python3", "-c", "open(b'tests/data/\\xff.json', 'wb').write(b'2')"]}]}}
    run = drive(start(make_pipeline, repo, stages, scenario, protected_paths=["tests/test_*.py"]).pk, sent, 60)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    [change] = run.stop_evidence["changes"]
    assert (change["path"], change["change"]) == ("tests/data/\\xff.json", "modified")
    assert change["sha256_after"] == hashlib.sha256(b"2").hexdigest()


@pytest.mark.parametrize("path", ["scripts/helpers.py", "examples/app.py", "docs/Makefile", "tests/unit/__init__.py",
                                  "app/json.py", "Makefile"])
def test_a_module_or_makefile_no_gate_loads_is_not_tampering(make_pipeline, sent, repo, path):
    """scripts/ and examples/ are on no sys.path of the tests; no gate runs make; a new package
    folder of tests (tests/unit/) changes no existing test; app/json.py is app.json."""
    step = {"write": {"app/core.py": CORE, path: "X = 1\n"}}
    run = drive(start(make_pipeline, repo, one_stage(scope=["**"]), {"answer": {"implement": [step]}},
                      protected_paths=["tests/test_*.py"]).pk, sent)
    assert run.status == "succeeded", run.stop_message


@pytest.mark.parametrize("path", ["pytest.toml", ".pytest.toml", "calc_evil-0.dist-info/entry_points.txt",
                                  ".gitattributes", "tests/__init__.py"])
def test_runner_files_package_metadata_and_a_new_package_of_tests_are_tampering(make_pipeline, sent, repo, path):
    step = {"write": {"app/core.py": CORE, path: "[pytest11]\nevil = app.evil\n"}}
    run = drive(start(make_pipeline, repo, one_stage(scope=["**"]), {"answer": {"implement": [step]}},
                      protected_paths=["tests/test_*.py"]).pk, sent)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    assert [c["path"] for c in run.stop_evidence["changes"]] == [path]


def test_a_test_module_an_earlier_stage_added_outside_the_protected_tree_is_carried(make_pipeline, repo, sent):
    stages = [{"key": "one", "requirement": "r", "scope": ["**"], "gates": [QUICK_GATE]},
              {"key": "two", "requirement": "r", "scope": ["**"], "gates": [QUICK_GATE]}]
    scenario = {"one": {"implement": [{"write": {"app/core.py": CORE, "app/test_double.py": NEW_TEST}}]},
                "two": {"implement": [{"write": {"app/test_double.py": WEAKENED}}]}}
    run = drive(start(make_pipeline, repo, stages, scenario, protected_paths=["tests/test_*.py"]).pk, sent, 60)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    assert [(c["path"], c["change"]) for c in run.stop_evidence["changes"]] == [("app/test_double.py", "modified")]
    record = next(r for r in run.protected_files if r["path"] == "app/test_double.py")
    assert record["why"].endswith("(a new test module)")


def test_an_attempt_that_tampers_and_links_out_names_both(make_pipeline, repo, sent):
    step = {"write": {"app/core.py": CORE, "tests/test_core.py": WEAKENED}, "run": ["ln", "-s", "/etc/passwd", "app/pw"]}
    run = drive(start(make_pipeline, repo, one_stage(), {"answer": {"implement": [step]}},
                      protected_paths=["tests/test_*.py"]).pk, sent)
    assert run.stop_reason == "protected_files_changed"
    assert [link["path"] for link in run.stop_evidence["links"]] == ["app/pw"]


def test_a_helper_an_earlier_stages_new_test_imports_is_carried_with_it(make_pipeline, repo, sent):
    stages = [{"key": "one", "requirement": "r", "scope": ["**"], "gates": [QUICK_GATE]},
              {"key": "two", "requirement": "r", "scope": ["**"], "gates": [QUICK_GATE]}]
    helper = "def ok(a, b):\n    assert a == b\n"
    test = "from e2e_helper import ok\n\nfrom app import core\n\n\ndef test_d():\n    ok(core.double(2), 4)\n"
    scenario = {"one": {"implement": [{"write": {"app/core.py": CORE, "e2e/e2e_helper.py": helper, "e2e/test_d.py": test,
                                                 "e2e/cases.json": "[]\n", "e2e/impl.py": "X = 1\n"}}]},
                "two": {"implement": [{"write": {"e2e/e2e_helper.py": "def ok(a, b):\n    pass\n", "e2e/impl.py": "X = 2\n"}}]}}
    run = drive(start(make_pipeline, repo, stages, scenario, protected_paths=["tests/test_*.py"]).pk, sent, 60)
    assert run.stop_reason == "protected_files_changed", run.stop_message
    # the helper it imports and the data beside it are carried; another module of the folder is not
    assert [c["path"] for c in run.stop_evidence["changes"]] == ["e2e/e2e_helper.py"]
    carried = {r["path"] for r in run.protected_files}
    assert {"e2e/test_d.py", "e2e/e2e_helper.py", "e2e/cases.json"} <= carried and "e2e/impl.py" not in carried
