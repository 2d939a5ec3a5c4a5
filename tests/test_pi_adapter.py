"""The Pi adapter (engine/agents/pi/adapter.py), driven directly, with the real ``pi`` 0.73.1 binary against
the scripted model endpoint (tests marked ``slow``), and its argument array, environment, parser and
classification alone.

The real-binary tests skip only when tools/agents has no pi (``make agents`` installs it).
"""
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from engine import boundary
from engine.text import transcript
from engine.agents import AgentRequest, AgentResult, adapters, get_adapter
from engine.agents.network import PROVIDER_HOSTS, network_allow
from engine.agents.pi.adapter import (PROVIDERS, READ_ONLY_TOOLS, PiAdapter, build_argv, credential_env_names, models_for,
                              parse_stream, prepare_home, project_config_mask, sandboxed, settings_for, split_model,
                              usage_of)
from engine.agents.cli_options import _refused_args
from engine.processes.process import MARKER_ENV, ProcessResult
from engine.scripted_endpoint import ScriptedEndpoint

from .support.adapters import log_of, write_jsonl
from .support.pi import make_request, needs_pi

# the stand-in CLIs these tests write in tmp_path are executables the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("stand_ins_listed")


USAGE_1 = {"input_tokens": 1001, "output_tokens": 41, "cache_read_input_tokens": 201, "cache_creation_input_tokens": 31}
USAGE_2 = {"input_tokens": 1102, "output_tokens": 12, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 0}
ROOT = Path(__file__).resolve().parents[1]



def marked(marker: str) -> list:
    """Live processes carrying ``CP_PROCESS_MARKER=marker`` (zombies have no environment)."""
    return [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(MARKER_ENV) == marker]


def said(request: AgentRequest) -> list[tuple[str, str]]:
    """``(kind, sentence)`` of the attempt's transcript (kept beside its raw log while pi ran)."""
    path = transcript.transcript_path(request.raw_path)
    return [(e["kind"], e["text"]) for e in map(json.loads, path.read_text().splitlines())]


# ----------------------------------------------------------------------------- the real pi CLI


@needs_pi
@pytest.mark.slow
def test_an_implementer_writes_and_runs_a_command_and_reports_the_scripted_usage(tmp_path):
    scenario = {"turns": [
        {"text": "I will write it.", "usage": USAGE_1, "tools": [
            {"tool": "write", "input": {"path": "app/core.py", "content": "def answer():\n    return 42\n"}},
            {"tool": "bash", "input": {"command": "echo made > made-by-pi.txt && echo ok"}}]},
        {"text": "DONE: pi scripted answer.", "usage": USAGE_2}]}
    request = make_request(tmp_path, "implementer", scenario)
    result = PiAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    work = Path(request.workspace)
    assert (work / "app" / "core.py").read_text() == "def answer():\n    return 42\n"
    assert (work / "made-by-pi.txt").read_text() == "made\n"
    # pi's own numbers: input without the cached tokens (pi-ai's convention), summed over both messages
    assert result.extra["gateway"]["cli_usage"] == {"input_tokens": 2103, "output_tokens": 53, "cached_tokens": 501,
                                                    "cache_creation_tokens": 31, "reasoning_tokens": None,
                                                    "cost_usd": 0.0}
    # what the model gateway read on the wire (the same numbers: Anthropic's convention is the ledger's); a
    # scripted model's cost is nobody's money
    assert result.usage == {"input_tokens": 2103, "output_tokens": 53, "cached_tokens": 501,
                            "cache_creation_tokens": 31, "reasoning_tokens": None, "cost_usd": None}
    assert result.final_message == "DONE: pi scripted answer." and result.session_id
    assert result.cli_version == "0.73.1" and result.simulated and result.structured is True
    assert result.extra["tool_calls"] == 2 and result.extra["refusals"] == [] and result.extra["turns"] == 2
    assert "SIMULATED" in log_of(request)
    # the attempt's own pi folder, nothing of the worker's; no session file (--no-session)
    agent = Path(request.home_dir) / ".pi" / "agent"
    assert json.loads((agent / "models.json").read_text())["providers"].keys() == {"cp-scripted"}
    assert not (agent / "sessions").exists() or not any((agent / "sessions").rglob("*.jsonl"))
    # the conversation, normalized from pi's JSON events (engine/text/transcript.py "pi")
    conversation = said(request)
    assert conversation[0][0] == "start" and ("text", "DONE: pi scripted answer.") in conversation
    assert ("tool_call", "Writes app/core.py (2 lines)") in conversation, conversation
    assert ("tool_call", "Runs `echo made > made-by-pi.txt && echo ok`") in conversation, conversation
    assert ("tool_result", "exit status 0 · 1 line of output") in conversation, conversation
    assert any(kind == "usage" and "2,103 in" in text for kind, text in conversation), conversation


REVIEW_TRIES_TO_WRITE = {"turns": [
    {"tools": [{"tool": "write", "input": {"path": "made-by-reviewer.txt", "content": "x\n"}},
               {"tool": "bash", "input": {"command": "echo hi > README.md"}},
               {"tool": "edit", "input": {"path": "README.md", "edits": [{"oldText": "hello", "newText": "bye"}]}},
               {"tool": "read", "input": {"path": "README.md"}}]},
    {"text": 'Looked at it.\n```json\n{"verdict": "pass", "findings": []}\n```'}]}


@needs_pi
@pytest.mark.slow
def test_a_reviewer_is_read_only_and_its_refused_calls_are_recorded(tmp_path):
    request = make_request(tmp_path, "reviewer", REVIEW_TRIES_TO_WRITE)
    result = PiAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    work = Path(request.workspace)
    assert sorted(p.name for p in work.iterdir()) == [".git", "README.md"]
    assert (work / "README.md").read_text() == "hello\n"
    refusals = result.extra["refusals"]
    assert [(r["tool"], r["message"], r["unavailable"]) for r in refusals] == [
        ("write", "Tool write not found", True), ("bash", "Tool bash not found", True),
        ("edit", "Tool edit not found", True)], refusals
    assert refusals[0]["path"] == "made-by-reviewer.txt" and refusals[1]["command"] == "echo hi > README.md"
    assert all(r["outcome"] == "refused" for r in refusals)
    assert result.final_message.endswith('{"verdict": "pass", "findings": []}\n```')
    assert [kind for kind, _ in said(request)].count("refusal") == 3
    assert ("refusal", "write was refused: the tool is not available to this role") in said(request)
    assert ("tool_result", "1 line read") in said(request)


@needs_pi
@pytest.mark.slow
def test_pi_says_what_happened_to_each_command(tmp_path):
    commands = ("cp-missing-program -m pytest", "false", "echo hi > /etc/cp-outcome-probe")
    scenario = {"turns": [*({"tool": "bash", "input": {"command": command}} for command in commands),
                          {"text": "done"}]}
    request = make_request(tmp_path, "implementer", scenario)
    result = PiAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    assert [(r["command"], r["exit_code"], r["outcome"]) for r in result.extra["refusals"]] == [
        (commands[0], 127, "command_not_found"), (commands[1], 1, "failed"), (commands[2], 1, "refused")]
    results = [(kind, text) for kind, text in said(request) if kind in ("tool_result", "refusal")]
    assert results == [("tool_result", "command not found: cp-missing-program (exit status 127)"),
                       ("tool_result", "failed with exit status 1"),
                       ("refusal", "bash was refused (exit status 1): /bin/bash: line 1: /etc/cp-outcome-probe: "
                                   "Read-only file system")], results


@needs_pi
@pytest.mark.slow
def test_a_documenter_writes_the_index(tmp_path):
    scenario = {"turns": [
        {"tool": "write", "input": {"path": "docs/INDEX.md", "content": "# Index\n\n- core: answer()\n"}},
        {"text": "Documented."}]}
    request = make_request(tmp_path, "documenter", scenario)
    result = PiAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    assert (Path(request.workspace) / "docs" / "INDEX.md").read_text() == "# Index\n\n- core: answer()\n"
    assert result.final_message == "Documented." and result.extra["refusals"] == []


@needs_pi
@pytest.mark.slow
def test_a_401_from_the_scripted_endpoint_is_auth_failed_within_seconds(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": [{"status": 401, "message": "fake 401 bad key"}]})
    started = time.monotonic()
    result = PiAdapter().run(request)
    assert time.monotonic() - started < 20
    # pi --mode json exits 0 on a failed request: the last assistant message says it
    assert result.exit_code == 0 and result.failure_kind == "auth_failed", result.failure_message
    assert "401" in result.failure_message and "fake 401 bad key" in result.failure_message
    assert all(value is None for value in result.usage.values())  # pi's all-zero placeholder is no report


@needs_pi
@pytest.mark.slow
def test_a_401_from_a_gateway_is_auth_failed_with_the_hint_and_the_key_reaches_it(tmp_path, gateway_listed):
    key = "sk-ant-gateway-test-" + uuid.uuid4().hex
    with ScriptedEndpoint({"turns": [{"status": 401, "message": "invalid x-api-key"}]}) as gateway:
        request = make_request(tmp_path, "implementer", None, base_url=gateway_listed(gateway.url),
                               model="anthropic/claude-sonnet-4-5",
                               env={"PATH": os.environ["PATH"], "ANTHROPIC_API_KEY": key, "OPENAI_API_KEY": "sk-other"})
        request.secrets = [key]
        result = PiAdapter().run(request)
        sent = [r for r in gateway.requests if r["api"] == "anthropic"]
        url = gateway.url
    assert result.failure_kind == "auth_failed", (result.failure_message, log_of(request)[-3000:])
    assert result.failure_message.endswith(f"The gateway ({url}) refused the key of GATEWAY_TEST_KEY (listed "
                                           "with it in CP_GATEWAYS): set GATEWAY_TEST_KEY to a key the gateway "
                                           "accepts in the workers' environment.")
    assert sent and sent[0]["headers"].get("x-api-key") == key and sent[0]["body"]["model"] == "claude-sonnet-4-5"
    assert key not in Path(request.raw_path).read_text()


@needs_pi
@pytest.mark.slow
def test_no_key_for_the_provider_is_auth_failed(tmp_path):
    request = make_request(tmp_path, "implementer", None, model="openai/gpt-5",
                           env={"PATH": os.environ["PATH"], "ANTHROPIC_API_KEY": "sk-ant-not-for-openai"})
    result = PiAdapter().run(request)
    assert result.exit_code == 1 and result.failure_kind == "auth_failed", (result.failure_message, log_of(request))
    assert "No API key found for openai" in result.failure_message and "Set OPENAI_API_KEY" in result.failure_message
    assert result.extra["network"]["connected"] == []


@needs_pi
@pytest.mark.slow
def test_a_hanging_endpoint_is_a_timeout_with_nothing_left(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": [{"hang": True}]}, deadline=4)
    started = time.monotonic()
    result = PiAdapter().run(request)
    assert time.monotonic() - started < 4 + 5 + 10
    assert result.failure_kind == "timeout", result.failure_message
    assert all(value is None for value in result.usage.values())
    assert marked(request.marker) == []


@needs_pi
def test_the_pinned_pi_passes_the_profile_check_for_every_role(tmp_path):
    adapter = PiAdapter()
    assert [adapter.check({"adapter": "pi"}, role) for role in ("implementer", "reviewer", "documenter")] == [[]] * 3
    stub = tmp_path / "pi"
    stub.write_text("#!/bin/sh\ncase \"$1\" in --version) echo 0.1.0;; *) echo 'pi --print --mode';; esac\n")
    stub.chmod(0o755)
    problems = adapter.check({"adapter": "pi", "executable": str(stub)}, "reviewer")
    assert ("--tools is not in `pi --help`, so it cannot enforce: read-only (an allowlist of read, grep, find and ls: "
            "no bash, edit or write)") in problems
    assert any(p.startswith("--no-extensions is not in `pi --help`") for p in problems)
    assert adapter.check({"adapter": "pi", "executable": str(tmp_path / "none")}, "reviewer")[0].startswith(
        "the pi executable was not found")
    assert "not one this adapter runs" in adapter.check({"adapter": "pi", "model": "groq/llama"}, "reviewer")[-1]


def test_a_missing_binary_is_missing_executable(tmp_path):
    request = make_request(tmp_path, "implementer", {"turns": ["x"]}, executable=str(tmp_path / "no-such-pi"))
    result = get_adapter("pi").run(request)
    assert result.failure_kind == "missing_executable" and "no-such-pi" in result.failure_message
    assert result.exit_code is None and all(value is None for value in result.usage.values())
    assert "[run-engine]" in log_of(request)


# ----------------------------------------------------------------------------- argument array, environment, files


def test_the_adapter_is_registered_with_its_credentials_hosts_and_refused_options():
    assert adapters()["pi"] is PiAdapter and PiAdapter.transcript_format == "pi" and "pi" in transcript.FORMATS
    assert boundary.CREDENTIALS["pi"] == credential_env_names() == (
        "ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN", "OPENAI_API_KEY", "GEMINI_API_KEY")
    assert set(PROVIDER_HOSTS["pi"]) == {host for info in PROVIDERS.values() for host in info["hosts"]}
    assert network_allow({"adapter": "pi"}, "http://127.0.0.1:9") == ["127.0.0.1:9"]
    assert network_allow({"adapter": "pi", "base_url": "https://gw.example:8443"})[-1] == "gw.example:8443"
    # an attempt reaches its own model's provider, not the others' APIs
    assert network_allow({"adapter": "pi"}) == ["api.anthropic.com"]
    assert network_allow({"adapter": "pi", "model": "openai/gpt-5"}) == ["api.openai.com"]
    assert network_allow({"adapter": "pi", "model": "google/gemini-2.5-pro"}) == ["generativelanguage.googleapis.com"]
    refused = _refused_args("pi", ["--tools", "read,write", "-e", "x.ts", "--no-builtin-tools", "--extension=y.ts",
                                   "--api-key", "k", "--mode", "text", "--provider", "openai", "--continue",
                                   "--thinking", "high"])
    assert [index for index, _ in refused] == [0, 2, 4, 5, 6, 8, 10, 12]  # not --thinking (13)
    assert "refused" in refused[0][1] and "set by the adapter" in refused[5][1]


def test_the_argument_array_per_role(tmp_path):
    reviewer = build_argv("pi", make_request(tmp_path, "reviewer"))
    assert reviewer == ["pi", "--print", "--mode", "json", "--no-session", "--offline", "--no-extensions",
                        "--no-skills", "--no-prompt-templates", "--no-themes", "--provider", "anthropic",
                        "--tools", "read,grep,find,ls"]
    implementer = build_argv("pi", make_request(tmp_path, "implementer", model="openai/gpt-5",
                                                extra_args=["--thinking", "low"]))
    assert implementer[10:] == ["--provider", "openai", "--model", "gpt-5", "--tools", "read,bash,edit,write",
                                "--thinking", "low"]
    scripted = build_argv("pi", make_request(tmp_path, "documenter", model="anthropic/claude-x"), scripted=True)
    assert scripted[10:] == ["--provider", "cp-scripted", "--model", "claude-x", "--tools", "read,bash,edit,write"]
    assert split_model({"model": "claude-sonnet-4-5"}) == ("anthropic", "claude-sonnet-4-5")
    assert split_model({"model": "openrouter/anthropic/claude"}) == ("openrouter", "anthropic/claude")
    assert split_model({}, scripted=True) == ("cp-scripted", "pi-scripted")
    assert "bash" not in READ_ONLY_TOOLS and "write" not in READ_ONLY_TOOLS and "edit" not in READ_ONLY_TOOLS


def test_the_environment_is_the_attempts_own(tmp_path, gateway_listed):
    request = make_request(tmp_path, "implementer", model="openai/gpt-5",
                           env={"PATH": "/usr/bin", "ANTHROPIC_API_KEY": "sk-ant", "OPENAI_API_KEY": "sk-oai",
                                "GEMINI_API_KEY": "g"})
    request.profile["env"] = {"HOME": "/root", "PI_CODING_AGENT_DIR": "/root/.pi/agent", "PI_OFFLINE": "0",
                              "PI_PACKAGE_DIR": "/elsewhere", "FOO": "bar"}
    home = request.home_dir
    env = PiAdapter().environment(request, home)
    assert env["HOME"] == home and env["PI_CODING_AGENT_DIR"] == f"{home}/.pi/agent" and env["PI_OFFLINE"] == "1"
    assert env["TMPDIR"] == f"{home}/tmp" and env["FOO"] == "bar" and "PI_PACKAGE_DIR" not in env
    # only the profile's provider's key
    assert env["OPENAI_API_KEY"] == "sk-oai" and "ANTHROPIC_API_KEY" not in env and "GEMINI_API_KEY" not in env
    # a gateway's key (CP_GATEWAYS: engine/boundary.py puts it under KEY_TARGETS["pi"]) goes where openai reads it
    request.profile.update(base_url=gateway_listed("https://gw.example/v1", "GATEWAY_KEY"), env={})
    request.env = {"PATH": "/usr/bin", **boundary.credential_env("pi", {"GATEWAY_KEY": "gw-key", "OPENAI_API_KEY": "own"},
                                                                    request.profile)}
    env = PiAdapter().environment(request, home)
    assert env["OPENAI_API_KEY"] == "gw-key" and "ANTHROPIC_API_KEY" not in env


def test_the_attempts_pi_folder_holds_our_settings_and_only_a_matching_login(tmp_path):
    worker = tmp_path / "worker" / ".pi" / "agent"
    (worker / "extensions").mkdir(parents=True)
    (worker / "extensions" / "worker.ts").write_text("export default () => {}")
    (worker / "settings.json").write_text('{"packages": ["npm:x"], "shellPath": "/bin/false"}')
    (worker / "models.json").write_text('{"providers": {"anthropic": {"baseUrl": "http://evil"}}}')
    (worker / "auth.json").write_text('{"anthropic": {"type": "oauth", "access": "a", "refresh": "r"}}')
    environ = {"PI_CODING_AGENT_DIR": str(worker)}
    home = tmp_path / "home"
    folder = prepare_home(str(home), {"model": "anthropic/claude-x"}, environ=environ)
    assert sorted(p.name for p in folder.iterdir()) == ["auth.json", "models.json", "settings.json"]
    assert json.loads((folder / "settings.json").read_text()) == settings_for({})
    assert json.loads((folder / "models.json").read_text()) == {"providers": {}}
    assert oct((folder / "auth.json").stat().st_mode & 0o777) == "0o600"
    folder = prepare_home(str(home), {"model": "openai/gpt-5"}, environ=environ)  # no openai login there
    assert sorted(p.name for p in folder.iterdir()) == ["models.json", "settings.json"]
    folder = prepare_home(str(home), {}, endpoint_url="http://127.0.0.1:9", environ=environ)
    assert not (folder / "auth.json").exists()
    provider = json.loads((folder / "models.json").read_text())["providers"]["cp-scripted"]
    assert provider["baseUrl"] == "http://127.0.0.1:9" and provider["api"] == "anthropic-messages"
    assert provider["apiKey"] == "CP_SCRIPTED_KEY" and provider["models"][0]["id"] == "pi-scripted"
    assert models_for({"model": "openai/gpt-5", "base_url": "https://gw.example/v1"}) == {
        "providers": {"openai": {"baseUrl": "https://gw.example/v1"}}}
    settings = settings_for({})
    assert settings["packages"] == settings["extensions"] == settings["skills"] == []
    assert settings["retry"]["provider"] == {"maxRetries": 0}


def test_the_worktrees_pi_folder_is_covered_in_the_sandbox(tmp_path):
    request = make_request(tmp_path, "reviewer")
    work = Path(request.workspace)
    assert project_config_mask(str(work)) == []  # nothing to cover (a mount point cannot be made read-only)
    (work / "config").mkdir()
    (work / ".pi").symlink_to("config")
    real = os.path.realpath(work / "config")
    assert project_config_mask(str(work)) == ["--tmpfs", real, "--remount-ro", real]
    (work / ".pi").unlink()
    (work / ".pi").symlink_to("/usr")  # outside the worktree: nothing the repository controls, nothing covered
    assert project_config_mask(str(work)) == []
    (work / ".pi").unlink()
    (work / ".pi").mkdir()
    argv = sandboxed(["pi", "--print"], {"PATH": os.environ["PATH"]}, request)
    end = argv.index("--")
    covered = os.path.realpath(work / ".pi")
    mask = ["--tmpfs", covered, "--remount-ro", covered]
    spots = [i for i in range(end) if argv[i:i + 4] == mask]
    # the cover comes after the worktree's bind (a later bind of it would uncover .pi again)
    assert spots and str(os.path.realpath(work)) in argv[:spots[0]], argv
    later = argv[spots[0] + 4:end]
    assert not [i for i in range(len(later) - 2) if later[i] in ("--bind", "--ro-bind") and
                later[i + 2] == str(os.path.realpath(work))], argv
    assert argv[end - 2:end] == ["--remount-ro", "/"] and argv[end + 1:] == ["pi", "--print"]


def test_credentials_preflight_and_hint(tmp_path):
    adapter = PiAdapter()
    empty = tmp_path / "no-pi"
    assert adapter.credential_problem({"model": "anthropic/x"}, {"ANTHROPIC_API_KEY": "k",
                                                                 "PI_CODING_AGENT_DIR": str(empty)}) is None
    problem = adapter.credential_problem({"model": "openai/gpt-5"}, {"ANTHROPIC_API_KEY": "k",
                                                                     "PI_CODING_AGENT_DIR": str(empty)})
    assert problem.code == "credentials_missing" and problem.provide == "OPENAI_API_KEY"
    assert "set OPENAI_API_KEY" in problem.message
    empty.mkdir()
    (empty / "auth.json").write_text('{"openai": {"type": "api_key", "key": "sk"}}')
    assert adapter.credential_problem({"model": "openai/gpt-5"}, {"PI_CODING_AGENT_DIR": str(empty)}) is None
    (empty / "auth.json").write_text("{}")  # what pi writes on its first start: no login
    assert adapter.credential_problem({"model": "openai/gpt-5"}, {"PI_CODING_AGENT_DIR": str(empty)}) is not None
    assert adapter.preflight({"adapter": "pi", "scripted_endpoint": {"default": []}}, {}) == []
    assert adapter.auth_hint({"scripted_endpoint": {"default": []}}) == ""
    assert adapter.auth_hint({"model": "google/gemini-2.5-pro"}).startswith("Set GEMINI_API_KEY in the workers'")


# ----------------------------------------------------------------------------- parsing and classification



def assistant(content, usage=None, stop="stop", error=None) -> dict:
    message = {"role": "assistant", "content": content, "stopReason": stop,
               "usage": usage or {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0,
                                  "cost": {"total": 0}}}
    if error:
        message["errorMessage"] = error
    return {"type": "message_end", "message": message}


def pi_usage(i, o, r, w, cost):
    return {"input": i, "output": o, "cacheRead": r, "cacheWrite": w, "totalTokens": i + o + r + w,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": cost}}


EVENTS = [
    {"type": "session", "version": 3, "id": "sess-1", "timestamp": "t", "cwd": "/w"},
    {"type": "agent_start"}, {"type": "turn_start"},
    {"type": "message_update", "assistantMessageEvent": {"type": "text_delta", "delta": "I"}, "message": {}},
    assistant([{"type": "text", "text": "I will."},
               {"type": "toolCall", "id": "c1", "name": "write", "arguments": {"path": "a.py", "content": "x"}},
               {"type": "toolCall", "id": "c2", "name": "bash", "arguments": {"command": "false"}}],
              pi_usage(1000, 40, 200, 30, 0.0125), stop="toolUse"),
    {"type": "tool_execution_start", "toolCallId": "c1", "toolName": "write", "args": {"path": "a.py", "content": "x"}},
    {"type": "tool_execution_end", "toolCallId": "c1", "toolName": "write",
     "result": {"content": [{"type": "text", "text": "EROFS: read-only file system, open 'a.py'"}]}, "isError": True},
    {"type": "tool_execution_start", "toolCallId": "c2", "toolName": "bash", "args": {"command": "false"}},
    {"type": "tool_execution_end", "toolCallId": "c2", "toolName": "bash",
     "result": {"content": [{"type": "text", "text": "\n\nCommand exited with code 1"}]}, "isError": True},
    {"type": "turn_end", "message": {}, "toolResults": []},
    {"type": "auto_retry_start", "attempt": 1, "maxAttempts": 2, "delayMs": 2000, "errorMessage": "529 overloaded"},
    assistant([], stop="error", error="529 overloaded_error"),
    assistant([{"type": "toolCall", "id": "c3", "name": "write", "arguments": {"path": "a.py", "content": "y"}}],
              pi_usage(1100, 10, 300, 0, 0.0025), stop="toolUse"),
    {"type": "tool_execution_start", "toolCallId": "c3", "toolName": "write", "args": {"path": "a.py", "content": "y"}},
    {"type": "tool_execution_end", "toolCallId": "c3", "toolName": "write",
     "result": {"content": [{"type": "text", "text": "Successfully wrote 1 bytes to a.py"}]}, "isError": False},
    assistant([{"type": "text", "text": "Done: a.py written."}], pi_usage(5, 2, 0, 0, 0.0)),
    {"type": "turn_end", "message": {}, "toolResults": []},
    {"type": "agent_end", "messages": []},
]


def test_the_parser_sums_usage_and_records_refusals(tmp_path):
    raw = tmp_path / "out.raw"
    write_jsonl(raw, EVENTS)
    parsed = parse_stream(str(raw))
    assert parsed["session_id"] == "sess-1" and parsed["ended"] and parsed["turns"] == 2 and parsed["retries"] == 1
    assert parsed["last_text"] == "Done: a.py written." and parsed["error"] == "" and not parsed["auth_error"]
    assert parsed["structured"] and parsed["tool_calls"] == 3 and parsed["truncated_lines"] == 0
    assert usage_of(parsed["usage"]) == {"input_tokens": 2105, "output_tokens": 52, "cached_tokens": 500,
                                         "cache_creation_tokens": 30, "reasoning_tokens": None, "cost_usd": 0.015}
    assert parsed["refusals"] == [
        {"tool": "write", "message": "EROFS: read-only file system, open 'a.py'", "unavailable": False,
         "sandbox_denied": True, "outcome": "refused", "path": "a.py", "recovered": True},
        {"tool": "bash", "message": "Command exited with code 1", "unavailable": False, "sandbox_denied": False,
         "outcome": "failed", "command": "false", "exit_code": 1}]
    # nothing reported: unknown, never 0
    write_jsonl(raw, [EVENTS[0], assistant([{"type": "text", "text": "x"}]), {"type": "agent_end"}])
    assert all(value is None for value in usage_of(parse_stream(str(raw))["usage"]).values())
    assert parse_stream(str(tmp_path / "missing.raw"))["usage"] is None


def test_each_failed_tool_call_says_what_happened_to_it(tmp_path):
    """pi 0.73.1's bash results (as test_pi_says_what_happened_to_each_command saw them): exit 127 is a
    missing program, EROFS the sandbox's refusal, a tool not in the allowlist a refusal, else failed."""
    calls = [("t1", "bash", {"command": "python -m pytest"},
              "/bin/bash: line 1: python: command not found\n\n\nCommand exited with code 127"),
             ("t2", "bash", {"command": "false"}, "(no output)\n\nCommand exited with code 1"),
             ("t3", "bash", {"command": "echo hi > /etc/x"},
              "/bin/bash: line 1: /etc/x: Read-only file system\n\n\nCommand exited with code 1"),
             ("t4", "write", {"path": "a.py", "content": "x"}, "Tool write not found")]
    raw = tmp_path / "out.raw"
    write_jsonl(raw, [EVENTS[0]] + [event for call, name, args, text in calls for event in (
        {"type": "tool_execution_start", "toolCallId": call, "toolName": name, "args": args},
        {"type": "tool_execution_end", "toolCallId": call, "toolName": name, "isError": True,
         "result": {"content": [{"type": "text", "text": text}]}})] + [{"type": "agent_end"}])
    refusals = parse_stream(str(raw))["refusals"]
    assert [(r["tool"], r["outcome"], r.get("exit_code")) for r in refusals] == [
        ("bash", "command_not_found", 127), ("bash", "failed", 1), ("bash", "refused", 1), ("write", "refused", None)]
    assert refusals[0]["command"] == "python -m pytest" and not refusals[0]["sandbox_denied"]
    assert refusals[2]["sandbox_denied"] and refusals[3]["unavailable"]


def test_the_parser_skips_an_overlong_line_and_keeps_going(tmp_path, monkeypatch):
    import engine.agents.lines as lines_module

    monkeypatch.setattr(lines_module, "MAX_LINE_BYTES", 1024)
    raw = tmp_path / "out.raw"
    write_jsonl(raw, [EVENTS[0], assistant([{"type": "text", "text": "y" * 5000}], pi_usage(1, 1, 0, 0, 0)),
                      assistant([{"type": "text", "text": "short"}], pi_usage(3, 2, 0, 0, 0)), {"type": "agent_end"}])
    parsed = parse_stream(str(raw))
    assert parsed["session_id"] == "sess-1" and parsed["ended"] and parsed["last_text"] == "short"
    assert parsed["truncated_lines"] == 1 and parsed["usage"]["input"] == 3


MEASURE = r"""
import json, os, resource, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.test_settings")
django.setup()
from engine.agents.pi import adapter as pi
pi.parse_stream(sys.argv[2])  # a small capture first: imports and caches warm
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
found = pi.parse_stream(sys.argv[1])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": after - before, "found": found}, default=str))
"""


def test_a_50_mb_line_grows_the_parsing_process_by_under_20_mb(tmp_path):
    """Issue 13 for pi: a tool result printed as one 50 MB line (tests/test_agent_lines.py does the same for
    claude and codex) is drained in bounded chunks, counted, and the events around it still parsed."""
    events = [EVENTS[0], None, assistant([{"type": "text", "text": "Done."}], pi_usage(3, 2, 0, 0, 0)),
              {"type": "agent_end", "messages": []}]
    big, small = tmp_path / "big.raw", tmp_path / "small.raw"
    with big.open("wb") as fh:
        for event in events:
            if event is None:
                fh.write(b'{"type":"tool_execution_end","toolCallId":"c","toolName":"bash","result":{"content":'
                         b'[{"type":"text","text":"')
                for _ in range(50):
                    fh.write(b"x" * (1024 * 1024))
                fh.write(b'"}]},"isError":false}\n')
            else:
                fh.write(json.dumps(event).encode() + b"\n")
    write_jsonl(small, [e for e in events if e is not None])
    assert big.stat().st_size > 50 * 1024 * 1024
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(big), str(small)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["growth_kib"] < 20 * 1024, f"the parser grew by {out['growth_kib']} KiB"
    found = out["found"]
    assert found["truncated_lines"] == 1 and found["session_id"] == "sess-1" and found["last_text"] == "Done."
    assert found["ended"] is True and found["usage"] == {"input": 3, "output": 2, "cacheRead": 0, "cacheWrite": 0,
                                                         "cost": 0.0}


def classify(tmp_path, events, **process_fields) -> AgentResult:
    request = make_request(tmp_path, "implementer", model="anthropic/claude-x")
    write_jsonl(Path(request.raw_path), events)
    fields = {"argv": ["pi"], "cwd": request.workspace, "exit_code": 0, "elapsed_seconds": 1.0} | process_fields
    return PiAdapter()._result(ProcessResult(**fields), request, "0.73.1")


def test_failure_classification(tmp_path):
    header = EVENTS[0]
    unauthorized = [header, assistant([], stop="error", error='401 {"type":"error","error":{"type":'
                                                                 '"authentication_error","message":"bad key"}}'),
                    {"type": "agent_end"}]
    result = classify(tmp_path, unauthorized)
    assert result.failure_kind == "auth_failed" and "bad key" in result.failure_message
    assert result.failure_message.endswith("a headless worker cannot log in by itself.")
    assert all(value is None for value in result.usage.values())
    result = classify(tmp_path, [header, "No API key found for anthropic.", "", "Use /login to log into a provider"],
                      exit_code=1)
    assert result.failure_kind == "auth_failed" and "No API key found for anthropic." in result.failure_message
    busy = [header, assistant([], stop="error", error="529 overloaded_error: Overloaded"), {"type": "agent_end"}]
    result = classify(tmp_path, busy)
    assert result.failure_kind == "crashed" and "Overloaded" in result.failure_message
    recovered = [header, assistant([], stop="error", error="529 overloaded"),
                 assistant([{"type": "text", "text": "ok"}], pi_usage(1, 1, 0, 0, 0)), {"type": "agent_end"}]
    result = classify(tmp_path, recovered)
    assert result.failure_kind is None and result.final_message == "ok" and result.usage["input_tokens"] == 1
    cut = [header, {"type": "agent_start"}, assistant([{"type": "text", "text": "half"}], pi_usage(1, 1, 0, 0, 0))]
    assert classify(tmp_path, cut).failure_kind == "malformed_result"
    result = classify(tmp_path, ["Plain text where JSON was expected."])
    assert result.failure_kind == "malformed_result" and result.structured is False
    assert result.final_message == "Plain text where JSON was expected."
    result = classify(tmp_path, [header, "Error: Unknown option --bogus"], exit_code=1)
    assert result.failure_kind == "crashed" and "--bogus" in result.failure_message
    result = classify(tmp_path, [header], exit_code=None, signal=15, timed_out=True, elapsed_seconds=4.2)
    assert result.failure_kind == "timeout"


def test_the_transcript_of_pi_events(tmp_path):
    normalizer = transcript.Normalizer("pi", "/w")
    entries = [e for event in EVENTS for e in normalizer.line(json.dumps(event).encode())]
    kinds = [(e["kind"], e["text"]) for e in entries]
    assert kinds[0] == ("start", "Pi started (session sess-1)")
    assert ("tool_call", "Writes a.py") in kinds and ("tool_call", "Runs `false`") in kinds
    assert ("refusal", "write was refused: EROFS: read-only file system, open 'a.py'") in kinds
    assert ("tool_result", "failed with exit status 1") in kinds
    assert ("usage", "tokens so far: 1,000 in · 40 out · 200 cached") in kinds
    assert kinds[-1] == ("result", "Finished: 2,105 tokens in, 52 out") and ("text", "Done: a.py written.") in kinds
    assert not any(e["kind"] == "output" for e in entries)  # the delta line is skipped, not shown raw
    unavailable = {"type": "tool_execution_end", "toolCallId": "z", "toolName": "bash",
                   "result": {"content": [{"type": "text", "text": "Tool bash not found"}]}, "isError": True}
    [entry] = normalizer.line(json.dumps(unavailable).encode())
    assert entry["kind"] == "refusal" and entry["text"] == "bash was refused: the tool is not available to this role"
