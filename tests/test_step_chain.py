"""A worker takes a run's consecutive steps in one task (engine/runner.py ``advance_chain``), each
still claimed, fenced and handed off, and a crash between two of them loses nothing. Real worker
processes, a real database."""
import os
import re
import time
import uuid

import pytest
from django.test import override_settings

from engine import operations, reconcile
from engine.models import Attempt, Run

from .conftest import ANSWER_STEP, wait_for
from .support.workers import Solo
from .support.runs import QUICK

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def received(worker: Solo) -> int:
    """How many advance_run messages the worker took."""
    return len(re.findall(r"Task engine\.advance_run\[[^\]]+\] received", worker.text()))


@pytest.mark.parametrize("budget, one_task", [("60", True), ("0", False)])
def test_a_run_s_steps_go_on_in_one_task_within_the_chain_budget(route, make_pipeline, repo, tmp_path, budget,
                                                                 one_task):
    queue = f"chain-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    worker = Solo(tmp_path, queue, CP_STEP_CHAIN_SECONDS=budget).start()
    try:
        run = operations.create_run(make_pipeline(), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        run = wait_for(run.pk, timeout=120)
        assert run.status == "succeeded", run.stop_message
        # implement, verify, review, document, checkpoint, finish: six steps, five hand-offs
        assert run.steps == 5, run.steps
        if one_task:  # the start's message carried the whole run
            assert received(worker) == 1, worker.text()[-4000:]
        else:  # every step through the queue, as before
            assert received(worker) == 6, worker.text()[-4000:]
        assert Attempt.objects.filter(run=run).count() == 3  # implement, review, document: once each
    finally:
        worker.stop()


def test_a_crash_between_two_chained_steps_is_picked_up_by_reconciliation(route, make_pipeline, repo, tmp_path):
    """The process dies right after a chained step handed the run off: no one holds the lease and no
    message carries its token. Reconciliation enqueues it again and the run ends, every step once."""
    queue = f"chain-crash-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    first = Solo(tmp_path, queue, CP_TEST_FAULT="chain.after_hand_off").start()
    second = None
    try:
        run = operations.create_run(make_pipeline(), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        deadline = time.monotonic() + 90
        while "CP_TEST_FAULT=chain.after_hand_off" not in first.text():
            assert time.monotonic() < deadline, first.text()[-4000:]
            time.sleep(0.2)
        first.kill()
        stuck = Run.objects.get(pk=run.pk)
        assert stuck.status == "running" and stuck.lease_token and not stuck.lease_owner  # handed off, unclaimed
        assert Attempt.objects.filter(run=run).count() == 1 and stuck.steps == 1
        second = Solo(tmp_path, queue, CP_QUEUED_STALE=1).start()
        deadline = time.monotonic() + 120
        while Run.objects.get(pk=run.pk).status in ("queued", "running"):
            assert time.monotonic() < deadline, second.text()[-6000:]
            with override_settings(CP_QUEUED_STALE=1):
                reconcile.reconcile()  # as beat would, every period
            time.sleep(0.5)
        run = Run.objects.get(pk=run.pk)
        assert run.status == "succeeded", run.stop_message
        ops = sorted(Attempt.objects.filter(run=run).values_list("operation", flat=True))
        assert ops == ["document", "implement", "review"], ops  # nothing ran twice
        assert run.events.filter(kind="succeeded").count() == 1
    finally:
        first.kill()
        if second is not None:
            second.stop()


def test_runs_started_together_end_in_the_order_they_were_started(route, make_pipeline, repo, tmp_path):
    """Three runs whose implement step takes 2 s, as a real agent's takes minutes, started at once on
    one pool process with the default budget: each run goes on to its end before the next one's
    first attempt starts, first come first served."""
    queue = f"fifo-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    worker = Solo(tmp_path, queue).start()
    try:
        slow = {"stages": {"answer": {"implement": [{**ANSWER_STEP, "sleep": 2}]}}}
        runs = [operations.create_run(make_pipeline(stages=QUICK, scenario=slow), str(repo), "main")
                for _ in range(3)]
        for run in runs:
            operations.request_start(run, requested_by="test", source="test")
        ended = []
        for run in runs:
            done = wait_for(run.pk, timeout=120)
            assert done.status == "succeeded", done.stop_message
            ended.append(done.events.get(kind="succeeded").at)
        assert ended == sorted(ended), ended
        for earlier, later in zip(runs, runs[1:]):
            first_attempt = Attempt.objects.filter(run=later).order_by("started_at").first()
            assert first_attempt.started_at >= earlier.events.get(kind="succeeded").at, \
                "a later run's attempt started before the earlier run ended"
    finally:
        worker.stop()
