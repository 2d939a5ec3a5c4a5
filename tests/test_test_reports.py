"""The test runner's own record (engine/checks/test_reports): the engine's pytest reporter loaded into a real
pytest, what it writes when the code under test ends the process early or rewrites its status, and
how a gate that exited 0 is judged against it.

Here pytest runs directly (a subprocess of this test, with the reporter's environment); the same
reporter inside the sandbox, through the engine's gates, is in tests/test_gate_records.py and
bench/integrity.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.checks import test_reports
from .conftest import PYTEST_INI

PASSING = "def test_one():\n    assert 1 + 1 == 2\n\n\ndef test_two():\n    assert 'a' < 'b'\n"


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    top = tmp_path / "project"
    for rel, text in {"pytest.ini": PYTEST_INI, **files}.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
    return top


def gate(tmp_path: Path, files: dict[str, str], command: str = "python -m pytest -q",
         apart: tuple[str, list[str]] | None = None) -> tuple[int, dict | None, str]:
    """Run ``command`` (by bash) in a project of ``files`` with the reporter loaded, as a gate does;
    ``(exit status, what the record says, output)``."""
    top = project(tmp_path, files)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    reporter = test_reports.prepare(tmp_path, home, apart)
    env = reporter.env({"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home),
                        "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"})
    try:
        done = subprocess.run(["bash", "-c", command], cwd=top, env=env, capture_output=True, text=True, timeout=120)
    finally:
        reporter.remove()
    return done.returncode, test_reports.read(reporter.record), done.stdout + done.stderr


@pytest.mark.slow  # each runs a real pytest (a second or two)
def test_an_honest_suite_passes_with_its_counts(tmp_path):
    status, summary, out = gate(tmp_path, {"tests/test_a.py": PASSING,
                                           "tests/test_b.py": "import pytest\n\n\n@pytest.mark.skip\ndef test_later():\n"
                                                              "    pass\n\n\n@pytest.mark.xfail\ndef test_known():\n"
                                                              "    assert False\n"})
    assert status == 0, out
    assert test_reports.judge("python -m pytest -q", status, summary) == ("", "")
    assert summary["counts"] == {"passed": 2, "failed": 0, "error": 0, "skipped": 1, "xfailed": 1, "xpassed": 0}
    assert summary["collected"] == 4 and summary["finished"] == 1 and summary["statuses"] == [0]
    assert "4 collected test(s): 2 passed, 1 skipped, 1 xfailed; 1 session(s), finished, status 0" in \
        test_reports.sentence(summary)


@pytest.mark.slow  # each runs a real pytest (a second or two)
@pytest.mark.parametrize("files, kind, said", [
    ({"tests/test_aaa_setup.py": "import os\nos._exit(0)\n", "tests/test_b.py": PASSING},
     "runner_incomplete", "session never finished"),
    ({"app.py": "import os\nos._exit(0)\n", "tests/test_b.py": "import app\n\n\n" + PASSING},
     "runner_incomplete", "session never finished"),
    ({"tests/test_aaa.py": "import os\n\n\ndef test_first():\n    os._exit(0)\n", "tests/test_b.py": PASSING},
     "runner_incomplete", "tests/test_b.py::test_one"),
    ({"tests/test_b.py": "import atexit, os\n\natexit.register(os._exit, 0)\n\n\ndef test_broken():\n"
                         "    assert 1 == 2\n"},
     "tests_failed", "1 failed test(s): tests/test_b.py::test_broken"),
    ({"tests/test_aaa.py": "import pytest\n\n\n@pytest.fixture(autouse=True)\ndef stop():\n"
                           "    pytest.exit('enough', returncode=0)\n\n\ndef test_first():\n    pass\n",
      "tests/test_b.py": PASSING},
     "runner_incomplete", "interrupted"),
], ids=["exit-at-collection", "exit-in-code-under-test", "exit-in-a-test", "atexit-rewrite", "pytest-exit-zero"])
def test_a_process_that_ends_early_with_0_or_rewrites_its_status_fails(tmp_path, files, kind, said):
    status, summary, out = gate(tmp_path, files)
    assert status == 0, out  # each of these passes a gate that trusts the exit status
    failure, why = test_reports.judge("python -m pytest -q", status, summary)
    assert failure == kind and said in why, (failure, why, summary)


@pytest.mark.slow  # each runs a real pytest (a second or two)
def test_a_gate_that_runs_pytest_and_records_nothing_fails_and_one_that_runs_no_pytest_is_an_exit_status_gate(
        tmp_path):
    # the gate's own PYTEST_PLUGINS keeps the engine's reporter out
    status, summary, out = gate(tmp_path, {"tests/test_b.py": PASSING}, "PYTEST_PLUGINS= python -m pytest -q")
    assert status == 0 and summary is None, out
    failure, why = test_reports.judge("PYTEST_PLUGINS= python -m pytest -q", status, summary)
    assert failure == "runner_incomplete" and "recorded no session" in why
    status, summary, out = gate(tmp_path, {}, "echo lint ok")
    assert (status, summary) == (0, None) and test_reports.judge("echo lint ok", 0, None) == ("", "")
    assert "exit-status gate" in test_reports.sentence(None)


@pytest.mark.slow  # each runs a real pytest (a second or two)
def test_a_failing_suite_keeps_its_exit_status_and_names_its_failures(tmp_path):
    status, summary, _ = gate(tmp_path, {"tests/test_b.py": "def test_bad():\n    assert 0\n\n\n" + PASSING})
    assert status == 1 and test_reports.judge("python -m pytest -q", status, summary) == ("", "")
    assert summary["counts"]["failed"] == 1 and summary["failed_ids"] == ["tests/test_b.py::test_bad"]


@pytest.mark.slow  # each runs a real pytest (a second or two)
def test_collect_only_runs_nothing_and_passes(tmp_path):
    status, summary, out = gate(tmp_path, {"tests/test_b.py": PASSING}, "python -m pytest -q --collect-only")
    assert status == 0 and test_reports.judge("python -m pytest", status, summary) == ("", ""), (out, summary)


@pytest.mark.slow  # each runs a real pytest (a second or two)
def test_a_test_that_runs_pytest_itself_does_not_write_into_the_gate_s_record(tmp_path):
    inner = ("import subprocess, sys\n\n\ndef test_runs_an_inner_failing_suite(tmp_path):\n"
             "    (tmp_path / 'test_inner.py').write_text('def test_x():\\n    assert 0\\n')\n"
             "    done = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', "
             "str(tmp_path)], capture_output=True, text=True)\n"
             "    assert done.returncode == 1, done.stdout\n")
    status, summary, out = gate(tmp_path, {"tests/test_b.py": inner})
    assert status == 0, out
    assert test_reports.judge("python -m pytest -q", status, summary) == ("", "")
    assert summary["sessions"] == 1 and summary["counts"]["passed"] == 1 and summary["counts"]["failed"] == 0


@pytest.mark.slow  # each runs a real pytest (a second or two)
def test_two_sessions_of_one_gate_must_both_finish(tmp_path):
    files = {"tests/test_b.py": PASSING, "other/test_c.py": "import os\nos._exit(0)\n"}
    status, summary, out = gate(tmp_path, files, "python -m pytest -q tests && python -m pytest -q other")
    assert status == 0 and summary["sessions"] == 2, (out, summary)
    assert test_reports.judge("python -m pytest -q tests", status, summary)[0] == "runner_incomplete"


def test_a_record_with_lines_the_reporter_did_not_write_is_not_trusted(tmp_path):
    record = tmp_path / "record.jsonl"
    record.write_text(json.dumps({"e": "start", "pid": 7}) + "\nnot json\n" + json.dumps({"e": "finish", "pid": 7,
                                                                                         "status": 0}) + "\n")
    failure, why = test_reports.judge("pytest", 0, test_reports.read(record))
    assert failure == "runner_incomplete" and "did not write" in why


def test_the_reporter_s_module_name_is_new_for_each_gate(tmp_path):
    first, second = test_reports.prepare(tmp_path, tmp_path), test_reports.prepare(tmp_path, tmp_path)
    assert first.module != second.module and first.record != second.record
    assert (first.folder / f"{first.module}.py").read_text() == test_reports.PLUGIN_SOURCE.read_text()
    env = first.env({"PYTHONPATH": "/x", "PYTEST_PLUGINS": "theirs"})
    assert env["PYTHONPATH"] == f"{first.folder}:/x" and env["PYTEST_PLUGINS"] == f"{first.module},theirs"


@pytest.mark.parametrize("command, runs", [
    ("python -m pytest -q", True), ("pytest", True), ("/opt/venv/bin/py.test -x", True), ("uv run pytest", True),
    ("cd sub && PYTHONHASHSEED=0 pytest tests", True), ("timeout 600 pytest", True), ("make test", False),
    ("pip show pytest", False), ("echo pytest", False), ("python -m unittest", False),
])
def test_which_commands_run_pytest(command, runs):
    assert test_reports.runs_pytest(command) is runs


@pytest.mark.slow  # each runs a real pytest (a second or two)
def test_the_agreed_files_run_apart_from_the_others(tmp_path):
    files = {"tests/test_agreed.py": "from app import core\n\n\ndef test_answer():\n    assert core.answer() == 42\n",
             "tests/test_aaa_new.py": "from app import core\n\ncore.answer = lambda: 42\n\n\ndef test_new():\n"
                                      "    pass\n",
             "app/__init__.py": "", "app/core.py": "def answer():\n    return 0\n"}
    status, summary, out = gate(tmp_path / "together", files)
    assert status == 0, out  # in one process the new module's patch makes the agreed test pass
    status, summary, out = gate(tmp_path / "only", files, apart=("only", ["tests/test_agreed.py"]))
    assert status == 1 and summary["apart"] == "only" and summary["failed_ids"] == ["tests/test_agreed.py::test_answer"]
    status, summary, out = gate(tmp_path / "except", files, apart=("except", ["tests/test_agreed.py"]))
    assert status == 0 and summary["collected"] == 1 and summary["counts"]["passed"] == 1, out
    # an invocation of the new tests that finds none exits 0, and its record says so
    status, summary, out = gate(tmp_path / "none", files, apart=("except", ["tests/test_agreed.py",
                                                                           "tests/test_aaa_new.py"]))
    assert status == 0 and summary["collected"] == 0 and summary["statuses"] == [0], out
    assert test_reports.judge("python -m pytest", status, summary) == ("", "")


# ----------------------------------------------------------------------------- python -m unittest

UT = "python -m unittest discover -s tests -t ."
UT_PASSING = ("import unittest\n\n\nclass TestA(unittest.TestCase):\n    def test_one(self):\n        self.assertEqual(1, 1)\n\n"
              "    @unittest.skip('later')\n    def test_later(self):\n        pass\n\n"
              "    @unittest.expectedFailure\n    def test_known(self):\n        self.assertEqual(1, 2)\n\n"
              "    def test_subtests(self):\n        for n in range(2):\n            with self.subTest(n=n):\n"
              "                self.assertEqual(n, n)\n")


@pytest.mark.parametrize("command, runner", [
    ("python -m unittest", "unittest"), ("python3 -munittest discover -s tests", "unittest"),
    ("cd x && python -m unittest -v tests.test_a", "unittest"), ("python -m pytest -q", "pytest"),
    ("python3 -X dev -W error -m unittest", "unittest"), ("python -c 'import x' -m unittest", None),
    ("pip show unittest", None), ("python -m mypkg unittest", None), ("make test", None)])
def test_which_commands_run_unittest(command, runner):
    assert test_reports.runner_of(command) == runner


@pytest.mark.slow  # each runs a real python -m unittest
def test_unittest_records_each_outcome_with_pytest_style_ids(tmp_path):
    status, summary, out = gate(tmp_path, {"tests/__init__.py": "", "tests/test_a.py": UT_PASSING}, UT)
    assert status == 0, out
    assert summary["runner"] == "unittest" and summary["finished"] == 1 and summary["statuses"] == [0]
    assert summary["counts"] == {"passed": 2, "failed": 0, "error": 0, "skipped": 1, "xfailed": 1, "xpassed": 0}
    assert test_reports.judge(UT, status, summary) == ("", "")
    record = test_reports.parse(next(tmp_path.glob("home/.cp-tests-*.jsonl")))
    assert sorted(record.outcomes) == ["tests/test_a.py::TestA::test_known", "tests/test_a.py::TestA::test_later",
                                       "tests/test_a.py::TestA::test_one", "tests/test_a.py::TestA::test_subtests"]
    assert "unittest recorded 4 collected test(s): 2 passed, 1 skipped, 1 xfailed" in test_reports.sentence(summary)


@pytest.mark.slow  # each runs a real python -m unittest
@pytest.mark.parametrize("files, kind", [
    # os._exit(0) in a test: unittest's session never finishes
    ({"tests/test_b.py": "import os, unittest\n\n\nclass TestB(unittest.TestCase):\n    def test_b(self):\n"
                         "        os._exit(0)\n"}, "runner_incomplete"),
    # a failing subtest, and an atexit handler that turns the status 1 into 0
    ({"tests/test_b.py": "import atexit, os, unittest\n\natexit.register(os._exit, 0)\n\n\n"
                         "class TestB(unittest.TestCase):\n    def test_b(self):\n        for n in range(2):\n"
                         "            with self.subTest(n=n):\n                self.assertEqual(n, 0)\n"}, "tests_failed"),
], ids=["exit-in-test", "atexit-after-failed-subtest"])
def test_unittest_that_ends_early_with_0_fails(tmp_path, files, kind):
    status, summary, out = gate(tmp_path, {"tests/__init__.py": "", "tests/test_a.py": UT_PASSING, **files}, UT)
    assert status == 0, out  # what an exit-status gate would have passed
    assert test_reports.judge(UT, status, summary)[0] == kind, summary


@pytest.mark.slow  # each runs a real python -m unittest
def test_unittest_with_no_record_fails_and_the_collect_only_mode_runs_nothing(tmp_path):
    assert test_reports.judge(UT, 0, None)[0] == "runner_incomplete"
    files = {"tests/__init__.py": "", "tests/test_a.py": UT_PASSING,
             "tests/test_boom.py": "import unittest\n\n\nclass TestBoom(unittest.TestCase):\n    def test_boom(self):\n"
                                   "        raise SystemExit('ran')\n"}
    status, summary, out = gate(tmp_path, files, "CP_TEST_COLLECT_ONLY=1 " + UT)
    record = test_reports.parse(next(tmp_path.glob("home/.cp-tests-*.jsonl")))
    assert status == 0 and not record.outcomes and "ran" not in out, out
    assert len(record.listed) == 5 and record.marked == {"tests/test_a.py::TestA::test_later",
                                                         "tests/test_a.py::TestA::test_known"}


@pytest.mark.slow  # each runs a real python -m unittest
def test_unittest_runs_the_agreed_files_apart_without_importing_the_others(tmp_path):
    """A new module that patches what the agreed test calls is not even imported in the agreed part."""
    files = {"tests/__init__.py": "", "app.py": "def answer():\n    return 0\n",
             "tests/test_core.py": "import unittest\n\nimport app\n\n\nclass TestCore(unittest.TestCase):\n"
                                   "    def test_answer(self):\n        self.assertEqual(app.answer(), 42)\n",
             "tests/test_aaa.py": "import app\n\napp.answer = lambda: 42\n"}
    status, summary, out = gate(tmp_path, files, UT)
    assert status == 0, out  # together, the patch makes the agreed test pass
    status, summary, out = gate(tmp_path / "apart", files, UT, apart=("only", ["tests/test_core.py"]))
    assert status == 1 and summary["failed_ids"] == ["tests/test_core.py::TestCore::test_answer"], out
    assert summary["apart"] == "only"
    status, summary, out = gate(tmp_path / "rest", files, UT, apart=("except", ["tests/test_core.py"]))
    assert status == 0 and summary["collected"] == 0 and summary["apart"] == "except", out


@pytest.mark.slow  # each runs a real python -m unittest
def test_unittest_s_agreed_part_imports_no_package_without_agreed_files(tmp_path):
    """unittest's discovery imports every package's __init__.py it walks: in the agreed part, a new package
    that holds none of the agreed files is not walked, so its __init__.py cannot patch what they call."""
    files = {"tests/__init__.py": "", "app.py": "def answer():\n    return 0\n",
             "tests/test_core.py": "import unittest\n\nimport app\n\n\nclass TestCore(unittest.TestCase):\n"
                                   "    def test_answer(self):\n        self.assertEqual(app.answer(), 42)\n",
             "tests/zz/__init__.py": "import app\n\napp.answer = lambda: 42\n"}
    status, summary, out = gate(tmp_path, files, UT)
    assert status == 0, out  # in one invocation, the package's patch makes the agreed test pass
    status, summary, out = gate(tmp_path / "apart", files, UT, apart=("only", ["tests/test_core.py"]))
    assert status == 1 and summary["failed_ids"] == ["tests/test_core.py::TestCore::test_answer"], out


@pytest.mark.slow  # each runs a real python -m unittest
def test_a_skip_inside_a_subtest_is_its_test_s_skip(tmp_path):
    files = {"tests/__init__.py": "", "tests/test_a.py":
             "import unittest\n\n\nclass TestA(unittest.TestCase):\n    def test_sub(self):\n        for n in range(2):\n"
             "            with self.subTest(n=n):\n                raise unittest.SkipTest('later')\n"}
    status, summary, out = gate(tmp_path, files, UT)
    record = test_reports.parse(next(tmp_path.glob("home/.cp-tests-*.jsonl")))
    assert status == 0 and record.outcomes == {"tests/test_a.py::TestA::test_sub": "skipped"}, (out, record.outcomes)
    assert summary["unreported"] == 0
