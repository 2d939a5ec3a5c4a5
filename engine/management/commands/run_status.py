"""``python manage.py run_status RUN_ID [--json] [--follow]``: where a run is and why."""

import time


from engine import answers, environments, operations
from engine.text import hints, tool_outcomes
from engine.models import RunEvent

from ._base import EngineCommand


def tool_sentence(attempt: dict) -> str:
    """What happened to an attempt's tool calls that did not succeed: "1 command not found, 2 failed, 1 refused"."""
    return tool_outcomes.sentence(attempt.get("tool_outcomes") or tool_outcomes.counts(attempt.get("refusals")))


def waiting_hint(data: dict) -> str:
    """What a pending, queued or silent run is waiting for, in a sentence ('' when nothing)."""
    run_id = data["id"]
    if data["waiting_for"] == "start":
        return f"needs Start: {hints.manage(f'start_run {run_id}')}"
    if data["waiting_for"] == "worker" and data.get("queued_without_worker"):
        return f"queued, and not claimed: {data['queued_without_worker']}"
    if data["waiting_for"] == "worker":
        return ("queued: waiting for a worker to claim it (is `make worker` running with the same DATABASE_URL "
                "and CELERY_BROKER_URL, and, on the embedded defaults, the same CP_VAR_DIR?)")
    pending = data.get("pending_decision")
    if data["waiting_for"] in ("review", "approval") and data.get("host_unconfirmed"):
        return (f"waits for its host: {data['host_unconfirmed']}; recover and recheck are refused until then "
                f"(or fail it: {hints.manage(f'fail_run {run_id} --reason TEXT')})")
    if data["waiting_for"] == "approval" and pending:
        return (f"waits for approval of files {pending['artifact']}: {hints.manage(f'approve {run_id}')} "
                f"--decision {pending['id']} --artifact {pending['artifact'][:12]} --reviewer YOUR_NAME "
                f"(or {hints.manage(f'request_changes {run_id}')} --decision {pending['id']} --artifact "
                f"{pending['artifact'][:12]} --note TEXT to send it back; or {hints.manage(f'recheck {run_id}')} "
                f"--note TEXT after a correction)")
    if data["waiting_for"] == "review" and data.get("stop_reason") == "budget_exhausted":
        return (f"its budget is exhausted: an exhausted execution budget requires a new run "
                f"({hints.manage('create_run ...')}); fail this one with "
                f"{hints.manage(f'fail_run {run_id} --reason TEXT')}")
    if data["waiting_for"] == "review" and pending:
        recover = next((a for a in data.get("actions") or [] if a["action"] == "recover"), None)
        verify = recover is None or (recover.get("initial") or {}).get("verify", True)
        return (f"waits for a person ({pending['reason']}): {hints.manage(f'recover {run_id}')} --decision "
                f"{pending['id']} --note TEXT --action retry"
                + (" (or --action verify: the gates and review again on the result as it is)" if verify
                   else " (the stage never produced a result to verify)"))
    if data.get("heartbeat_stale"):
        return (f"no heartbeat for {data['heartbeat_age_seconds']:.0f} s: the worker holding this run may have "
                "died; reconciliation (`make beat`) will interrupt it and stop it for review")
    return ""


def host_text(data: dict) -> str:
    """`` on host NAME`` (with ``, LOST: no heartbeat for N s`` when it stopped beating and the run has
    not ended), or ``""`` before a first claim pinned the run to a host."""
    if not data.get("host"):
        return ""
    if data.get("host_alive") or data["status"] in ("succeeded", "failed"):  # an ended run waits for no host
        return f" on host {data['host']}"
    age = data.get("host_beat_age_seconds")
    return f" on host {data['host']} (LOST: " + (f"no heartbeat for {age:.0f} s)" if age is not None else "it never beat)")


def tests_counts(tests: dict | None) -> str:
    """`` [pytest: 12 passed, 1 skipped; agreed 5 of 5]`` (or ``[unittest: ...]``): what a check's test runner recorded (engine/checks/test_reports),
    '' for an exit-status gate."""
    if not tests or not tests.get("counts"):
        return ""
    counts = ", ".join(f"{n} {k}" for k, n in tests["counts"].items() if n) or "no test"
    agreed = tests.get("agreed")
    if agreed:
        counts += f"; agreed {agreed['count'] - agreed['missing']} of {agreed['count']} passed again"
    return f" [{tests.get('runner') or 'pytest'}: {counts}]"


def check_outcome(check: dict) -> str:
    """``pass (exit 0)``, ``FAIL (exit 1)``, ``RUNNING``, or what cut it short (``INTERRUPTED``, ``CANCELLED``,
    ``TIMEOUT``, ``killed by signal 9``): a check that was stopped did not fail."""
    if check["passed"]:
        return "pass (exit 0)"
    if check["ended_at"] is None:
        return "RUNNING"
    kind = check["failure_kind"]
    if kind in ("interrupted", "cancelled", "timeout"):
        return kind.upper()
    if kind in ("process_limit", "memory_limit", "write_limit", "output_too_large"):  # engine/processes/limits.py
        return f"FAIL ({kind}: stopped at its limit)"
    if kind in ("runner_incomplete", "tests_failed", "tests_missing"):  # exit 0, but the runner's record says not
        return f"FAIL ({kind}: exit {check['exit_code']}, not what its test runner recorded)"
    if check["exit_code"] is None and check["signal"] is not None:
        return f"killed by signal {check['signal']}"
    return f"FAIL (exit {check['exit_code']}" + (f", {kind})" if kind and kind != "nonzero_exit" else ")")


class Command(EngineCommand):
    help = "Show a run: status, stages, attempts, checks; --follow prints progress until the run stops."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", help="print the run record as JSON")
        parser.add_argument("--follow", action="store_true", help="print progress lines until the run stops")
        parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls with --follow")
        parser.add_argument("--timeout", type=float, default=0, help="give up following after this many seconds")

    def handle(self, *args, **options):
        run = operations.get_run(options["run_id"])
        if options["follow"]:
            # with --json the progress lines go to stderr, so stdout stays one JSON document
            self.progress = self.stderr if options["json"] else self.stdout
            self.follow(run, options["interval"], options["timeout"])
        if options["json"]:
            self.print_json(operations.run_status(run))
        elif not options["follow"]:
            self.summary(operations.run_status(run))

    def follow(self, run, interval, timeout):
        out = self.progress.write
        seen, hinted = 0, None
        started = time.monotonic()
        sim = f" [SIMULATED: {run.simulated_reason}]" if run.simulated else ""
        out(f"following run {run.pk} of {run.pipeline_name}{sim}")
        while True:
            for event in RunEvent.objects.filter(run=run, pk__gt=seen).order_by("id"):
                seen = event.pk
                out(f"{event.at:%H:%M:%S} {event.kind:<18} {event.message}")
            run.refresh_from_db()
            if operations.run_stopped(run):
                for event in RunEvent.objects.filter(run=run, pk__gt=seen).order_by("id"):
                    seen = event.pk
                    out(f"{event.at:%H:%M:%S} {event.kind:<18} {event.message}")
                out(f"run {run.pk} is {run.status}" + (f" ({run.stop_reason})" if run.stop_reason else ""))
                return
            hint = waiting_hint(operations.run_status(run))
            if hint and hint != hinted:
                out(f"         {hint}")
            hinted = hint
            if timeout and time.monotonic() - started > timeout:
                out(f"run {run.pk} is still {run.status} after {timeout:.0f} s; stopped following")
                return
            time.sleep(interval)

    def summary(self, data):
        sim = " [SIMULATED]" if data["simulated"] else ""
        status = data["status"] + (" (NO HEARTBEAT: its worker may be gone)" if data.get("heartbeat_stale") else "")
        lines = [f"run {data['id']} of {data['pipeline']}{sim}: {status}",
                 f"  commit {data['commit']} ({data['revision']}), branch {data['branch']}",
                 f"  worktree {data['worktree']}" + host_text(data),
                 f"  used: {answers.totals_sentence(data['totals'])}"]
        hint = waiting_hint(data)
        if hint:
            lines.append(f"  {hint}")
        if data["stop_reason"]:
            lines.append(f"  stopped: {data['stop_reason']}: {data['stop_message']}")
        evidence = data.get("stop_evidence") or {}
        earlier = evidence.get("led_here")
        if isinstance(earlier, dict) and earlier.get("reason"):  # the stop a person failed or recovered it from
            lines.append(f"  what led here: {earlier['reason']}: {earlier.get('message') or ''}")
        if data["status"] in ("waiting_review", "waiting_approval") and evidence.get("host_confirmed") is True:
            lines.append(f"  since then: host {evidence.get('host') or data['host']} is back and confirmed the run's "
                         f"old processes gone ({evidence.get('host_reaped', 0)} still alive were stopped)")
        setup = data.get("setup")
        if setup:
            check = setup["check"] or {}
            info = check.get("setup") or {}
            made_by = info.get("made_by") or {}
            how = ("not run yet" if not check
                   else f"reused environment {environments.short(info.get('key'))} made by run {made_by.get('run', '?')} (check "
                        f"{made_by.get('check', '?')}); nothing ran" if setup["reused"]
                   else f"{check_outcome(check)}, {check.get('elapsed_seconds') or 0:.1f} s" +
                        (f", environment {environments.short(info.get('key'))}" if info.get("key") else ""))
            lines.append(f"  setup: {how}")
        for stage in data["stages"]:
            lines.append(f"  stage {stage['key']}: {stage['status']} ({stage['phase']})"
                         + (f", checkpoint {stage['checkpoint'][:12]}" if stage["checkpoint"] else "")
                         + (f", repairs {stage['repairs_used']}/{stage['repair_allowance']}"
                            if stage["repairs_used"] else ""))
            for a in stage["attempts"]:
                how = ("stopped by the engine at its deadline" if a["status"] == "timeout"
                       else f"exit {a['exit_code']}" if a["exit_code"] is not None
                       else f"killed by signal {a['signal']}" if a["signal"] is not None
                       else "no exit status yet" if a["status"] in ("preparing", "running") else "no exit status")
                lines.append(f"    attempt {a['number']} {a['operation']} [{a['adapter']}]: {a['status']}, {how}"
                             + (f", {a['failure_kind']}" if a["failure_kind"] and a["failure_kind"] != a["status"]
                                else "")
                             + (f", verdict {a['verdict']['verdict']}" if a["verdict"] else "")
                             + (f", invalid verdict: {a['verdict_problem']}" if a["verdict_problem"] else "")
                             + (f", tool calls: {tool_sentence(a)}" if a["refusals"] else ""))
            for c in stage["checks"]:
                lines.append(f"    check {c['name']}: {check_outcome(c)} `{c['command']}`"
                             + (" [stale]" if c["stale"] else "") + tests_counts(c.get("tests")))
        for line in lines:
            self.stdout.write(line)

