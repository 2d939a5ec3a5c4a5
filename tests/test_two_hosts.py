"""Two hosts on one machine (README.md, "Several hosts"): two real workers with their own host names
(CP_HOST_NAME) and var directories (their own "disks": worktrees, logs, agent homes), one PostgreSQL
and one Redis, each host with its own real ``celery beat``.

* runs started together spread over both hosts, and every step of a run is claimed on its host;
* killing one host's worker and beat leaves the other host's run untouched and marks the dead host's
  run interrupted exactly once, saying that host has had no heartbeat; no step of it runs elsewhere;
* when the host comes back, its reconciliation confirms the old processes gone, and only then is a
  recovery accepted; the run then goes on, on its own host.

Hosts share one PostgreSQL and one Redis, so these tests need the suite on PostgreSQL + Redis (CI's
second suite); on SQLite and the filesystem broker they are skipped, with that reason.
"""
from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from engine import operations
from engine.models import Attempt, Run

from .conftest import ANSWER_STEP, make_repo, wait_for, wait_until
from .support.workers import Beat, Solo, stub
from .support.runs import QUICK

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ON_SHARED_SERVICES = connection.vendor == "postgresql" and settings.CELERY_BROKER_URL.startswith("redis")
SHARED_SERVICES = ("two hosts share one PostgreSQL and one Redis; this suite runs on SQLite and the filesystem "
                   "broker (CI's PostgreSQL + Redis suite runs them: DATABASE_URL, CELERY_BROKER_URL)")

#: The settings every process of these hosts gets: heartbeats and staleness of seconds, not minutes.
FAST = {"CP_HEARTBEAT_INTERVAL": 0.5, "CP_HEARTBEAT_STALE": 3, "CP_WORKER_BEAT": 0.5, "CP_WORKER_STALE": 3,
        "CP_HOST_STALE": 4, "CP_RECONCILE_PERIOD": 1, "CP_QUEUED_STALE": 3}

STEP_CLAIMED = re.compile(r"run (\d+)(?: \[simulated\])?: (\w+) step claimed by (\S+):(\d+)")


class FakeHost:
    """One "host": its name, its own var directory and repositories folder, a worker and (optionally) a
    beat, on the test's queue."""

    def __init__(self, root: Path, queue: str, name: str):
        self.name, self.queue = name, queue
        self.var = root / name / "var"
        self.repos = root / name / "repos"
        self.var.mkdir(parents=True)
        self.repos.mkdir(parents=True)
        self.logs = root / name
        # its own repositories, and a folder both hosts reach (as a shared file system would be)
        roots = f"{self.repos}:{root / 'shared'}"
        self.env = {**FAST, "CP_HOST_NAME": name, "CP_VAR_DIR": str(self.var), "CP_HOST_REPOS": roots}
        self.worker: Solo | None = None
        self.beat: Beat | None = None
        self.old_logs: list[str] = []

    def start(self, beat: bool = True) -> "FakeHost":
        self.worker = Solo(self.logs, self.queue, **self.env).start()
        if beat:
            self.beat = Beat(self.logs, self.queue, settings.CELERY_BROKER_URL, **self.env).start()
        return self

    def kill(self) -> None:
        """``kill -9`` of the host's worker (its process group) and beat: the host is gone."""
        if self.worker is not None:
            self.worker.kill()
            self.old_logs.append(self.worker.text())
        if self.beat is not None:
            self.beat.proc.kill()
            self.beat.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill()
        if self.beat is not None:
            self.beat.stop()

    def claims(self) -> list[tuple[int, str, str]]:
        """``(run id, step kind, host)`` of every step this host's workers claimed, from their logs."""
        text = "".join(self.old_logs) + (self.worker.text() if self.worker else "")
        return [(int(m[1]), m[2], m[3]) for m in STEP_CLAIMED.finditer(text)]

    def repo(self, tag: str) -> Path:
        """A small repository only this host reaches (CP_HOST_REPOS)."""
        return small_repo(self.repos / tag)


def small_repo(path: Path) -> Path:
    return make_repo(path, {
        "app/__init__.py": "", "app/core.py": '"""Core."""\n',
        "tests/test_core.py": "from app import core\n\n\ndef test_answer():\n    assert core.answer() == 42\n",
        "docs/PLAN.md": "# Plan\n", "docs/INDEX.md": "# Index\n- docs/PLAN.md\n"})


@pytest.fixture
def two_hosts(route, tmp_path):
    if not ON_SHARED_SERVICES:
        pytest.skip(SHARED_SERVICES)
    queue = f"hosts-{uuid.uuid4().hex[:8]}"
    route(queue)  # this process's Start and Recover messages go to the hosts' shared queue
    tag = uuid.uuid4().hex[:6]
    pair = [FakeHost(tmp_path, queue, f"host-a-{tag}"), FakeHost(tmp_path, queue, f"host-b-{tag}")]
    yield pair
    for host in pair:
        host.stop()


def _assert_every_step_on_its_host(runs: list[Run], pair: list[FakeHost]) -> None:
    by_name = {host.name: host for host in pair}
    for run in runs:
        run = Run.objects.get(pk=run.pk)
        assert run.host in by_name, run.host
        assert Path(run.worktree).is_relative_to(by_name[run.host].var), (run.worktree, run.host)
        claims = [(kind, host) for host_ in pair for run_id, kind, host in host_.claims() if run_id == run.pk]
        assert claims, f"no claim of run {run.pk} in the workers' logs"
        assert {host for _, host in claims} == {run.host}, (run.pk, claims)
        assert set(Attempt.objects.filter(run=run).values_list("host", flat=True)) == {run.host}


def test_runs_spread_over_two_hosts_and_every_step_runs_on_its_host(two_hosts, make_pipeline, tmp_path):
    for host in two_hosts:
        host.start(beat=False)
    slow = {"stages": {"answer": {"implement": [{**ANSWER_STEP, "sleep": 1}]}}}
    repo = small_repo(tmp_path / "shared" / "project")  # both hosts reach it: whichever is free claims a run
    runs = [operations.create_run(make_pipeline(stages=QUICK, scenario=slow), str(repo), "main") for _ in range(6)]
    for run in runs:
        operations.request_start(run, requested_by="test", source="test")
    for run in runs:
        done = wait_for(run.pk, timeout=180)
        assert done.status == "succeeded", done.stop_message
    used = {Run.objects.get(pk=run.pk).host for run in runs}
    assert used == {host.name for host in two_hosts}, f"the runs did not spread: {used}"
    _assert_every_step_on_its_host(runs, two_hosts)


def test_a_dead_host_leaves_the_other_untouched_and_its_run_waits_for_it(two_hosts, make_pipeline):
    a, b = two_hosts
    a.start()
    b.start()
    # one run each: a repository only host a reaches, one only host b reaches
    text_a, text_b = f"A-{uuid.uuid4().hex[:6]}", f"B-{uuid.uuid4().hex[:6]}"
    run_a = operations.create_run(make_pipeline(stages=QUICK, scenario={
        "stages": {"answer": {"implement": [stub(text_a, 120), ANSWER_STEP]}}}), str(a.repo("only-a")), "main")
    run_b = operations.create_run(make_pipeline(stages=QUICK, scenario={
        "stages": {"answer": {"implement": [stub(text_b, 12)]}}}), str(b.repo("only-b")), "main")
    for run in (run_a, run_b):
        operations.request_start(run, requested_by="test", source="test")
    for run, host in ((run_a, a), (run_b, b)):
        wait_until(lambda run=run: Attempt.objects.filter(run=run, status="running").exclude(pid=None).exists(),
                   60, f"run {run.pk}'s agent on {host.name}", [host.worker])
        assert Run.objects.get(pk=run.pk).host == host.name
    a.kill()
    run_a = wait_for(run_a.pk, statuses=("waiting_review",), timeout=60)
    assert run_a.stop_reason == "interrupted"
    assert run_a.stop_message.startswith(f"Host {a.name} has had no heartbeat for "), run_a.stop_message
    assert run_a.stop_evidence["host_confirmed"] is False
    # host b's run goes on to its end, untouched
    done_b = wait_for(run_b.pk, timeout=120)
    assert done_b.status == "succeeded", done_b.stop_message
    assert not done_b.events.filter(kind__in=("stopped", "interrupted")).exists()
    # exactly once: one decision, one interrupted attempt, and b's beat said so once
    run_a = Run.objects.get(pk=run_a.pk)
    assert run_a.decisions.count() == 1
    assert list(Attempt.objects.filter(run=run_a).values_list("status", flat=True)) == ["interrupted"]
    lost = [int(n) for n in re.findall(r'"host_lost": (\d+)', b.beat.text())]
    assert sum(lost) == 1, lost
    # no recovery while host a has not confirmed its old processes gone
    decision = run_a.decisions.get(state="pending")
    with pytest.raises(operations.OperationError) as refused:
        operations.recover(run_a, decision.pk, "go on", "retry", reviewer="test")
    assert refused.value.code == "host_unconfirmed"
    # host a comes back: its reconciliation at start confirms, then the recovery runs on host a
    a.start()
    wait_until(lambda: Run.objects.get(pk=run_a.pk).stop_evidence.get("host_confirmed") is True, 60,
               "host a to confirm its old processes gone", [a.worker])
    operations.recover(run_a, decision.pk, "go on", "retry", reviewer="test")
    done_a = wait_for(run_a.pk, statuses=("succeeded", "failed", "waiting_review"), timeout=120)
    assert done_a.status == "succeeded", done_a.stop_message
    _assert_every_step_on_its_host([run_a, run_b], two_hosts)
