"""An attempt cannot take the worker down with it: processes, memory, bytes written and output are
bounded per attempt and per gate (engine/processes/limits.py; issue 17).

The attacks, each by the real claude CLI's Bash tool (the model scripted): fork 400 processes,
write 1 GB into the worktree or the data folder, print 1 GB into the CLI's own output (through
``/proc/1/fd/1``, the sandbox's first process, whose standard output is the engine's pipe), and
allocate past the memory limit. Each attempt is stopped with its reason, the evidence up to the
limit is kept, nothing of the tree is left running, its control groups are gone, and another run
on the same worker goes on as if nothing happened.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.processes import limits
from engine.models import Attempt, Check
from engine.processes.process import find_marked

from ..conftest import wait_for
from .attacks import QUICK_STAGE, claude_attack_pipeline, needs_claude, start_and_drive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MB = 1024 * 1024


def leftover_groups(record: dict) -> list[str]:
    """The control groups an attempt or check had (its ``limits`` record) that are still there."""
    assert record["groups"] or record["mechanism"] == "fallback", record
    return [group for group in record["groups"] if Path(group).exists()]


def attack(make_pipeline, repo, sent, command: str, **limits_asked):
    pipeline = claude_attack_pipeline(make_pipeline, [command], name="bounded", limits=limits_asked)
    run = start_and_drive(pipeline, repo, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    return run, attempt


def test_the_worker_says_which_limits_are_in_force():
    kind, sentence = limits.mechanism()
    assert kind in ("cgroup-v2", "cgroup-v1", "fallback") and sentence
    if Path("/sys/fs/cgroup/pids/cgroup.procs").exists() and Path("/sys/fs/cgroup/memory").is_dir():
        assert kind in ("cgroup-v2", "cgroup-v1"), sentence  # this project's machines mount the v1 controllers
    assert "512 processes" in limits.describe() and kind.replace("cgroup-", "cgroup ") in limits.describe()


def test_a_pipeline_lowers_a_limit_and_cannot_raise_one():
    from engine.pipeline.format import PipelineFormatError

    from ..conftest import pipeline_definition
    assert pipeline_definition(limits={"max_processes": 50})["limits"]["max_processes"] == 50
    with pytest.raises(PipelineFormatError, match="limits.max_output_mb: 100000 is above the operator's limit"):
        pipeline_definition(limits={"max_output_mb": 100_000})
    assert limits.effective({"max_processes": 50, "max_write_mb": None}).max_processes == 50
    assert limits.effective({"max_processes": 10**6}).max_processes == limits.operator_limits().max_processes


@needs_claude
def test_a_fork_bomb_is_stopped_at_the_process_limit(make_pipeline, repo, sent):
    run, attempt = attack(make_pipeline, repo, sent, "for i in $(seq 400); do sleep 120 & done; wait",
                          max_processes=64)
    assert (attempt.failure_kind, run.stop_reason) == ("process_limit", "process_limit"), attempt.failure_message
    assert attempt.limits["limits"]["max_processes"] == 64 and attempt.limits["reached"] == "process_limit"
    assert attempt.limits["mechanism"] in ("cgroup-v1", "cgroup-v2")
    assert 0 < attempt.limits["peak_processes"] <= 64
    assert find_marked(attempt.marker) == [] and leftover_groups(attempt.limits) == []
    assert "limit reached: process_limit" in (Path(settings.VAR_DIR) / attempt.log_path).read_text()


@needs_claude
@pytest.mark.parametrize("where", ["worktree", "data folder"])
def test_writing_a_gigabyte_is_stopped_at_the_write_limit(make_pipeline, repo, sent, where):
    target = "app/junk.bin" if where == "worktree" else '"$CP_DATA_DIR/junk.bin"'
    run, attempt = attack(make_pipeline, repo, sent, f"head -c 1073741824 /dev/zero > {target}; sleep 30",
                          max_write_mb=20)
    assert (attempt.failure_kind, run.stop_reason) == ("write_limit", "write_limit"), attempt.failure_message
    assert 20 * MB <= attempt.limits["written_bytes"] < 40 * MB  # stopped at the limit, not at 1 GB
    written = Path(run.worktree, "app", "junk.bin") if where == "worktree" else \
        Path(settings.VAR_DIR, "scratch", f"run-{run.pk}", "data", "junk.bin")
    assert written.exists() and written.stat().st_size <= 20 * MB  # what it wrote up to the limit is kept
    assert find_marked(attempt.marker) == []


@needs_claude
def test_printing_a_gigabyte_into_the_clis_output_is_stopped_and_both_ends_are_kept(make_pipeline, repo, sent):
    run, attempt = attack(make_pipeline, repo, sent,
                          "(echo FIRST-LINE; head -c 1073741824 /dev/zero | tr '\\0' y; echo; echo LAST-LINE) "
                          "> /proc/1/fd/1; sleep 30", max_output_mb=4)
    assert (attempt.failure_kind, run.stop_reason) == ("output_too_large", "output_too_large"), attempt.failure_message
    assert attempt.limits["reached"] == "output_too_large"
    raw = Path(settings.VAR_DIR, attempt.raw_path)
    assert raw.stat().st_size < 5 * MB and attempt.output_bytes <= 4 * MB
    text = raw.read_bytes()
    assert b"FIRST-LINE" in text[:2 * MB] and b"output passed its cap of 4194304 bytes" in text
    assert find_marked(attempt.marker) == []


@needs_claude
def test_allocating_past_the_memory_limit_is_stopped(make_pipeline, repo, sent):
    grab = f"{sys.executable} -c \"b = bytearray(400 * 1024 * 1024); import time; time.sleep(30)\""
    run, attempt = attack(make_pipeline, repo, sent, f"{grab}; sleep 30", max_memory_mb=256)
    assert (attempt.failure_kind, run.stop_reason) == ("memory_limit", "memory_limit"), attempt.failure_message
    assert find_marked(attempt.marker) == [] and leftover_groups(attempt.limits) == []


def test_a_gate_running_an_agents_fork_bomb_fails_at_the_limit(make_pipeline, repo, sent):
    stage = {**QUICK_STAGE, "gates": [{"name": "bomb", "command": "for i in $(seq 400); do sleep 120 & done; wait"}]}
    pipeline = make_pipeline(stages=[stage], limits={"max_processes": 64})
    run = start_and_drive(pipeline, repo, sent)
    check = Check.objects.filter(run=run, name="bomb").order_by("id").first()
    assert check is not None and not check.passed and check.failure_kind == "process_limit", run.stop_message
    assert check.limits["reached"] == "process_limit" and leftover_groups(check.limits) == []


def test_a_gate_writing_a_gigabyte_fails_at_the_write_limit_and_says_so(make_pipeline, repo, sent):
    from django.core.management import call_command
    from io import StringIO

    stage = {**QUICK_STAGE, "gates": [{"name": "fill", "command": "head -c 1073741824 /dev/zero > big.bin"}],
             "repair_allowance": 0}
    pipeline = make_pipeline(stages=[stage], limits={"max_write_mb": 20})
    run = start_and_drive(pipeline, repo, sent)
    check = Check.objects.filter(run=run, name="fill").order_by("id").first()
    assert check is not None and not check.passed and check.failure_kind == "write_limit", run.stop_message
    assert check.limits["reached"] == "write_limit" and check.limits["written_bytes"] >= 20 * MB
    assert "limit reached: write_limit" in (Path(settings.VAR_DIR) / check.log_path).read_text()
    out = StringIO()
    call_command("run_status", str(run.pk), stdout=out)
    assert "FAIL (write_limit: stopped at its limit)" in out.getvalue()


@needs_claude
def test_the_worker_and_another_run_are_unaffected(workers, make_pipeline, repo):
    bomb = claude_attack_pipeline(make_pipeline, ["for i in $(seq 400); do sleep 120 & done; wait"], name="bomb",
                                  limits={"max_processes": 64})
    honest = make_pipeline(name="honest")
    runs = [operations.create_run(pipeline, str(repo), "main") for pipeline in (bomb, honest)]
    for run in runs:
        operations.request_start(run, requested_by="t", source="test")
    bombed, finished = (wait_for(run.pk, timeout=240) for run in runs)
    assert bombed.stop_reason == "process_limit", bombed.stop_message
    assert finished.status == "succeeded", finished.stop_message
    assert all(proc.poll() is None for proc in workers.procs)  # the worker lives on
    assert "attempt limits: " in workers.log_text()
