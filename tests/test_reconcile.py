"""Reconciliation: lost wake-up messages are sent again; a step whose worker died is interrupted once."""
import os
import shutil
import subprocess
import time
from datetime import timedelta

from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.utils import timezone

from engine import operations, reconcile, runner
from engine.models import Attempt, Run, StartRequest

from .conftest import git

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_queued_run_nobody_claimed_is_enqueued_again_once(make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    assert sent == [(run.pk, None)]
    assert reconcile.reconcile()["requeued"] == 0  # not stale yet
    StartRequest.objects.filter(run=run).update(last_enqueued_at=timezone.now() - timedelta(hours=1))
    assert reconcile.reconcile()["requeued"] == 1
    assert reconcile.reconcile()["requeued"] == 0  # the second pass finds it fresh
    assert sent == [(run.pk, None), (run.pk, None)]
    assert StartRequest.objects.get(run=run).enqueued_times == 2


def test_a_lost_hand_off_is_enqueued_again_with_its_token(make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    runner.advance(*sent.pop(0))  # implement; hands off to verify
    (run_id, token), = sent
    sent.clear()  # the message is lost
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert reconcile.reconcile()["handoffs"] == 1
    assert sent == [(run.pk, token)]
    assert reconcile.reconcile()["handoffs"] == 0


def test_a_step_whose_worker_died_is_interrupted_once_and_its_processes_reaped(make_pipeline, repo, sent):
    """Field cases C17 and C20 (docs/field-cases.md) in small: a dead owner, a live agent tree, two reconcilers."""
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    Run.objects.filter(pk=run.pk).update(status="running", lease_owner="vm:1", lease_token="dead-worker",
                                         heartbeat_at=timezone.now() - timedelta(hours=1))
    stage = run.stages.get()
    stage.status = "running"
    stage.save()
    marker = f"cp-test-{os.getpid()}-{time.monotonic_ns()}"
    agent = subprocess.Popen(["sleep", "600"], start_new_session=True,
                             env={**os.environ, "CP_PROCESS_MARKER": marker})
    Attempt.objects.create(run=run, stage=stage, operation="implement", number=1, role="implementer",
                           profile_name="scripted", adapter="scripted", simulated=True, deadline_seconds=60,
                           status="running", host=__import__("socket").gethostname(), pid=agent.pid,
                           pid_create_time=psutil.Process(agent.pid).create_time(), marker=marker)
    first = reconcile.reconcile()
    second = reconcile.reconcile()
    assert first["interrupted"] == 1 and second["interrupted"] == 0
    agent.wait(timeout=10)
    assert agent.returncode is not None
    run = Run.objects.get(pk=run.pk)
    assert run.status == "waiting_review" and run.stop_reason == "interrupted"
    attempt = Attempt.objects.get(run=run)
    assert attempt.status == "interrupted" and attempt.ended_at is not None
    assert run.decisions.filter(state="pending", reason="interrupted").count() == 1


def test_an_interruption_inspects_what_the_attempt_left_in_the_worktree(make_pipeline, repo, sent):
    """Before anything is repeated, the worktree is compared with the attempt's starting manifest."""
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    runner.advance(*sent.pop(0))  # implement: the agent wrote app/core.py
    attempt = Attempt.objects.get(run=run)
    assert attempt.start_manifest
    # as if the worker had died while the agent was still at work
    Attempt.objects.filter(pk=attempt.pk).update(status="running", ended_at=None, elapsed_seconds=None)
    Run.objects.filter(pk=run.pk).update(lease_owner="vm:1", lease_token="dead-worker",
                                         heartbeat_at=timezone.now() - timedelta(hours=1))
    assert reconcile.reconcile()["interrupted"] == 1
    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.stop_reason) == ("waiting_review", "interrupted")
    effects, = run.stop_evidence["effects"]
    assert effects["attempt"] == attempt.pk and effects["start_manifest"] == attempt.start_manifest
    assert effects["changed"] == [{"path": "app/core.py", "status": "modified"}]
    assert run.stop_evidence["attempt"] == attempt.pk
    assert "changed 1 file(s) in the worktree before it was interrupted (app/core.py)" in run.stop_message
    assert run.manifests.filter(digest=effects["manifest"]).exists()  # the inspected files are a record
    attempt.refresh_from_db()
    assert attempt.elapsed_seconds is not None and attempt.elapsed_seconds >= 0
    assert attempt.output_bytes == (Path(settings.VAR_DIR) / attempt.log_path).stat().st_size > 0
    assert attempt.result_manifest.digest == effects["manifest"]  # what it left, kept as its (unverified) result
    patch = (Path(settings.VAR_DIR) / attempt.patch_path).read_text()
    assert "+++ b/app/core.py" in patch and "return 42" in patch
    # a retry is numbered after the interrupted attempt
    operations.recover(run, run.decisions.get(state="pending").pk, "the worker died", "retry", reviewer="t")
    (Path(run.worktree) / "app" / "left_over.py").write_text("x = 1\n")  # unverified, from no attempt of ours
    runner.advance(*sent.pop())
    assert list(Attempt.objects.filter(run=run).values_list("number", "operation")) == [(1, "implement"),
                                                                                       (2, "implement")]
    # the retry started from the stage's start, not from what the interrupted attempt left
    retry = Attempt.objects.get(run=run, number=2)
    assert retry.start_manifest == git(repo, "rev-parse", f"{run.commit}^{{tree}}").strip()
    assert not (Path(run.worktree) / "app" / "left_over.py").exists()
    assert run.events.filter(kind="workspace", message__contains="put back to the stage's start").exists()
    assert (Path(settings.VAR_DIR) / retry.patch_path).read_text().count("+++ b/") == 1  # only app/core.py


@pytest.mark.pipeline
def test_recovery_within_an_exhausted_budget_is_refused_naming_a_new_run(make_pipeline, repo, sent, admin_client):
    from django.urls import reverse

    from .support.runs import drive

    run = operations.create_run(make_pipeline(budgets={"max_attempts": 1}), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "budget_exhausted")
    decision = run.decisions.get(state="pending")
    checks = run.checks.count()
    for action in ("retry", "verify"):  # a verification ends in a review, an agent attempt: no budget for it
        with pytest.raises(operations.OperationError) as caught:
            operations.recover(run, decision.pk, "one more go", action, reviewer="t")
        assert (caught.value.code, caught.value.field) == ("budget_exhausted", "action")
        assert "requires a new run" in caught.value.message
    with pytest.raises(operations.OperationError) as caught:
        operations.recheck(run, "I corrected it", requested_by="t")
    assert (caught.value.code, caught.value.field) == ("budget_exhausted", "run")
    decision.refresh_from_db()
    assert decision.state == "pending" and Run.objects.get(pk=run.pk).status == "waiting_review"  # nothing changed
    assert run.checks.count() == checks and sent == []  # no gate ran again, nothing was queued
    # the run's page offers only Fail, and says why
    text = admin_client.get(reverse("admin:engine_run_detail", args=[run.pk])).content.decode()
    assert 'data-cp-action="fail"' in text
    assert 'data-cp-action="recover"' not in text and 'data-cp-action="recheck"' not in text
    assert "budget is exhausted" in text and "requires a new run" in text


@pytest.mark.pipeline
def test_a_missing_repository_never_stops_a_reconcile_pass(make_pipeline, repo, sent, tmp_path):
    """A finished run whose repository is gone, with a journal entry still an intent: the pass
    records the fact on that run once and settles the other runs' entries."""
    import shutil

    from engine.models import JournalEntry, RunEvent

    from .conftest import make_repo
    from .support.runs import drive

    runs = []
    for name in ("gone", "kept"):
        origin = make_repo(tmp_path / name, {"app/__init__.py": "", "app/core.py": '"""Core."""\n',
                                              "docs/PLAN.md": "plan\n"})
        stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"], "gates": [{"name": "unit", "command": "true"}]}]
        run = operations.create_run(make_pipeline(name=f"p-{name}", stages=stages), str(origin), "main")
        operations.request_start(run, requested_by="t", source="test")
        run = drive(run.pk, sent)
        assert run.status == "succeeded", run.stop_message
        entry = JournalEntry.objects.filter(run=run).order_by("-id").first()
        JournalEntry.objects.filter(pk=entry.pk).update(state=JournalEntry.State.INTENT, commit="")
        runs.append((run, entry, origin))
    (gone, gone_entry, gone_origin), (kept, kept_entry, _) = runs
    shutil.rmtree(gone_origin)
    first = reconcile.reconcile()
    second = reconcile.reconcile()
    assert first["journal_done"] == 1 and second["journal_done"] == 0
    assert JournalEntry.objects.get(pk=kept_entry.pk).state == "done"
    assert JournalEntry.objects.get(pk=gone_entry.pk).state == "intent"
    [event] = RunEvent.objects.filter(run=gone, kind="journal_unresolved")
    assert event.data["journal"] == gone_entry.pk and "cannot be read" in event.message


def test_an_index_lock_is_left_alone_while_another_hosts_attempt_is_unconfirmed(run_row, monkeypatch):
    """The reconciler cannot see another host's processes: a git there may hold the lock."""
    from django.utils import timezone

    from engine import reconcile as reconciliation
    from engine import workspace
    from engine.models import Attempt

    looked = []
    monkeypatch.setattr(workspace, "clear_stale_index_lock", lambda *a, **k: looked.append(a) or {})
    stale = timezone.now() - timezone.timedelta(seconds=600)
    run = run_row(status="running", stage_statuses=("running",), lease_owner="w:1", lease_token="t" * 32,
                  heartbeat_at=stale, worktree="/nonexistent/worktree")
    Attempt.objects.create(run=run, stage=run.stages.get(), operation="implement", number=1, role="implementer",
                           profile_name="scripted", adapter="scripted", deadline_seconds=60, status="running",
                           host="another-host", started_at=stale)
    assert reconciliation.interrupt(run.pk, run.lease_token, stale) is True
    run.refresh_from_db()
    assert looked == []
    assert (run.status, run.stop_reason) == ("waiting_review", "interrupted")
    assert "index lock was left alone" in run.stop_message and "another host" in run.stop_message


def test_a_run_creation_killed_before_its_rename_leaves_no_staging_folder_for_ever(make_pipeline, repo, tmp_path):
    """create_run stages the protected files in runs/.creating-<uuid> before its transaction; a process
    killed in between leaves the folder. A reconcile pass removes one older than STAGING_STALE_SECONDS
    and leaves a fresh one (a creation in progress) and a link alone."""
    runs = Path(settings.VAR_DIR) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    old, fresh, link = runs / ".creating-old", runs / ".creating-fresh", runs / ".creating-link"
    for folder in (old, fresh):
        (folder / "protected").mkdir(parents=True)
        (folder / "protected" / "tests__test_core.py").write_text("kept\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    link.symlink_to(outside)
    long_ago = time.time() - reconcile.STAGING_STALE_SECONDS - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(link, (long_ago, long_ago), follow_symlinks=False)

    reconcile.reconcile()
    assert not old.exists() and (fresh / "protected" / "tests__test_core.py").is_file()
    assert link.is_symlink() and (outside / "keep.txt").is_file()
    # a run created meanwhile is untouched and leaves no staging folder of its own
    run = operations.create_run(make_pipeline(protected_paths=["tests/test_*.py"]), str(repo), "main")
    assert sorted(p.name for p in runs.glob(".creating-*")) == [".creating-fresh", ".creating-link"]
    assert (Path(settings.VAR_DIR) / run.control_dir / "protected").is_dir()
    link.unlink()
    shutil.rmtree(fresh)
