"""Queue The Start Request under concurrency: real worker processes, a real database and broker."""
import threading
import time

import pytest
from django.db import connection, transaction

from engine import operations, runner
from engine.models import Attempt, Run, StartRequest
from engine.operations import OperationError
from engine.tasks import advance_run

from .conftest import git, new_log_text, wait_for
from .support.runs import QUICK_SCENARIO, QUICK_STAGE

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def start_from_thread(run_id: int, results: list, delay: float) -> None:
    time.sleep(delay)
    try:
        operations.request_start(run_id, requested_by="thread", source="test")
        results.append("accepted")
    except OperationError as exc:
        results.append(exc.code)
    finally:
        connection.close()


def test_c16_two_starts_5ms_apart_give_exactly_one_execution(workers, make_pipeline, repo):
    pipeline = make_pipeline(stages=QUICK_STAGE, scenario=QUICK_SCENARIO)
    runs = [operations.create_run(pipeline, str(repo), "main") for _ in range(50)]
    outcomes = []
    for run in runs:
        results = []
        threads = [threading.Thread(target=start_from_thread, args=(run.pk, results, delay))
                   for delay in (0.0, 0.005)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        outcomes.append(sorted(results))
        # a duplicated wake-up message, as a broker redelivery would make: it must claim nothing
        advance_run.delay(run.pk, None)
    assert outcomes == [["accepted", "already_started"]] * 50
    for run in runs:
        final = wait_for(run.pk, timeout=300)
        assert final.status == "succeeded", (final.pk, final.stop_reason, final.stop_message)
        assert Attempt.objects.filter(run=run, operation="implement").count() == 1  # one launch
        assert Attempt.objects.filter(run=run).count() == 3  # and its one review and one documentation
    assert StartRequest.objects.filter(run__in=runs).count() == 50
    logs = new_log_text(workers)
    assert "OperationalError" not in logs and "database is locked" not in logs
    assert "DoesNotExist" not in logs
    assert logs.count("claims nothing") >= 50  # the duplicates were seen and dropped


def committed_elsewhere(run_id: int) -> bool:
    """Whether another connection (another thread) sees the start request: it was committed."""
    seen = []

    def look():
        try:
            seen.append(StartRequest.objects.filter(run_id=run_id).exists())
        finally:
            connection.close()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    return seen == [True]


def test_c18_the_wake_up_message_is_sent_only_after_commit(workers, make_pipeline, repo, monkeypatch):
    pipeline = make_pipeline(stages=QUICK_STAGE, scenario=QUICK_SCENARIO)
    runs = [operations.create_run(pipeline, str(repo), "main") for _ in range(50)]
    published = {}
    original = runner.enqueue

    def recording_enqueue(run_id, token):
        published.setdefault(run_id, (connection.in_atomic_block, committed_elsewhere(run_id)))
        original(run_id, token)

    monkeypatch.setattr(runner, "enqueue", recording_enqueue)
    for run in runs:
        with transaction.atomic():
            operations.request_start(run, requested_by="test", source="test")
            time.sleep(0.2)  # the gap between "enqueue" and commit that used to lose races
            assert run.pk not in published
    assert published == {run.pk: (False, True) for run in runs}
    for run in runs:
        assert wait_for(run.pk, timeout=300).status == "succeeded"
    logs = new_log_text(workers)
    assert "DoesNotExist" not in logs and "Traceback" not in logs


def test_c18_a_rolled_back_start_publishes_nothing(transactional_db, make_pipeline, repo, monkeypatch):
    pipeline = make_pipeline(stages=QUICK_STAGE, scenario=QUICK_SCENARIO)
    run = operations.create_run(pipeline, str(repo), "main")
    published = []
    monkeypatch.setattr(runner, "enqueue", lambda run_id, token: published.append(run_id))

    class Injected(Exception):
        pass

    with pytest.raises(Injected):
        with transaction.atomic():
            operations.request_start(run, requested_by="test", source="test")
            raise Injected("after the start request row was written")
    assert published == []
    run = Run.objects.get(pk=run.pk)
    assert run.status == "pending"
    assert not StartRequest.objects.filter(run=run).exists()
    assert git(repo, "branch", "--list").strip() == "* main"
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    # and a real Start afterwards works
    operations.request_start(run, requested_by="test", source="test")
    assert published == [run.pk]
