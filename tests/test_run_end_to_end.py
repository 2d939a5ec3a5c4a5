"""Runs carried out by real Celery worker processes on real git repositories and real gates."""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.models import Attempt, Check, Run

from .conftest import ANSWER_STEP, PYTEST_INI, git, make_repo, new_log_text, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOUBLE_STEP = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 42\n\n\n'
                                        'def double():\n    return 2 * answer()\n',
                         "tests/test_double.py": "from app import core\n\n\ndef test_double():\n"
                                                 "    assert core.double() == 84\n"}}
WRONG_STEP = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 41\n'}}

TWO_STAGES = [
    {"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
     "gates": [{"name": "unit", "command": "python -m pytest -q tests/test_core.py"}]},
    {"key": "double", "requirement": "Add app.core.double() returning twice the answer, with a test.",
     "scope": ["app/**", "tests/**"], "depends_on": ["answer"],
     "gates": [{"name": "all", "command": "python -m pytest -q"}]},
]


#: The default stage with no repairs allowed: a failed gate stops the run at once (gate_failed).
NO_REPAIR = [{"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
              "gates": [{"name": "unit", "command": "python -m pytest -q"}], "repair_allowance": 0}]


def start(run):
    operations.request_start(run, requested_by="test", source="test")
    return wait_for(run.pk)


def test_two_stages_run_through_a_real_worker(workers, make_pipeline, repo):
    scenario = {"stages": {"answer": {"implement": [ANSWER_STEP]}, "double": {"implement": [DOUBLE_STEP]}}}
    pipeline = make_pipeline(name="two", stages=TWO_STAGES, scenario=scenario)
    (repo / "untracked.txt").write_text("not included\n")
    before = (git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD"), git(repo, "rev-parse", "main"))
    run = operations.create_run(pipeline, str(repo), "main")
    run = start(run)
    data = operations.run_status(run)
    assert data["status"] == "succeeded", data["stop_message"]
    first, second = data["stages"]
    assert first["status"] == second["status"] == "passed"
    assert first["base_commit"] == run.commit
    assert second["base_commit"] == first["checkpoint"]
    commits = git(repo, "rev-list", f"{run.commit}..{run.branch}").split()
    assert commits == [second["checkpoint"], first["checkpoint"]]
    # the checkpoint holds exactly the files the gates tested
    for stage in (first, second):
        tree = git(repo, "rev-parse", f"{stage['checkpoint']}^{{tree}}").strip()
        assert stage["accepted_manifest"] == tree
        assert all(c["manifest"] == tree and c["passed"] and c["exit_code"] == 0 for c in stage["checks"]
                   if c["kind"] not in ("final", "start"))  # a start check collects the agreed tests: no files
        assert [a["operation"] for a in stage["attempts"]] == ["implement", "review", "document"]
        assert all(a["simulated"] for a in stage["attempts"])
    # and the whole result was verified again on the final checkpoint
    final_tree = git(repo, "rev-parse", f"{second['checkpoint']}^{{tree}}").strip()
    finals = [c for stage in (first, second) for c in stage["checks"] if c["kind"] == "final"]
    assert [(c["name"], c["passed"], c["manifest"]) for c in finals] == [("unit", True, final_tree),
                                                                        ("all", True, final_tree)]
    assert "def double" in git(repo, "show", f"{second['checkpoint']}:app/core.py")
    message = git(repo, "log", "-1", "--format=%B", first["checkpoint"])
    assert "Control-Panel-Journal:" in message
    # the second stage was told what the first one produced
    prompt = Path(second["attempts"][0]["prompt"]).read_text()
    assert "Accepted output of the stages this one depends on" in prompt
    assert first["checkpoint"] in prompt and "app/core.py" in prompt
    assert "Make app.core.answer() return 42." not in prompt
    assert "One stage: answer." in prompt  # the master plan
    # each stage keeps its own evidence, and every recorded digest matches its file
    prompts = [Path(stage["attempts"][0]["prompt"]) for stage in (first, second)]
    assert prompts[0] != prompts[1] and "One stage" in prompts[0].read_text()
    for stage in (first, second):
        attempt = stage["attempts"][0]
        assert hashlib.sha256(Path(attempt["prompt"]).read_bytes()).hexdigest() == attempt["prompt_sha256"]
        assert hashlib.sha256(Path(attempt["patch"]).read_bytes()).hexdigest() == attempt["patch_sha256"]
    attempt = first["attempts"][0]
    assert attempt["usage"]["input_tokens"] == 10 and attempt["usage"]["cost_usd"] is None
    assert "writing app/core.py" in Path(attempt["log"]).read_text()
    # the original checkout is untouched
    assert (git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD"),
            git(repo, "rev-parse", "main")) == before
    assert git(repo, "branch", "--list", "--format=%(refname:short)").split() == [run.branch, "main"]
    assert "DoesNotExist" not in new_log_text(workers)


def test_a_failing_gate_stops_the_run_naming_the_gate(workers, make_pipeline, repo):
    pipeline = make_pipeline(stages=NO_REPAIR, scenario={"stages": {"answer": {"implement": [WRONG_STEP]}}})
    run = start(operations.create_run(pipeline, str(repo), "main"))
    assert run.status == "waiting_review"
    assert run.stop_reason == "gate_failed"
    assert "'unit'" in run.stop_message and "exited 1" in run.stop_message
    check = Check.objects.get(run=run, kind="gate")
    assert (check.exit_code, check.passed, check.name) == (1, False, "unit")
    assert run.stop_evidence == {"check": check.pk, "gate": "unit", "manifest": check.manifest_digest}
    assert "assert 41 == 42" in (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert not run.stages.get().checkpoint_commit
    assert git(repo, "rev-list", "--count", f"{run.commit}..{run.branch}").strip() == "0"
    assert Path(run.worktree).is_dir()  # kept for inspection
    assert run.decisions.get().reason == "gate_failed"


def test_a_gate_command_that_does_not_exist_fails_with_that_said(workers, make_pipeline, repo):
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
               "gates": [{"name": "lint", "command": "no-such-linter --strict"}], "repair_allowance": 0}]
    run = start(operations.create_run(make_pipeline(stages=stages), str(repo), "main"))
    assert run.status == "waiting_review" and run.stop_reason == "gate_failed"
    check = Check.objects.get(run=run, kind="gate")
    assert check.exit_code == 127 and check.failure_kind == "command_not_found" and not check.passed
    assert "command not found" in run.stop_message


@pytest.mark.parametrize("command", ["python -m pytest -q | tee gate.log", "python -m pytest -q; echo done"])
def test_c24_a_pipe_or_a_trailing_command_cannot_hide_a_failure(workers, make_pipeline, repo, command):
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
               "gates": [{"name": "tests", "command": command}], "repair_allowance": 0}]
    pipeline = make_pipeline(stages=stages, scenario={"stages": {"answer": {"implement": [WRONG_STEP]}}})
    run = start(operations.create_run(pipeline, str(repo), "main"))
    check = Check.objects.get(run=run, kind="gate")
    assert check.exit_code == 1 and not check.passed
    assert check.argv[:3] == ["bash", "-eo", "pipefail"]
    assert run.status == "waiting_review" and run.stop_reason == "gate_failed"


def worktree_entries(repo) -> list[str]:
    return [line for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]


def test_c01_a_branch_checked_out_elsewhere_stops_before_the_agent(workers, make_pipeline, repo, tmp_path):
    pipeline = make_pipeline()
    run = operations.create_run(pipeline, str(repo), "main")
    other = tmp_path / "other-worktree"
    git(repo, "worktree", "add", "-q", "-b", run.branch, str(other), "main")
    entries_before = git(repo, "worktree", "list", "--porcelain")
    admin_before = sorted(p.name for p in (repo / ".git" / "worktrees").iterdir())
    run = start(run)
    assert run.status == "waiting_review" and run.stop_reason == "workspace_branch_in_use"
    assert str(other) in run.stop_message
    attempt = Attempt.objects.get(run=run)  # one attempt: it stopped before any agent ran
    assert attempt.status == "failed" and attempt.failure_kind == "workspace_branch_in_use"
    assert attempt.pid is None and attempt.exit_code is None and attempt.usage is None
    assert not attempt.patch_path and attempt.result_manifest is None
    assert not Path(run.worktree).exists()
    assert git(repo, "worktree", "list", "--porcelain") == entries_before
    assert sorted(p.name for p in (repo / ".git" / "worktrees").iterdir()) == admin_before
    # once the other worktree is gone, a retry succeeds
    git(repo, "worktree", "remove", str(other))
    decision = run.decisions.get(state="pending")
    operations.recover(run, decision.pk, "removed the other worktree", "retry", reviewer="test")
    run = wait_for(run.pk)
    assert run.status == "succeeded", run.stop_message
    assert [(a.number, a.operation) for a in Attempt.objects.filter(run=run).order_by("number")] == [
        (1, "implement"), (2, "implement"), (3, "review"), (4, "document")]


def test_c02_a_worktree_deleted_outside_git_is_recreated(workers, make_pipeline, repo):
    scenario = {"stages": {"answer": {"implement": [WRONG_STEP, ANSWER_STEP]}}}
    run = start(operations.create_run(make_pipeline(stages=NO_REPAIR, scenario=scenario), str(repo), "main"))
    assert run.stop_reason == "gate_failed"
    shutil.rmtree(run.worktree)
    assert any(line.endswith(run.worktree) for line in worktree_entries(repo))
    operations.recover(run, run.decisions.get(state="pending").pk, "try again", "retry", reviewer="test")
    run = wait_for(run.pk)
    assert run.status == "succeeded", run.stop_message
    assert [line for line in worktree_entries(repo) if line.endswith(run.worktree)] == [f"worktree {run.worktree}"]
    assert len(worktree_entries(repo)) == 2  # the main checkout and this run's worktree


def test_c04_submodules_are_populated_in_the_worktree(workers, make_pipeline, tmp_path):
    lib = make_repo(tmp_path / "lib", {"libmod.py": "VALUE = 7\n"})
    pinned = git(lib, "rev-parse", "HEAD").strip()
    git(lib, "commit", "-q", "--allow-empty", "-m", "later, not pinned")
    repo = make_repo(tmp_path / "origin", {
        "tests/test_lib.py": "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "
                             "'vendor' / 'lib'))\nimport libmod\n\n\ndef test_value():\n    assert libmod.VALUE == 7\n",
        "docs/PLAN.md": "plan\n", "pytest.ini": PYTEST_INI})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(repo / "vendor" / "lib", "checkout", "-q", pinned)
    git(repo, "add", "vendor/lib")
    git(repo, "commit", "-q", "-m", "vendor lib")
    stages = [{"key": "answer", "requirement": "change nothing", "scope": ["app/**"],
               "gates": [{"name": "tests", "command": "python -m pytest -q"}]}]
    pipeline = make_pipeline(stages=stages, scenario={"stages": {"answer": {"implement": [{"print": "nothing"}]}}})
    run = start(operations.create_run(pipeline, str(repo), "main"))
    assert run.status == "succeeded", run.stop_message
    status = git(run.worktree, "submodule", "status")
    assert status.startswith(f" {pinned} vendor/lib"), status
    manifest = json.loads((Path(settings.VAR_DIR) / Attempt.objects.get(run=run, operation="implement").result_manifest.path).read_text())
    assert manifest["changes"] == []
    assert {"path": "vendor/lib", "mode": "160000", "blob": pinned} in manifest["entries"]
    # nothing changed, so the checkpoint is the starting commit itself
    assert run.stages.get().checkpoint_commit == run.commit


def test_two_start_run_processes_one_accepted_one_refused(workers, make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    env = workers.env()
    argv = [sys.executable, "manage.py", "start_run", str(run.pk)]
    procs = [subprocess.Popen(argv, cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [(p.wait(timeout=60), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    refusal = next(err for code, _, err in results if code == 1)
    assert "already_started" in refusal
    run = wait_for(run.pk)
    assert run.status == "succeeded"
    assert Attempt.objects.filter(run=run, operation="implement").count() == 1
    assert Run.objects.get(pk=run.pk).start_request.enqueued_times == 1


@pytest.mark.parametrize("variant", ["commits", "renames"])
def test_c31_an_agent_that_commits_or_renames_its_branch_loses_nothing(workers, make_pipeline, repo, variant):
    """The agent tries to commit (and rename its branch): the sandbox keeps the repository's git
    metadata read-only, so nothing of it lands, and every change it made is in the manifest from
    the base, checkpointed by the engine. (The engine also keeps commits an agent made and stops on a
    moved HEAD, ``head_moved``: engine/workspace.py, tests/test_workspace.py.)"""
    commit_1 = "git add -A; git commit -q -m wip"
    if variant == "renames":
        commit_1 += "; git branch -m renamed-by-agent"
    step = {"write": {**ANSWER_STEP["write"]}, "run": ["sh", "-c", commit_1 + "; echo 'EXTRA = 2' > app/extra.py"]}
    run = start(operations.create_run(make_pipeline(scenario={"stages": {"answer": {"implement": [step]}}}),
                                      str(repo), "main"))
    attempt = Attempt.objects.get(run=run, operation="implement")
    log = (Path(settings.VAR_DIR) / attempt.log_path).read_text()
    assert "Read-only file system" in log or "Unable to create" in log, log
    manifest = json.loads((Path(settings.VAR_DIR) / attempt.result_manifest.path).read_text())
    assert {c["path"] for c in manifest["changes"]} == {"app/core.py", "app/extra.py"}  # both changes, from base
    patch = (Path(settings.VAR_DIR) / attempt.patch_path).read_text()
    assert "return 42" in patch and "EXTRA = 2" in patch
    assert run.status == "succeeded", run.stop_message
    checkpoint = run.stages.get().checkpoint_commit
    assert git(repo, "rev-parse", run.branch).strip() == checkpoint
    assert git(repo, "rev-parse", f"{checkpoint}^").strip() == run.commit  # parent: the recorded base
    assert git(repo, "show", f"{checkpoint}:app/extra.py") == "EXTRA = 2\n"
    assert "renamed-by-agent" not in git(repo, "branch", "--list")
