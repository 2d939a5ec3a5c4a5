"""Crashes, redeliveries, duplicate beats and a broker restart, with real processes: a stage never
runs twice and no evidence is lost.

Every test here has its own private ``redis-server`` (tests/redis_server.py) on a free loopback
port: the shared Redis on 6379 is never stopped. The workers are real ``celery -A controlpanel
worker`` processes (``Solo``, one pool process each; the broker restart's ``MakeWorker``, two, as
``make worker`` starts one), the beats real ``celery -A controlpanel beat`` processes, all pointed
at the private server by ``CELERY_BROKER_URL``; the test process
publishes its own messages (Start, Recover) there too (``publish``). The stub agent is the
scripted test adapter: it prints, writes, sleeps and runs shell commands as an agent would.

Field cases (docs/field-cases.md): C15 (redelivery after the visibility timeout), C17 (two beats), C20 (a worker or
its pool child killed mid attempt); plus the issue's acceptance item for a broker restart, with a
worker started as ``make worker`` starts one (its flags are asserted equal to the Makefile's and
docker-compose.yml's), and kombu's side of the crash a broker restart used to cause.

Settings given to every engine process (the bounds below are derived from them):
CP_HEARTBEAT_INTERVAL 0.5 s, CP_HEARTBEAT_STALE ``STALE``, CP_RECONCILE_PERIOD ``PERIOD``,
CP_QUEUED_STALE ``QUEUED_STALE``.
"""
from __future__ import annotations

import io
import json
import os
import random
import re
import shlex
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import yaml
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from engine import operations, reconcile, runner
from engine.models import ATTEMPT_OPEN, Attempt, Run
from engine.processes.worker_process import WORKER_FLAGS, start_worker, worker_argv

from .conftest import ANSWER_STEP, wait_for, wait_until
from .redis_server import INSTALL_HINT, RedisServer, redis_binary
from .support.workers import PERIOD, STALE, Beat, Solo, agent_tree, dead, engine_env, live_attempt, stub, tree_gone
from .support.runs import QUICK

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(settings.BASE_DIR)
#: What one pass may take on a busy two-core machine once it is due: the beat's message reaching
#: an idle worker, the pass's queries, reaping an agent tree that dies at its first SIGTERM.
SLACK = 3.0


# ----------------------------------------------------------------------------- the private broker


@pytest.fixture
def broker(tmp_path):
    """A private redis-server for this test only, stopped at the end."""
    if redis_binary() is None:
        pytest.skip(INSTALL_HINT)
    server = RedisServer(tmp_path).start()
    yield server
    server.kill()


@pytest.fixture
def publish(monkeypatch):
    """Send what this process sends (Start, Recover, a reconciliation's resend) to ``queue`` on
    the broker ``url`` instead of the session's broker: ``publish(url, queue)``."""
    from kombu import Connection

    from engine.tasks import advance_run

    def to(url: str, queue: str) -> None:
        def enqueue(run_id: int, token: str | None) -> None:
            with Connection(url) as conn:
                advance_run.apply_async(args=[run_id, token], queue=queue, connection=conn)
        monkeypatch.setattr(runner, "enqueue", enqueue)
    return to


#: The pool size of ``MakeWorker``: ``make worker`` leaves it to Celery (one process per core: 2 on
#: the two-core machines this runs on), docker-compose.yml says 2. With two, a free process keeps
#: asking the broker for work (a pending BRPOP) while a step holds its unacknowledged message.
MAKE_WORKER_CONCURRENCY = 2


class MakeWorker(Solo):
    """A worker as ``make worker`` starts one: ``worker_argv`` (``WORKER_FLAGS``, the Makefile's and
    docker-compose.yml's: test_the_worker_flags_are_the_same_everywhere) with a pool of
    ``MAKE_WORKER_CONCURRENCY`` processes, on its own ``queue``."""

    def start(self) -> "MakeWorker":
        self.proc = start_worker(str(self.log), env=self.env, concurrency=MAKE_WORKER_CONCURRENCY, queue=self.queue)
        return self


def start_all(solos: list[Solo]) -> list[Solo]:
    """Start the workers side by side (each start waits for its 'ready')."""
    with ThreadPoolExecutor(len(solos)) as pool:
        list(pool.map(Solo.start, solos))
    return solos


# ----------------------------------------------------------------------------- helpers


def var(rel: str) -> Path:
    return Path(settings.VAR_DIR) / rel


def watch_silence(run_id: int, watch: "OpenAttempts", timeout: float) -> dict:
    """Sample ``run_status`` of a running run whose owner is dead until a reconciler takes it over.

    Returns ``samples`` ([(monotonic seconds, run_status dict)], all taken while the dead owner
    still held the lease), ``last_beat`` (its last heartbeat, a datetime), ``stale_from`` (the
    monotonic moment the heartbeat went stale) and ``acted_by`` (a monotonic moment by which the
    reconciliation had acted). Fails after ``timeout`` seconds.
    """
    owner = Run.objects.get(pk=run_id).lease_owner
    samples, end = [], time.monotonic() + timeout
    while True:
        watch.check()
        at = time.monotonic()
        data = operations.run_status(run_id)
        row = Run.objects.get(pk=run_id)  # read after the status: if it is still the dead owner's, so was the status
        if row.status != "running" or row.lease_owner != owner:
            break
        samples.append((at, data))
        last_beat = row.heartbeat_at
        assert at < end, f"run {run_id} still held by {owner} after {timeout} s"
        time.sleep(0.05)
    assert samples, "the reconciliation acted before the first sample"
    at, data = samples[-1]
    return {"samples": samples, "last_beat": last_beat, "acted_by": time.monotonic(),
            "stale_from": at - data["heartbeat_age_seconds"] + STALE}


class OpenAttempts:
    """Watches a run's attempts: ``check()`` records how many of a stage's attempts are open at once."""

    def __init__(self, run_id: int):
        self.run_id, self.most = run_id, 0

    def check(self) -> None:
        for stage_id in set(Attempt.objects.filter(run_id=self.run_id).values_list("stage_id", flat=True)):
            open_now = Attempt.objects.filter(run_id=self.run_id, stage_id=stage_id, status__in=ATTEMPT_OPEN).count()
            self.most = max(self.most, open_now)


def assert_no_overlap(run: Run) -> None:
    """No two attempts of a stage were ever open at once: their [start, end] intervals do not overlap."""
    for stage in run.stages.all():
        attempts = list(stage.attempts.order_by("number"))
        for earlier, later in zip(attempts, attempts[1:]):
            assert earlier.ended_at is not None, f"attempt {earlier.number} never ended"
            assert earlier.ended_at <= (later.started_at or later.created_at), (
                f"attempts {earlier.number} and {later.number} of stage {stage.key} overlap")


def interruptions(run: Run) -> int:
    return run.events.filter(kind="stopped", message__startswith="Stopped (interrupted)").count()


# --------------------------------------------------------- docs/field-cases.md C15: redelivery


def test_c15_a_start_redelivered_after_the_visibility_timeout_launches_nothing(broker, publish, make_pipeline, repo,
                                                                               tmp_path):
    queue = f"c15-{uuid.uuid4().hex[:8]}"
    publish(broker.url, queue)
    side = "launches.txt"  # in the run's data folder, outside the worktree: one line per agent launch
    # two workers on one queue, one pool process each: the copy put back on the queue after the
    # visibility timeout reaches the idle one while the first copy still runs
    env = engine_env(broker.url, CP_VISIBILITY_TIMEOUT=10, CP_BROKER_RESTORE_INTERVAL=1)
    workers = [Solo(tmp_path, queue, **env) for _ in range(2)]
    try:
        start_all(workers)
        scenario = {"stages": {"answer": {"implement": [stub("C15 working", 30, side)]}}}
        run = operations.create_run(make_pipeline(stages=QUICK, scenario=scenario), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        drop = f"run {run.pk}: message (token -) claims nothing: the step is owned or done; dropped"
        seen_while_running = None
        end = time.monotonic() + 120
        while (current := Run.objects.get(pk=run.pk)).status in ("queued", "running"):
            if seen_while_running is None and drop in "".join(w.text() for w in workers):
                seen_while_running = Attempt.objects.get(run=run, operation="implement").status
            assert time.monotonic() < end, "\n".join(w.text()[-3000:] for w in workers)
            time.sleep(0.2)
        logs = [w.text() for w in workers]
        assert current.status == "succeeded", current.stop_message
        launches = (var("scratch") / f"run-{run.pk}" / "data" / side).read_text()
        assert len(launches.splitlines()) == 1, launches  # the agent was launched once
        assert Attempt.objects.filter(run=run, operation="implement").count() == 1
        assert not Attempt.objects.filter(run=run, late=True).exists()
        # the redelivered Start arrived while the only launch still ran, and was dropped
        assert seen_while_running == "running", logs
        # it was the same message again (same task id), taken by the other, idle worker
        received = [re.findall(r"Task engine\.advance_run\[([0-9a-f-]+)\] received", text) for text in logs]
        assert set(received[0]) & set(received[1]), "no message was delivered to both workers"
        assert current.events.filter(kind="succeeded").count() == 1
        assert Attempt.objects.get(run=run, operation="implement").status == "succeeded"
    finally:
        for worker in workers:
            worker.kill()


# --------------------------------------------------------- docs/field-cases.md C17: two reconcilers


@pytest.mark.parametrize("reconcilers", ["two beats", "two threads"])
def test_c17_a_run_whose_owner_died_is_interrupted_exactly_once(reconcilers, broker, publish, make_pipeline, repo,
                                                                tmp_path, settings):
    settings.CP_HEARTBEAT_STALE = STALE  # this process's passes (the threads) use the workers' threshold
    queue = f"c17-{uuid.uuid4().hex[:8]}"
    passes = f"c17-beat-{uuid.uuid4().hex[:8]}"  # the beats' own queue (they send nothing to the victim's)
    publish(broker.url, queue)
    victim = Solo(tmp_path, queue, **engine_env(broker.url))
    beats: list[Beat] = []
    try:
        victim.start()  # the beats reconcile in their own processes: no other worker is needed
        text = f"C17-{uuid.uuid4().hex[:8]}"
        scenario = {"stages": {"answer": {"implement": [stub(text, 60)]}}}
        run = operations.create_run(make_pipeline(stages=QUICK, scenario=scenario), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        attempt = wait_until(lambda: live_attempt(run.pk, text), 60, "the agent's first output", [victim])
        tree = agent_tree(attempt)
        victim.kill()  # its agent tree dies with it (the sandbox's --die-with-parent); the run stays running
        assert wait_until(lambda: all(dead(proc) for proc in tree), 10, "the agent's tree to die with its worker")
        assert Run.objects.get(pk=run.pk).status == "running"
        if reconcilers == "two beats":
            beats = [Beat(tmp_path, passes, broker.url) for _ in range(2)]
            for beat in beats:  # launched together, so their passes are due at the same moments
                beat.launch()
            for beat in beats:
                beat.wait_ready()
            wait_for(run.pk, statuses=("waiting_review",), timeout=STALE + 3 * PERIOD + 30)
            # a few more passes from both beats after the interruption: each a no-op
            sent = [beat.sent() for beat in beats]
            wait_until(lambda: all(beat.sent() >= n + 2 for beat, n in zip(beats, sent)), 6 * PERIOD + 10,
                       "two more passes from each beat", beats)
            time.sleep(1)  # the last passes are executed
            results = [r for beat in beats for r in beat.results()]
            assert sum(r["interrupted"] for r in results) == 1, results
            assert all(len(beat.results()) >= 3 for beat in beats)  # both beats made their passes
        else:
            wait_until(lambda: (Run.objects.get(pk=run.pk).heartbeat_at is not None and
                                operations.run_status(run.pk)["heartbeat_age_seconds"] > STALE + 0.2),
                       STALE + 10, "the heartbeat to go stale")
            barrier, results = threading.Barrier(2), {}

            def reconciler(name: str, delay: float) -> None:
                try:
                    barrier.wait(timeout=10)
                    time.sleep(delay)
                    results[name] = reconcile.reconcile()
                except BaseException as exc:  # reported below
                    results[name] = exc
                finally:
                    connection.close()

            delay = random.uniform(0, 0.05)  # 0-50 ms apart
            threads = [threading.Thread(target=reconciler, args=("first", 0.0)),
                       threading.Thread(target=reconciler, args=("second", delay))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            assert all(isinstance(r, dict) for r in results.values()) and len(results) == 2, results
            assert sorted(r["interrupted"] for r in results.values()) == [0, 1], (delay, results)
        run = Run.objects.get(pk=run.pk)
        assert (run.status, run.stop_reason) == ("waiting_review", "interrupted"), run.stop_message
        assert interruptions(run) == 1  # one move to interrupted
        assert run.decisions.filter(state="pending").count() == 1
        assert run.decisions.get(state="pending").reason == "interrupted"
        assert Attempt.objects.filter(run=run).count() == 1  # no attempt was added
        attempt.refresh_from_db()
        assert attempt.status == "interrupted" and attempt.ended_at is not None
        assert tree_gone(attempt) and all(dead(proc) for proc in tree)
    finally:
        for beat in beats:
            beat.stop()
        victim.kill()


# --------------------------------------------------------- docs/field-cases.md C20: a killed worker


@pytest.mark.parametrize("victim", ["pool child", "whole worker"])
def test_c20_a_killed_worker_is_interrupted_within_one_period_and_a_retry_succeeds(
        victim, broker, publish, make_pipeline, repo, tmp_path, settings):
    settings.CP_HEARTBEAT_STALE = STALE  # the Control Panel (run_status) judges staleness as the workers do
    queue = f"c20-{uuid.uuid4().hex[:8]}"
    publish(broker.url, queue)
    workers = start_all([Solo(tmp_path, queue, **engine_env(broker.url)) for _ in range(2)])
    beat = None
    try:
        beat = Beat(tmp_path, queue, broker.url).start()
        partial = f"PARTIAL-{uuid.uuid4().hex[:10]}"
        scenario = {"stages": {"answer": {"implement": [stub(partial, 60), ANSWER_STEP]}}}
        run = operations.create_run(make_pipeline(stages=QUICK, scenario=scenario), str(repo), "main")
        control = var(run.control_dir)
        frozen_file, frozen = (control / "definition.json").read_bytes(), json.loads(json.dumps(run.definition))
        operations.request_start(run, requested_by="test", source="test")
        watch = OpenAttempts(run.pk)
        attempt = wait_until(lambda: watch.check() or live_attempt(run.pk, partial), 60, "the agent's partial output",
                             workers)
        tree = agent_tree(attempt)
        owner = int(Run.objects.get(pk=run.pk).lease_owner.rsplit(":", 1)[1])  # host:pid of the pool process
        child = psutil.Process(owner)
        holder = next(w for w in workers if child.ppid() == w.proc.pid)
        if victim == "pool child":
            os.kill(owner, signal.SIGKILL)  # the worker's main process lives on and forks a new child
        else:
            holder.kill()
        wait_until(lambda: dead(child), 10, "the pool process to die")  # no heartbeat can land after this
        # the agent's tree dies with its pool process (the sandbox's --die-with-parent): no orphan
        assert wait_until(lambda: all(dead(proc) for proc in tree), 10, "the agent's tree to die with its worker")
        # nobody beats now: run_status shows the heartbeat's age growing and heartbeat_stale
        # turning true, until the reconciliation takes the run over
        silent = watch_silence(run.pk, watch, STALE + PERIOD + SLACK + 10)
        samples = silent["samples"]
        ages = [data["heartbeat_age_seconds"] for _, data in samples]
        assert len(ages) >= 3 and ages == sorted(ages) and ages[-1] > ages[0] + 1, ages
        if "heartbeat_stale" in samples[0][1]:
            # exactly when the age passes CP_HEARTBEAT_STALE, and seen before the reconciliation
            # acted unless it acted within one sampling gap of that moment
            assert all(data["heartbeat_stale"] == (data["heartbeat_age_seconds"] > STALE) for _, data in samples)
            assert samples[0][1]["heartbeat_stale"] is False, samples[0]
            seen = any(data["heartbeat_stale"] for _, data in samples)
            assert seen or silent["acted_by"] - silent["stale_from"] < 0.5, silent
        run = wait_for(run.pk, statuses=("waiting_review", "failed", "succeeded"), timeout=30)
        assert (run.status, run.stop_reason) == ("waiting_review", "interrupted"), run.stop_message
        # within one reconciliation period of the heartbeat going stale (plus one pass's own time)
        stopped = run.events.get(kind="stopped")
        lag = (stopped.at - silent["last_beat"]).total_seconds() - STALE
        assert lag <= PERIOD + SLACK, f"interrupted {lag:.1f} s after the heartbeat went stale"
        if victim == "pool child":
            assert holder.proc.poll() is None  # only the pool child died
            assert "exited with 'signal 9 (SIGKILL)'" in holder.text()
        # the agent's tree is gone, the attempt says how it ended, the evidence is kept
        attempt.refresh_from_db()
        assert tree_gone(attempt) and all(dead(proc) for proc in tree)
        assert attempt.status == "interrupted" and attempt.ended_at is not None
        assert partial in var(attempt.log_path).read_text()
        assert (control / "definition.json").read_bytes() == frozen_file
        on_disk = json.loads((control / "definition.json").read_text())
        assert operations.canonical_sha256(on_disk) == run.definition_sha256
        assert (control / "definition.sha256").read_text().strip() == run.definition_sha256
        assert run.definition == frozen == on_disk
        if victim == "whole worker":  # a worker is restarted in its place
            workers[workers.index(holder)] = Solo(tmp_path, queue, **engine_env(broker.url)).start()
        decision = run.decisions.get(state="pending")
        out = io.StringIO()
        call_command("recover", str(run.pk), "--decision", str(decision.pk), "--note", f"{victim} killed mid attempt",
                     "--action", "retry", "--reviewer", "test", stdout=out)
        assert "queued" in out.getvalue()
        end = time.monotonic() + 120
        while (run := Run.objects.get(pk=run.pk)).status in ("queued", "running"):
            watch.check()
            assert time.monotonic() < end, "\n".join(w.text()[-3000:] for w in workers)
            time.sleep(0.1)
        assert run.status == "succeeded", run.stop_message
        implements = list(Attempt.objects.filter(run=run, operation="implement").order_by("number"))
        assert [a.status for a in implements] == ["interrupted", "succeeded"]
        assert implements[1].number == attempt.number + 1 and implements[0].pk == attempt.pk
        assert watch.most == 1  # never two attempts of the stage open at once
        assert_no_overlap(run)
        assert interruptions(run) == 1
        assert partial in var(attempt.log_path).read_text()  # the retry did not overwrite the evidence
    finally:
        if beat is not None:
            beat.stop()
        for worker in workers:
            worker.kill()


# ----------------------------------------------------------------------------- a broker restart


def test_a_broker_restart_mid_run_ends_the_run_with_its_evidence(broker, publish, make_pipeline, repo, tmp_path):
    queue = f"restart-{uuid.uuid4().hex[:8]}"
    publish(broker.url, queue)
    # as `make worker`: before controlpanel/celery.py's fix, this worker (a step running, a free
    # pool process) stopped at the restart with "Unrecoverable error: AttributeError("'NoneType'
    # object has no attribute 'hostname'")" once the step ended, and the run never finished
    # every step through the queue (CP_STEP_CHAIN_SECONDS 0): the hand-off after the attempt must be
    # a message, sent while the broker is down
    worker = MakeWorker(tmp_path, queue, **engine_env(broker.url, CP_STEP_CHAIN_SECONDS=0)).start()
    beat = None
    try:
        beat = Beat(tmp_path, queue, broker.url).start()
        partial = f"BEFORE-RESTART-{uuid.uuid4().hex[:8]}"
        scenario = {"stages": {"answer": {"implement": [stub(partial, 3)]}}}
        run = operations.create_run(make_pipeline(stages=QUICK, scenario=scenario), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        wait_until(lambda: live_attempt(run.pk, partial), 60, "the agent's output", [worker])
        broker.stop()  # SIGTERM; it comes back empty (--save "")
        down_at = time.monotonic()
        # the attempt ends and hands the run to its next step while the broker is down: that
        # message cannot be sent
        wait_until(lambda: Run.objects.get(pk=run.pk).lease_owner == "", 30, "the hand-off", [worker])
        wait_until(lambda: f"run {run.pk}: could not reach the broker" in worker.text(), 30,
                   "the failed send to be logged", [worker])
        time.sleep(max(0.0, 5 - (time.monotonic() - down_at)))
        assert worker.proc.poll() is None, f"the worker exited with {worker.proc.returncode}:\n{worker.text()[-6000:]}"
        broker.start()
        try:
            run = wait_for(run.pk, timeout=120)
        except AssertionError:
            raise AssertionError(f"{worker.text()[-6000:]}\n--- beat\n{beat.text()[-3000:]}") from None
        assert run.status in ("succeeded", "waiting_review", "failed")
        if run.status != "succeeded":
            assert run.stop_reason and run.stop_message
        for attempt in Attempt.objects.filter(run=run):
            assert var(attempt.log_path).is_file(), attempt.log_path
        implement = Attempt.objects.get(run=run, operation="implement")
        assert implement.status == "succeeded"
        assert partial in var(implement.log_path).read_text()
        log = worker.text()
        assert worker.proc.poll() is None, f"the worker exited with {worker.proc.returncode}:\n{log[-6000:]}"
        assert "Unrecoverable error" not in log, log[-6000:]
        lost = log.find("Connection to broker lost")
        assert lost >= 0, log[-4000:]
        # the connection was lost while the step's message was unacknowledged (the state that killed the worker)
        assert "Restoring 1 unacknowledged message(s)" in log[lost:], log[lost:][-4000:]
        assert f"Cannot connect to redis://:**@127.0.0.1:{broker.port}/0" in log[lost:], log[lost:][-4000:]
        assert f"Connected to redis://:**@127.0.0.1:{broker.port}/0" in log[lost:], log[lost:][-4000:]  # reconnected
        beat_log = beat.text()
        refused = beat_log.find("beat: Connection error")
        assert refused >= 0 and "in the beat process" in beat_log[refused:], beat_log[-3000:]
        # the lost hand-off was sent again by a reconciliation pass of the beat
        assert any(r["handoffs"] for r in beat.results()), beat_log[-4000:]
        assert run.status == "succeeded", run.stop_message
    finally:
        if beat is not None:
            beat.stop()
        worker.kill()


def test_a_lost_broker_does_not_break_closing_a_channel_with_an_unacked_message(broker):
    """kombu's side of the broker-restart crash, on a real (private) Redis and without a worker.

    The worker's state when Redis went away: the task channel holds one unacknowledged message (a
    step running, ``acks_late``) and has a BRPOP pending (a free pool process: prefetch 2), and a
    later channel has an auto-delete fanout queue (the worker's remote control, pidbox). Celery
    5.7's ``Consumer.on_connection_error_after_connected`` then calls ``connection.collect()`` and
    ``ignore_errors(connection, connection.close)``. The second call raised ``AttributeError:
    'NoneType' object has no attribute 'hostname'`` (no connection error: the worker stopped)
    until controlpanel/celery.py's ``close_redis_channels_after_a_lost_broker``.
    """
    from kombu import Connection, Exchange, Queue
    from kombu.common import ignore_errors

    name = f"close-{uuid.uuid4().hex[:8]}"
    tasks = Queue(name, Exchange(name, "direct"), name)
    with Connection(broker.url) as producer_conn:
        producer_conn.Producer().publish({"step": 1}, exchange=tasks.exchange, routing_key=name, declare=[tasks])
    conn = Connection(broker.url)
    try:
        received = []
        channel = conn.default_channel
        channel.basic_qos(0, 2, False)
        conn.Consumer([tasks], channel=channel, callbacks=[lambda body, message: received.append(message)]).consume()
        control = conn.channel()
        conn.Consumer([Queue(f"{name}.pidbox", Exchange(f"{name}.bcast", "fanout"), auto_delete=True)],
                      channel=control, no_ack=True, callbacks=[lambda body, message: None]).consume()
        end = time.monotonic() + 10
        while not received and time.monotonic() < end:
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
        for _ in range(10):  # until a drain times out: the next BRPOP is then pending
            try:
                conn.drain_events(timeout=0.3)
            except TimeoutError:
                break
        assert len(received) == 1 and not received[0].acknowledged
        assert channel._in_poll, "no BRPOP pending: the test no longer sets up the state it is about"
        broker.stop()
        conn.collect(socket_timeout=2)
        ignore_errors(conn, conn.close)
        assert channel.closed  # the close completed (its restore of the message failed: no broker)
    finally:
        ignore_errors(conn, conn.release)


# ----------------------------------------------------------------------------- one set of worker flags


def celery_worker_flags(command: str) -> set[str]:
    """The value-less options of a ``celery ... worker ...`` command line (shell syntax): those
    after ``worker``, leaving out the ones that take a value (log level, queues, pool size, name)."""
    words = shlex.split(command)
    words = words[words.index("worker") + 1:]
    with_value = {"-l", "--loglevel", "-Q", "--queues", "-c", "--concurrency", "-n", "--hostname", "-s", "--schedule"}
    flags, skip = set(), False
    for word in words:
        if skip:
            skip = False
        elif word in with_value:
            skip = True
        elif word.startswith("-"):
            flags.add(word)
    return flags


def test_the_worker_flags_are_the_same_everywhere():
    """``make worker``, docker-compose.yml's worker and the tests' workers (``worker_argv``) start
    with the same flags, ``WORKER_FLAGS``: the configuration the suite runs is the one deployed.
    docker-compose.yml's worker and beat are restarted when they exit."""
    makefile = (BASE_DIR / "Makefile").read_text().splitlines()
    target = makefile.index("worker: migrate")
    recipe = [line.strip() for line in makefile[target + 1:] if line.startswith("\t")][0]
    assert "celery -A controlpanel worker" in recipe, recipe
    compose = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())["services"]
    expected = set(WORKER_FLAGS)
    assert len(expected) == len(WORKER_FLAGS) and expected
    assert celery_worker_flags(recipe) == expected, recipe
    workers = [service for service in compose.values() if "controlpanel worker" in str(service.get("command"))]
    assert len(workers) == 2, list(compose)  # two hosts (tests/test_compose.py)
    for service in workers:
        assert celery_worker_flags(service["command"]) == expected, service["command"]
        assert service["restart"] == "unless-stopped"
    assert celery_worker_flags(shlex.join(worker_argv(1, queue="q"))) == expected
    assert compose["beat"]["restart"] == "unless-stopped"
