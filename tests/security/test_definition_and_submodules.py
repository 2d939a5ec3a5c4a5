"""A run's frozen definition rewritten in the database between steps, and an agent's
``.gitmodules`` pointing the final verification at a repository the agent cannot read (issue:
"Database takeover", "Final verification")."""
from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from engine import machine, operations, runner
from engine.models import Attempt, Check, Run

from ..conftest import ANSWER_STEP, git, make_repo
from ..support.runs import drive
from .attacks import QUICK_STAGE

pytestmark = pytest.mark.django_db(transaction=True)


def weaken(run_id: int, *, digest_too: bool = False) -> Run:
    """What a process that reached the database would do: weaken the frozen gate to ``true``
    (and, with ``digest_too``, write the new digest into the row as well)."""
    row = Run.objects.get(pk=run_id)
    definition = row.definition
    definition["pipeline"]["stages"][0]["gates"][0]["command"] = "true"
    fields = {"definition": definition}
    if digest_too:
        fields["definition_sha256"] = machine.definition_digest(definition)
    Run.objects.filter(pk=run_id).update(**fields)
    return row


STAGE = {**QUICK_STAGE, "gates": [{"name": "unit", "command": "python -m pytest -q"}]}


def test_a_definition_edited_between_steps_fails_the_run_before_anything_launches(make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(stages=[STAGE]), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run_id, token = sent.pop(0)
    assert runner.advance(run_id, token) == "implement"
    row = weaken(run_id)
    run = drive(run_id, sent)
    assert run.status == "failed" and run.stop_reason == "definition_tampered", run.stop_message
    assert run.stop_evidence["row_sha256"] == row.definition_sha256
    assert run.stop_evidence["control_record_sha256"] == row.definition_sha256
    assert not Check.objects.filter(run=run).exists()  # the verify step never ran
    assert Attempt.objects.filter(run=run).count() == 1
    assert not run.decisions.filter(state="pending").exists()  # nothing to recover: a new run is needed


@pytest.mark.parametrize("digest_too", [False, True], ids=["definition", "definition-and-digest"])
def test_a_definition_edited_before_the_first_step_fails_the_run(make_pipeline, repo, sent, digest_too):
    """Before any stage started, and also when the row's digest is rewritten to match: the control
    record ``definition.sha256`` (out of every agent's reach) is the authority."""
    run = operations.create_run(make_pipeline(stages=[STAGE]), str(repo), "main")
    weaken(run.pk, digest_too=digest_too)
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "failed" and run.stop_reason == "definition_tampered", (run.status, run.stop_message)
    assert not Attempt.objects.filter(run=run).exists() and not Check.objects.filter(run=run).exists()


@pytest.mark.slow
def test_the_final_verification_never_fetches_from_an_agents_gitmodules(make_pipeline, tmp_path, sent):
    secret = "contents-the-agent-may-not-read-5b1f"
    hidden = make_repo(tmp_path / "hidden-repo", {"SECRET.txt": secret + "\n"})
    lib = make_repo(tmp_path / "lib", {"lib.txt": "lib\n"})
    repo = make_repo(tmp_path / "origin", {"app/__init__.py": "", "app/core.py": '"""Core."""\n',
                                           "docs/PLAN.md": "# Plan\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(repo, "commit", "-qm", "submodule")
    modules = Path(repo, ".gitmodules").read_text().replace(str(lib), str(hidden))
    assert str(hidden) in modules
    step = {**ANSWER_STEP, "write": {**ANSWER_STEP["write"], ".gitmodules": modules}}
    stage = {**QUICK_STAGE, "scope": ["app/**", ".gitmodules"],
             "gates": [{"name": "unit", "command": "cat vendor/lib/* || true"}]}
    run = operations.create_run(make_pipeline(stages=[stage], scenario={"stages": {"answer": {"implement": [step]}}}),
                                str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.stop_reason == "nested_repository", (run.status, run.stop_message)
    assert ".gitmodules" in run.stop_message and "fetched nothing" in run.stop_message
    for check in Check.objects.filter(run=run):
        assert secret not in (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert not Check.objects.filter(run=run, kind="final").exists()
    assert not list(Path(settings.VAR_DIR).rglob("SECRET.txt"))


def test_a_final_check_cannot_rewrite_what_the_next_final_check_tests(make_pipeline, tmp_path, sent):
    """Stage two breaks stage one's result and its code, run by the first final check, rewrites
    stage one's protected check and leaves an ignored helper: each final check runs on a fresh
    checkout of the checkpoint, so stage one's check still tests the committed files and the run
    does not succeed (a fresh-eyes tester had it succeed with the regression)."""
    repo = make_repo(tmp_path / "origin", {
        "app.py": "def value():\n    return 1\n", "docs/PLAN.md": "# Plan\n",
        "check_one.py": "import app\nassert app.value() == 1, app.value()\nprint('check_one ok')\n"})
    breaker = ("import os\n\ndef value():\n    return 999\n\n"
               "if os.environ.get('CP_STAGE') == 'final':\n"
               "    open('check_one.py', 'w').write(\"print('check_one ok (rewritten)')\\n\")\n"
               "    open('planted.txt', 'w').write('left by an earlier final check')\n")
    stages = [{"key": "one", "requirement": "r", "scope": ["notes.txt"],
               "gates": [{"name": "one", "command": "python check_one.py"},
                         {"name": "clean", "command": "test ! -e planted.txt"}]},
              {"key": "two", "requirement": "r", "scope": ["app.py"], "gates": [{"name": "two", "command": "true"}]}]
    scenario = {"stages": {"one": {"implement": [{"write": {"notes.txt": "n\n"}}]},
                           "two": {"implement": [{"write": {"app.py": breaker}}]}}}
    pipeline = make_pipeline(stages=stages, scenario=scenario, protected_paths=["check_*.py"],
                             baseline_checks=[{"name": "smoke", "command": "python -c 'import app'"}])
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status != "succeeded" and run.stop_reason == "final_verification_failed", run.stop_message
    final = {c.name: c for c in Check.objects.filter(run=run, kind="final")}
    assert not final["one"].passed and final["clean"].passed
    # the rewrite itself is refused too: protected files are read-only while a check runs
    assert "Read-only file system" in (Path(settings.VAR_DIR) / final["smoke"].log_path).read_text()
    assert "check_one ok (rewritten)" not in (Path(settings.VAR_DIR) / final["one"].log_path).read_text().splitlines()


def test_a_gates_own_command_cannot_rewrite_a_protected_test_before_it_runs(make_pipeline, tmp_path, sent):
    """The gate runs the agent's helper first, which rewrites the protected test to pass and to put
    itself back once read (out of every manifest's sight): protected files are bound read-only
    while gates run, so the rewrite fails and the real test fails the gate (a fresh-eyes tester
    had such a run succeed with a regression)."""
    original = "from app.core import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    repo = make_repo(tmp_path / "origin", {"app/__init__.py": "", "app/core.py": "def add(a, b):\n    return a + b\n",
                                           "tests/test_core.py": original, "docs/PLAN.md": "# Plan\n"})
    weakened = f"import pathlib; pathlib.Path(__file__).write_text({original!r})\ndef test_add():\n    pass\n"
    helper = f"import pathlib\npathlib.Path('tests/test_core.py').write_text({weakened!r})\n"
    step = {"write": {"app/core.py": "def add(a, b):\n    return a - b\n", "app/selfcheck.py": helper}}
    gate = "python app/selfcheck.py || true; python -m pytest -q -p no:cacheprovider tests/test_core.py"
    stage = {**QUICK_STAGE, "gates": [{"name": "unit", "command": gate}]}
    pipeline = make_pipeline(stages=[stage], protected_paths=["tests/test_*.py"],
                             scenario={"stages": {"answer": {"implement": [step]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status != "succeeded", run.stop_message
    check = Check.objects.filter(run=run, name="unit").order_by("id").first()
    log = (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert not check.passed and "Read-only file system" in log and "1 failed" in log, log
    assert Path(run.worktree, "tests", "test_core.py").read_text() == original
