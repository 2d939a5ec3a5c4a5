"""Gate commands: each runs with ``bash -eo pipefail -c`` inside the agents' sandbox (bytecode
removed first, the run's protected files bound read-only, a gate's ``network_allow`` reached
through its own egress proxy) and is recorded as a Check; the latest results of a stage's gates
on a set of files, and the sentence that says how a check ended."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import boundary, environments, machine
from ..checks import test_reports
from ..processes import limits
from ..agents import sandbox
from ..agents.network import egress, network_record
from ..models import Check, Run, StageRun
from ..redaction import Redactor, secret_env_values
from .common import LeaseLost, fenced, hosts_sentence, lease_guard
from .paths import control_path, process_marker_prefix, scratch_dirs, var_path


def gate_commands(run: Run) -> list[str]:
    """Every gate command of the run's frozen definition: baseline checks, then each stage's gates."""
    pipeline = run.definition["pipeline"]
    commands = [g["command"] for g in pipeline.get("baseline_checks") or []]
    return commands + [g["command"] for stage in pipeline["stages"] for g in stage.get("gates") or []]


def run_gate(run: Run, stage: StageRun, gate: dict, kind: str, digest_before: str, env: dict, should_stop,
             round_no: int, cwd: str | None = None, lease: str | None = None,
             apart: tuple[str, list[str]] | None = None) -> Check:
    """Run one frozen gate command with ``bash -eo pipefail -c`` in the worktree (or ``cwd``) and record a Check.

    ``lease``: the step's fencing token; a gate whose lease is gone by the time it starts is
    stopped at once (LeaseLost). ``apart``: the gate's pytest collects only the listed test files
    (``("only", files)``) or all but them (``("except", files)``): engine/steps/agreed.py."""
    argv = ["bash", "-eo", "pipefail", "-c", gate["command"]]
    cwd = cwd or run.worktree
    if gate.get("network_allow"):  # the only hosts this gate reaches, through its own egress proxy
        with egress({"network_allow": gate["network_allow"]}, deny=boundary.service_addresses()) as (proxy, policy):
            check = _run_gate_in(run, stage, gate, kind, digest_before, argv, cwd, env, should_stop, lease, policy,
                                 apart)
        record = network_record(proxy)
        Check.objects.filter(pk=check.pk).update(network=record)
        if record["refused"] and lease:
            with transaction.atomic():
                if fenced(run.pk, lease) is not None:
                    machine.event(run, "network_refused",
                                  f"Check '{gate['name']}' tried to reach what its network_allow does not name: "
                                  f"{hosts_sentence(record['refused'])}. Its egress proxy refused each.",
                                  stage=stage, gate_check=check, data={"refused": record["refused"][:50]})
        return check
    return _run_gate_in(run, stage, gate, kind, digest_before, argv, cwd, env, should_stop, lease, None, apart)


def _run_gate_in(run: Run, stage: StageRun, gate: dict, kind: str, digest_before: str, argv: list[str], cwd: str,
                 env: dict, should_stop, lease: str | None, network, apart=None) -> Check:
    """``run_gate`` inside the sandbox, with ``network`` (a NetworkPolicy) or none."""
    env, launch, reporter = _gate_sandbox(run, argv, cwd, env, network, apart)
    try:
        return _run_gate_process(run, stage, gate, kind, digest_before, argv, cwd, env, launch, should_stop, lease,
                                 reporter)
    finally:
        shutil.rmtree(env["HOME"], ignore_errors=True)
        reporter.remove()


def _run_gate_process(run: Run, stage: StageRun, gate: dict, kind: str, digest_before: str, argv: list[str],
                      cwd: str, env: dict, launch: list[str], should_stop, lease: str | None,
                      reporter: test_reports.Reporter) -> Check:
    """Record the Check, run ``launch`` under supervision, and fill the Check in: its exit status,
    then what the test runner recorded against it (engine/checks/test_reports)."""
    check = Check.objects.create(
        run=run, stage=stage, kind=kind, name=gate["name"], command=gate["command"], argv=argv, cwd=cwd,
        started_at=timezone.now(), manifest_digest=digest_before,
    )
    log_rel = control_path(run, "checks", f"{check.pk:05d}-{gate['name']}.log")
    check.log_path = log_rel  # recorded before it runs: a running gate's log can be followed
    check.save(update_fields=["log_path"])
    try:
        result, bounds = _bounded(run, gate, cwd, env, launch, log_rel, should_stop, lease, f"check-{check.pk}")
    except LeaseLost:
        Check.objects.filter(pk=check.pk).update(failure_kind="cancelled", ended_at=timezone.now())
        raise
    check.limits = bounds.record()
    if launch is not argv and result.signal is None and result.exit_code is not None and result.exit_code > 128:
        # bubblewrap reports a command killed by signal N as exit 128 + N
        result.signal, result.exit_code = result.exit_code - 128, None
    failure = process_failure(result)
    check.tests = _tests_of(run, check, reporter, log_rel)
    why = ""
    if not failure and not result.timed_out and not result.cancelled:
        failure, why = test_reports.judge(gate["command"], result.exit_code, check.tests)
    if why:  # said in the check's log too, where people read what the gate printed
        check.tests = {**(check.tests or {}), "why": why}
        with contextlib.suppress(OSError), open(var_path(log_rel), "a", encoding="utf-8") as log:
            log.write(f"\n[control panel] The gate failed ({failure}): {why}; only a finished test session "
                      "whose record agrees with the exit status passes.\n")
    check.log_path = log_rel
    check.ended_at = timezone.now()
    check.elapsed_seconds = result.elapsed_seconds
    check.exit_code = result.exit_code
    check.signal = result.signal
    check.passed = (result.exit_code == 0 and not result.timed_out and not result.cancelled and not result.limit
                    and not failure)
    check.failure_kind = failure
    check.save()
    return check


def process_failure(result) -> str:
    """How a check's process ended, as its failure kind ('' for an exit status of 0)."""
    if result.missing_executable:
        return "missing_executable"
    if result.limit:  # process_limit, memory_limit, write_limit, output_too_large
        return result.limit
    if result.timed_out:
        return "timeout"
    if result.cancelled:
        return "cancelled"
    if result.signal is not None:
        return "killed"
    if result.exit_code == 127:
        return "command_not_found"
    if result.exit_code != 0:
        return "nonzero_exit"
    return ""


def collect_tests(run: Run, gate: dict, cwd: str, env: dict, should_stop, lease: str | None,
                  log_rel: str, collect_only: bool = True) -> dict:
    """The gate's command run in ``cwd`` with ``--collect-only`` added for pytest (``CP_TEST_COLLECT_ONLY``
    for unittest: nothing runs), in
    the gates' sandbox and under their limits, recorded as no Check: what engine/steps/agreed.py
    keeps as the stage's agreed tests. Returns ``{"exit_code", "log_path", "record_path",
    "listed", "marked", "outcomes"}`` (``record_path`` None when no runner recorded anything).
    ``collect_only`` False runs the tests (``outcomes``: each test's, as its runner recorded it)."""
    argv = ["bash", "-eo", "pipefail", "-c", gate["command"]]
    if collect_only:
        env = {**env, "PYTEST_ADDOPTS": " ".join(filter(None, [env.get("PYTEST_ADDOPTS"), "--collect-only"])),
               "CP_TEST_COLLECT_ONLY": "1"}  # python -m unittest: engine/checks/test_reports/unittest_hook.py lists, runs none
    env, launch, reporter = _gate_sandbox(run, argv, cwd, env)
    try:
        result, _ = _bounded(run, gate, cwd, env, launch, log_rel, should_stop, lease,
                             f"{'collect' if collect_only else 'baseline'}-{gate['name']}")
        record = test_reports.parse(reporter.record)
        return {"exit_code": result.exit_code, "log_path": log_rel,
                "record_path": _keep_record(reporter, log_rel) if record is not None else None,
                "listed": sorted(set(record.listed)) if record else [],
                "marked": sorted(record.marked) if record else [],
                "outcomes": dict(record.outcomes) if record else {}}
    finally:
        shutil.rmtree(env["HOME"], ignore_errors=True)
        reporter.remove()


def _bounded(run: Run, gate: dict, cwd: str, env: dict, launch: list[str], log_rel: str, should_stop,
             lease: str | None, marker: str):
    """``(result, bounds)`` of ``launch`` run under the gate's deadline and the run's limits: the code a
    gate runs is the agent's, bounded as an attempt is (engine/processes/limits.py). Raises LeaseLost."""
    deadline = float(gate.get("deadline") or run.definition["pipeline"]["deadlines"]["gate"])
    bounds = limits.Bounds(limits.effective(run.definition["pipeline"].get("limits")), "check",
                           [cwd, env.get("HOME", ""), env.get("TMPDIR", ""), env.get("CP_DATA_DIR", "")],
                           marker=f"{process_marker_prefix(run)}{marker}")
    result = bounds.run(launch, cwd=cwd, env=env, deadline_seconds=deadline, log_path=str(var_path(log_rel)),
                        redactor=Redactor(secret_env_values(env)), should_stop=should_stop, grace_seconds=5.0,
                        on_start=lease_guard(run.pk, lease) if lease else None)
    return result, bounds


def _keep_record(reporter: test_reports.Reporter, log_rel: str) -> str | None:
    """The runner's record copied beside the log ``log_rel`` (its path), as evidence; None when it could not be."""
    kept = log_rel[:-len(".log")] + ".tests.jsonl" if log_rel.endswith(".log") else log_rel + ".tests.jsonl"
    try:
        if reporter.record.stat().st_size > test_reports.MAX_RECORD_BYTES:
            return None
        shutil.copyfile(reporter.record, var_path(kept))
    except OSError:
        return None
    return kept


def _tests_of(run: Run, check: Check, reporter: test_reports.Reporter, log_rel: str) -> dict | None:
    """What the gate's test runner recorded (engine/checks/test_reports ``read``), its record kept beside the
    check's log as evidence (``record_path``)."""
    summary = test_reports.read(reporter.record)
    if summary is not None:
        kept = _keep_record(reporter, log_rel)
        if kept:
            summary["record_path"] = kept
    return summary


def _gate_sandbox(run: Run, argv: list[str], cwd: str, env: dict, network=None,
                  apart=None) -> tuple[dict, list[str], test_reports.Reporter]:
    """The environment and argument array of a gate: inside the agents' bubblewrap sandbox.

    A gate runs code an agent wrote, so it gets what an agent gets (engine/agents/sandbox.py):
    an allow-listed view (system folders, the Python install and PATH folders read-only), ``cwd``
    (the worktree or the final checkout), the run's TMPDIR and data folder and a fresh HOME of its
    own writable (``gate-home-*``, removed after the check: what one gate's code leaves there, a
    ``.pth`` file in the user site folder or a ``.gitconfig``, never reaches the next gate), its own PID namespace (nothing it starts outlives it) and its own network
    namespace with no way out: loopback only, where two runs' gates may bind the same port. The
    run's protected files are bound read-only in ``cwd`` (``_protected_in``).
    ``network``: a gate with ``network_allow`` gets its egress proxy's NetworkPolicy (those hosts only).

    Raises boundary.BoundaryNotEnforced when no sandbox can be made, or the self-check finds a
    Control Panel service reachable from inside: a gate never runs unguarded.
    """
    boundary.self_check()
    scratch = Path(scratch_dirs(run.pk)["tmp"]).parent
    home = Path(tempfile.mkdtemp(prefix="gate-home-", dir=scratch))
    reporter = test_reports.prepare(scratch, home, apart)
    remove_bytecode(cwd)
    env = reporter.env({**env, "HOME": str(home), **(network.env() if network is not None else {})})
    env, binds = environments.apply_to(run, env, cwd)  # the setup's environment, read-only, first on PATH
    writable = [cwd, env["TMPDIR"], env["CP_DATA_DIR"], str(home)]
    visible = sandbox.git_dirs(cwd) + sandbox.tool_paths(env.get("PATH")) + [str(reporter.folder)]
    read_only = [os.path.join(cwd, ".git"), *_protected_in(run, cwd)]
    return env, sandbox.wrap(argv, writable=writable, read_only=read_only,
                             hide=sandbox.private_paths(str(settings.VAR_DIR)), visible=visible,
                             network=network, binds=binds), reporter


#: Protected files bound read-only one by one while a gate runs, at most (each is three bwrap
#: arguments; a command line has a size limit).
MAX_BOUND_PROTECTED = 4000


def remove_bytecode(top: str) -> int:
    """Remove every ``__pycache__`` folder and ``*.pyc``/``*.pyo`` file under ``top`` (not in its
    ``.git``, following no symlink); returns how many were removed.

    Called before every gate: bytecode is excluded from manifests (never a deliverable, never
    seen by the tamper checks), and Python runs a ``.pyc`` whose header matches a source file's
    size and mtime instead of that source, or a sourceless ``x.pyc`` as module ``x``: an agent
    (or an earlier gate's code) could plant one for a protected helper.
    """
    removed = 0
    for folder, dirs, files in os.walk(top, followlinks=False):
        if folder == top and ".git" in dirs:
            dirs.remove(".git")
        for name in list(dirs):
            if name == "__pycache__":
                dirs.remove(name)
                path = os.path.join(folder, name)
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)
                removed += 1
        for name in files:
            if name.endswith((".pyc", ".pyo")) or name == "__pycache__":
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
                removed += 1
    return removed


def _protected_in(run: Run, cwd: str) -> list[str]:
    """The run's protected files as they lie in ``cwd``, to be bound read-only while a gate runs:
    code a gate runs (the agent's) must not rewrite a protected test before the runner reads it
    (and put it back after, out of the manifests' sight). Regular files only, whose real path is
    inside ``cwd``: a symlink, or a file reached through one, is never bound (the tamper checks
    report what changed)."""
    top = os.path.realpath(cwd)
    found = []
    # the records the patterns or a gate name first, then the folder rule's: past the cap, the
    # manifests before and after the gates still see a change (only a rewrite put back unseen)
    records = sorted(run.protected_files or [], key=lambda r: not r["why"].startswith(("matches", "named", "read by")))
    for record in records[:MAX_BOUND_PROTECTED]:
        path = os.path.join(top, record["path"])
        real = os.path.realpath(path)
        if real == path and real.startswith(top + os.sep) and os.path.isfile(path) and not os.path.islink(path):
            found.append(path)
    return found


def gate_results(stage: StageRun, digest: str) -> dict[str, bool]:
    """The latest non-stale result of each of the stage's gates on the files ``digest``;
    a gate that did not run on them counts as not passed."""
    pipeline = stage.run.definition["pipeline"]
    names = [g["name"] for g in pipeline.get("baseline_checks") or []] + [g["name"] for g in stage.spec["gates"]]
    results = {name: False for name in names}
    for check in stage.checks.filter(manifest_digest=digest, stale=False).order_by("id"):
        if check.name in results:
            results[check.name] = check.passed
    return results


def setup_sentence(check: Check) -> str:
    """How a setup check (engine/steps/setup.py) ended, in one sentence."""
    info = check.setup or {}
    if check.passed and info.get("reused"):
        made_by = info.get("made_by") or {}
        return (f"Setup: reused the environment {environments.short(info.get('key'))} made by run {made_by.get('run', '?')}'s "
                f"setup (check {made_by.get('check', '?')}, exit status 0); nothing ran.")
    if check.passed:
        return (f"Setup passed in {check.elapsed_seconds or 0:.1f} s: its commands exited 0; the environment "
                f"{environments.short(info.get('key'))} is kept for later runs and shown read-only to every agent and gate.")
    why = {"timeout": "passed its deadline and was killed", "cancelled": "was stopped because the run stopped",
           "killed": f"was killed by signal {check.signal}",
           "command_not_found": "failed: command not found (exit status 127)",
           "setup_refused": "were not run (its log says why)" if check.exit_code is None else
           f"exited {check.exit_code}, but what they kept was refused (its log says why)"}.get(
        check.failure_kind, f"exited {check.exit_code}" if check.exit_code is not None else "could not run")
    return f"Setup failed: its commands {why}{'' if check.failure_kind in ('', 'nonzero_exit') else f' ({check.failure_kind})'}."


def check_sentence(check: Check) -> str:
    if check.kind == "setup":
        return setup_sentence(check)
    label = {"baseline": "Baseline check", "gate": "Gate"}.get(check.kind, "Check")
    if check.passed:
        return f"{label} '{check.name}' passed: `{check.command}` exited 0."
    reasons = {
        "command_not_found": f"`{check.command}` failed: command not found (exit 127)",
        "missing_executable": f"`{check.command}` could not start: bash was not found",
        "timeout": f"`{check.command}` passed its deadline and was killed",
        "killed": f"`{check.command}` was killed by signal {check.signal}",
        "cancelled": f"`{check.command}` was stopped because the run stopped",
        "runner_incomplete": f"`{check.command}` did not finish its tests (runner_incomplete): "
                             f"{(check.tests or {}).get('why') or 'its runner recorded no finished session'}",
        "tests_failed": f"`{check.command}` had failing tests (tests_failed): "
                        f"{(check.tests or {}).get('why') or 'its runner recorded failures'}",
        "tests_missing": f"`{check.command}` did not run every agreed test (tests_missing): "
                         f"{(check.tests or {}).get('why') or 'agreed tests were not reported passed'}",
    }
    why = reasons.get(check.failure_kind, f"`{check.command}` exited {check.exit_code}")
    if check.failure_kind in ("runner_incomplete", "tests_failed", "tests_missing"):
        return (f"{label} '{check.name}' failed: {why}; only an exit status of 0 from a test session that its "
                f"runner recorded to the end, every test passing, passes.")
    return f"{label} '{check.name}' failed: {why}; only an exit status of 0 passes."
