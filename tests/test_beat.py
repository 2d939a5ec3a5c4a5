"""Beat reconciles on its own: with every worker dead, a run whose worker was killed mid-attempt
is interrupted by the beat process itself (controlpanel/beat.py; its agent tree died with its worker),
within one reconciliation period after its heartbeat went stale. Real processes: a worker, its
agent, a ``celery beat``; the suite's database and broker."""
import time
import uuid

import pytest
from django.conf import settings

from engine import operations
from engine.models import Attempt, Run

from .conftest import wait_for, wait_until
from .support.workers import Beat, Solo, agent_tree, dead, live_attempt, stub, tree_gone
from .support.runs import QUICK

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STALE, PERIOD = 2.0, 1.0


def test_beat_alone_interrupts_a_run_whose_only_worker_died_and_reaps_its_agent(route, make_pipeline, repo,
                                                                                  tmp_path):
    queue = f"beat-alone-{uuid.uuid4().hex[:8]}"
    route(queue)
    worker = Solo(tmp_path, queue).start()
    beat = None
    try:
        text = f"BEAT-{uuid.uuid4().hex[:8]}"
        run = operations.create_run(make_pipeline(stages=QUICK, scenario={
            "stages": {"answer": {"implement": [stub(text, 120)]}}}), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        attempt = wait_until(lambda: live_attempt(run.pk, text), 60, "the agent's first output", [worker])
        tree = agent_tree(attempt)
        worker.kill()  # the only worker: nobody is left to take a message from the queue
        killed_at = time.monotonic()
        # the agent's tree dies with its worker (the sandbox's --die-with-parent): no orphan to reap
        assert wait_until(lambda: all(dead(proc) for proc in tree), 10, "the agent's tree to die with its worker")
        beat = Beat(tmp_path, queue, settings.CELERY_BROKER_URL, CP_HEARTBEAT_STALE=STALE,
                    CP_RECONCILE_PERIOD=PERIOD).start()
        ready_at = time.monotonic()  # a loaded machine takes many seconds to start a beat; not the engine's time
        run = wait_for(run.pk, statuses=("waiting_review",), timeout=STALE + 4 * PERIOD + 20)
        done_at = time.monotonic()
        assert run.stop_reason == "interrupted", run.stop_message
        assert wait_until(lambda: tree_gone(attempt), 10, "the agent tree to be gone")
        assert Attempt.objects.get(pk=attempt.pk).status == "interrupted"
        assert "reconciliation pass (reconcile) in the beat process" in beat.text()
        assert '"interrupted": 1' in beat.text()
        # the heartbeat stopped at the kill: stale STALE s later; from then, or from the beat's start if that
        # came later, at most one period plus the reaping
        since = max(killed_at + STALE, ready_at)
        assert done_at - since <= PERIOD + 8, (
            f"interrupted {done_at - since:.1f} s after the heartbeat went stale and the beat was up "
            f"({done_at - killed_at:.1f} s after the kill)\n{beat.text()[-3000:]}")
        assert Run.objects.get(pk=run.pk).status == "waiting_review"
        # the attempt's HOME (a CLI's unredacted session and temporary files) did not outlive it
        from engine.steps.paths import attempt_homes
        assert not attempt_homes(run.pk).exists(), list(attempt_homes(run.pk).rglob("*"))[:5]
    finally:
        worker.kill()
        if beat is not None:
            beat.stop()
