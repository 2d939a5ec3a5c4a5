"""pi's output as the conversation's entries (engine/transcript.py reads each line through ``entries``),
and the outcome of its tool calls (``outcome_of``, which engine/agents/pi/adapter.py records too)."""
from __future__ import annotations

import re

from ... import tool_outcomes
from ...transcript import Normalizer, cut, first_lines

#: Its event lines that say nothing new (``--mode json`` 0.73.1: a delta with the whole partial
#: message; its ``message_end`` follows): engine/transcript.py skips them unread.
SKIPPED = ('{"type":"message_update"', '{"type":"tool_execution_update"')
#: Its tool names (0.73.1) -> the names ``Normalizer.tool_sentence`` words (their inputs have the same keys).
_TOOLS = {"bash": "Bash", "read": "Read", "write": "Write", "edit": "Edit", "grep": "Grep", "find": "Glob",
          "ls": "LS"}
#: 0.73.1's bash result ends with "Command exited with code N" when the command failed.
EXIT = re.compile(r"Command exited with code (-?\d+)\s*$")


def outcome_of(tool: str, content: str, error: bool, command: str = "") -> tuple[str | None, int | None]:
    """``(outcome, exit status)`` of a ``tool_execution_end`` (engine/tool_outcomes.py): ``content`` its
    result's text, ``error`` its ``isError``. "Tool X not found" is a tool not in the role's allowlist
    (refused)."""
    code = None
    if tool == "bash":
        found = EXIT.search(content) if error else None
        code = (int(found.group(1)) if found else None) if error else 0
    refused = error and (content.strip() == f"Tool {tool} not found"
                         or bool(tool_outcomes.CLI_REFUSAL.search(content[:500])))
    return tool_outcomes.classify(code, content, command, refused=refused, error=error), code


def entries(n: Normalizer, event: dict) -> list[dict]:
    """pi 0.73.1 ``--mode json`` (engine/agents/pi/adapter.py): the session header, each complete
    message (``message_end``: the assistant's text, thinking and tool calls with its usage),
    each tool result (``tool_execution_end``), retries, and the end (``agent_end``)."""
    kind = str(event.get("type") or "")
    if kind == "session":
        return [{"kind": "start", "text": f"Pi started (session {event.get('id') or '?'})"}]
    if kind == "message_end":
        message = event.get("message") if isinstance(event.get("message"), dict) else {}
        if message.get("role") != "assistant":
            return []
        out = []
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and str(block.get("text") or "").strip():
                out.append({"kind": "text", "text": cut(str(block["text"]))})
            elif block.get("type") == "thinking" and str(block.get("thinking") or "").strip():
                out.append({"kind": "thinking", "text": cut(str(block["thinking"]), 600)})
            elif block.get("type") == "toolCall":
                name, call = str(block.get("name") or ""), str(block.get("id") or "")
                args = block.get("arguments") if isinstance(block.get("arguments"), dict) else {}
                n.called(call, name, args)
                text = n.tool_sentence(_TOOLS.get(name, name), args)
                if name == "edit" and isinstance(args.get("edits"), list):
                    text += f" ({len(args['edits'])} replacement{'s' if len(args['edits']) != 1 else ''})"
                out.append({"kind": "tool_call", "tool": name, "call": call, "text": text})
        usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
        if any(isinstance(usage.get(key), int) and usage[key] for key in ("input", "output", "cacheRead")):
            n.add_usage({"input_tokens": usage.get("input"), "output_tokens": usage.get("output"),
                             "cache_read_input_tokens": usage.get("cacheRead")})
            out.append(n.usage_entry())
        n.kept["failed"] = message.get("stopReason") in ("error", "aborted")
        if n.kept["failed"]:
            out.append({"kind": "error", "ok": False, "text": "The model request failed: "
                        + cut(str(message.get("errorMessage") or message.get("stopReason")), 400)})
        return out
    if kind == "tool_execution_end":
        call, name = str(event.get("toolCallId") or ""), str(event.get("toolName") or "")
        result = event.get("result") if isinstance(event.get("result"), dict) else {}
        content = result.get("content")
        if isinstance(content, list):
            content = "\n".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
        content = str(content or "")
        error = bool(event.get("isError"))
        entry = {"kind": "tool_result", "tool": name, "call": call, "ok": not error, "detail": first_lines(content)}
        outcome, entry["exit"] = outcome_of(name, content, error, n.commands.get(call, ""))
        if outcome or error:
            unavailable = error and content.strip() == f"Tool {name} not found"
            n.unsuccessful(entry, outcome or "failed", content, f"{name or 'The tool call'} was refused: the "
                               f"tool is not available to this role" if unavailable else "")
        else:
            rows = [row for row in content.splitlines() if row.strip()]
            many = f"{len(rows)} line{'s' if len(rows) != 1 else ''}"
            if name == "bash":
                entry["text"] = f"exit status 0 · {many} of output" if rows else "exit status 0"
            elif name in ("write", "edit") or not rows:
                entry["text"] = "done"
            elif name == "read":
                entry["text"] = f"{many} read"
            else:
                entry["text"] = f"{many} of output"
        if entry.get("exit") is None:
            entry.pop("exit", None)
        return [entry]
    if kind == "auto_retry_start":
        return [{"kind": "error", "ok": False, "text": f"Retrying the model request ({event.get('attempt')} of "
                                                       f"{event.get('maxAttempts')}): "
                                                       f"{cut(str(event.get('errorMessage') or ''), 300)}"}]
    if kind == "agent_end":
        u = n.usage
        if n.kept.get("failed"):
            return [{"kind": "error", "ok": False, "text": "The agent ended with an error (its last model request "
                                                           "failed)"}]
        return [{"kind": "result", "ok": True, "text": f"Finished: {u['input_tokens']:,} tokens in, "
                                                       f"{u['output_tokens']:,} out"}]
    return []
