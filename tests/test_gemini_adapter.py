"""The Gemini CLI adapter (engine/agents/gemini/adapter.py), driven directly, with the real ``gemini`` 0.61.0
binary against the scripted model endpoint (tests marked ``slow``), and its argument array,
environment, parser and classification alone.

The real-binary tests skip only when tools/agents has no gemini (``make agents`` installs it).
"""
import json
import os
import socket
import time
import tracemalloc
from pathlib import Path

import psutil
import pytest

from engine.agents import AgentResult, get_adapter
from engine.agents.gemini.adapter import (GeminiCliAdapter, build_argv, parse_stream, policy_for, session_tokens,
                                  settings_for, usage_of)
from engine.agents.lines import MAX_LINE_BYTES
from engine.processes.process import MARKER_ENV, ProcessResult
from engine.agents.base import AgentRequest

from .support.adapters import log_of, write_jsonl
from .support.gemini import make_request, needs_gemini

# the stand-in CLIs these tests write in tmp_path are executables the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("stand_ins_listed")


USAGE_1 = {"promptTokenCount": 701, "candidatesTokenCount": 31, "cachedContentTokenCount": 200,
           "thoughtsTokenCount": 3}
USAGE_2 = {"promptTokenCount": 702, "candidatesTokenCount": 32, "cachedContentTokenCount": 201,
           "thoughtsTokenCount": 4}



def marked(marker: str) -> list:
    """Live processes carrying ``CP_PROCESS_MARKER=marker``."""
    return [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(MARKER_ENV) == marker]


def conversation(request: AgentRequest) -> list[tuple[str, str]]:
    """``(kind, sentence)`` of every entry of the attempt's transcript (beside its raw log)."""
    path = Path(request.raw_path).parent / "transcript.jsonl"
    return [(e["kind"], e["text"]) for e in map(json.loads, path.read_text().splitlines())]


@pytest.fixture(autouse=True)
def no_stray_error_reports():
    """gemini writes gemini-client-error-*.json into its TMPDIR: the attempt's HOME, never /tmp."""
    before = set(Path("/tmp").glob("gemini-client-error-*.json"))
    yield
    assert set(Path("/tmp").glob("gemini-client-error-*.json")) - before == set()


# ----------------------------------------------------------------------------- the real gemini CLI


@needs_gemini
@pytest.mark.slow
def test_an_implementer_writes_runs_a_command_and_reports_the_scripted_usage(tmp_path):
    scenario = {"turns": [
        {"tools": [{"tool": "write_file", "input": {"file_path": "{cwd}/app.py", "content": "ANSWER = 41\n"}},
                   {"tool": "run_shell_command", "input": {"command": "echo made > made-by-gemini.txt"}}],
         "usage": USAGE_1},
        {"tool": "replace", "input": {"file_path": "{cwd}/app.py", "old_string": "41", "new_string": "42",
                                      "instruction": "fix the answer"}},
        {"text": "DONE: gemini scripted answer.", "usage": USAGE_2}]}
    request = make_request(tmp_path, "implementer", scenario)
    result = GeminiCliAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    work = Path(request.workspace)
    assert (work / "app.py").read_text() == "ANSWER = 42\n"
    assert (work / "made-by-gemini.txt").read_text() == "made\n"
    # the second turn's usage is the endpoint's default (100 in, 20 out, none cached, no thoughts)
    # what the model gateway read on the wire: input at full price apart from the cached input (which the
    # prompt count includes), output with the thoughts; then the CLI's own claim, kept beside it
    assert result.usage == {"input_tokens": 501 + 100 + 501, "output_tokens": 34 + 20 + 36,
                            "cached_tokens": 200 + 201, "reasoning_tokens": 3 + 4,
                            "cache_creation_tokens": None, "cost_usd": None}
    assert result.extra["gateway"]["cli_usage"] == {"input_tokens": 701 + 100 + 702, "output_tokens": 31 + 20 + 32,
                                                    "cached_tokens": 200 + 201, "reasoning_tokens": 3 + 4,
                                                    "cache_creation_tokens": None, "cost_usd": None}
    assert result.final_message == "DONE: gemini scripted answer." and result.session_id
    assert result.cli_version == "0.61.0" and result.simulated
    assert result.extra["tool_calls"] == 3 and result.extra["refusals"] == [] and result.extra["truncated_lines"] == 0
    assert result.extra["network"]["refused"] == []  # nothing but the scripted endpoint was asked for
    assert "SIMULATED" in log_of(request)
    said = conversation(request)
    assert ("start", "Gemini CLI started (model gemini-2.5-pro, session " + result.session_id + ")") in said, said
    assert ("text", "DONE: gemini scripted answer.") in said
    assert ("tool_call", "Writes app.py (1 line)") in said and ("tool_call", "Runs `echo made > made-by-gemini.txt`") in said
    assert any(kind == "usage" and "1,503 in" in text for kind, text in said), said
    assert marked(request.marker) == []


@needs_gemini
@pytest.mark.slow
def test_a_reviewer_cannot_write_or_run_and_its_refused_calls_are_recorded(tmp_path):
    scenario = {"turns": [
        {"tools": [{"tool": "write_file", "input": {"file_path": "{cwd}/made-by-reviewer.txt", "content": "no\n"}},
                   {"tool": "replace", "input": {"file_path": "{cwd}/README.md", "old_string": "hello",
                                                 "new_string": "changed", "instruction": "x"}},
                   {"tool": "run_shell_command", "input": {"command": "touch shell-by-reviewer.txt"}}]},
        # plan mode would let write_file write a *.md file in the worktree: the tool is not there either
        {"tool": "enter_plan_mode", "input": {"reason": "planning"}},
        {"tool": "read_file", "input": {"file_path": "{cwd}/README.md"}},
        {"text": '{"verdict": "pass", "findings": []}'}]}
    request = make_request(tmp_path, "reviewer", scenario)
    result = GeminiCliAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    work = Path(request.workspace)
    assert sorted(p.name for p in work.iterdir()) == [".git", "README.md"]
    assert (work / "README.md").read_text() == "hello\n"
    assert result.final_message == '{"verdict": "pass", "findings": []}'
    refusals = result.extra["refusals"]
    assert [r["tool"] for r in refusals] == ["write_file", "replace", "run_shell_command", "enter_plan_mode"]
    assert all(r["error_type"] == "tool_not_registered" and "not found" in r["message"] for r in refusals)
    assert all(r["outcome"] == "refused" for r in refusals)
    assert refusals[0]["path"] == str(work / "made-by-reviewer.txt")
    said = conversation(request)
    assert [kind for kind, _ in said].count("refusal") == 4, said
    assert ("tool_call", "Reads README.md") in said


@needs_gemini
@pytest.mark.slow
def test_gemini_says_what_happened_to_each_command(tmp_path):
    """Its shell tool reports a command that exited non-zero as a success, its output what the command
    printed: the exit status is known only when it printed nothing ("Command exited with code: 1")."""
    commands = ("cp-missing-program -m pytest", "false", "echo hi > /etc/cp-outcome-probe")
    scenario = {"turns": [*({"tool": "run_shell_command", "input": {"command": command}} for command in commands),
                          {"text": "done"}]}
    request = make_request(tmp_path, "implementer", scenario)
    result = GeminiCliAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    assert [(r["command"], r.get("exit_code"), r["outcome"]) for r in result.extra["refusals"]] == [
        (commands[0], None, "command_not_found"), (commands[1], 1, "failed"), (commands[2], None, "refused")]
    assert "cp-missing-program: command not found" in result.extra["refusals"][0]["message"]
    results = [(kind, text) for kind, text in conversation(request) if kind in ("tool_result", "refusal")]
    assert results[:2] == [("tool_result", "command not found: cp-missing-program"),
                           ("tool_result", "failed with exit status 1")], results
    assert results[2][0] == "refusal" and results[2][1].startswith("run_shell_command was refused: ")
    assert results[2][1].endswith(": /etc/cp-outcome-probe: Read-only file system")


@needs_gemini
@pytest.mark.slow
def test_a_documenter_writes_the_docs_index(tmp_path):
    scenario = {"turns": [
        {"tool": "write_file", "input": {"file_path": "{cwd}/docs/INDEX.md", "content": "# Index\n\n- README.md\n"}},
        {"text": "Documented."}]}
    request = make_request(tmp_path, "documenter", scenario)
    result = GeminiCliAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    assert (Path(request.workspace) / "docs" / "INDEX.md").read_text() == "# Index\n\n- README.md\n"
    assert result.final_message == "Documented." and result.extra["refusals"] == []


@needs_gemini
@pytest.mark.slow
def test_a_401_from_the_endpoint_is_auth_failed_within_seconds(tmp_path):
    request = make_request(tmp_path, "implementer",
                           {"turns": [{"status": 401, "message": "API key not valid. Please pass a valid API key."}]})
    started = time.monotonic()
    result = GeminiCliAdapter().run(request)
    assert time.monotonic() - started < 30
    assert result.failure_kind == "auth_failed", (result.failure_message, log_of(request)[-3000:])
    assert result.exit_code == 145 and result.signal is None  # gemini's own status, not "signal 17"
    assert "401" in result.failure_message and "UNAUTHENTICATED" in result.failure_message
    assert all(value is None for value in result.usage.values())
    # a real model's failure names what to set; the scripted endpoint's (above) needs no hint
    assert "Set GEMINI_API_KEY" not in result.failure_message
    real = GeminiCliAdapter()._result(ProcessResult(argv=["gemini"], cwd=request.workspace, exit_code=145,
                                                    elapsed_seconds=1.0),
                                      make_request(tmp_path, "implementer"), "0.61.0")
    assert real.failure_kind == "auth_failed" and real.failure_message.endswith(GeminiCliAdapter().auth_hint({}))


@needs_gemini
@pytest.mark.slow
def test_a_hanging_endpoint_is_a_timeout_with_nothing_left(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": [{"hang": True}]}, deadline=6)
    started = time.monotonic()
    result = GeminiCliAdapter().run(request)
    assert time.monotonic() - started < 6 + 5 + 10
    assert result.failure_kind == "timeout", (result.failure_message, log_of(request)[-2000:])
    assert all(value is None for value in result.usage.values())
    assert marked(request.marker) == []


@needs_gemini
@pytest.mark.slow
def test_no_key_is_auth_failed_with_the_hint(tmp_path, monkeypatch, gateway_listed):
    """A real (not scripted) attempt with no GEMINI_API_KEY: gemini exits 41 before any request."""
    with socket.socket() as probe:  # a loopback port nothing listens on: no request may be needed at all
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    request = make_request(tmp_path, "implementer", base_url=gateway_listed(f"http://127.0.0.1:{port}"))
    request.env = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    result = GeminiCliAdapter().run(request)
    assert result.exit_code == 41 and result.failure_kind == "auth_failed", (result.failure_message,
                                                                             log_of(request)[-2000:])
    assert "GEMINI_API_KEY" in result.failure_message
    assert result.failure_message.endswith(GeminiCliAdapter().auth_hint(request.profile))
    assert "GATEWAY_TEST_KEY" in GeminiCliAdapter().auth_hint(request.profile)


@needs_gemini
def test_the_pinned_gemini_passes_the_profile_check_for_every_role(tmp_path):
    adapter = GeminiCliAdapter()
    assert [adapter.check({"adapter": "gemini-cli"}, role) for role in ("implementer", "reviewer", "documenter")] == [[]] * 3
    stub = tmp_path / "gemini"
    stub.write_text("#!/bin/sh\necho '0.1.0'\n")
    stub.chmod(0o755)
    problems = adapter.check({"adapter": "gemini-cli", "executable": str(stub)}, "reviewer")
    assert ("--approval-mode is not in `gemini --help`, so it cannot enforce: read-only (the default approval "
            "mode: no writing or shell tools)") in problems


def test_a_missing_binary_is_missing_executable(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": ["x"]}, executable=str(tmp_path / "no-such-gemini"))
    result = get_adapter("gemini-cli").run(request)
    assert result.failure_kind == "missing_executable" and "no-such-gemini" in result.failure_message
    assert result.exit_code is None and all(value is None for value in result.usage.values())


# ----------------------------------------------------------------------------- argument array, environment, parsing


def test_the_argument_array_per_role(tmp_path):
    home = str(tmp_path / "attempt-home")
    reviewer = build_argv("gemini", make_request(tmp_path, "reviewer"))
    assert reviewer == ["gemini", "-p", "", "-o", "stream-json", "--approval-mode", "default",
                        "--policy", f"{home}/.gemini/cp-policy.toml", "--allowed-mcp-server-names", "cp-none",
                        "-e", "cp-none"]
    implementer = build_argv("gemini", make_request(tmp_path, "implementer", model="gemini-2.5-flash",
                                                    extra_args=["--screen-reader"]))
    assert implementer[5:10] == ["-m", "gemini-2.5-flash", "--approval-mode", "yolo", "--skip-trust"]
    assert implementer[-1] == "--screen-reader"
    scripted = build_argv("gemini", make_request(tmp_path, "documenter"), endpoint_url="http://127.0.0.1:9")
    assert scripted[scripted.index("-m") + 1] == "gemini-2.5-pro" and "--skip-trust" in scripted


def test_the_environment_home_key_base_url_and_trust(tmp_path):
    adapter = GeminiCliAdapter()
    request = make_request(tmp_path, "reviewer", base_url="https://gw.example/gemini")
    request.env = {"PATH": "/usr/bin", "GOOGLE_API_KEY": "AIza-test-0123456789", "GEMINI_CLI_SYSTEM_SETTINGS_PATH": "/x",
                   "GEMINI_CLI_TRUST_WORKSPACE": "true", "GEMINI_MODEL": "other"}
    env = adapter.environment(request, request.home_dir)
    assert env["HOME"] == env["GEMINI_CLI_HOME"] == request.home_dir
    assert env["TMPDIR"] == os.path.join(request.home_dir, "tmp")
    assert env["GEMINI_API_KEY"] == "AIza-test-0123456789"
    assert env["GOOGLE_GEMINI_BASE_URL"] == "https://gw.example/gemini"
    assert env["GEMINI_CLI_TRUST_WORKSPACE"] == "false"  # the reviewer's worktree is untrusted
    assert "GEMINI_CLI_SYSTEM_SETTINGS_PATH" not in env and "GEMINI_MODEL" not in env
    writer = adapter.environment(make_request(tmp_path, "implementer"), request.home_dir)
    assert "GEMINI_CLI_TRUST_WORKSPACE" not in writer  # --skip-trust trusts it
    assert writer["GOOGLE_GEMINI_BASE_URL"] == "https://generativelanguage.googleapis.com"


def test_settings_and_policy_per_role(tmp_path):
    settings = settings_for(make_request(tmp_path, "reviewer", max_turns=7))
    assert settings["security"] == {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}}
    assert {"google_web_search", "web_fetch", "enter_plan_mode", "invoke_agent"} <= set(settings["tools"]["exclude"])
    assert settings["model"] == {"maxSessionTurns": 7}
    assert 'toolName = ["write_file", "replace", "run_shell_command"]' in policy_for("reviewer")
    assert 'decision = "deny"' in policy_for("reviewer") and "deny" not in policy_for("implementer")


def test_credentials_for_the_preflight(tmp_path):
    adapter = GeminiCliAdapter()
    profile = {"adapter": "gemini-cli"}
    assert adapter.credential_problem(profile, {"GEMINI_API_KEY": "k"}) is None
    assert adapter.credential_problem(profile, {"GOOGLE_API_KEY": "k"}) is None
    problem = adapter.credential_problem(profile, {})
    assert problem.code == "credentials_missing" and problem.provide == "GEMINI_API_KEY"
    assert adapter.preflight({**profile, "scripted_endpoint": {"default": []}}, environ={}) == []



STREAM = [
    "Warning: 256-color support not detected. Using a terminal with at least 256-color support is recommended.",
    {"type": "init", "session_id": "b691f068-2e47-4c9b-8df8-da4d473a6a14", "model": "gemini-2.5-pro"},
    {"type": "message", "role": "user", "content": "Do it\n"},
    {"type": "message", "role": "assistant", "content": "Looking", "delta": True},
    {"type": "tool_use", "tool_name": "write_file", "tool_id": "w1", "parameters": {"file_path": "/w/a.txt"}},
    {"type": "tool_result", "tool_id": "w1", "status": "error",
     "error": {"type": "invalid_tool_params", "message": "File path must be within the workspace"}},
    {"type": "tool_use", "tool_name": "write_file", "tool_id": "w2", "parameters": {"file_path": "/w/a.txt"}},
    {"type": "tool_result", "tool_id": "w2", "status": "success"},
    {"type": "message", "role": "assistant", "content": "All ", "delta": True},
    {"type": "message", "role": "assistant", "content": "done.", "delta": True},
    {"type": "result", "status": "success", "stats": {"total_tokens": 789, "input_tokens": 777, "output_tokens": 7,
                                                      "cached": 100, "input": 677, "duration_ms": 52, "tool_calls": 2}},
]


def test_the_parser_finds_session_text_refusals_and_usage(tmp_path):
    raw = tmp_path / "out.raw"
    write_jsonl(raw, STREAM)
    parsed = parse_stream(str(raw))
    assert parsed["session_id"] == "b691f068-2e47-4c9b-8df8-da4d473a6a14" and parsed["model"] == "gemini-2.5-pro"
    assert parsed["last_text"] == "All done." and parsed["tool_calls"] == 2 and not parsed["auth_error"]
    assert parsed["refusals"] == [{"tool": "write_file", "message": "File path must be within the workspace",
                                   "error_type": "invalid_tool_params", "outcome": "refused", "path": "/w/a.txt",
                                   "recovered": True}]
    assert parsed["stderr_tail"] == []
    assert usage_of(parsed["result"]) == {"input_tokens": 777, "output_tokens": 7, "cached_tokens": 100,
                                          "reasoning_tokens": None, "cache_creation_tokens": None, "cost_usd": None}
    # thoughts come from the session record only; without stats nothing is made up
    assert usage_of(parsed["result"], {"thoughts": 5})["reasoning_tokens"] == 5
    assert all(value is None for value in usage_of({"type": "result", "status": "success"}).values())


def test_each_shell_command_that_did_not_succeed_is_recorded_with_what_happened(tmp_path):
    """gemini 0.61.0 reports a command that exited non-zero as a *success* of run_shell_command (as
    test_gemini_says_what_happened_to_each_command saw it): its output, or "Command exited with code:
    N" when it printed nothing. A missing program and a sandbox refusal are read from the shell's own
    line; a tool not given to the role is refused; output with no exit status is not a failure."""
    calls = [("s1", "run_shell_command", {"command": "python -m pytest"}, "success", None,
              "/usr/bin/bash: line 4: python: command not found"),
             ("s2", "run_shell_command", {"command": "false"}, "success", None, "Command exited with code: 1"),
             ("s3", "run_shell_command", {"command": "echo hi > /etc/x"}, "success", None,
              "/usr/bin/bash: line 4: /etc/x: Read-only file system"),
             ("s4", "run_shell_command", {"command": "cat < missing.txt"}, "success", None,
              "/usr/bin/bash: line 4: missing.txt: No such file or directory"),  # its exit status is unknown
             ("s5", "run_shell_command", {"command": "ls"}, "success", None, "README.md"),
             ("w1", "write_file", {"file_path": "/w/a.txt"}, "error",
              {"type": "tool_not_registered", "message": 'Tool "write_file" not found'}, None)]
    raw = tmp_path / "out.raw"
    write_jsonl(raw, [STREAM[1]] + [event for call, tool, params, status, error, output in calls for event in (
        {"type": "tool_use", "tool_name": tool, "tool_id": call, "parameters": params},
        {"type": "tool_result", "tool_id": call, "status": status,
         **({"error": error} if error else {}), **({"output": output} if output else {})})] + [STREAM[-1]])
    refusals = parse_stream(str(raw))["refusals"]
    assert [(r["tool"], r.get("command"), r["outcome"], r.get("exit_code")) for r in refusals] == [
        ("run_shell_command", "python -m pytest", "command_not_found", None),
        ("run_shell_command", "false", "failed", 1),
        ("run_shell_command", "echo hi > /etc/x", "refused", None),
        ("write_file", None, "refused", None)]
    assert refusals[0]["message"] == "/usr/bin/bash: line 4: python: command not found"
    assert refusals[3]["error_type"] == "tool_not_registered"


def test_session_tokens_are_read_from_the_attempts_own_record(tmp_path):
    sid = "b691f068-2e47-4c9b-8df8-da4d473a6a14"
    chats = tmp_path / ".gemini" / "tmp" / "work" / "chats"
    chats.mkdir(parents=True)
    write_jsonl(chats / "session-2026-12-02T15-12-b691f068.jsonl", [
        {"sessionId": sid, "kind": "main"}, {"type": "user", "content": []},
        {"type": "gemini", "id": "m1", "tokens": {"input": 777, "output": 7, "cached": 100, "thoughts": 5, "tool": 0}},
        {"type": "gemini", "id": "m1", "tokens": {"input": 777, "output": 7, "cached": 100, "thoughts": 5, "tool": 0},
         "toolCalls": []},  # the same message written again: counted once
        {"type": "gemini", "id": "m2", "tokens": {"input": 10, "output": 1, "cached": 0, "thoughts": 2, "tool": 0}}])
    assert session_tokens(str(tmp_path), sid) == {"input": 787, "output": 8, "cached": 100, "thoughts": 7, "tool": 0}
    assert session_tokens(str(tmp_path), "b691f068-0000-0000-0000-000000000000") is None
    assert session_tokens(str(tmp_path), "../../etc") is None


def classify(tmp_path, events, **process_fields) -> AgentResult:
    request = make_request(tmp_path, "implementer")
    write_jsonl(Path(request.raw_path), events)
    fields = {"argv": ["gemini"], "cwd": request.workspace, "exit_code": 1, "elapsed_seconds": 1.0} | process_fields
    return GeminiCliAdapter()._result(ProcessResult(**fields), request, "0.61.0")


def test_failure_classification(tmp_path):
    no_key = ["When using Gemini API, you must specify the GEMINI_API_KEY environment variable."]
    result = classify(tmp_path, no_key, exit_code=41)
    assert result.failure_kind == "auth_failed" and "GEMINI_API_KEY" in result.failure_message
    assert result.failure_message.endswith(GeminiCliAdapter().auth_hint({}))
    denied = [{"type": "init", "session_id": "s"}, {"type": "result", "status": "error", "error": {
        "type": "unknown", "message": '[API Error: {"error":{"code":403,"message":"denied","status":"PERMISSION_DENIED"}}]'}}]
    assert classify(tmp_path, denied, exit_code=None, signal=17).failure_kind == "auth_failed"  # bwrap's 128+17
    busy = [{"type": "init", "session_id": "s"}, {"type": "result", "status": "error", "error": {
        "type": "unknown", "message": '[API Error: {"error":{"code":503,"status":"UNAVAILABLE"}}]'}}]
    result = classify(tmp_path, busy, exit_code=145)
    assert result.failure_kind == "crashed" and "UNAVAILABLE" in result.failure_message
    untrusted = ["Gemini CLI is not running in a trusted directory. To proceed, either use `--skip-trust`"]
    result = classify(tmp_path, untrusted, exit_code=55)
    assert result.failure_kind == "crashed" and "untrusted folder" in result.failure_message
    assert classify(tmp_path, [{"type": "init", "session_id": "s"}], exit_code=0).failure_kind == "malformed_result"
    timeout = classify(tmp_path, [], exit_code=None, signal=15, timed_out=True)
    assert timeout.failure_kind == "timeout" and timeout.signal == 15
    result = classify(tmp_path, ["Unknown argument: bogus"], exit_code=1)
    assert result.failure_kind == "crashed" and "bogus" in result.failure_message


def test_a_50_mb_line_goes_through_the_parser_in_bounded_memory(tmp_path):
    raw = tmp_path / "out.raw"
    huge = json.dumps({"type": "tool_result", "tool_id": "x", "status": "success", "output": "y" * (50 * 1024 * 1024)})
    with open(raw, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "init", "session_id": "s-1", "model": "m"}) + "\n")
        fh.write(huge + "\n")
        fh.write(json.dumps({"type": "message", "role": "assistant", "content": "after", "delta": True}) + "\n")
        fh.write(json.dumps({"type": "result", "status": "success", "stats": {"input_tokens": 1, "output_tokens": 2,
                                                                             "cached": 0}}) + "\n")
    del huge
    tracemalloc.start()
    try:
        parsed = parse_stream(str(raw))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_LINE_BYTES, peak  # a few MiB for a 50 MiB line (read whole: over 50 MiB)
    assert parsed["truncated_lines"] == 1 and parsed["session_id"] == "s-1" and parsed["last_text"] == "after"
    assert usage_of(parsed["result"])["output_tokens"] == 2
