"""The scripted model endpoint (engine/scripted_endpoint.py), alone and driving the REAL agent CLIs.

Fast tests talk to the endpoint with urllib. The tests marked ``slow`` run the real ``claude``
2.1.197 and ``codex`` 0.171.0 binaries from tools/agents (installed by
scripts/install-agent-clis.sh when missing) in a fresh git repository, offline, with the
endpoint as their model provider; each CLI run is killed if it lasts more than 60 s.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.scripted_endpoint import (ScenarioError, ScriptedEndpoint, anthropic_turn_index, gemini_turn_index,
                                      normalize_scenario, responses_turn_index)

ROOT = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = ROOT / "scripts" / "install-agent-clis.sh"
AGENT_BIN = Path(os.environ.get("AGENT_CLIS_PREFIX") or ROOT / "tools" / "agents") / "node_modules" / ".bin"
CLI_DEADLINE = 60.0  # seconds a CLI run may take before it is killed

# ----------------------------------------------------------------------------- helpers


def post(url: str, body: dict, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """POST ``body`` as JSON; returns (status, headers, raw body). HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def sse_events(raw: bytes) -> list[tuple[str, dict]]:
    """Parse ``event: NAME\\ndata: JSON\\n\\n`` frames into [(name, data)]; every frame must have both."""
    events = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        assert set(lines) == {"event", "data"}, frame
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        events.append((lines["event"], data))
    return events


def user(text: str) -> dict:
    """An Anthropic user message holding one text block."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


WRITE_TURN = {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/hello.txt", "content": "hi\n"}}],
              "text": "Writing it.",
              "usage": {"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 3,
                        "cache_creation_input_tokens": 2}}


@pytest.fixture
def endpoint(tmp_path):
    """A factory: ``endpoint(scenario)`` starts a ScriptedEndpoint with cwd=tmp_path, stopped after the test."""
    started = []

    def factory(scenario, **kwargs):
        ep = ScriptedEndpoint(scenario, cwd=kwargs.pop("cwd", str(tmp_path)), **kwargs).start()
        started.append(ep)
        return ep

    yield factory
    for ep in started:
        ep.stop()


# ----------------------------------------------------------------------------- fast: Anthropic API


def test_it_answers_a_streaming_tool_turn_as_sse(endpoint, tmp_path):
    ep = endpoint({"turns": [WRITE_TURN, {"text": "DONE"}]})
    status, headers, raw = post(ep.url + "/v1/messages?beta=true",
                                {"model": "claude-x", "stream": True, "messages": [user("go")], "tools": [{"name": "Write"}]})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = sse_events(raw)
    names = [name for name, _ in events]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["model"] == "claude-x" and start["role"] == "assistant" and start["content"] == []
    assert start["usage"] == {"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 3,
                              "cache_creation_input_tokens": 2}
    assert events[1][1]["content_block"] == {"type": "text", "text": ""}
    assert events[2][1]["delta"] == {"type": "text_delta", "text": "Writing it."}
    tool_block = events[4][1]["content_block"]
    assert tool_block["type"] == "tool_use" and tool_block["name"] == "Write" and tool_block["input"] == {}
    assert tool_block["id"].startswith("toolu_")
    delta = events[5][1]["delta"]
    assert delta["type"] == "input_json_delta"
    assert json.loads(delta["partial_json"]) == {"file_path": f"{tmp_path}/hello.txt", "content": "hi\n"}
    assert [e[1]["index"] for e in events[1:7]] == [0, 0, 0, 1, 1, 1]
    assert events[7][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[7][1]["usage"] == {"output_tokens": 7}
    [recorded] = ep.model_requests("anthropic")
    assert recorded["path"] == "/v1/messages?beta=true" and recorded["turn"] == 0 and recorded["body"]["model"] == "claude-x"


def test_it_answers_plain_json_without_stream_and_counts_assistant_turns(endpoint):
    ep = endpoint([WRITE_TURN, {"text": "DONE", "usage": {"input_tokens": 5, "output_tokens": 1}}])
    history = [user("go"), {"role": "system", "content": "mid-conversation system note"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Write", "input": {}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
               {"role": "system", "content": "another"}]
    status, headers, raw = post(ep.url + "/v1/messages", {"model": "m", "messages": history, "tools": [{"name": "Write"}]})
    assert status == 200 and headers["Content-Type"] == "application/json"
    answer = json.loads(raw)
    assert answer["type"] == "message" and answer["role"] == "assistant" and answer["stop_reason"] == "end_turn"
    assert answer["content"] == [{"type": "text", "text": "DONE"}]
    assert answer["usage"] == {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 0,
                               "cache_creation_input_tokens": 0}
    assert ep.model_requests()[0]["turn"] == 1


def test_it_answers_a_failure_status_with_the_provider_error_json_and_times(endpoint):
    ep = endpoint([{"status": 401, "message": "fake 401"}])
    for _ in range(2):  # without ``times`` every request for that turn fails
        status, _, raw = post(ep.url + "/v1/messages?beta=true", {"stream": True, "messages": [user("go")], "tools": [{}]})
        assert status == 401
        assert json.loads(raw) == {"type": "error", "error": {"type": "authentication_error", "message": "fake 401"}}
    ep = endpoint([{"status": 529, "times": 1, "text": "recovered"}])
    assert post(ep.url + "/v1/messages", {"messages": [user("go")], "tools": [{}]})[0] == 529
    status, _, raw = post(ep.url + "/v1/messages", {"messages": [user("go")], "tools": [{}]})
    assert status == 200 and json.loads(raw)["content"][0]["text"] == "recovered"
    assert [r["answer"] for r in ep.requests] == ["529", "turn"]


def test_it_answers_side_calls_without_consuming_a_turn(endpoint):
    ep = endpoint({"turns": [{"text": "main answer"}], "side_text": "A title"})
    status, _, raw = post(ep.url + "/v1/messages", {"messages": [user("Write the title")], "tools": []})
    assert status == 200 and json.loads(raw)["content"] == [{"type": "text", "text": "A title"}]
    status, _, raw = post(ep.url + "/v1/messages", {"messages": [user("go")], "tools": [{"name": "Bash"}]})
    assert json.loads(raw)["content"] == [{"type": "text", "text": "main answer"}]
    assert [(r["kind"], r["turn"]) for r in ep.requests] == [("side", None), ("main", 0)]


def test_it_gives_fresh_tool_ids_on_every_answer(endpoint):
    two_calls = {"tools": [{"tool": "Bash", "input": {"command": "true"}}, {"tool": "Bash", "input": {"command": "false"}}]}
    ep = endpoint([two_calls])
    ids = []
    for _ in range(3):  # the same turn asked again (a retry, a --resume): new ids each time
        _, _, raw = post(ep.url + "/v1/messages", {"messages": [user("go")], "tools": [{}]})
        ids += [block["id"] for block in json.loads(raw)["content"] if block["type"] == "tool_use"]
    assert len(ids) == 6 and len(set(ids)) == 6


def test_it_ends_the_conversation_when_the_scenario_has_no_turn_left(endpoint):
    ep = endpoint([])
    _, _, raw = post(ep.url + "/v1/messages", {"messages": [user("go")], "tools": [{}]})
    answer = json.loads(raw)
    assert answer["stop_reason"] == "end_turn" and "no turn 0" in answer["content"][0]["text"]


def test_it_answers_head_and_refuses_unknown_paths(endpoint):
    ep = endpoint([])
    with urllib.request.urlopen(urllib.request.Request(ep.url + "/", method="HEAD"), timeout=5) as resp:
        assert resp.status == 200
    assert post(ep.url + "/v1/other", {})[0] == 404
    assert [(r["method"], r["path"]) for r in ep.requests] == [("HEAD", "/"), ("POST", "/v1/other")]


def test_it_delays_and_hangs_and_stop_releases_hanging_requests(endpoint):
    ep = endpoint([{"delay": 0.5, "text": "late"}])
    started = time.monotonic()
    assert post(ep.url + "/v1/messages", {"messages": [user("go")], "tools": [{}]})[0] == 200
    assert time.monotonic() - started >= 0.5
    ep = endpoint([{"hang": True}])
    with pytest.raises(TimeoutError):
        post(ep.url + "/v1/messages", {"messages": [user("go")], "tools": [{}]}, timeout=0.5)
    assert ep.requests[-1]["answer"] == "hang"
    started = time.monotonic()
    ep.stop()
    assert time.monotonic() - started < 3


def test_it_refuses_a_malformed_scenario():
    for bad in ({"turns": [{"tool": "Write", "inptu": {}}]}, {"turn": []}, [{"usage": {"input": 1}}],
                [{"status": "401"}], [{"tools": [{"name": "Write"}]}], [{"delay": -1}], "text"):
        with pytest.raises(ScenarioError):
            normalize_scenario(bad)
    turn = normalize_scenario(["just text"])["turns"][0]
    assert turn["text"] == "just text" and turn["tools"] == [] and turn["status"] is None


def test_turn_counting_rules():
    assert anthropic_turn_index({"messages": [user("go")]}) == 0
    assert anthropic_turn_index({"messages": [user("a"), {"role": "assistant", "content": []}, user("b"),
                                              {"role": "assistant", "content": "x"}, user("c")]}) == 2
    dev = {"type": "message", "role": "developer", "content": []}
    fc = lambda n: {"type": "function_call", "call_id": f"c{n}", "name": "exec_command", "arguments": "{}"}  # noqa: E731
    out = lambda n: {"type": "function_call_output", "call_id": f"c{n}", "output": ""}  # noqa: E731
    msg = {"type": "message", "role": "user", "content": []}
    assert responses_turn_index({"input": [dev, msg]}) == 0
    # codex 0.171.0 sends the calls of one response together, then their outputs
    assert responses_turn_index({"input": [dev, msg, fc(1), fc(2), out(1), out(2)]}) == 1
    assert responses_turn_index({"input": [dev, msg, {"type": "reasoning"}, fc(1), out(1), fc(2), out(2)]}) == 2
    assert responses_turn_index({"input": "a bare string prompt"}) == 0


# ----------------------------------------------------------------------------- fast: Responses API


def test_it_answers_the_responses_api_as_sse(endpoint, tmp_path):
    ep = endpoint([{"tool": "exec_command", "input": {"cmd": "touch {cwd}/x"},
                    "usage": {"input_tokens": 50, "output_tokens": 5, "cached_input_tokens": 20,
                              "reasoning_output_tokens": 1}},
                   {"text": "done"}])
    status, headers, raw = post(ep.url + "/v1/responses", {"model": "gpt-fake", "stream": True, "input": [
        {"type": "message", "role": "developer", "content": []}, {"type": "message", "role": "user", "content": []}]})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = sse_events(raw)
    assert [n for n, _ in events] == ["response.created", "response.output_item.added", "response.output_item.done",
                                      "response.completed"]
    item = events[2][1]["item"]
    assert item["type"] == "function_call" and item["name"] == "exec_command" and item["call_id"].startswith("call_")
    assert json.loads(item["arguments"]) == {"cmd": f"touch {tmp_path}/x"}
    completed = events[3][1]["response"]
    assert completed["status"] == "completed" and completed["output"] == [item]
    assert completed["usage"] == {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 5,
                                  "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 55}
    status, _, raw = post(ep.url + "/v1/responses", {"stream": True, "input": [
        {"type": "message", "role": "user", "content": []}, item,
        {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}]})
    events = sse_events(raw)
    assert [n for n, _ in events] == ["response.created", "response.output_item.added", "response.output_text.delta",
                                      "response.output_item.done", "response.completed"]
    assert events[2][1]["delta"] == "done"
    assert events[3][1]["item"]["content"] == [{"type": "output_text", "text": "done", "annotations": []}]


def test_it_answers_a_responses_failure_with_the_openai_error_json(endpoint):
    ep = endpoint([{"status": 401, "message": "fake 401"}])
    status, _, raw = post(ep.url + "/v1/responses", {"stream": True, "input": []})
    assert status == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key"


# ----------------------------------------------------------------------------- fast: Gemini API


def gemini_frames(raw: bytes) -> list[dict]:
    """Parse Google's SSE (``data: JSON`` frames separated by a blank line) into the JSON objects."""
    frames = [frame for frame in raw.decode().replace("\r\n", "\n").split("\n\n") if frame.strip()]
    assert all(frame.startswith("data: ") for frame in frames), frames
    return [json.loads(frame[len("data: "):]) for frame in frames]


def test_it_answers_the_gemini_api_as_sse_with_function_calls_and_usage(endpoint, tmp_path):
    ep = endpoint([{"tools": [{"tool": "write_file", "input": {"file_path": "{cwd}/x", "content": "x"}}],
                    "text": "Writing.",
                    "usage": {"promptTokenCount": 50, "candidatesTokenCount": 5, "cachedContentTokenCount": 20,
                              "thoughtsTokenCount": 2}},
                   {"text": "done"}])
    url = ep.url + "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    status, headers, raw = post(url, {"contents": [{"role": "user", "parts": [{"text": "go"}]}]})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    frames = gemini_frames(raw)
    parts = [part for frame in frames for part in frame["candidates"][0]["content"]["parts"]]
    assert parts == [{"text": "Writing."}, {"functionCall": {"name": "write_file",
                                                             "args": {"file_path": f"{tmp_path}/x", "content": "x"}}}]
    last = frames[-1]
    assert last["candidates"][0]["finishReason"] == "STOP" and all("usageMetadata" not in f for f in frames[:-1])
    assert last["usageMetadata"] == {"promptTokenCount": 50, "candidatesTokenCount": 5, "totalTokenCount": 57,
                                     "cachedContentTokenCount": 20, "thoughtsTokenCount": 2}
    model_turn = {"role": "model", "parts": parts}
    answer = {"role": "user", "parts": [{"functionResponse": {"name": "write_file", "response": {"output": "ok"}}}]}
    status, _, raw = post(ep.url + "/v1beta/models/gemini-2.5-pro:generateContent",
                          {"contents": [{"role": "user", "parts": [{"text": "go"}]}, model_turn, answer]})
    reply = json.loads(raw)
    assert status == 200 and reply["candidates"][0]["content"] == {"role": "model", "parts": [{"text": "done"}]}
    assert reply["usageMetadata"] == {"promptTokenCount": 100, "candidatesTokenCount": 20, "totalTokenCount": 120}
    assert [(r["api"], r["turn"]) for r in ep.model_requests()] == [("gemini", 0), ("gemini", 1)]


def test_it_answers_a_gemini_failure_with_the_google_error_json(endpoint):
    ep = endpoint([{"status": 401, "message": "API key not valid."}])
    status, _, raw = post(ep.url + "/v1beta/models/m:streamGenerateContent?alt=sse", {"contents": []})
    assert status == 401 and json.loads(raw) == {"error": {"code": 401, "message": "API key not valid.",
                                                           "status": "UNAUTHENTICATED"}}


def test_gemini_turns_are_the_model_contents():
    user_turn = {"role": "user", "parts": [{"text": "go"}]}
    assert gemini_turn_index({"contents": [user_turn]}) == 0
    assert gemini_turn_index({"contents": [user_turn, {"role": "model", "parts": []}, user_turn,
                                           {"role": "model", "parts": []}, user_turn]}) == 2
    assert gemini_turn_index({"contents": "not a list"}) == 0


def test_the_command_line_prints_its_url_and_serves(tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("turns:\n  - text: from the file\n", encoding="utf-8")
    record = tmp_path / "requests.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "engine.scripted_endpoint", "--scenario", str(scenario),
                             "--cwd", str(tmp_path), "--record", str(record)],
                            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        _, _, raw = post(url + "/v1/messages", {"messages": [user("go")], "tools": [{}]})
        assert json.loads(raw)["content"][0]["text"] == "from the file"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert json.loads(record.read_text().splitlines()[0])["path"] == "/v1/messages"
    bad = tmp_path / "bad.yaml"
    bad.write_text("turns: [{nope: 1}]\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "engine.scripted_endpoint", "--scenario", str(bad)], cwd=str(ROOT),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "unknown keys" in result.stderr


# ----------------------------------------------------------------------------- slow: the real CLIs


@pytest.fixture(scope="module")
def agent_bin():
    """tools/agents/node_modules/.bin, after running scripts/install-agent-clis.sh if a binary is missing."""
    if not ((AGENT_BIN / "claude").exists() and (AGENT_BIN / "codex").exists()):
        result = subprocess.run(["bash", str(INSTALL_SCRIPT)], cwd=str(ROOT), capture_output=True, text=True,
                                timeout=600, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, f"install-agent-clis.sh failed:\n{result.stdout}\n{result.stderr}"
    return AGENT_BIN


@pytest.fixture
def git_repo(tmp_path):
    """A fresh git repository with one commit (README.md), at tmp_path/repo."""
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "T",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    (repo / "README.md").write_text("hello readme\n", encoding="utf-8")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", *args], cwd=str(repo), env=env, check=True, capture_output=True)
    return repo


def base_env(home: Path) -> dict:
    """A minimal environment for a CLI: PATH and locale from ours, a fresh HOME, nothing else inherited."""
    home.mkdir(exist_ok=True)
    env = {key: os.environ[key] for key in ("PATH", "LANG", "LC_ALL") if key in os.environ}
    env["HOME"] = str(home)
    return env


def run_cli(argv: list[str], cwd: Path, env: dict) -> tuple[int, str, str, float]:
    """Run a CLI (own session, stdin /dev/null); kill it after CLI_DEADLINE s. Returns (rc, stdout, stderr, seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CLI_DEADLINE)
    except subprocess.TimeoutExpired:
        # SIGINT first: claude 2.1.197 then takes its tool shells down too (seen with the real binary)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"{argv[0]} ran longer than {CLI_DEADLINE} s and was killed\nstdout:\n{out[-3000:]}\n"
                    f"stderr:\n{err[-3000:]}")
    return proc.returncode, out, err, time.monotonic() - started


def claude(agent_bin: Path, ep: ScriptedEndpoint, repo: Path, home: Path, *extra: str) -> tuple[int, list[dict], str, float]:
    """Run the real claude headless against ``ep``; returns (rc, stream-json events, stderr, seconds)."""
    env = base_env(home) | {"ANTHROPIC_BASE_URL": ep.url, "ANTHROPIC_API_KEY": "dummy-key-for-tests",
                            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}
    argv = [str(agent_bin / "claude"), "-p", "Do the scripted task.", "--output-format", "stream-json", "--verbose",
            "--max-turns", "5", "--permission-mode", "acceptEdits", *extra]
    rc, out, err, seconds = run_cli(argv, repo, env)
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return rc, events, err, seconds


def tool_results(request: dict) -> list[dict]:
    """The tool_result blocks of the last message of a recorded Anthropic request."""
    content = request["body"]["messages"][-1]["content"]
    return [block for block in content if isinstance(block, dict) and block.get("type") == "tool_result"]


@pytest.mark.slow
def test_claude_writes_a_file_and_reports_the_scripted_usage(agent_bin, endpoint, git_repo, tmp_path):
    usage1 = {"input_tokens": 1002, "output_tokens": 40, "cache_read_input_tokens": 2001,
              "cache_creation_input_tokens": 300}
    usage2 = {"input_tokens": 1003, "output_tokens": 45, "cache_read_input_tokens": 2004,
              "cache_creation_input_tokens": 305}
    ep = endpoint({"turns": [
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/hello.txt", "content": "hello from the script\n"}}],
         "usage": usage1},
        {"text": "DONE: scripted final answer.", "usage": usage2},
    ]}, cwd=str(git_repo))
    rc, events, err, _ = claude(agent_bin, ep, git_repo, tmp_path / "home")
    assert rc == 0, err
    assert (git_repo / "hello.txt").read_text() == "hello from the script\n"
    result = events[-1]
    assert result["type"] == "result" and result["is_error"] is False and result["num_turns"] == 2
    assert result["result"] == "DONE: scripted final answer."
    assert {key: result["usage"][key] for key in usage1} == {key: usage1[key] + usage2[key] for key in usage1}
    assert result["total_cost_usd"] > 0
    # claude 2.1.197 prices its default model (opus) at $5 / $25 / $0.50 / $6.25 per M tokens (seen in its own cost report)
    u = result["usage"]
    assert result["total_cost_usd"] == pytest.approx(
        (u["input_tokens"] * 5 + u["output_tokens"] * 25 + u["cache_read_input_tokens"] * 0.5
         + u["cache_creation_input_tokens"] * 6.25) / 1e6)
    assert result["session_id"] and events[0]["type"] == "system" and events[0]["session_id"] == result["session_id"]
    main = ep.model_requests("anthropic")
    assert [r["turn"] for r in main] == [0, 1] and ep.model_requests(kind="side") == []
    assert ep.requests[0]["method"] == "HEAD"
    [written] = tool_results(main[1])
    tool_use = [b for b in main[1]["body"]["messages"][-2]["content"] if b["type"] == "tool_use"][0]
    assert written["tool_use_id"] == tool_use["id"] and not written.get("is_error")


@pytest.mark.slow
def test_claude_fails_fast_on_401(agent_bin, endpoint, git_repo, tmp_path):
    ep = endpoint([{"status": 401, "message": "fake 401"}], cwd=str(git_repo))
    rc, events, err, seconds = claude(agent_bin, ep, git_repo, tmp_path / "home")
    assert rc == 1 and seconds < 10
    result = events[-1]
    assert result["type"] == "result" and result["is_error"] is True and result["api_error_status"] == 401
    assert "401" in result["result"]
    assert len(ep.model_requests()) == 1  # CLAUDE_CODE_MAX_RETRIES=0: no retry


@pytest.mark.slow
def test_claude_with_read_only_tools_cannot_write_edit_or_run(agent_bin, endpoint, git_repo, tmp_path):
    ep = endpoint([
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/written.txt", "content": "no\n"}},
                   {"tool": "Edit", "input": {"file_path": "{cwd}/README.md", "old_string": "hello",
                                              "new_string": "changed"}},
                   {"tool": "Bash", "input": {"command": "touch x", "description": "make x"}}]},
        {"text": "Could not change anything."},
    ], cwd=str(git_repo))
    rc, events, err, _ = claude(agent_bin, ep, git_repo, tmp_path / "home", "--tools", "Read,Grep,Glob")
    assert rc == 0, err
    assert sorted(p.name for p in git_repo.iterdir()) == [".git", "README.md"]
    assert (git_repo / "README.md").read_text() == "hello readme\n"
    main = ep.model_requests("anthropic")
    offered = {tool["name"] for tool in main[0]["body"]["tools"]}
    assert offered == {"Read", "Grep", "Glob"}
    results = tool_results(main[1])
    assert len(results) == 3 and all(r.get("is_error") for r in results)
    texts = [json.dumps(r["content"]) for r in results]
    assert all("No such tool available" in text for text in texts), texts
    assert events[-1]["type"] == "result" and events[-1]["is_error"] is False


def codex(agent_bin: Path, ep: ScriptedEndpoint, repo: Path, home: Path) -> tuple[int, list[dict], str, float]:
    """Run the real ``codex exec`` against ``ep`` as a custom provider; returns (rc, JSONL events, stderr, seconds).

    The provider settings are the ones codex 0.171.0 takes for a custom provider, plus
    zero retries so that a failure ends at once instead of reconnecting 5 times. Its bundled
    bubblewrap comes first on PATH: codex takes a host's ``bwrap`` before its own, and with
    Debian's 0.8.0 every command fails ("bwrap: execvp codex-linux-sandbox"), as
    engine/agents/codex/adapter.py ``sandboxed`` says. Codex passes over a ``bwrap`` inside a folder its
    commands may write (tried: one under /tmp, writable by default in workspace-write), so /tmp and
    $TMPDIR are made read-only as the adapter makes them (``WORKSPACE_WRITE_OVERRIDES``).
    """
    env = base_env(home) | {"SCRIPTED_KEY": "dummy-key-for-tests"}
    from engine.agents.codex.adapter import WORKSPACE_WRITE_OVERRIDES
    from engine.agents.sandbox import bundled_bwrap
    if bundled_bwrap():
        first = ROOT / "test-artifacts" / "codex-bwrap"
        first.mkdir(parents=True, exist_ok=True)
        try:
            (first / "bwrap").symlink_to(bundled_bwrap())
        except FileExistsError:  # an earlier test, or one running beside this
            pass
        env["PATH"] = f"{first}{os.pathsep}{env.get('PATH', '')}"
    argv = [str(agent_bin / "codex"), "exec", "--json", "--sandbox", "workspace-write", "--skip-git-repo-check",
            *(arg for override in WORKSPACE_WRITE_OVERRIDES for arg in ("-c", override)),
            "-c", "model_provider=scripted", "-c", "model_providers.scripted.name=scripted",
            "-c", f'model_providers.scripted.base_url="{ep.url}/v1"', "-c", "model_providers.scripted.wire_api=responses",
            "-c", "model_providers.scripted.env_key=SCRIPTED_KEY",
            "-c", "model_providers.scripted.request_max_retries=0", "-c", "model_providers.scripted.stream_max_retries=0",
            "-m", "gpt-scripted", "Do the scripted task."]
    rc, out, err, seconds = run_cli(argv, repo, env)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rc, events, err, seconds


@pytest.mark.slow
def test_codex_runs_a_command_and_reports_the_scripted_usage(agent_bin, endpoint, git_repo, tmp_path):
    usage1 = {"input_tokens": 501, "output_tokens": 31, "cached_input_tokens": 200, "reasoning_output_tokens": 3}
    usage2 = {"input_tokens": 502, "output_tokens": 32, "cached_input_tokens": 201, "reasoning_output_tokens": 4}
    ep = endpoint([{"tool": "exec_command", "input": {"cmd": "touch made-by-codex.txt"}, "usage": usage1},
                   {"text": "DONE: codex scripted answer.", "usage": usage2}], cwd=str(git_repo))
    rc, events, err, _ = codex(agent_bin, ep, git_repo, tmp_path / "home")
    assert rc == 0, err
    assert (git_repo / "made-by-codex.txt").exists(), [i for i in ep.requests[-1]["body"]["input"]
                                                    if i.get("type") == "function_call_output"]
    [completed] = [e for e in events if e["type"] == "turn.completed"]
    assert {key: completed["usage"][key] for key in usage1} == {key: usage1[key] + usage2[key] for key in usage1}
    commands = [e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"]
    assert len(commands) == 1 and commands[0]["exit_code"] == 0 and "touch made-by-codex.txt" in commands[0]["command"]
    messages = [e["item"]["text"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
    assert messages == ["DONE: codex scripted answer."]
    main = ep.model_requests("responses")
    assert [r["turn"] for r in main] == [0, 1]
    output = [i for i in main[1]["body"]["input"] if i.get("type") == "function_call_output"]
    assert len(output) == 1 and "Process exited with code 0" in output[0]["output"]


@pytest.mark.slow
def test_codex_fails_fast_on_401_without_retries(agent_bin, endpoint, git_repo, tmp_path):
    ep = endpoint([{"status": 401, "message": "fake 401"}], cwd=str(git_repo))
    rc, events, err, seconds = codex(agent_bin, ep, git_repo, tmp_path / "home")
    assert rc == 1 and seconds < 10
    [failed] = [e for e in events if e["type"] == "turn.failed"]
    assert "401" in failed["error"]["message"]
    assert len(ep.model_requests()) == 1
