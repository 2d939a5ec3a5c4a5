"""The Codex adapter (engine/agents/codex/adapter.py), driven directly, with the real ``codex`` 0.171.0 binary
against the scripted model endpoint (tests marked ``slow``), and its parser and classification alone.

The real-binary tests skip only when tools/agents has no codex (``make agents`` installs it).
"""
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from engine import operations
from engine.text import transcript
from engine.agents import AgentResult, get_adapter
from engine.agents.codex.adapter import CodexAdapter, build_argv, parse_events, usage_of
from engine.models import Attempt
from engine.processes.process import MARKER_ENV, ProcessResult

from .conftest import git
from .support.runs import drive
from .support.adapters import log_of, write_jsonl
from .support.codex import make_request, needs_codex

# the stand-in CLIs these tests write in tmp_path are executables the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("stand_ins_listed")


USAGE_1 = {"input_tokens": 501, "output_tokens": 31, "cached_input_tokens": 200, "reasoning_output_tokens": 3}
USAGE_2 = {"input_tokens": 502, "output_tokens": 32, "cached_input_tokens": 201, "reasoning_output_tokens": 4}


def marked(marker: str) -> list:
    """Live processes carrying ``CP_PROCESS_MARKER=marker`` (zombies have no environment)."""
    return [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(MARKER_ENV) == marker]


# ----------------------------------------------------------------------------- the real codex CLI


WRITE_ANSWER = {"turns": [
    {"tool": "exec_command", "input": {"cmd": "printf 'def answer():\\n    return 42\\n' > app/core.py"},
     "usage": USAGE_1},
    {"text": "Done: answer() returns 42.", "usage": USAGE_2},
]}


REVIEW_TRIES_TO_WRITE = {"turns": [
    {"tool": "exec_command", "input": {"cmd": "touch made-by-reviewer.txt"}},
    {"tool": "exec_command", "input": {"cmd": "echo hi > app/core.py"}},
    {"text": 'Looked at it.\n```json\n{"verdict": "pass", "findings": []}\n```'}]}


@needs_codex
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stage_run_by_the_real_codex_through_the_engine(make_pipeline, repo, sent):
    pipeline = make_pipeline(
        name="codex", roles={"implementer": "codex", "reviewer": "codex", "documenter": "codex"},
        profiles={"codex": {"adapter": "codex", "scripted_endpoint": {"stages": {"answer": {
            "implement": WRITE_ANSWER, "review": REVIEW_TRIES_TO_WRITE}}}}},
        deadlines={"implement": 60, "gate": 120})
    run = operations.create_run(pipeline, str(repo), "main")
    assert run.simulated and run.simulated_reason == "scripted model endpoint"
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    log = (Path(settings.VAR_DIR) / attempt.log_path).read_text()
    assert run.status == "succeeded", (run.stop_message, log[-3000:])
    assert attempt.adapter == "codex" and attempt.simulated and attempt.cli_version.startswith("codex-cli 0.171.0")
    # the model gateway's reading of the wire (engine/model_gateway/usage.py): input at full price apart from
    # the cached input, which OpenAI counts among its input_tokens (1003 = 602 + 401)
    assert attempt.usage["input_tokens"] == 602 and attempt.usage["output_tokens"] == 63
    assert attempt.usage["cached_tokens"] == 401 and attempt.usage["cost_usd"] is None
    assert attempt.gateway["cli_usage"]["input_tokens"] == 1003  # codex's own claim, kept as a claim
    assert attempt.session_id and attempt.final_message == "Done: answer() returns 42."
    assert "return 42" in git(repo, "show", f"{run.stages.get().checkpoint_commit}:app/core.py")
    assert "SIMULATED" in log
    # the reviewer: codex exec in its read-only sandbox; the writes it tried are refused and
    # recorded, nothing is created, and the run went on on its verdict
    review = Attempt.objects.get(run=run, operation="review")
    assert review.status == "succeeded" and review.verdict == {"verdict": "pass", "findings": []}
    assert [d["command"] for d in review.refusals] == ["touch made-by-reviewer.txt", "echo hi > app/core.py"]
    assert not (Path(run.worktree) / "made-by-reviewer.txt").exists()
    assert "return 42" in (Path(run.worktree) / "app" / "core.py").read_text()
    # the conversations, normalized from the real CLI's JSON events (engine/text/transcript.py)
    said = conversation(attempt)
    assert said[0][0] == "start" and ("text", "Done: answer() returns 42.") in said
    assert any(kind == "tool_call" and text.startswith("Runs `") and "app/core.py" in text for kind, text in said), said
    assert any(kind == "tool_result" and text == "exit status 0" for kind, text in said), said
    assert any(kind == "usage" and "1,003 in" in text for kind, text in said), said
    review_said = conversation(review)
    # each refused write once, as a call and its refusal: from codex's stream when it reports one (under load
    # its own guess of a sandbox denial says no; it names the command as its shell ran it, `bash -lc ...`) or
    # from its session record (the adapter's entries: engine/agents/codex/adapter.py ``_log_denials``)
    for command in ("touch made-by-reviewer.txt", "echo hi > app/core.py"):
        calls = [text for kind, text in review_said if kind == "tool_call" and command in text]
        assert len(calls) == 1 and calls[0].startswith("Runs `"), review_said
    assert [kind for kind, _ in review_said].count("refusal") == 2, review_said


def conversation(attempt) -> list[tuple[str, str]]:
    """``(kind, sentence)`` of every entry of an attempt's transcript (beside its raw log)."""
    path = Path(settings.VAR_DIR) / attempt.raw_path
    entries = [json.loads(line) for line in (path.parent / "transcript.jsonl").read_text().splitlines()]
    return [(entry["kind"], entry["text"]) for entry in entries]


@needs_codex
@pytest.mark.slow
def test_an_implementer_runs_a_command_and_reports_the_scripted_usage(tmp_path):
    scenario = {"turns": [{"tool": "exec_command", "input": {"cmd": "touch made-by-codex.txt"}, "usage": USAGE_1},
                          {"text": "DONE: codex scripted answer.", "usage": USAGE_2}]}
    request = make_request(tmp_path, "implementer", scenario)
    result = CodexAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    assert (Path(request.workspace) / "made-by-codex.txt").exists()
    # what the model gateway read on the wire (input at full price apart from the cached input), and codex's claim
    assert result.usage == {"input_tokens": 602, "cached_tokens": 401, "output_tokens": 63, "reasoning_tokens": 7,
                            "cache_creation_tokens": None, "cost_usd": None}
    assert result.extra["gateway"]["cli_usage"] == {"input_tokens": 1003, "cached_tokens": 401, "output_tokens": 63,
                                                    "reasoning_tokens": 7, "cache_creation_tokens": 0, "cost_usd": None}
    assert result.session_id and result.final_message == "DONE: codex scripted answer."
    assert result.cli_version.startswith("codex-cli 0.171.0")
    assert result.simulated and result.extra["commands"] == 1 and result.extra["refusals"] == []
    assert "SIMULATED" in log_of(request)
    # the session id is codex's thread id, and its session record lives in the attempt's own HOME
    assert list((Path(request.home_dir) / "sessions").rglob(f"rollout-*{result.session_id}.jsonl"))


@needs_codex
@pytest.mark.slow
def test_an_implementers_tmp_is_its_own_and_never_the_hosts(tmp_path):
    """codex's commands may write /tmp and $TMPDIR, as every CLI's shell and every gate may (a repository's
    tests write /tmp/foo): both are the attempt's own, the sandbox's private /tmp gone with it, so nothing
    lands in the host's /tmp."""
    probe = Path("/tmp") / f"cp-codex-probe-{uuid.uuid4().hex}"
    scenario = {"turns": [{"tool": "exec_command", "input": {"cmd": f"echo leak > {probe} && cat {probe}"}},
                          {"tool": "exec_command", "input": {"cmd": 'echo tmp > "$TMPDIR/x" && echo kept > inside.txt'}},
                          {"text": "done"}]}
    request = make_request(tmp_path, "implementer", scenario)
    request.env["TMPDIR"] = str(tmp_path / "attempt-tmp")  # as engine/steps/attempts.py gives every attempt
    os.makedirs(request.env["TMPDIR"])
    try:
        result = CodexAdapter().run(request)
        assert result.exit_code == 0 and result.failure_kind is None, log_of(request)[-3000:]
        assert not probe.exists()
        assert (Path(request.workspace) / "inside.txt").read_text() == "kept\n"
        assert (tmp_path / "attempt-tmp" / "x").read_text() == "tmp\n"
        assert result.extra["refusals"] == [], result.extra["refusals"]
    finally:
        probe.unlink(missing_ok=True)


@needs_codex
@pytest.mark.slow
def test_a_reviewer_in_the_read_only_sandbox_writes_nothing_and_the_refusal_is_logged(tmp_path):
    scenario = {"turns": [{"tool": "exec_command", "input": {"cmd": "touch x"}},
                          {"tool": "exec_command", "input": {"cmd": "echo hi > y"}},
                          {"text": '{"verdict": "pass", "findings": []}'}]}
    request = make_request(tmp_path, "reviewer", scenario)
    result = CodexAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, log_of(request)[-3000:]
    assert sorted(p.name for p in Path(request.workspace).iterdir()) == [".git", "README.md"]
    assert result.final_message == '{"verdict": "pass", "findings": []}'
    denials = result.extra["refusals"]
    assert [d["command"] for d in denials] == ["touch x", "echo hi > y"] and all(d["sandbox_denied"] for d in denials)
    assert all(d["outcome"] == "refused" for d in denials)
    log = log_of(request)
    # each refusal in the log once: codex's stream reports one itself under load (its own guess of a sandbox
    # denial says no), the adapter adds those it left out from the session record
    assert re.search(r"sandbox refused [12] command\(s\)", log) and log.count("Read-only file system") >= 2


#: A missing program, a plain failure and a write the sandbox refuses (/etc is read-only in it).
OUTCOME_COMMANDS = ("cp-missing-program -m pytest", "false", "echo hi > /etc/cp-outcome-probe")


@needs_codex
@pytest.mark.slow
def test_codex_says_what_happened_to_each_command(tmp_path):
    scenario = {"turns": [*({"tool": "exec_command", "input": {"cmd": cmd}} for cmd in OUTCOME_COMMANDS),
                          {"text": "done"}]}
    request = make_request(tmp_path, "implementer", scenario)
    result = CodexAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, log_of(request)[-3000:]
    assert [(r["command"], r["exit_code"], r["outcome"]) for r in result.extra["refusals"]] == [
        ("cp-missing-program -m pytest", 127, "command_not_found"), ("false", 1, "failed"),
        ("echo hi > /etc/cp-outcome-probe", 1, "refused")], result.extra["refusals"]
    said = [(e["kind"], e.get("exit"), e["text"]) for e in map(json.loads, Path(request.raw_path).with_name(
        "transcript.jsonl").read_text().splitlines()) if e["kind"] in ("tool_result", "refusal")]
    assert said[:2] == [("tool_result", 127, "command not found: cp-missing-program (exit status 127)"),
                        ("tool_result", 1, "failed with exit status 1")], said
    # the refused write once: from codex's stream when it reports it (under load its own guess of a sandbox
    # denial can say no), else from its session record, which the adapter adds
    [(kind, code, text)] = said[2:]
    assert (kind, code) == ("refusal", 1) and text.endswith("/etc/cp-outcome-probe: Read-only file system"), said
    assert text.startswith(("The sandbox refused it (exit status 1)", "shell was refused (exit status 1)")), said


@needs_codex
@pytest.mark.slow
def test_a_permissive_worker_codex_config_does_not_loosen_the_reviewer(tmp_path, monkeypatch):
    """The worker's ~/.codex/config.toml asks for full access; only its auth.json reaches the attempt."""
    worker_home = tmp_path / "worker-home"
    (worker_home / ".codex").mkdir(parents=True)
    (worker_home / ".codex" / "config.toml").write_text('sandbox_mode = "danger-full-access"\napproval_policy = "never"\n')
    (worker_home / ".codex" / "auth.json").write_text('{"OPENAI_API_KEY": null}')
    monkeypatch.setenv("HOME", str(worker_home))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    scenario = {"turns": [{"tool": "exec_command", "input": {"cmd": "touch made.txt"}}, {"text": "done"}]}
    request = make_request(tmp_path, "reviewer", scenario)
    result = CodexAdapter().run(request)
    assert result.exit_code == 0, log_of(request)[-3000:]
    assert not (Path(request.workspace) / "made.txt").exists()
    home = Path(request.home_dir)
    assert (home / "auth.json").exists() and not (home / "config.toml").exists()


SECRET = "s3cret-do-not-read"


@pytest.fixture
def private_files(monkeypatch):
    """Another run's control record in the var directory, and a worker HOME with a codex login.

    Both lie outside /tmp (which the sandbox replaces by its own anyway), so only the hiding of
    the var directory and of the worker's HOME can keep them from the agent."""
    tag = uuid.uuid4().hex[:12]
    control = Path(settings.VAR_DIR) / "runs" / f"999-other-{tag}" / "control.json"
    control.parent.mkdir(parents=True)
    control.write_text(json.dumps({"run": 999, "note": SECRET}))
    worker_home = Path(settings.BASE_DIR) / "test-artifacts" / f"worker-home-{tag}"
    (worker_home / ".codex").mkdir(parents=True)
    (worker_home / ".codex" / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": None, "note": SECRET}))
    monkeypatch.setenv("HOME", str(worker_home))  # the worker's HOME, as the sandbox and prepare_home see it
    monkeypatch.delenv("CODEX_HOME", raising=False)
    try:
        yield {"control": control, "auth": worker_home / ".codex" / "auth.json", "home": worker_home}
    finally:
        shutil.rmtree(control.parent, ignore_errors=True)
        shutil.rmtree(worker_home, ignore_errors=True)


@needs_codex
@pytest.mark.slow
@pytest.mark.parametrize("role", ["implementer", "reviewer"])
def test_codex_runs_in_the_engine_sandbox(tmp_path, private_files, role):
    """Its commands cannot read the var directory or the worker's HOME, cannot signal a process of
    the host (own PID namespace), and codex's own rules still apply inside: the reviewer writes
    nothing; every failed or refused command is recorded."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    commands = [f"cat '{private_files['control']}'", f"cat '{private_files['auth']}'",
                f"kill -9 {bystander.pid}", f"echo x > '{private_files['home']}/written.txt'",
                "echo kept > inside.txt"]
    scenario = {"turns": [{"tool": "exec_command", "input": {"cmd": cmd}} for cmd in commands] + [{"text": "done"}]}
    request = make_request(tmp_path, role, scenario)
    try:
        result = CodexAdapter().run(request)
        assert bystander.poll() is None  # still alive: codex's commands are in the sandbox's PID namespace
    finally:
        bystander.kill()
        bystander.wait()
    raw = Path(request.raw_path).read_text()
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    assert SECRET not in raw and SECRET not in log_of(request)
    assert not (private_files["home"] / "written.txt").exists()
    refused = {r["command"]: r for r in result.extra["refusals"]}
    for cmd in commands[:2]:  # hidden: an empty folder where the var directory and the worker's HOME are
        assert refused[cmd]["exit_code"] == 1 and "No such file or directory" in refused[cmd]["message"], refused
    assert "No such process" in refused[commands[2]]["message"], refused
    # the worker's HOME is not in the view at all (allow-listed filesystem): no such folder, or read-only
    assert refused[commands[3]]["exit_code"] != 0
    assert any(text in refused[commands[3]]["message"] for text in ("Read-only file system", "No such file or directory"))
    inside = Path(request.workspace) / "inside.txt"
    if role == "implementer":
        assert inside.read_text() == "kept\n" and commands[4] not in refused
    else:
        assert not inside.exists() and refused[commands[4]]["sandbox_denied"], refused
        assert sorted(p.name for p in Path(request.workspace).iterdir()) == [".git", "README.md"]
    # the -o file was written in the attempt's HOME (the control folder is hidden inside), read
    # after the process ended, and kept redacted in the control folder
    assert result.final_message == "done"
    assert not (Path(request.home_dir) / "codex-last-message-1.txt").exists()
    assert (Path(request.control_dir) / "codex-last-message-1.txt").read_text().strip() == "done"


@needs_codex
@pytest.mark.slow
def test_401_is_auth_failed_within_seconds(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": [{"status": 401, "message": "fake 401"}]})
    started = time.monotonic()
    result = CodexAdapter().run(request)
    assert time.monotonic() - started < 20
    assert result.failure_kind == "auth_failed" and result.exit_code == 1, result.failure_message
    assert "401" in result.failure_message
    assert all(value is None for value in result.usage.values())


@needs_codex
@pytest.mark.slow
def test_a_hanging_endpoint_is_a_timeout_with_nothing_left(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": [{"hang": True}]}, deadline=4)
    started = time.monotonic()
    result = CodexAdapter().run(request)
    assert time.monotonic() - started < 4 + 5 + 10
    assert result.failure_kind == "timeout", result.failure_message
    assert all(value is None for value in result.usage.values())
    assert marked(request.marker) == []


@needs_codex
def test_the_pinned_codex_passes_the_profile_check_for_every_role(tmp_path):
    adapter = CodexAdapter()
    assert [adapter.check({"adapter": "codex"}, role) for role in ("implementer", "reviewer", "documenter")] == [[]] * 3
    stub = tmp_path / "codex"
    stub.write_text("#!/bin/sh\necho 'codex-cli 0.1.0'\n")
    stub.chmod(0o755)
    problems = adapter.check({"adapter": "codex", "executable": str(stub)}, "reviewer")
    assert "--sandbox is not in `codex exec --help`, so it cannot enforce: read-only (the read-only sandbox)" in problems
    assert adapter.check({"adapter": "codex", "executable": str(tmp_path / "none")}, "reviewer")[0].startswith(
        "the codex executable was not found")


def test_a_missing_binary_is_missing_executable(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": ["x"]}, executable=str(tmp_path / "no-such-codex"))
    result = get_adapter("codex").run(request)
    assert result.failure_kind == "missing_executable" and "no-such-codex" in result.failure_message
    assert result.exit_code is None and all(value is None for value in result.usage.values())
    assert "[run-engine]" in log_of(request)


def test_exit_0_without_a_completed_turn_is_malformed_with_unknown_usage(tmp_path):
    stub = tmp_path / "codex"
    stub.write_text('#!/bin/sh\necho \'{"type":"thread.started","thread_id":"t-1"}\'\necho \'{"type":"turn.started"}\'\n'
                    "exit 0\n")
    stub.chmod(0o755)
    request = make_request(tmp_path, "implementer", executable=str(stub))
    result = CodexAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind == "malformed_result"
    assert all(value is None for value in result.usage.values()) and result.session_id == "t-1"


# ----------------------------------------------------------------------------- argument array and parsing


def test_the_argument_array_per_role(tmp_path):
    reviewer = build_argv("codex", make_request(tmp_path, "reviewer"))
    implementer = build_argv("codex", make_request(tmp_path, "implementer", model="gpt-5"))
    home = str(tmp_path / "attempt-home")  # the -o file: visible and writable inside the sandbox
    assert reviewer == ["codex", "exec", "--json", "--skip-git-repo-check", "--ignore-user-config", "--ignore-rules",
                        "-C", str(tmp_path / "work"), "--sandbox", "read-only", "-c", 'web_search="disabled"',
                        "-o", f"{home}/codex-last-message-1.txt", "-"]
    assert implementer[8:14] == ["--sandbox", "workspace-write",
                                 "-c", "sandbox_workspace_write.network_access=false",
                                 "-c", 'web_search="disabled"']
    assert implementer[-3:] == ["-m", "gpt-5", "-"]
    scripted = build_argv("codex", make_request(tmp_path, "documenter"), endpoint_url="http://127.0.0.1:9")
    assert 'model_providers.scripted.base_url="http://127.0.0.1:9/v1"' in scripted
    assert scripted[scripted.index("-m") + 1] == "gpt-scripted" and scripted[-1] == "-"


def test_the_environment_passes_the_openai_key_as_codex_api_key(tmp_path):
    request = make_request(tmp_path, "implementer")
    request.env = {"PATH": "/usr/bin", "OPENAI_API_KEY": "sk-test-0123456789"}
    env = CodexAdapter().environment(request, request.home_dir)
    assert env["HOME"] == env["CODEX_HOME"] == request.home_dir
    assert env["CODEX_API_KEY"] == "sk-test-0123456789"


def test_the_parser_sums_usage_and_finds_session_and_final_message(tmp_path):
    raw = tmp_path / "out.raw"
    usage = {"input_tokens": 1003, "cached_input_tokens": 401, "cache_write_input_tokens": 5, "output_tokens": 63,
             "reasoning_output_tokens": 7}
    events = [
        'WARNING: proceeding, even though we could not create PATH aliases: Refusing to create helper binaries',
        {"type": "thread.started", "thread_id": "019a-thread"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata not found"}},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution", "command": "ls",
                                            "aggregated_output": "x" * 100, "exit_code": 0, "status": "completed"}},
        {"type": "item.completed", "item": {"id": "item_2", "type": "agent_message", "text": "first"}},
        {"type": "turn.completed", "usage": usage},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message", "text": "Done: fixed 2 files"}},
        {"type": "turn.completed", "usage": usage},
    ]
    write_jsonl(raw, events)
    parsed = parse_events(str(raw))
    assert parsed["session_id"] == "019a-thread" and parsed["turns_completed"] == 2 and parsed["commands"] == 1
    assert parsed["last_text"] == "Done: fixed 2 files" and not parsed["auth_error"] and parsed["stderr_tail"] == []
    assert usage_of(parsed["usage"]) == {"input_tokens": 2006, "cached_tokens": 802, "cache_creation_tokens": 10,
                                         "output_tokens": 126, "reasoning_tokens": 14, "cost_usd": None}
    # without usage: unknown, never 0
    write_jsonl(raw, [e for e in events if not (isinstance(e, dict) and e["type"] == "turn.completed")]
                + [{"type": "turn.completed"}])
    parsed = parse_events(str(raw))
    assert parsed["turns_completed"] == 1 and all(value is None for value in usage_of(parsed["usage"]).values())
    # a key codex did not report stays None (older codex has no cache_write_input_tokens)
    write_jsonl(raw, [{"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 1}}])
    assert usage_of(parse_events(str(raw))["usage"])["cache_creation_tokens"] is None
    assert parse_events(str(tmp_path / "missing.raw"))["usage"] is None


def test_refusals_the_stream_reports_itself_are_recorded(tmp_path):
    """A declined command and a failed (or declined) patch, as codex's exec JSONL schema reports
    them; 0.171.0 offline emits neither (module docstring of rejected_item)."""
    events = [{"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
              {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution", "command": "rm -rf /x",
                                                  "aggregated_output": "", "exit_code": None, "status": "declined"}},
              {"type": "item.completed", "item": {"id": "item_2", "type": "file_change", "status": "failed",
                                                  "changes": [{"path": "/w/a.py", "kind": "update"},
                                                              {"path": "/w/b.py", "kind": "add"}]}},
              {"type": "item.completed", "item": {"id": "item_3", "type": "file_change", "status": "completed",
                                                  "changes": [{"path": "/w/c.py", "kind": "add"}]}},
              {"type": "item.completed", "item": {"id": "item_4", "type": "command_execution", "command": "false",
                                                  "aggregated_output": "", "exit_code": 1, "status": "failed"}},
              {"type": "turn.completed", "usage": {"input_tokens": 1}}]
    result = classify(tmp_path, events, exit_code=0)
    assert result.failure_kind is None
    assert result.extra["refusals"] == [
        {"tool": "exec_command", "command": "rm -rf /x", "exit_code": None, "message": "declined",
         "sandbox_denied": True, "outcome": "refused"},
        {"tool": "apply_patch", "command": "update /w/a.py, add /w/b.py", "exit_code": None,
         "message": "codex reported the patch as failed (not applied, or declined)", "sandbox_denied": False,
         "outcome": "failed"}]
    assert "sandbox refused 1 command(s)" in log_of(make_request(tmp_path, "implementer"))


def session_item(payload: dict) -> dict:
    return {"timestamp": "2026-12-06T18:27:13.284Z", "type": "response_item", "payload": payload}


def test_each_failed_command_says_what_happened_to_it(tmp_path):
    """The session record of codex 0.171.0 (shapes of test_codex_says_what_happened_to_each_command):
    exit 127 is a missing program whatever its output says, not a refusal, and codex reports it in its
    JSONL itself; a read-only file system is the sandbox's refusal; anything else failed."""
    thread = "01a24c9c-2c89-7381-844c-6250b01147a7"
    commands = [("c1", "python -m pytest", 127, "/bin/bash: line 1: python: command not found\n"),
                ("c2", "python3 -m pytest", 127, "/bin/bash: line 1: /usr/bin/python3: Permission denied\n"),
                ("c3", "false", 1, ""),
                ("c4", "echo hi > /etc/probe", 1, "/bin/bash: line 1: /etc/probe: Read-only file system\n")]
    request = make_request(tmp_path, "implementer")
    record = Path(request.home_dir) / "sessions" / "2026" / "12" / "06" / f"rollout-2026-12-06T18-27-13-{thread}.jsonl"
    record.parent.mkdir(parents=True)
    write_jsonl(record, [item for call, command, code, output in commands for item in (
        session_item({"type": "function_call", "name": "exec_command", "arguments": json.dumps({"cmd": command}),
                      "call_id": call}),
        session_item({"type": "function_call_output", "call_id": call,
                      "output": f"Chunk ID: 6ca398\nWall time: 0.0000 seconds\nProcess exited with code {code}\n"
                                f"Original token count: 15\nOutput:\n{output}"}))])
    events = [{"type": "thread.started", "thread_id": thread}, {"type": "turn.started"}] + [
        {"type": "item.completed", "item": {"id": call, "type": "command_execution", "command": f"/bin/bash -lc '{cmd}'",
                                            "aggregated_output": output, "exit_code": code, "status": "failed"}}
        for call, cmd, code, output in commands[:3]] + [{"type": "turn.completed", "usage": {"input_tokens": 1}}]
    write_jsonl(Path(request.raw_path), events)
    transcript.build(request.raw_path, "codex", request.workspace)
    result = CodexAdapter()._result(ProcessResult(argv=["codex"], cwd=request.workspace, exit_code=0,
                                                  elapsed_seconds=1.0), request, "codex-cli 0.171.0")
    refusals = result.extra["refusals"]
    assert [(r["command"], r["exit_code"], r["outcome"]) for r in refusals] == [
        ("python -m pytest", 127, "command_not_found"), ("python3 -m pytest", 127, "command_not_found"),
        ("false", 1, "failed"), ("echo hi > /etc/probe", 1, "refused")]
    assert [r["sandbox_denied"] for r in refusals] == [False, True, False, True]  # the key keeps its meaning
    # only the sandbox's refusal, which codex's JSONL left out, is added to the log and the conversation
    log = log_of(request)
    assert "sandbox refused 1 command(s)" in log and "/etc/probe" in log and "python3" not in log
    said = [(e["kind"], e["text"]) for e in map(json.loads, transcript.transcript_path(request.raw_path).read_text()
                                                 .splitlines()) if e["kind"] in ("tool_result", "refusal")]
    assert said == [("tool_result", "command not found: python (exit status 127)"),
                    ("tool_result", "command not found: python3 (exit status 127)"),
                    ("tool_result", "failed with exit status 1"),
                    ("refusal", "The sandbox refused it (exit status 1): /bin/bash: line 1: /etc/probe: Read-only "
                                "file system")]


def test_the_parser_skips_an_overlong_line_and_keeps_going(tmp_path, monkeypatch):
    import engine.agents.codex.adapter as codex_module
    import engine.agents.lines as lines_module

    monkeypatch.setattr(lines_module, "MAX_LINE_BYTES", 1024)
    raw = tmp_path / "out.raw"
    write_jsonl(raw, [{"type": "thread.started", "thread_id": "t"},
                      {"type": "item.completed", "item": {"type": "agent_message", "text": "y" * 5000}},
                      {"type": "turn.completed", "usage": {"input_tokens": 1}}])
    parsed = codex_module.parse_events(str(raw))
    assert parsed["session_id"] == "t" and parsed["turns_completed"] == 1 and parsed["last_text"] == ""
    assert parsed["truncated_lines"] == 1


def classify(tmp_path, events, **process_fields) -> AgentResult:
    request = make_request(tmp_path, "implementer")
    write_jsonl(Path(request.raw_path), events)
    fields = {"argv": ["codex"], "cwd": request.workspace, "exit_code": 1, "elapsed_seconds": 1.0} | process_fields
    return CodexAdapter()._result(ProcessResult(**fields), request, "codex-cli 0.171.0")


def test_failure_classification(tmp_path):
    missing_key = [{"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
                   {"type": "error", "message": "Missing environment variable: `CP_SCRIPTED_KEY`."},
                   {"type": "turn.failed", "error": {"message": "Missing environment variable: `CP_SCRIPTED_KEY`."}}]
    result = classify(tmp_path, missing_key)
    assert result.failure_kind == "auth_failed" and "CP_SCRIPTED_KEY" in result.failure_message
    busy = [{"type": "turn.failed", "error": {"message": "We're currently experiencing high demand"}}]
    result = classify(tmp_path, busy)
    assert result.failure_kind == "crashed" and "high demand" in result.failure_message
    offline = [{"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"}] + [
        {"type": "error", "message": "Reconnecting... waiting for network (Connection failed: error sending request)"}] * 3
    result = classify(tmp_path, offline, exit_code=None, signal=15, timed_out=True, elapsed_seconds=4.2)
    assert result.failure_kind == "timeout" and "3 reconnect notices" in result.failure_message
    assert "waiting for network" in result.failure_message
    result = classify(tmp_path, ["error: unexpected argument '--bogus' found"], exit_code=2)
    assert result.failure_kind == "crashed" and "--bogus" in result.failure_message
    assert classify(tmp_path, [], exit_code=0).failure_kind == "malformed_result"
