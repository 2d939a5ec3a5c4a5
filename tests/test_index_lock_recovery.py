"""Recovery finishes by itself: git's ``index.lock`` in a run's worktree, a checkpoint whose commit
exists, and a final verification that touches only its own worktree.

Real processes throughout: real git (one of them kept slow inside ``git reset`` by a clean filter
of the repository's own configuration, so it holds the worktree's ``index.lock`` when its worker
is killed with SIGKILL), real lock holders (a process that creates the lock file and keeps it
open, as git does), real worker processes (``Solo``) where a worker dies or must wait.

Helpers find the lock the way git does, by the worktree's ``.git`` file, not through the engine.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from engine import machine, operations, reconcile, runner, steps, workspace
from engine.models import JournalEntry, Run, RunEvent

from .conftest import git, index_is, make_repo, wait_for
from .conftest import wait_until as until
from .support.workers import Solo
from .support.runs import QUICK, drive

pytestmark = pytest.mark.django_db(transaction=True)


# ----------------------------------------------------------------------------- helpers


def lock_file(worktree: str) -> Path:
    """``<repo>/.git/worktrees/<id>/index.lock`` of a linked worktree, from its ``.git`` file."""
    text = Path(worktree, ".git").read_text().strip()
    assert text.startswith("gitdir:"), text
    return Path(text[len("gitdir:"):].strip()) / "index.lock"


HOLDER = r"""
import os, sys, time
lock, release = sys.argv[1], sys.argv[2]
fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)  # as git takes it
print("held", flush=True)
end = time.monotonic() + float(sys.argv[3])
while not os.path.exists(release) and time.monotonic() < end:
    time.sleep(0.05)
os.close(fd)
os.unlink(lock)  # as git gives it up
"""


class Holder:
    """A live process that creates ``lock`` and keeps it open until ``release()`` (or ``seconds``)."""

    def __init__(self, lock: Path, tmp: Path, seconds: float = 90.0):
        self.lock, self.release_file = lock, tmp / f"release-{uuid.uuid4().hex[:6]}"
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(self.release_file), str(seconds)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        self.release_file.touch()
        self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.lock.unlink(missing_ok=True)


def advance_until_checkpoint(run_id: int, sent: list) -> Run:
    """Take steps in this process until the run's next step is its stage's checkpoint."""
    for _ in range(30):
        run = Run.objects.get(pk=run_id)
        assert run.status in ("queued", "running"), run.stop_message
        if run.status == "running" and machine.next_step(run).kind == "checkpoint":
            return run
        runner.advance(*sent.pop(0))
    raise AssertionError("the run never reached its checkpoint")


# ----------------------------------------------------------------------------- the lock, alone


def test_a_stale_lock_is_removed_and_a_live_one_never(repo, tmp_path):
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "w", str(worktree))
    lock = lock_file(str(worktree))
    lock.write_text("")  # left by a git that was killed: nobody has it open
    result = workspace.clear_stale_index_lock(str(worktree), str(repo))
    assert result["state"] == "removed" and result["path"] == str(lock) and not lock.exists()

    holder = Holder(lock, tmp_path)  # a live process has it open
    try:
        result = workspace.clear_stale_index_lock(str(worktree), str(repo))
        assert result["state"] == "live" and lock.exists()
        assert [(h["pid"], h["why"]) for h in result["holders"]] == [(holder.proc.pid, "open")]
    finally:
        holder.kill()

    lock.write_text("")  # a live git working in the worktree (here: waiting on its stdin) may own it
    # a git of somebody else's (not the engine's), alive in the worktree: the holder to detect
    live_git = subprocess.Popen(["git", "hash-object", "--stdin"], cwd=str(worktree), stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        result = workspace.clear_stale_index_lock(str(worktree), str(repo))
        assert result["state"] == "live" and lock.exists()
        assert (live_git.pid, "git_in_worktree") in [(h["pid"], h["why"]) for h in result["holders"]]
    finally:
        live_git.communicate(b"x", timeout=10)
    assert workspace.clear_stale_index_lock(str(worktree), str(repo))["state"] == "removed"
    # a worktree or repository that is gone: nothing to do, nothing raised
    shutil.rmtree(worktree)
    assert workspace.clear_stale_index_lock(str(worktree), str(repo))["state"] == "absent"
    assert workspace.clear_stale_index_lock(str(tmp_path / "nowhere"), str(tmp_path / "none"))["state"] == "absent"


def test_an_index_operation_waits_for_a_live_holder_then_runs(repo, tmp_path):
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "w", str(worktree))
    lock = lock_file(str(worktree))
    holder = Holder(lock, tmp_path)
    waits = []
    try:
        threading.Timer(1.5, holder.release).start()
        started = time.monotonic()
        workspace.git_index_op(["reset", "-q"], str(worktree), repo=str(repo), wait_seconds=30, on_wait=waits.append)
        assert 1.4 < time.monotonic() - started < 10
        assert [w["path"] for w in waits] == [str(lock)] and waits[0]["holders"][0]["pid"] == holder.proc.pid
    finally:
        holder.kill()
    holder = Holder(lock, tmp_path)  # one that never lets go: a clear stop, nothing removed
    try:
        with pytest.raises(workspace.WorkspaceError) as caught:
            workspace.git_index_op(["reset", "-q"], str(worktree), repo=str(repo), wait_seconds=0.5)
        assert caught.value.code == "index_locked" and str(lock) in caught.value.message
        assert f"pid {holder.proc.pid}" in caught.value.message and lock.exists()
    finally:
        holder.kill()


def test_journal_moves_go_through_the_machine(make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    stage = run.stages.get()
    done = JournalEntry.objects.create(run=run, stage=stage, parent_commit=run.commit, expected_tree="t")
    machine.journal_done(done, "a" * 40)
    done.refresh_from_db()
    assert (done.state, done.commit) == ("done", "a" * 40)
    abandoned = JournalEntry.objects.create(run=run, stage=stage, parent_commit=run.commit, expected_tree="t")
    machine.journal_abandoned(abandoned)
    assert JournalEntry.objects.get(pk=abandoned.pk).state == "abandoned"
    for entry in (done, abandoned):
        with pytest.raises(machine.IllegalTransition):
            machine.journal_done(entry, "b" * 40)
        with pytest.raises(machine.IllegalTransition):
            machine.journal_abandoned(entry)


# ----------------------------------------------------------------------------- the checkpoint step, in this process


@pytest.mark.pipeline
def test_a_reset_that_never_gets_the_lock_keeps_the_commit_and_one_recovery_finishes(make_pipeline, repo, sent,
                                                                                      tmp_path, settings):
    """The commit is made, then a live process keeps the index lock past CP_INDEX_LOCK_WAIT: the run
    stops ``index_locked`` with the journal entry done (its commit exists), and one Recover
    finishes the stage with the index equal to the checkpoint, and no second commit."""
    settings.CP_INDEX_LOCK_WAIT = 1.0
    run = operations.create_run(make_pipeline(stages=QUICK), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = advance_until_checkpoint(run.pk, sent)
    holder = Holder(lock_file(run.worktree), tmp_path)
    try:
        runner.advance(*sent.pop(0))  # the checkpoint: commit made, reset refused for 1 s
        run = Run.objects.get(pk=run.pk)
        assert (run.status, run.stop_reason) == ("waiting_review", "index_locked"), run.stop_message
        entry = JournalEntry.objects.get(run=run)
        tip = git(repo, "rev-parse", run.branch).strip()
        assert (entry.state, entry.commit) == ("done", tip)  # never abandoned: its commit exists
        assert f"pid {holder.proc.pid}" in run.stop_message and tip[:12] in run.stop_message
        assert run.events.filter(kind="index_lock_wait").exists()
    finally:
        holder.release()
    operations.recover(run, run.decisions.get(state="pending").pk, "the other git finished", "verify", reviewer="t")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert git(repo, "rev-list", f"{run.commit}..{run.branch}").split() == [run.stages.get().checkpoint_commit]
    assert run.stages.get().checkpoint_commit == tip
    assert index_is(run.worktree, tip)
    assert run.decisions.count() == 1  # one Recover was enough
    assert not JournalEntry.objects.filter(run=run).exclude(state="done").exists()


@pytest.mark.pipeline
def test_a_live_lock_during_the_checkpoint_is_waited_for(make_pipeline, repo, sent, tmp_path):
    run = operations.create_run(make_pipeline(stages=QUICK), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = advance_until_checkpoint(run.pk, sent)
    holder = Holder(lock_file(run.worktree), tmp_path)
    timer = threading.Timer(2.0, holder.release)
    timer.start()
    try:
        run = drive(run.pk, sent)
    finally:
        timer.join()
        holder.kill()
    assert run.status == "succeeded", run.stop_message
    checkpoint = run.stages.get().checkpoint_commit
    assert index_is(run.worktree, checkpoint) and not lock_file(run.worktree).exists()
    assert run.events.filter(kind="index_lock_wait", message__contains=f"pid {holder.proc.pid}").exists()
    assert JournalEntry.objects.get(run=run).state == "done"


# ----------------------------------------------------------------------------- final verification


@pytest.mark.pipeline
def test_final_verification_leaves_the_users_own_worktree_registrations_alone(make_pipeline, repo, sent, tmp_path):
    """A worktree of the user's whose folder is away for a moment (an unmounted disk, a rename)
    keeps its registration: the final verification removes only the checkout it made."""
    mine = tmp_path / "user-wt"
    git(repo, "worktree", "add", "-q", "-b", "user-branch", str(mine))
    admin = Path(git(repo, "rev-parse", "--git-common-dir").strip())
    admin = (admin if admin.is_absolute() else repo / admin) / "worktrees" / "user-wt"
    assert admin.is_dir()
    away = tmp_path / "user-wt-away"
    mine.rename(away)  # momentarily missing
    run = operations.create_run(make_pipeline(stages=QUICK), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert run.checks.filter(kind="final").exists()
    assert admin.is_dir(), "the user's worktree registration was pruned"
    away.rename(mine)
    assert str(mine) in git(repo, "worktree", "list", "--porcelain")
    assert git(mine, "rev-parse", "--abbrev-ref", "HEAD").strip() == "user-branch"
    final_dirs = [p.name for p in admin.parent.iterdir() if p.name.startswith("final-")]
    assert final_dirs == []  # its own checkout's registration is gone


@pytest.mark.pipeline
def test_final_checkouts_are_made_under_the_repository_lock(make_pipeline, repo, sent, tmp_path):
    run = operations.create_run(make_pipeline(stages=QUICK), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    folder, own = tmp_path / "final-x", tmp_path / "final-x-scratch"
    errors = []

    def checkout() -> None:
        try:
            steps._final_checkout(run, run.stages.get().checkpoint_commit, folder, own)
        except BaseException as exc:  # reported below
            errors.append(exc)

    with workspace.repo_lock(str(Path(settings.VAR_DIR) / "locks"), run.repo_path):
        thread = threading.Thread(target=checkout)
        thread.start()
        time.sleep(1.0)
        assert not folder.exists(), "a final checkout was added while another holder had the repository lock"
    thread.join(timeout=30)
    assert not errors and (folder / "app" / "core.py").is_file()
    assert str(folder) in git(repo, "worktree", "list", "--porcelain")
    steps._remove_final_checkout(run, folder, own)
    assert not folder.exists() and str(folder) not in git(repo, "worktree", "list", "--porcelain")


# ----------------------------------------------------------------------------- reconciliation never raises


def test_reconcile_goes_on_when_a_checkpointing_runs_repository_and_worktree_are_gone(make_pipeline, repo, sent,
                                                                                      tmp_path):
    gone_origin = make_repo(tmp_path / "gone", {"app/__init__.py": "", "app/core.py": '"""Core."""\n',
                                                 "docs/PLAN.md": "plan\n"})
    doomed = operations.create_run(make_pipeline(name="p-gone", stages=QUICK), str(gone_origin), "main")
    operations.request_start(doomed, requested_by="t", source="test")
    doomed = advance_until_checkpoint(doomed.pk, sent)
    runner.advance(*sent.pop(0))  # its checkpoint is made ...
    entry = JournalEntry.objects.get(run=doomed)
    JournalEntry.objects.filter(pk=entry.pk).update(state="intent", commit="")  # ... as a crash would leave it
    stage = doomed.stages.get()
    stage.status, stage.phase = "running", "checkpoint"
    stage.save()
    Run.objects.filter(pk=doomed.pk).update(status="running", lease_owner="vm:1", lease_token="dead",
                                            heartbeat_at=timezone.now() - timedelta(hours=1))
    shutil.rmtree(doomed.worktree)
    shutil.rmtree(gone_origin)
    counts = reconcile.reconcile()
    assert counts["interrupted"] == 1 and counts["resumed"] == 0
    doomed = Run.objects.get(pk=doomed.pk)
    assert (doomed.status, doomed.stop_reason) == ("waiting_review", "interrupted")
    assert RunEvent.objects.filter(run=doomed, kind="journal_unresolved").count() == 1
    assert JournalEntry.objects.get(pk=entry.pk).state == "intent"  # nothing invented
    assert reconcile.reconcile()["journal_done"] == 0  # and the next pass goes on, saying it once
    assert RunEvent.objects.filter(run=doomed, kind="journal_unresolved").count() == 1


# ----------------------------------------------------------------------------- real workers, a real kill -9

SLOW_FILTER = """#!/bin/sh
# clean filter (the identity): inside `git reset`, while {mark} exists, it first says so and sleeps,
# so that git holds the worktree's index.lock
if [ -e {mark} ] && tr '\\0' ' ' < /proc/$PPID/cmdline | grep -q ' reset '; then
  touch {started}
  sleep 120
fi
exec cat
"""


@pytest.mark.slow
def test_a_worker_killed_while_git_holds_the_index_lock_recovers_by_itself(route, make_pipeline, tmp_path, settings):
    """SIGKILL to the worker (its whole process group, git included) while the checkpoint's
    ``git reset`` holds ``index.lock``, after the commit was made: the stale lock is removed,
    the stage completes with the index equal to the checkpoint, the journal entry is done with
    that commit, and the run succeeds without anybody's Recover."""
    settings.CP_HEARTBEAT_STALE = 1  # this process's reconciliation passes judge staleness as the workers do
    origin = make_repo(tmp_path / "origin", {
        "app/__init__.py": "", "app/core.py": '"""Core."""\n', "docs/PLAN.md": "# Plan\n",
        ".gitattributes": "*.py filter=slow\n"})
    mark, started = tmp_path / "slow-reset", tmp_path / "reset-started"
    script = tmp_path / "slow-filter.sh"
    script.write_text(SLOW_FILTER.format(mark=mark, started=started))
    script.chmod(0o755)
    git(origin, "config", "filter.slow.clean", str(script))
    mark.touch()
    queue = f"lock-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    first = Solo(tmp_path, queue).start()
    second = None
    try:
        run = operations.create_run(make_pipeline(stages=QUICK), str(origin), "main")
        operations.request_start(run, requested_by="test", source="test")
        until(started.exists, 90, "the checkpoint's git reset to hold the index lock", [first])
        first.kill()  # kill -9 of the worker's process group: the git inside `reset` dies too
        mark.unlink()
        run = Run.objects.get(pk=run.pk)
        lock = lock_file(run.worktree)
        assert lock.exists(), "no index.lock was left: the test no longer sets up the crash it is about"
        entry = JournalEntry.objects.get(run=run)
        assert entry.state == "intent" and run.status == "running"
        tip = git(origin, "rev-parse", run.branch).strip()
        assert git(origin, "rev-list", "--count", f"{run.commit}..{run.branch}").strip() == "1"  # the commit exists
        second = Solo(tmp_path, queue, CP_HEARTBEAT_STALE=1).start()  # reconciles when it starts

        def finished() -> bool:  # a pass as beat would run it, should the start-up pass be early
            reconcile.reconcile()
            return Run.objects.get(pk=run.pk).status not in ("queued", "running")

        until(finished, 120, "the run to finish", [second])
        run = Run.objects.get(pk=run.pk)
        assert run.status == "succeeded", f"{run.stop_reason}: {run.stop_message}"
        assert not run.decisions.exists()  # nobody was asked
        entry.refresh_from_db()
        assert (entry.state, entry.commit) == ("done", tip)  # the crashed step's own entry and commit
        assert JournalEntry.objects.filter(run=run).count() == 1
        assert run.stages.get().checkpoint_commit == tip
        assert git(origin, "rev-list", f"{run.commit}..{run.branch}").split() == [tip]  # no second commit
        assert not lock.exists()
        assert index_is(run.worktree, tip)
        resumed = run.events.get(kind="checkpoint_resumed")
        assert "index lock" in resumed.message and "was removed" in resumed.message
    finally:
        first.kill()
        mark.unlink(missing_ok=True)
        if second is not None:
            second.stop()


@pytest.mark.slow
def test_a_worker_waits_for_a_live_index_lock_and_succeeds(route, make_pipeline, repo, tmp_path):
    """A live process holds the worktree's index.lock for a few seconds around the checkpoint of
    a run on a real worker: the step waits, says so, and succeeds once the lock is released."""
    queue = f"live-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    worker = Solo(tmp_path, queue).start()
    holder = None
    try:
        stages = [{**QUICK[0], "gates": [{"name": "slow", "command": "sleep 2"}]}]
        run = operations.create_run(make_pipeline(stages=stages), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        until(lambda: run.checks.filter(kind="gate", ended_at=None).exists(), 90, "the gate to run", [worker])
        holder = Holder(lock_file(Run.objects.get(pk=run.pk).worktree), tmp_path)
        until(lambda: (RunEvent.objects.filter(run=run, kind="index_lock_wait").exists()
                       or Run.objects.get(pk=run.pk).status != "running"), 90, "the step to wait", [worker])
        current = Run.objects.get(pk=run.pk)
        assert current.status == "running", f"{current.stop_reason}: {current.stop_message}"
        time.sleep(2)  # the step keeps waiting
        assert Run.objects.get(pk=run.pk).status == "running"
        holder.release()
        run = wait_for(run.pk, timeout=120)
        assert run.status == "succeeded", f"{run.stop_reason}: {run.stop_message}"
        checkpoint = run.stages.get().checkpoint_commit
        assert index_is(run.worktree, checkpoint)
        assert JournalEntry.objects.get(run=run).state == "done"
        assert run.events.filter(kind="index_lock_wait", message__contains=f"pid {holder.proc.pid}").exists()
    finally:
        if holder is not None:
            holder.kill()
        worker.kill()
