"""Benchmark: the run detail page of a long run, against the same page of a short one.

Issue text: "The run page of a run with 50 attempts and 200 MB of logs renders in under 300 ms
of server time (logs by reference and tail only), measured in ``bench/``."

Run from the repository root::

    .venv/bin/python bench/run_page.py
    .venv/bin/python bench/run_page.py --attempts 20 --mb 50 --runs 5     # a quick try

Everything lives in a temporary directory under ``$TMPDIR`` (removed at the end; ``--keep``
keeps it): its own var directory and SQLite database (``controlpanel.settings`` with
``CP_VAR_DIR`` pointing there, migrated afresh), a small git repository, and one saved pipeline
with the scripted test adapter. Two runs of that pipeline are given recorded evidence as a
finished run leaves it:

* the **baseline** run: 1 attempt with a 1 KB output log, 2 checks, 5 events;
* the **long** run: ``--attempts`` (50) attempts whose output logs hold ``--mb`` (200) MB of real
  bytes between them (log lines, not sparse files), each attempt with a patch, two checks with
  their logs and five events (250 in all), and a conversation (engine/text/transcript.py) of
  ``--calls`` (2,000) tool calls with their failed results (about 1 MB of transcript each).

Both runs are *running*, their last attempt open: the page shows that attempt's conversation
live at the top (its box loads from the tail endpoint, as the browser does), so the page and the
box are measured as a person watching a long run sees them.

Measured: the server time of ``GET /admin/engine/run/<id>/detail/`` for a logged-in superuser,
through Django's full request handler in this process (``django.test.Client``: middleware,
authentication, the view, the template; no network), once untimed and then ``--runs`` (15)
times in turn for each run; medians are compared. Also printed: the queries each page makes
(they must not grow with the attempts) and the response size (the logs must be links, not
content).

Also measured the same way: the live conversation box (``GET <run>/attempt/<a>/tail/`` of the open
attempt), long against baseline.

*Target:* median(long run) < 300 ms and median(long conversation box) < 300 ms, PASS or FAIL (exit status 0 or 1). The ratio
median(long) / median(baseline) is printed as the cost of 50 attempts and 200 MB over one; the
run also fails when the long page makes more queries than the baseline page or its body holds
more than 2 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 300.0


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def _make_repo(path: Path) -> Path:
    (path / "app").mkdir(parents=True)
    (path / "app" / "__init__.py").write_text("")
    (path / "app" / "core.py").write_text('"""Core."""\n')
    (path / "tests").mkdir()
    (path / "tests" / "test_core.py").write_text("def test_ok():\n    assert len('ok') == 2\n")
    _git(path, "init", "-q", "-b", "main")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "initial")
    return path


def _write_log(path: Path, size: int) -> None:
    """``size`` bytes of agent-like output lines (real bytes on disk)."""
    line = b"2026-12-01 08:00:00 working on app/core.py: reading, thinking, writing ... 0123456789\n"
    block = line * ((1 << 20) // len(line) + 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left > 0:
            chunk = block[:left]
            fh.write(chunk)
            left -= len(chunk)


def _conversation(raw: Path, calls: int) -> None:
    """A claude stream-json capture of ``calls`` tool calls with their results at ``raw``, and its
    transcript beside it, made by engine/text/transcript.py as a live attempt's follower makes it."""
    from engine.text import transcript

    raw.parent.mkdir(parents=True, exist_ok=True)
    with open(raw, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "system", "subtype": "init", "model": "claude-x", "tools": ["Bash", "Read"],
                             "claude_code_version": "2.1.197"}) + "\n")
        for n in range(calls):
            fh.write(json.dumps({"type": "assistant", "message": {"id": f"m{n}", "usage": {
                "input_tokens": 100, "output_tokens": 20}, "content": [
                {"type": "text", "text": f"Step {n}: let me run the tests again and look at the failure."},
                {"type": "tool_use", "id": f"t{n}", "name": "Bash",
                 "input": {"command": "python -m pytest -q tests/test_core.py", "description": "Run the tests"}}]}})
                     + "\n")
            fh.write(json.dumps({"type": "user", "message": {"content": [
                {"type": "tool_result", "tool_use_id": f"t{n}", "is_error": True,
                 "content": "Exit code 1\n" + "F" * 40 + "\nFAILED tests/test_core.py::test_answer\n1 failed"}]}})
                     + "\n")
    transcript.build(raw, "claude", "/work")


def _fill(run, attempts: int, log_bytes: int, calls: int) -> None:
    """Give ``run`` recorded attempts, checks and events, as a long run leaves them; its last attempt is
    still running (the page shows its conversation live at the top), each attempt has a transcript of
    ``calls`` tool calls."""
    from django.conf import settings
    from django.utils import timezone

    from engine.models import Attempt, Check, Run, RunEvent

    stage = run.stages.get()
    var = Path(settings.VAR_DIR)
    now = timezone.now()
    # fixture data of a run in progress (engine/machine.py makes these moves in a real run)
    Run.objects.filter(pk=run.pk).update(status="running", started_at=now, heartbeat_at=now, lease_owner="bench:1")
    for n in range(1, attempts + 1):
        operation = "implement" if n == 1 else "repair"
        folder = f"{run.control_dir}/stages/01-{stage.key}/attempts/{n:03d}-{operation}"
        _write_log(var / folder / "output.log", log_bytes)
        _conversation(var / folder / "output.raw", calls)
        last = n == attempts
        (var / folder / "prompt.md").write_text("# Requirement\nMake it work.\n")
        (var / folder / "patch.diff").write_text("--- a/app/core.py\n+++ b/app/core.py\n@@ -1 +1,2 @@\n"
                                                 ' """Core."""\n+VALUE = 1\n')
        attempt = Attempt.objects.create(
            run=run, stage=stage, operation=operation, number=n, role="implementer", profile_name="scripted",
            adapter="scripted", simulated=True, deadline_seconds=600, status="running" if last else "failed",
            failure_kind="" if last else "gate_failed", exit_code=None if last else 0,
            elapsed_seconds=None if last else 30.0 + n, started_at=now, ended_at=None if last else now,
            log_path=f"{folder}/output.log", raw_path=f"{folder}/output.raw",
            prompt_path=f"{folder}/prompt.md", patch_path=f"{folder}/patch.diff", output_bytes=log_bytes,
            usage={"input_tokens": 1200, "output_tokens": 300, "cached_tokens": 900, "cost_usd": 0.02})
        for name in ("unit", "lint"):
            log = f"{run.control_dir}/checks/{n:03d}-{name}.log"
            _write_log(var / log, 4096)
            check = Check.objects.create(run=run, stage=stage, name=name, command=f"make {name}", cwd=run.worktree,
                                         exit_code=1, passed=False, failure_kind="nonzero_exit", log_path=log,
                                         started_at=now, ended_at=now, elapsed_seconds=2.5,
                                         manifest_digest="ab" * 20)
            RunEvent.objects.create(run=run, kind="check_failed", message=f"Gate '{name}' failed (exit 1).",
                                    stage=stage, gate_check=check)
        for text in ("recorded before launch", "ended: exit 0", "repair consumed"):
            RunEvent.objects.create(run=run, kind="attempt", message=f"Attempt {n} {text}.", stage=stage,
                                    attempt=attempt)


def _time_page(client, url: str, runs: int) -> tuple[list[float], int, int]:
    """Median inputs for one page: ``(times in ms, queries of one request, body bytes)``."""
    from django.core import signals
    from django.db import close_old_connections, connection

    # one connection for the whole benchmark, as a warm server process has
    signals.request_finished.disconnect(close_old_connections)
    response = client.get(url)  # untimed: warm caches, templates compiled
    if response.status_code != 200:
        raise SystemExit(f"FAIL: {url} answered {response.status_code}")
    counted = []

    def count(execute, sql, params, many, context):
        counted.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        client.get(url)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    return times, len(counted), len(response.content)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--mb", type=float, default=200.0, help="MB (10^6 bytes) of output logs in the long run")
    parser.add_argument("--runs", type=int, default=15, help="timed repetitions per page")
    parser.add_argument("--calls", type=int, default=2000, help="tool calls in each attempt's conversation")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-run-page-"))
    os.environ.update({"CP_VAR_DIR": str(tmp / "var"), "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
                       "DJANGO_ALLOWED_HOSTS": "testserver,127.0.0.1"})
    os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    try:
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.test import Client
        from django.urls import reverse

        from engine import operations
        from engine.pipeline.format import validate

        call_command("migrate", verbosity=0)
        repo = _make_repo(tmp / "repo")
        doc = {"name": "bench", "stages": [{"key": "answer", "requirement": "Make it work.", "scope": ["app/**"],
                                            "gates": [{"name": "unit", "command": "true"}]}],
               "roles": {"implementer": "scripted", "reviewer": "scripted", "documenter": "scripted"},
               "profiles": {"scripted": {"adapter": "scripted", "scenario": {"default": [{}]}}}}
        pipeline, _ = operations.save_pipeline(validate(doc, "<bench>"))
        baseline = operations.create_run(pipeline, str(repo), "main")
        long_run = operations.create_run(pipeline, str(repo), "main")
        _fill(baseline, 1, 1024, 2)
        per_log = int(args.mb * 1e6 / args.attempts)
        started = time.perf_counter()
        _fill(long_run, args.attempts, per_log, args.calls)
        written = sum(f.stat().st_size for f in (tmp / "var" / long_run.control_dir).rglob("output.log"))
        print(f"long run {long_run.pk}: {args.attempts} attempts, {written / 1e6:.0f} MB of output "
              f"logs on disk, written in {time.perf_counter() - started:.1f} s")

        user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench-only")
        client = Client()
        client.force_login(user)
        base_times, base_queries, base_size = _time_page(client, reverse("admin:engine_run_detail",
                                                                         args=[baseline.pk]), args.runs)
        long_times, long_queries, long_size = _time_page(client, reverse("admin:engine_run_detail",
                                                                         args=[long_run.pk]), args.runs)
        from engine.models import Attempt

        def live_box(run) -> str:
            attempt = Attempt.objects.filter(run=run, status="running").get()
            return reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])

        base_box_times, _, base_box_size = _time_page(client, live_box(baseline), args.runs)
        long_box_times, _, long_box_size = _time_page(client, live_box(long_run), args.runs)
        base_ms, long_ms = statistics.median(base_times), statistics.median(long_times)
        base_box_ms, long_box_ms = statistics.median(base_box_times), statistics.median(long_box_times)
        print(f"baseline page (1 attempt, 1 KB of logs): median {base_ms:.1f} ms over {args.runs} "
              f"(min {min(base_times):.1f}, max {max(base_times):.1f}), {base_queries} queries, {base_size} bytes")
        print(f"long page ({args.attempts} attempts, {args.mb:.0f} MB of logs): median {long_ms:.1f} ms "
              f"(min {min(long_times):.1f}, max {max(long_times):.1f}), {long_queries} queries, {long_size} bytes")
        print(f"ratio long / baseline: {long_ms / base_ms:.2f}")
        print(f"live conversation box: baseline (2 tool calls) median {base_box_ms:.1f} ms, {base_box_size} bytes; "
              f"long ({args.calls} tool calls) median {long_box_ms:.1f} ms (min {min(long_box_times):.1f}, max "
              f"{max(long_box_times):.1f}), {long_box_size} bytes; ratio {long_box_ms / base_box_ms:.2f}")
        problems = []
        if long_box_ms >= TARGET_MS:
            problems.append(f"the conversation box: median {long_box_ms:.1f} ms >= {TARGET_MS:.0f} ms")
        if long_box_size > 2_000_000:
            problems.append(f"the conversation box is {long_box_size} bytes: it must show the end, not all of it")
        if long_ms >= TARGET_MS:
            problems.append(f"median {long_ms:.1f} ms >= {TARGET_MS:.0f} ms")
        if long_queries > base_queries:
            problems.append(f"the long page makes {long_queries} queries, the baseline {base_queries}")
        if long_size > 2_000_000:
            problems.append(f"the long page is {long_size} bytes: logs must be links and tails, not content")
        if problems:
            print("FAIL: " + "; ".join(problems))
            return 1
        print(f"PASS: the page of a run with {args.attempts} attempts and {args.mb:.0f} MB of logs renders in "
              f"{long_ms:.1f} ms of server time (target < {TARGET_MS:.0f} ms), with no more queries than the "
              f"baseline; its live conversation box ({args.calls} tool calls) in {long_box_ms:.1f} ms")
        return 0
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
