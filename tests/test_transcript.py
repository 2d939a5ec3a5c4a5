"""The agent's conversation, normalized (engine/text/transcript.py) and shown on the run page.

The stream shapes are those of the real CLIs (the real-binary tests in tests/test_claude_adapter.py
and tests/test_codex_adapter.py check the same sentences on their own output); here each kind of
entry, the bounds, the redaction, the live follower and the page's fragment are checked without a
model.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.urls import reverse

from engine.text import transcript
from engine.models import Attempt
from engine.redaction import Redactor

from .support.pages import page
from .support.pages import live_attempt, pending_run  # noqa: F401 (fixtures)
from .support.runs import run_with
from .conftest import ANSWER_STEP

WS = "/srv/example-worktree"  # a worktree's path as the CLIs report it; nothing is read there


def lines(*events) -> bytes:
    return b"".join((json.dumps(e).encode() if isinstance(e, dict) else e) + b"\n" for e in events)


def normalize(fmt: str, data: bytes, tmp_path: Path, redactor: Redactor | None = None) -> list[dict]:
    out = tmp_path / f"{fmt}.jsonl"
    out.unlink(missing_ok=True)
    keeper = transcript.Transcript(out, fmt, WS, redactor)
    keeper.feed(data)
    keeper.close()
    return [json.loads(line) for line in out.read_text().splitlines()]


CLAUDE_STREAM = lines(
    {"type": "system", "subtype": "init", "session_id": "s1", "model": "claude-x", "tools": ["Bash", "Read"],
     "claude_code_version": "2.1.197"},
    {"type": "assistant", "message": {"id": "m1", "usage": {"input_tokens": 100, "output_tokens": 20},
                                      "content": [{"type": "text", "text": "Let me look."}]}},
    {"type": "assistant", "message": {"id": "m1", "usage": {"input_tokens": 100, "output_tokens": 20}, "content": [
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": f"{WS}/app/core.py"}},
        {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "python -m pytest -q",
                                                                  "description": "Run the tests"}},
        {"type": "tool_use", "id": "t3", "name": "Grep", "input": {"pattern": "def answer", "path": WS}},
        {"type": "tool_use", "id": "t4", "name": "Write", "input": {"file_path": f"{WS}/app/new.py",
                                                                   "content": "a = 1\nb = 2\n"}}]}},
    {"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "1\tx = 1\n2\ty = 2"},
        {"type": "tool_result", "tool_use_id": "t2", "is_error": True, "content": "Exit code 1\nF\n1 failed"},
        {"type": "tool_result", "tool_use_id": "t3", "is_error": True,
         "content": "<tool_use_error>Error: No such tool available: Grep</tool_use_error>"},
        {"type": "tool_result", "tool_use_id": "t4", "content": [{"type": "text", "text": "File created"}]}]}},
    b"some stderr line",
    {"type": "result", "is_error": False, "num_turns": 3, "result": "Done: it works.",
     "usage": {"input_tokens": 300, "output_tokens": 60}, "total_cost_usd": 0.003},
)


def test_claude_stream_json_becomes_sentences(tmp_path):
    said = [(e["kind"], e["text"]) for e in normalize("claude", CLAUDE_STREAM, tmp_path)]
    assert said == [
        ("start", "Claude Code 2.1.197 started (model claude-x, 2 tools: Bash, Read)"),
        ("text", "Let me look."),
        ("usage", "tokens so far: 100 in · 20 out · 0 cached"),  # one usage per message id, not per block
        ("tool_call", "Reads app/core.py"),
        ("tool_call", "Runs `python -m pytest -q`"),
        ("tool_call", "Searches for “def answer” in the working directory"),
        ("tool_call", "Writes app/new.py (2 lines)"),
        ("tool_result", "2 lines read"),
        ("tool_result", "failed with exit status 1"),
        ("refusal", "Grep was refused: Error: No such tool available: Grep"),
        ("tool_result", "done"),
        ("output", "some stderr line"),
        ("result", "Finished: 3 turns; 300 tokens in, 60 out; cost $0.0030"),
    ]
    entries = normalize("claude", CLAUDE_STREAM, tmp_path)
    failed = entries[8]
    assert failed["ok"] is False and failed["exit"] == 1 and failed["call"] == "t2" and "1 failed" in failed["detail"]
    assert entries[4]["detail"] == "Run the tests"
    assert [e["n"] for e in entries] == list(range(1, len(entries) + 1))


def test_codex_json_events_become_sentences(tmp_path):
    data = lines(
        {"type": "thread.started", "thread_id": "th1"},
        {"type": "item.completed", "item": {"id": "i0", "type": "reasoning", "text": "Thinking about it"}},
        {"type": "item.started", "item": {"id": "i1", "type": "command_execution", "command": "bash -lc ls",
                                          "status": "in_progress"}},
        {"type": "item.completed", "item": {"id": "i1", "type": "command_execution", "command": "bash -lc ls",
                                            "aggregated_output": "a\nb\n", "exit_code": 0, "status": "completed"}},
        {"type": "item.completed", "item": {"id": "i2", "type": "command_execution", "command": "rm -rf /",
                                            "aggregated_output": "", "exit_code": 1, "status": "declined"}},
        {"type": "item.completed", "item": {"id": "i3", "type": "file_change", "status": "completed",
                                            "changes": [{"path": f"{WS}/app/core.py", "kind": "update"}]}},
        {"type": "item.completed", "item": {"id": "i4", "type": "agent_message", "text": "All done."}},
        {"type": "turn.completed", "usage": {"input_tokens": 1003, "cached_input_tokens": 401, "output_tokens": 63}},
        {"type": "turn.failed", "error": {"message": "stream disconnected"}},
    )
    said = [(e["kind"], e["text"]) for e in normalize("codex", data, tmp_path)]
    assert said == [
        ("start", "Codex started (thread th1)"),
        ("thinking", "Thinking about it"),
        ("tool_call", "Runs `bash -lc ls`"),
        ("tool_result", "exit status 0"),
        ("tool_call", "Runs `rm -rf /`"),  # a completed item never seen started still shows its call
        ("refusal", "The command was refused (declined by the sandbox policy)"),
        ("tool_call", "Changed app/core.py (update)"),
        ("text", "All done."),
        ("usage", "tokens so far: 1,003 in · 63 out · 401 cached"),
        ("error", "The turn failed: stream disconnected"),
    ]


def test_the_scripted_agent_gets_the_same_treatment(tmp_path):
    data = lines(b"[scripted agent] implement of stage answer, attempt 1 (simulated)", b"wrote app/core.py",
                 b"running sh -c echo hi", b"hi", b"",
                 {"type": "result", "simulated": True, "is_error": False, "result": "Scripted step done.",
                  "usage": {"input_tokens": 10, "output_tokens": 5}})
    said = [(e["kind"], e["text"]) for e in normalize("scripted", data, tmp_path)]
    assert said == [("start", "The scripted test agent started: implement of stage answer, attempt 1 (simulated)"),
                    ("tool_call", "Wrote app/core.py"), ("tool_call", "Runs `sh -c echo hi`"), ("output", "hi"),
                    ("result", "Finished: 10 tokens in, 5 tokens out")]


def test_an_over_long_line_is_not_parsed_and_the_stream_goes_on(tmp_path):
    big = b'{"type": "assistant", "message": {"content": [{"type": "text", "text": "' + b"x" * (5 << 20) + b'"}]}}'
    out = tmp_path / "t.jsonl"
    keeper = transcript.Transcript(out, "claude", WS)
    process = psutil.Process()
    before = process.memory_info().rss
    for start in range(0, len(big), 64 * 1024):  # as the follower reads it: in pieces
        keeper.feed(big[start:start + 64 * 1024])
    keeper.feed(b"\n" + lines({"type": "result", "num_turns": 1, "result": "ok"}))
    keeper.close()
    grown = process.memory_info().rss - before
    entries = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["kind"] for e in entries] == ["cut", "result"]
    assert f"{len(big):,} bytes" in entries[0]["text"] and "raw output" in entries[0]["text"]
    assert grown < 20 * 1024 * 1024, grown  # never the whole line in memory (a few MB of slack for the allocator)


def test_texts_and_results_are_bounded(tmp_path):
    data = lines({"type": "assistant", "message": {"content": [{"type": "text", "text": "y" * 50_000}]}},
                 {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "z",
                                                           "content": "\n".join(f"row {n}" for n in range(500))}]}})
    text, result = normalize("claude", data, tmp_path)
    assert len(text["text"]) == transcript.TEXT_CHARS and text["text"].endswith("…")
    assert result["detail"].splitlines()[-1] == "… 494 more lines" and len(result["detail"].splitlines()) == 7


def test_the_follower_keeps_the_transcript_while_the_log_grows(tmp_path):
    raw = tmp_path / "output.raw"
    raw.write_bytes(b"")
    follower = transcript.Follower(raw, "claude", WS)
    follower.start()
    try:
        with open(raw, "ab") as fh:
            fh.write(CLAUDE_STREAM[:CLAUDE_STREAM.index(b"\n") + 1])
            fh.flush()
            deadline = time.monotonic() + 10
            path = transcript.transcript_path(raw)
            while time.monotonic() < deadline and "started" not in (path.read_text() if path.exists() else ""):
                time.sleep(0.05)
            assert "Claude Code 2.1.197 started" in path.read_text()  # read while the process still writes
            fh.write(CLAUDE_STREAM[CLAUDE_STREAM.index(b"\n") + 1:] + b'{"type": "result", "num_turns": 9')
    finally:
        follower.finish()
    entries, last = transcript.read_tail(transcript.transcript_path(raw))
    assert last == len(entries) and entries[-1]["kind"] == "output"  # the unfinished last line, as text
    assert sum(1 for e in entries if e["kind"] == "result") == 1


def test_each_line_is_redacted_before_it_is_read(tmp_path):
    secret = "s3cr3t-value-of-the-worker-0123456789"
    data = lines({"type": "assistant", "message": {"content": [
        {"type": "text", "text": f"the key is sk-ant-api03-{'A' * 40} and {secret}"},
        {"type": "tool_use", "id": "q", "name": "Bash", "input": {"command": f"curl -H 'x: {secret}' h"}}]}})
    entries = normalize("claude", data, tmp_path, Redactor([secret]))
    stored = (tmp_path / "claude.jsonl").read_text()
    assert secret not in stored and "AAAAAAAAAA" not in stored and "[REDACTED]" in entries[0]["text"]
    assert "[REDACTED]" in entries[1]["text"]


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_a_scripted_attempt_keeps_its_transcript_and_the_page_shows_it(staff, make_pipeline, repo, sent):  # noqa: F811
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP]})
    attempt = Attempt.objects.get(run=run, operation="implement")
    stored = Path(settings.VAR_DIR) / attempt.raw_path
    assert (stored.parent / "transcript.jsonl").is_file()
    fragment = staff.get(reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])).content.decode()
    assert 'class="cp-tail cp-conversation' in fragment
    assert re.search(r'data-kind="tool_call" data-tool="Write">.*?Wrote app/core\.py', fragment)
    assert "Finished: 10 tokens in, 5 tokens out" in fragment
    assert "?view=log" in fragment  # the plain log is one click away
    plain = staff.get(reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk]) + "?view=log")
    assert "wrote app/core.py" in plain.content.decode() and "the conversation" in plain.content.decode()
    served = staff.get(reverse("admin:engine_attempt_file", args=[attempt.pk, "transcript"]))
    assert served.status_code == 200 and b'"kind": "tool_call"' in b"".join(served.streaming_content)


@pytest.mark.django_db
def test_the_conversation_box_polls_while_the_attempt_runs_and_204s_while_nothing_changed(staff, make_pipeline,  # noqa: F811
                                                                                       repo):
    run = pending_run(make_pipeline, repo)
    attempt, log = live_attempt(run, "hello\n")
    attempt.raw_path = str(Path(attempt.log_path).with_name("output.raw"))
    attempt.save(update_fields=["raw_path"])
    raw = Path(settings.VAR_DIR) / attempt.raw_path
    raw.write_bytes(CLAUDE_STREAM[:CLAUDE_STREAM.index(b"\n") + 1])
    transcript.build(raw, "claude", WS)
    url = reverse("admin:engine_run_attempt_tail", args=[run.pk, attempt.pk])
    first = staff.get(url, {"live": "1"}).content.decode()
    found = re.search(r"hx-vals='([^']+)'", first)
    asked = json.loads(found.group(1).replace("&quot;", '"'))
    assert staff.get(url, {**asked, "live": "1"}).status_code == 204  # nothing new: htmx swaps nothing
    raw.write_bytes(CLAUDE_STREAM)
    transcript.build(raw, "claude", WS)
    grown = staff.get(url, {**asked, "live": "1"})
    assert grown.status_code == 200 and "Runs `python -m pytest -q`" in grown.content.decode()
    # the page puts the live box at the top, before the actions, and the attempt's row points to it
    text = page(staff, run)
    assert text.index('id="live"') < text.index('id="actions"') < text.index('id="timeline"')
    assert f'hx-get="{url}" hx-trigger="load"' in text and "watch it at the top of the page" in text


# ----------------------------------------------------------------------------- what happened to each command
# The results as each real CLI reported them in its sandbox (the adapters' tests run them:
# ``test_*_says_what_happened_to_each_command``): a missing program, a plain failure, a sandbox refusal.

MISSING, FAILS, DENIED = "cp-missing-program -m pytest", "false", "echo hi > /etc/cp-probe"
NOT_FOUND_LINE = "/bin/bash: line 1: cp-missing-program: command not found"
EROFS_LINE = "/bin/bash: line 1: /etc/cp-probe: Read-only file system"


def claude_commands() -> bytes:
    calls = [("c1", MISSING, f"Exit code 127\n{NOT_FOUND_LINE}"), ("c2", FAILS, "Exit code 1"),
             ("c3", DENIED, f"Exit code 1\n{EROFS_LINE}")]
    return lines(*[event for call, command, said in calls for event in (
        {"type": "assistant", "message": {"content": [{"type": "tool_use", "id": call, "name": "Bash",
                                                       "input": {"command": command}}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": call, "is_error": True,
                                                  "content": said}]}})])


def codex_commands() -> bytes:  # codex leaves what its sandbox refused out of its JSON (the adapter adds it)
    return lines(*[{"type": "item.completed", "item": {"id": call, "type": "command_execution", "command": command,
                                                       "aggregated_output": said, "exit_code": code,
                                                       "status": "failed"}}
                   for call, command, said, code in (
                       ("i1", f"/bin/bash -lc '{MISSING}'", NOT_FOUND_LINE + "\n", 127),
                       ("i2", f"/bin/bash -lc {FAILS}", "", 1),
                       ("i3", f"/bin/bash -lc '{DENIED}'", EROFS_LINE + "\n", 1))])


def pi_commands() -> bytes:
    calls = [("p1", MISSING, f"{NOT_FOUND_LINE}\n\n\nCommand exited with code 127"),
             ("p2", FAILS, "(no output)\n\nCommand exited with code 1"),
             ("p3", DENIED, f"{EROFS_LINE}\n\n\nCommand exited with code 1")]
    return lines(*[event for call, command, said in calls for event in (
        {"type": "message_end", "message": {"role": "assistant", "content": [
            {"type": "toolCall", "id": call, "name": "bash", "arguments": {"command": command}}]}},
        {"type": "tool_execution_end", "toolCallId": call, "toolName": "bash", "isError": True,
         "result": {"content": [{"type": "text", "text": said}]}})])


def gemini_commands() -> bytes:  # a command that exits non-zero is a *success* of gemini's shell tool
    calls = [("g1", MISSING, "/usr/bin/bash: line 4: cp-missing-program: command not found"),
             ("g2", FAILS, "Command exited with code: 1"),
             ("g3", DENIED, "/usr/bin/bash: line 4: /etc/cp-probe: Read-only file system")]
    return lines(*[event for call, command, said in calls for event in (
        {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": call, "parameters": {"command": command}},
        {"type": "tool_result", "tool_id": call, "status": "success", "output": said})])


@pytest.mark.parametrize("fmt, stream, tool, exits", [
    ("claude", claude_commands, "Bash", (127, 1, 1)),
    ("codex", codex_commands, "shell", (127, 1, 1)),
    ("pi", pi_commands, "bash", (127, 1, 1)),
    ("gemini", gemini_commands, "run_shell_command", (None, 1, None)),  # with output gemini says no exit status
])
def test_each_cli_says_what_happened_to_each_command(tmp_path, fmt, stream, tool, exits):
    results = [e for e in normalize(fmt, stream(), tmp_path) if e["kind"] in ("tool_result", "refusal")]
    found = [(e["kind"], e["ok"], e.get("exit"), e["text"]) for e in results]
    status = [f" (exit status {code})" if code is not None else "" for code in exits]
    shell = "/usr/bin/bash: line 4" if fmt == "gemini" else "/bin/bash: line 1"
    assert found == [
        # a missing program is its own result, not a refusal
        ("tool_result", False, exits[0], f"command not found: cp-missing-program{status[0]}"),
        ("tool_result", False, 1, "failed with exit status 1"),  # a plain failure
        ("refusal", False, exits[2], f"{tool} was refused{status[2]}: {shell}: /etc/cp-probe: Read-only file "
                                     "system"),
    ]
    assert "cp-missing-program: command not found" in results[0]["detail"]  # what the shell said, kept


def test_exit_127_wins_over_refusal_wording_and_a_cli_refusal_stays_a_refusal(tmp_path):
    data = lines(
        {"type": "assistant", "message": {"content": [
            {"type": "tool_use", "id": "a", "name": "Bash", "input": {"command": "python -m pytest"}},
            {"type": "tool_use", "id": "b", "name": "Write", "input": {"file_path": f"{WS}/x.py", "content": "x"}}]}},
        {"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "a", "is_error": True,
             "content": "Exit code 127\n/bin/bash: line 1: python: Permission denied"},
            {"type": "tool_result", "tool_use_id": "b", "is_error": True,
             "content": "Claude requested permissions to write to x.py, but you haven't granted it yet."}]}})
    first, second = [e for e in normalize("claude", data, tmp_path) if e["kind"] != "tool_call"]
    assert (first["kind"], first["exit"], first["text"]) == ("tool_result", 127, "command not found: python "
                                                                                "(exit status 127)")
    assert (second["kind"], second["text"]) == ("refusal", "Write was refused: Claude requested permissions to "
                                                           "write to x.py, but you haven't granted it yet.")
    # a tool gemini does not give the role is refused; a failed edit only failed
    data = lines({"type": "tool_use", "tool_name": "write_file", "tool_id": "w", "parameters": {"file_path": "a"}},
                 {"type": "tool_result", "tool_id": "w", "status": "error",
                  "error": {"type": "tool_not_registered", "message": 'Tool "write_file" not found'}},
                 {"type": "tool_use", "tool_name": "replace", "tool_id": "r", "parameters": {"file_path": "a"}},
                 {"type": "tool_result", "tool_id": "r", "status": "error",
                  "error": {"type": "edit_no_occurrence_found", "message": "0 occurrences found for old_string"}})
    said = [(e["kind"], e["text"]) for e in normalize("gemini", data, tmp_path) if e["kind"] != "tool_call"]
    assert said == [("refusal", 'write_file was refused: Tool "write_file" not found'),
                    ("tool_result", "failed: 0 occurrences found for old_string")]


def test_what_a_person_reads_first_is_the_conversation_not_the_stream_s_pieces(tmp_path):
    """Issue 22: gemini's streamed pieces of one message are one entry on the page (spaces kept), codex's
    here-document writes read "Writes path (N lines)", its start-up notice is no error, claude's model name
    has no context-window suffix."""
    gemini = lines(
        {"type": "message", "role": "assistant", "content": "The answer is in app/co", "delta": True},
        {"type": "message", "role": "assistant", "content": "re.py", "delta": True},
        {"type": "message", "role": "assistant", "content": " and it is 42.", "delta": True},
        {"type": "tool_use", "tool_name": "read_file", "tool_id": "t1", "parameters": {"file_path": "app/core.py"}},
        {"type": "message", "role": "assistant", "content": "Done", "delta": True})
    said = [(e["kind"], e["text"]) for e in transcript.joined(normalize("gemini", gemini, tmp_path))]
    assert said == [("text", "The answer is in app/core.py and it is 42."), ("tool_call", "Reads app/core.py"),
                    ("text", "Done")]
    write = "bash -lc \"cat > app/core.py <<'EOF'\ndef answer():\n    return 42\nEOF\""
    codex = lines(
        {"type": "item.completed", "item": {"id": "e0", "type": "error",
                                            "message": "Model metadata for `gpt-fake` not found. Defaulting to "
                                                       "fallback metadata; this can degrade performance"}},
        {"type": "item.started", "item": {"id": "i1", "type": "command_execution", "command": write}},
        {"type": "item.completed", "item": {"id": "e1", "type": "error", "message": "sandbox crashed"}})
    said = [(e["kind"], e["text"]) for e in normalize("codex", codex, tmp_path)]
    assert said == [("start", "Codex's start-up notice (not an error)"), ("tool_call", "Writes app/core.py (2 lines)"),
                    ("error", "sandbox crashed")]
    claude = lines({"type": "system", "subtype": "init", "model": "claude-opus-4-8[1m]", "tools": [],
                    "claude_code_version": "2.1.197"})
    [start] = normalize("claude", claude, tmp_path)
    assert "model claude-opus-4-8," in start["text"] and "[1m]" not in start["text"]
