"""End An Unsuccessful Run: ``fail_run`` stops and reaps the run's processes before it records the
failure, keeps every piece of evidence, and a result that arrives afterwards changes nothing.

The running case uses a real worker process (``Solo``) and a real agent process tree: the
scripted agent starts a grandchild that ignores SIGTERM and leaves its session."""
import io
import os
import time
import uuid
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from engine import operations
from engine.processes import process
from engine.models import Attempt, Run
from engine.operations import OperationError
from engine.steps import process_marker_prefix

from .conftest import ANSWER_STEP, wait_for
from .support.workers import Solo
from .support.runs import QUICK, drive

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reason_is_required_and_names_its_field(make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    for reason in ("", "   ", None):
        with pytest.raises(OperationError) as caught:
            operations.fail_run(run, reason)
        assert (caught.value.code, caught.value.field) == ("reason_required", "reason")
    with pytest.raises(OperationError) as caught:
        operations.fail_run(run, "x" * (operations.MAX_NOTE_CHARS + 1))
    assert (caught.value.code, caught.value.field) == ("reason_too_long", "reason")
    assert Run.objects.get(pk=run.pk).status == "pending"  # nothing changed
    with pytest.raises(OperationError) as caught:
        operations.fail_run(987654, "no such run")
    assert (caught.value.code, caught.value.field) == ("unknown_run", "run")


def test_a_pending_run_fails_at_once_and_a_failed_run_takes_no_action(make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    failed = operations.fail_run(run, "wrong revision chosen", requested_by="alice")
    assert (failed.status, failed.stop_reason) == ("failed", "failed_by_operator")
    assert "alice" in failed.stop_message and "wrong revision chosen" in failed.stop_message
    assert failed.finished_at is not None
    with pytest.raises(OperationError) as caught:
        operations.fail_run(run, "again")
    assert (caught.value.code, caught.value.field) == ("already_finished", "run")
    with pytest.raises(OperationError) as caught:
        operations.request_start(run, requested_by="t", source="test")
    assert caught.value.code == "already_started"
    assert sent == []  # nothing was ever sent to a worker


@pytest.mark.pipeline
def test_a_run_waiting_for_review_fails_and_its_decision_cannot_be_used(make_pipeline, repo, sent):
    stages = [{**QUICK[0], "gates": [{"name": "unit", "command": "false"}]}]
    run = operations.create_run(make_pipeline(stages=stages), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    drive(run.pk, sent)
    run.refresh_from_db()
    assert run.status == "waiting_review"
    decision = run.decisions.get(state="pending")
    operations.fail_run(run, "the requirement was wrong", requested_by="bob")
    run.refresh_from_db()
    assert run.status == "failed"
    decision.refresh_from_db()
    assert decision.state == "superseded"
    with pytest.raises(OperationError) as caught:
        operations.recover(run, decision.pk, "try again", "retry", reviewer="bob")
    assert caught.value.code == "not_waiting_review"
    # the evidence stays: the attempt, its log and the failed check
    attempts = list(Attempt.objects.filter(run=run))
    assert attempts and all(a.status == "succeeded" and (Path(settings.VAR_DIR) / a.log_path).is_file()
                            for a in attempts)
    assert run.checks.filter(passed=False).exists()
    assert run.stages.get().status == "failed"


def test_the_command_needs_a_reason_and_says_what_it_did(make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    with pytest.raises(CommandError) as caught:
        call_command("fail_run", str(run.pk), reason="  ")
    assert "reason_required [reason]" in str(caught.value)
    out = io.StringIO()
    call_command("fail_run", str(run.pk), reason="not needed any more", by="carol", stdout=out)
    assert f"run {run.pk} [simulated]: failed (failed_by_operator)" in out.getvalue()
    with pytest.raises(CommandError) as caught:
        call_command("fail_run", str(run.pk), reason="twice")
    assert "already_finished [run]" in str(caught.value)


def run_processes(run) -> list[psutil.Process]:
    prefix = process_marker_prefix(run)
    found = []
    for proc in psutil.process_iter():
        try:
            if (proc.environ().get(process.MARKER_ENV) or "").startswith(prefix) \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.slow
def test_failing_a_running_attempt_reaps_first_and_a_late_result_changes_nothing(route, make_pipeline, repo,
                                                                                  tmp_path):
    queue = f"fail-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    worker = Solo(tmp_path, queue).start()
    try:
        stubborn = ("trap '' TERM INT; setsid sh -c \"trap '' TERM INT; sleep 300\" & "
                    "echo partial output before the failure; sleep 300")
        scenario = {"stages": {"answer": {"implement": [{**ANSWER_STEP, "run": ["sh", "-c", stubborn]}]}}}
        run = operations.create_run(make_pipeline(stages=QUICK, scenario=scenario), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        end = time.monotonic() + 60
        while True:
            attempt = Attempt.objects.filter(run=run, status="running").exclude(pid=None).first()
            if attempt is not None and len(run_processes(run)) >= 3:
                log = Path(settings.VAR_DIR) / attempt.log_path
                if b"partial output before the failure" in log.read_bytes():
                    break
            assert time.monotonic() < end, "the attempt did not start its tree"
            time.sleep(0.1)
        before = run_processes(run)
        failed = operations.fail_run(run, "the agent is going the wrong way", requested_by="dana")
        # processes first: when the failure is recorded, nothing of the run is left
        assert run_processes(run) == []
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in before)
        assert (failed.status, failed.stop_reason) == ("failed", "failed_by_operator")
        assert failed.stop_evidence["reaped"] >= 3
        events = list(failed.events.order_by("id").values_list("kind", flat=True))
        assert events.index("fail_requested") < events.index("failed")
        # the evidence is kept: the partial log, the frozen definition, the worktree
        assert b"partial output before the failure" in log.read_bytes()
        assert (Path(settings.VAR_DIR) / failed.control_dir / "definition.json").is_file()
        assert Path(failed.worktree, "app", "core.py").is_file()
        # the worker's result of the killed attempt arrives and is stored as late; nothing changes
        end = time.monotonic() + 60
        while not failed.events.filter(kind="late_result").exists():
            assert time.monotonic() < end, worker.text()[-4000:]
            time.sleep(0.2)
        time.sleep(1)
        final = Run.objects.get(pk=run.pk)
        assert (final.status, final.stop_reason) == ("failed", "failed_by_operator")
        attempt.refresh_from_db()
        assert attempt.late and attempt.ended_at is not None
        assert Attempt.objects.filter(run=run).count() == 1  # no further step ran
        assert final.stages.get().status == "failed" and not final.stages.get().checkpoint_commit
        assert run_processes(run) == []
        assert "Traceback" not in worker.text()
    finally:
        worker.kill()


@pytest.mark.slow
def test_failing_a_run_whose_worker_died_leaves_no_process(route, make_pipeline, repo, tmp_path):
    queue = f"fail-dead-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    worker = Solo(tmp_path, queue).start()
    try:
        scenario = {"stages": {"answer": {"implement": [{"run": ["sh", "-c", "echo started; sleep 300"]}]}}}
        run = operations.create_run(make_pipeline(stages=QUICK, scenario=scenario), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        end = time.monotonic() + 60
        while not run_processes(run) or not Attempt.objects.filter(run=run, status="running").exclude(pid=None):
            assert time.monotonic() < end
            time.sleep(0.1)
        worker.kill()  # the whole worker dies: the sandbox (bubblewrap --die-with-parent) takes the tree with it
        end = time.monotonic() + 10
        while run_processes(run):
            assert time.monotonic() < end, "the agent's tree outlived its worker"
            time.sleep(0.1)
        failed = operations.fail_run(run, "giving up on it")
        assert run_processes(run) == []
        attempt = Attempt.objects.get(run=run)
        assert attempt.status == "cancelled" and attempt.failure_kind == "failed_by_operator"
        assert failed.stop_evidence["cancelled_attempts"] == [attempt.number]
        assert wait_for(run.pk, timeout=5).status == "failed"
    finally:
        worker.kill()
