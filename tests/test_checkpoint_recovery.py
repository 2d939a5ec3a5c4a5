"""Journaled checkpoints under a real crash: the worker's process dies between the journal entry
and the commit, or between the commit and the journal update (``engine.faults``). Recovery must
find the truth from git and never make a second commit: with the commit made, reconciliation
finishes the step and the run goes on by itself; without it, a person's Recover checkpoints the
stage. Real worker processes, a real database."""
import os
import time
import uuid

import pytest

from engine import operations, reconcile
from engine.models import JournalEntry, Run

from .conftest import git, index_is, wait_for
from .support.workers import Solo

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def wait_until(predicate, timeout=90.0, what="condition"):
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.parametrize("point", ["checkpoint.before_commit", "checkpoint.after_commit"])
def test_a_crash_inside_the_checkpoint_never_makes_a_second_commit(route, make_pipeline, repo, tmp_path, point):
    queue = f"journal-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    first = Solo(tmp_path, queue, CP_TEST_FAULT=point).start()
    second = None
    try:
        run = operations.create_run(make_pipeline(), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        wait_until(lambda: f"CP_TEST_FAULT={point}" in first.text(), what="the crash")
        first.kill()
        entry = JournalEntry.objects.get(run=run)
        assert entry.state == "intent"  # the crash left the journal saying only what was meant
        ahead = git(repo, "rev-list", "--count", f"{run.commit}..{run.branch}").strip()
        assert ahead == ("0" if point == "checkpoint.before_commit" else "1")
        second = Solo(tmp_path, queue, CP_HEARTBEAT_STALE=1).start()  # reconciles when it starts
        if point == "checkpoint.after_commit":
            # the truth is in git: the commit with its journal id exists, so reconciliation finishes
            # the crashed step itself (its own entry done with that commit) and the run goes on
            def finished() -> bool:  # a reconciliation pass as beat would run it, should the start-up pass be early
                reconcile.reconcile()
                return Run.objects.get(pk=run.pk).status not in ("queued", "running")

            wait_until(finished, what="the run to finish by itself")
            run = Run.objects.get(pk=run.pk)
            assert run.status == "succeeded", run.stop_message
            assert not run.decisions.exists()  # nobody was asked
            entry.refresh_from_db()
            assert entry.state == "done" and entry.commit == git(repo, "rev-parse", run.branch).strip()
            assert run.events.filter(kind="checkpoint_resumed").exists()
        else:  # no commit carries its id: left for the person's recovery, nothing invented
            def interrupted() -> bool:
                reconcile.reconcile()
                return Run.objects.get(pk=run.pk).status == "waiting_review"

            wait_until(interrupted, what="the interruption")
            run = Run.objects.get(pk=run.pk)
            assert run.stop_reason == "interrupted", run.stop_message
            time.sleep(1)
            entry.refresh_from_db()
            assert entry.state == "intent" and not entry.commit
            operations.recover(run, run.decisions.get(state="pending").pk, "the worker crashed", "verify",
                               reviewer="test")
            try:
                run = wait_for(run.pk, timeout=120)
            except AssertionError:
                raise AssertionError(second.text()[-6000:]) from None
        assert run.status == "succeeded", run.stop_message
        commits = git(repo, "rev-list", f"{run.commit}..{run.branch}").split()
        assert len(commits) == 1 and commits[0] == run.stages.get().checkpoint_commit
        if point == "checkpoint.after_commit":
            assert commits[0] == entry.commit  # the crashed step's commit, reused
            assert run.events.filter(kind="checkpoint", message__contains="found already committed").exists()
            assert index_is(run.worktree, commits[0])  # the index is the checkpoint's
    finally:
        first.kill()
        if second is not None:
            second.stop()
