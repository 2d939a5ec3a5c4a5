"""Claude Code's output (``--output-format stream-json``, checked on 2.1.197), read from the same
events two ways: into the facts the attempt's result is built from (``parse_stream``, ``usage_of``:
engine/agents/claude/adapter.py) and into the conversation's entries (``entries``, which
engine/text/transcript.py calls for each line): ``system``/``init`` (its version, model and tools),
``assistant`` and ``user`` messages (Anthropic Messages-shaped: engine/text/transcript.py
``Normalizer.messages``) and the final ``result``."""
from __future__ import annotations

import json
import re

from ...text import tool_outcomes
from ...text.transcript import Normalizer, cut, first_lines
from ..base import empty_usage
from ..lines import JsonEvents, stderr_lines
from .policy import WRITE_TOOLS


#: What Claude Code appends to a model's name for its context window (``claude-opus-4-8[1m]``): not the name.
MODEL_SUFFIX = re.compile(r"\[[^\]]*\]$")


def entries(n: Normalizer, event: dict) -> list[dict]:
    """The entries of one event of the stream (module docstring)."""
    kind = event.get("type")
    if kind == "system" and event.get("subtype") == "init":
        tools = event.get("tools") if isinstance(event.get("tools"), list) else []
        version = event.get("claude_code_version") or "?"
        model = MODEL_SUFFIX.sub("", str(event.get("model") or "?"))
        return [{"kind": "start", "text": f"Claude Code {version} started (model {model}, "
                                          f"{len(tools)} tool{'s' if len(tools) != 1 else ''}: "
                                          f"{cut(', '.join(str(t) for t in tools), 300)})"}]
    if kind in ("assistant", "user"):
        return n.messages(event)
    if kind == "result":
        own_usage = dict(n.usage)
        reported = event.get("usage") if isinstance(event.get("usage"), dict) else {}
        tokens_in = reported.get("input_tokens", own_usage["input_tokens"])
        tokens_out = reported.get("output_tokens", own_usage["output_tokens"])
        cost = event.get("total_cost_usd")
        turns = event.get("num_turns")
        said = [f"{turns} turn{'s' if turns != 1 else ''}" if isinstance(turns, int) else "",
                f"{tokens_in:,} tokens in, {tokens_out:,} out" if isinstance(tokens_in, int)
                and isinstance(tokens_out, int) else "",
                f"cost ${cost:.4f}" if isinstance(cost, (int, float)) else ""]
        summary = "; ".join(part for part in said if part)
        if event.get("is_error"):
            return [{"kind": "error", "ok": False,
                     "text": f"The agent ended with an error{': ' + summary if summary else ''}",
                     "detail": first_lines(str(event.get("result") or "; ".join(
                         str(e) for e in event.get("errors") or [])))}]
        return [{"kind": "result", "ok": True, "text": f"Finished{': ' + summary if summary else ''}",
                 "detail": first_lines(str(event.get("result") or ""), 10)}]
    return []  # the CLI's other system events (task notifications, hooks) say nothing a person needs


#: Messages of the CLI that mean it has no usable login (checked on 2.1.197).
AUTH_TEXTS = ("Not logged in", "Please run /login", "Failed to authenticate", "authentication_failed",
              "Invalid API key", "invalid x-api-key")


def parse_stream(raw_path: str, stderr_path: str | None = None) -> dict:
    """Read a stream-json capture line by line (bounded memory).

    Returns ``{"result": dict | None, "last_text": str, "session_id": str, "version": str,
    "auth_error": bool, "refusals": [{"tool", "message", "outcome"}]}``: the last ``result`` object (None
    when missing or cut: docs/field-cases.md C11), the last assistant text (the fallback final
    message, docs/field-cases.md C29), the session id of the init event, and the tool calls the
    CLI refused or that failed (tool results with ``is_error``: a removed tool, a denied
    permission; at most 200; ``"outcome"``: engine/text/tool_outcomes.py ``of_message_result``, a missing program
    ``command_not_found``, what the permission rules refused ``refused``, else ``failed``; ``"exit_code"``
    when the error says "Exit code N"; with ``"path"`` when the call named a file, and ``"recovered": True``
    when a later file-writing call on that file succeeded), and ``"truncated_lines": int``: lines longer than
    engine/agents/lines.py MAX_LINE_BYTES, read in bounded chunks and not parsed (whole in the raw log);
    ``"structured": bool``: whether any line was a JSON event, and ``"plain_text": str``: the
    lines that were not (engine/agents/lines.py ``PlainText``, bounded), which become the final
    message when the CLI printed text instead of its stream. ``stderr_path``: the attempt's stderr
    capture, read for the not-logged-in texts only.
    """
    found = {"result": None, "last_text": "", "session_id": "", "version": "", "auth_error": False,
             "refusals": [], "truncated_lines": 0, "structured": False, "plain_text": ""}
    for text in stderr_lines(stderr_path):
        if any(auth in text for auth in AUTH_TEXTS):
            found["auth_error"] = True
    tools: dict[str, str] = {}
    paths: dict[str, str] = {}  # tool_use id -> the file it writes or reads
    commands: dict[str, str] = {}  # tool_use id -> a Bash command line

    def auth_text(line: bytes) -> None:
        if any(text.encode() in line for text in AUTH_TEXTS):
            found["auth_error"] = True

    stream = JsonEvents(raw_path, on_line=auth_text)
    for event in stream:
        kind = event.get("type")
        if kind == "result":
            found["result"] = event
        elif kind == "system" and event.get("subtype") == "init":
            found["session_id"] = event.get("session_id") or found["session_id"]
            found["version"] = event.get("claude_code_version") or found["version"]
        elif kind == "assistant":
            for block in (event.get("message") or {}).get("content") or []:
                if isinstance(block, dict) and block.get("type") == "text" and block.get("text"):
                    found["last_text"] = block["text"]
                elif isinstance(block, dict) and block.get("type") == "tool_use":
                    tools[str(block.get("id"))] = str(block.get("name"))
                    given = block.get("input") if isinstance(block.get("input"), dict) else {}
                    target = given.get("file_path") or given.get("notebook_path")
                    if isinstance(target, str):
                        paths[str(block.get("id"))] = target[:1000]
                    command = given.get("command")
                    if block.get("name") == "Bash" and isinstance(command, str) and len(commands) < 10_000:
                        commands[str(block.get("id"))] = command[:2000]
        elif kind == "user":
            for block in (event.get("message") or {}).get("content") or []:
                if not (isinstance(block, dict) and block.get("type") == "tool_result"):
                    continue
                call = str(block.get("tool_use_id"))
                if not block.get("is_error"):
                    # a later success on the same file: the refusals of it before were recovered from
                    if call in paths and tools.get(call) in WRITE_TOOLS:
                        for refusal in found["refusals"]:
                            if refusal.get("path") == paths[call]:
                                refusal["recovered"] = True
                    continue
                content = block.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                if len(found["refusals"]) < 200:
                    said = text if isinstance(content, str) else "\n".join(  # as the conversation reads it
                        str(part.get("text") or "") for part in (content if isinstance(content, list) else [])
                        if isinstance(part, dict))
                    outcome, code = tool_outcomes.of_message_result(tools.get(call, "?"), said, True,
                                                                    commands.get(call, ""))
                    refusal = {"tool": tools.get(call, "?"), "message": text[:500], "outcome": outcome}
                    if code is not None:
                        refusal["exit_code"] = code
                    if call in paths:
                        refusal["path"] = paths[call]
                    found["refusals"].append(refusal)
    found["truncated_lines"], found["structured"] = stream.truncated, stream.structured
    found["plain_text"] = stream.plain.text
    return found


def usage_of(result: dict | None) -> dict:
    """Usage of a result object in our keys; every field None when not reported (never 0 made up)."""
    usage = empty_usage()
    if not result:
        return usage
    reported = result.get("usage")
    if isinstance(reported, dict):
        usage["input_tokens"] = reported.get("input_tokens")
        usage["output_tokens"] = reported.get("output_tokens")
        usage["cached_tokens"] = reported.get("cache_read_input_tokens")
        usage["cache_creation_tokens"] = reported.get("cache_creation_input_tokens")
    if isinstance(result.get("total_cost_usd"), (int, float)) and isinstance(reported, dict):
        usage["cost_usd"] = result["total_cost_usd"]
    return usage
