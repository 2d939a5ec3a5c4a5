"""The step protocol run in this process (no worker): the run's environment, gate outcomes, late results."""
import json
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from engine import operations, runner
from engine.models import Attempt, Check, Run, RunEvent

from .conftest import ANSWER_STEP
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)


ENV_GATE = ('test "$TMPDIR" = "$CP_TMP_DIR" && test -d "$CP_DATA_DIR" && test -d "$TMPDIR" '
            '&& test "$CP_PORT_COUNT" -gt 0 && test "$CP_PORT_BASE" -ge 1024 && test "$CP_WORKTREE" = "$PWD" '
            '&& test -z "${DJANGO_SETTINGS_MODULE:-}" && test -z "${DATABASE_URL:-}" '
            '&& test -z "${CELERY_BROKER_URL:-}" && test "$GIT_TERMINAL_PROMPT" = 0 '
            '&& echo "$CP_RUN_ID $CP_PORT_BASE $CP_DATA_DIR" > "$CP_DATA_DIR/seen"')


@pytest.mark.pipeline
def test_each_run_gets_its_own_folders_and_ports(make_pipeline, repo, sent, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/x")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "controlpanel.test_settings")
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"], "gates": [{"name": "env", "command": ENV_GATE}]}]
    pipeline = make_pipeline(stages=stages)
    seen = []
    for _ in range(2):
        run = operations.create_run(pipeline, str(repo), "main")
        operations.request_start(run, requested_by="t", source="test")
        run = drive(run.pk, sent)
        assert run.status == "succeeded", run.stop_message
        data_dir = Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}" / "data"
        seen.append((data_dir / "seen").read_text().split())
        assert not str(data_dir).startswith(run.worktree)
    (run_a, port_a, dir_a), (run_b, port_b, dir_b) = seen
    assert run_a != run_b and port_a != port_b and dir_a != dir_b
    assert abs(int(port_a) - int(port_b)) >= settings.CP_PORT_SPAN


@pytest.mark.pipeline
def test_a_gate_past_its_deadline_fails_as_timeout(make_pipeline, repo, sent):
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
               "gates": [{"name": "slow", "command": "sleep 30", "deadline": 1}], "repair_allowance": 0}]
    run = operations.create_run(make_pipeline(stages=stages), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    started = time.monotonic()
    run = drive(run.pk, sent)
    assert time.monotonic() - started < 20
    check = Check.objects.get(run=run)
    assert check.failure_kind == "timeout" and not check.passed and check.exit_code is None
    assert run.stop_reason == "gate_failed" and "deadline" in run.stop_message


@pytest.mark.pipeline
def test_a_killed_gate_fails(make_pipeline, repo, sent):
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
               "gates": [{"name": "suicide", "command": "kill -9 $$"}], "repair_allowance": 0}]
    run = operations.create_run(make_pipeline(stages=stages), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    check = Check.objects.get(run=run)
    assert check.signal == 9 and check.exit_code is None and not check.passed and check.failure_kind == "killed"
    assert run.status == "waiting_review"


def test_a_result_after_the_lease_is_lost_is_stored_as_late(make_pipeline, repo, sent, settings):
    """A step whose lease is taken over (a reconciler, an operator) stops its agent; its result changes nothing."""
    settings.CP_HEARTBEAT_INTERVAL = 0.2
    slow = {"stages": {"answer": {"implement": [{"print": "working", "sleep": 20}]}}}
    run = operations.create_run(make_pipeline(scenario=slow), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")

    def take_over():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if Attempt.objects.filter(run=run, status="running").exclude(pid=None).exists():
                break
            time.sleep(0.1)
        Run.objects.filter(pk=run.pk).update(lease_token="taken-over", lease_owner="someone-else")
        connection.close()

    thief = threading.Thread(target=take_over)
    thief.start()
    started = time.monotonic()
    run_id, token = sent.pop(0)
    assert runner.advance(run_id, token) == "late"
    thief.join()
    assert time.monotonic() - started < 15  # the 20 s agent was stopped, not waited for
    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.lease_token, run.lease_owner) == ("running", "taken-over", "someone-else")
    attempt = Attempt.objects.get(run=run)
    assert attempt.late and attempt.status == "cancelled"
    assert run.stages.get().phase == "implement"  # nothing moved on
    assert RunEvent.objects.filter(run=run, kind="late_result").exists()
    assert sent == []  # and nothing was enqueued


@pytest.mark.pipeline
def test_status_json_contract(make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    data = operations.run_status(drive(run.pk, sent))
    json.dumps(data)
    for key in ("id", "status", "simulated", "commit", "branch", "worktree", "stop_reason", "stop_message", "stages"):
        assert key in data
    stage = data["stages"][0]
    for key in ("key", "status", "checkpoint", "attempts", "checks"):
        assert key in stage
    attempt = stage["attempts"][0]
    for key in ("operation", "number", "status", "adapter", "exit_code", "elapsed_seconds", "usage", "failure_kind",
                "prompt", "log", "patch"):
        assert key in attempt
    assert Path(attempt["prompt"]).is_file() and Path(attempt["log"]).is_file() and Path(attempt["patch"]).is_file()
    check = stage["checks"][0]
    for key in ("name", "command", "exit_code", "passed", "log", "manifest"):
        assert key in check
    assert check["passed"] is True and check["exit_code"] == 0 and Path(check["log"]).is_file()


@pytest.mark.parametrize("command, status, kind", [("echo from the command; exit 0", "succeeded", ""),
                                                    ("echo from the command; exit 3", "failed", "crashed")])
@pytest.mark.pipeline
def test_a_scenario_command_gives_the_agent_its_output_and_status(make_pipeline, repo, sent, command, status,
                                                                    kind):
    step = {**ANSWER_STEP, "run": ["sh", "-c", command]}
    run = operations.create_run(make_pipeline(scenario={"stages": {"answer": {"implement": [step]}}}), str(repo),
                                "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert (attempt.status, attempt.failure_kind) == (status, kind)
    assert "from the command" in (Path(settings.VAR_DIR) / attempt.log_path).read_text()


@pytest.mark.pipeline
def test_an_attempt_that_never_launched_says_why_in_its_log(make_pipeline, repo, sent):
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"], "docs": ["docs/MISSING.md"],
               "gates": [{"name": "unit", "command": "true"}]}]
    run = operations.create_run(make_pipeline(stages=stages), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.stop_reason == "missing_file" and "docs/MISSING.md" in run.stop_message
    attempt = Attempt.objects.get(run=run)
    assert attempt.pid is None
    assert "not launched: missing_file" in (Path(settings.VAR_DIR) / attempt.log_path).read_text()


@pytest.mark.pipeline
def test_an_implementer_writing_outside_its_scope_stops_the_run(make_pipeline, repo, sent):
    step = {"write": {**ANSWER_STEP["write"], "README.md": "rewritten by the agent\n", "app/sub/x.py": "ok\n"}}
    run = operations.create_run(make_pipeline(scenario={"stages": {"answer": {"implement": [step]}}}), str(repo),
                                "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "waiting_review" and run.stop_reason == "scope_violation"
    assert run.stop_evidence["outside"] == ["README.md"]
    attempt = Attempt.objects.get(run=run)
    patch = (Path(settings.VAR_DIR) / attempt.patch_path).read_text()
    assert "rewritten by the agent" in patch  # the diff is kept
    assert not Check.objects.filter(run=run).exists()  # no gate ran on out-of-scope work


def test_scope_globs():
    """gitignore patterns (engine/checks/globs.py): an unanchored name matches at any depth, "/" anchors."""
    from engine.checks.globs import matches, outside

    assert matches("app/a/b.py", ["app/**"]) and matches("app/x", ["app/"]) and not matches("apps/x", ["app/**"])
    assert matches("README.md", ["*.md"]) and matches("docs/a.md", ["*.md"])
    assert matches("README.md", ["/*.md"]) and not matches("docs/a.md", ["/*.md"])
    assert matches("docs/a.md", ["**/*.md"]) and matches("a.md", ["**/*.md"])
    assert outside(["app/x.py", "tests/t.py", "setup.py"], ["app/**", "tests/**"]) == ["setup.py"]


@pytest.mark.pipeline
def test_c10_an_agent_waiting_for_a_person_fails_fast_as_interactive_prompt(make_pipeline, repo, sent):
    ask = ("import sys; print('Do you want to continue? [Y/n]', flush=True); "
           "answer = sys.stdin.readline(); sys.exit(0 if answer.strip() == 'y' else 1)")
    step = {"run": ["python3", "-c", ask]}
    pipeline = make_pipeline(scenario={"stages": {"answer": {"implement": [step]}}}, deadlines={"implement": 600})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    started = time.monotonic()
    run = drive(run.pk, sent)
    assert time.monotonic() - started < 10
    attempt = Attempt.objects.get(run=run)
    assert attempt.status == "failed" and attempt.failure_kind == "interactive_prompt"
    assert run.stop_reason == "interactive_prompt" and "Do you want to continue" in run.stop_message


@pytest.mark.pipeline
def test_files_a_gate_writes_outside_the_scope_never_reach_a_checkpoint(make_pipeline, repo, sent):
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
               "gates": [{"name": "unit", "command": "python -m pytest -q | tee gate.log"}]}]
    run = operations.create_run(make_pipeline(stages=stages), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "waiting_review" and run.stop_reason == "scope_violation"
    assert run.stop_evidence["outside"] == ["gate.log"] and "gate" in run.stop_message
    assert not run.stages.get().checkpoint_commit


@pytest.mark.pipeline
def test_an_agent_that_relinks_the_worktrees_git_stops_the_run_before_any_git_runs(make_pipeline, repo, sent,
                                                                                  tmp_path):
    evil = tmp_path / "evil.git"
    step = {"run": ["sh", "-c", f"git init -q --bare {evil} && echo 'gitdir: {evil}' > .git"]}
    run = operations.create_run(make_pipeline(scenario={"stages": {"answer": {"implement": [step]}}}), str(repo),
                                "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    # the sandbox binds the worktree's .git file read-only: the rewrite fails and nothing points elsewhere
    assert run.status == "waiting_review" and run.stop_reason in ("workspace_tampered", "crashed"), run.stop_message
    assert "evil.git" not in Path(run.worktree, ".git").read_text()
    assert not Check.objects.filter(run=run).exists()
