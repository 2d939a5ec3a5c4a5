"""pi's output (``--mode json``, checked on 0.73.1), read from the same events two ways: into the
facts the attempt's result is built from (``parse_stream``, ``usage_of``: engine/agents/pi/adapter.py)
and into the conversation's entries (``entries``, which engine/text/transcript.py calls for each line);
both word a tool call's outcome by ``outcome_of``."""
from __future__ import annotations

import re
from collections import deque

from ...text import tool_outcomes
from ...text.transcript import Normalizer, cut, first_lines
from ..base import empty_usage
from ..lines import JsonEvents, stderr_lines
from .policy import WRITE_TOOLS

#: Its event lines that say nothing new (``--mode json`` 0.73.1: a delta with the whole partial
#: message; its ``message_end`` follows): engine/text/transcript.py skips them unread.
SKIPPED = ('{"type":"message_update"', '{"type":"tool_execution_update"')
#: Its tool names (0.73.1) -> the names ``Normalizer.tool_sentence`` words (their inputs have the same keys).
_TOOLS = {"bash": "Bash", "read": "Read", "write": "Write", "edit": "Edit", "grep": "Grep", "find": "Glob",
          "ls": "LS"}
#: 0.73.1's bash result ends with "Command exited with code N" when the command failed.
EXIT = re.compile(r"Command exited with code (-?\d+)\s*$")


def outcome_of(tool: str, content: str, error: bool, command: str = "") -> tuple[str | None, int | None]:
    """``(outcome, exit status)`` of a ``tool_execution_end`` (engine/text/tool_outcomes.py): ``content`` its
    result's text, ``error`` its ``isError``. "Tool X not found" is a tool not in the role's allowlist
    (refused)."""
    code = None
    if tool == "bash":
        found = EXIT.search(content) if error else None
        code = (int(found.group(1)) if found else None) if error else 0
    refused = error and (tool_outcomes.unavailable_tool(tool, content)
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
            unavailable = error and tool_outcomes.unavailable_tool(name, content)
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


#: Texts of an error message (the last assistant message's ``errorMessage``, or stderr) that mean
#: "no usable credentials" (0.73.1: "401 {...authentication_error...}", "No API key found for anthropic.").
AUTH_TEXTS = ("No API key found", "authentication_error", "permission_error", "invalid x-api-key",
              "Invalid API key", "Incorrect API key", "invalid_api_key", "Unauthorized", "OAuth token")


#: At most this many refused or failed tool calls are recorded per attempt; each message cut to OUTPUT_CHARS.
MAX_REFUSALS = 200


OUTPUT_CHARS = 500


#: Texts of a tool error that say the sandbox refused it.
DENIAL_TEXTS = ("Read-only file system", "read-only file system", "EROFS", "Permission denied", "EACCES",
                "Operation not permitted", "EPERM")


def _text_of(content) -> str:
    """The text blocks of a message's or tool result's ``content``, joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(str(block.get("text") or "") for block in content
                     if isinstance(block, dict) and block.get("type") == "text")


def parse_stream(raw_path: str, stderr_path: str | None = None) -> dict:
    """Read a ``pi --mode json`` capture line by line (bounded memory, engine/agents/lines.py);
    ``stderr_path``: the attempt's stderr capture when it is kept apart (its lines join ``stderr_tail``).

    Returns ``{"session_id": str, "ended": bool, "turns": int, "assistant_messages": int,
    "usage": dict | None, "last_text": str, "stop_reason": str, "error": str, "auth_error": bool,
    "retries": int, "tool_calls": int, "refusals": list, "stderr_tail": list[str],
    "truncated_lines": int, "structured": bool, "plain_text": str}``:

    * ``session_id``: the header's ``id``; ``ended``: an ``agent_end`` event was read; ``turns``:
      ``turn_end`` events;
    * ``usage``: the ``usage`` of every assistant ``message_end`` summed in pi's names (``input``,
      ``output``, ``cacheRead``, ``cacheWrite``, ``cost`` = ``cost.total`` in USD); a failed
      request's all-zero placeholder is not counted; None when no message reported tokens;
    * ``stop_reason``/``error``: of the last assistant message (``error`` its ``errorMessage`` when
      the stop reason is ``error`` or ``aborted``, else ''); an error an automatic retry recovered
      from is not kept;
    * ``auth_error``: the last error or a stderr line names AUTH_TEXTS, or the error is a 401/403;
    * ``refusals``: the tool calls pi refused or that failed (``tool_execution_end`` with
      ``isError``), at most MAX_REFUSALS, in order: ``{"tool": name, "message": the result text
      (OUTPUT_CHARS), "path"?: the file named, "command"?: a bash command, "unavailable": the
      tool is not in the allowlist ("Tool X not found"), "sandbox_denied": DENIAL_TEXTS in it,
      "outcome": ``outcome_of`` (bash's exit status 127 ``command_not_found``, a
      tool not in the allowlist or a sandbox denial ``refused``, else ``failed``), "exit_code"?: bash's
      "Command exited with code N", "recovered"?: True when a later write or edit of that file succeeded}``;
    * ``stderr_tail``: the last five lines of ``stderr_path`` and of the raw log that are not JSON
      (pi's stderr);
    * ``structured``: whether any line was a JSON event; ``plain_text``: the raw log's lines that
      were not (engine/agents/lines.py ``PlainText``, bounded), the final message when pi printed
      text instead of its events;
    * ``truncated_lines``: lines longer than engine/agents/lines.py MAX_LINE_BYTES, not parsed (an
      assistant message longer than that has its usage left out of the sum).
    """
    found = {"session_id": "", "ended": False, "turns": 0, "assistant_messages": 0, "usage": None, "last_text": "",
             "stop_reason": "", "error": "", "auth_error": False, "retries": 0, "tool_calls": 0, "refusals": [],
             "stderr_tail": [], "truncated_lines": 0, "structured": False, "plain_text": ""}
    calls: dict[str, dict] = {}
    stderr_tail: deque[str] = deque(maxlen=5)
    for text in stderr_lines(stderr_path):
        stderr_tail.append(text[:OUTPUT_CHARS])
    stream = JsonEvents(raw_path, skip=tuple(prefix.encode() for prefix in SKIPPED),
                        on_text=lambda line: stderr_tail.append(line.decode("utf-8", errors="replace")[:OUTPUT_CHARS]))
    for event in stream:
        kind = event.get("type")
        if kind == "session":
            found["session_id"] = str(event.get("id") or found["session_id"])
        elif kind == "agent_end":
            found["ended"] = True
        elif kind == "turn_end":
            found["turns"] += 1
        elif kind == "auto_retry_start":
            found["retries"] += 1
        elif kind == "message_end":
            message = event.get("message")
            if isinstance(message, dict) and message.get("role") == "assistant":
                _assistant(found, message)
        elif kind == "tool_execution_start":
            found["tool_calls"] += 1
            args = event.get("args") if isinstance(event.get("args"), dict) else {}
            if len(calls) < 10_000:
                calls[str(event.get("toolCallId"))] = args
        elif kind == "tool_execution_end":
            _tool_end(found, event, calls)
    found["stderr_tail"] = list(stderr_tail)
    found["truncated_lines"], found["structured"] = stream.truncated, stream.structured
    found["plain_text"] = stream.plain.text
    texts = [found["error"], *found["stderr_tail"]]
    if any(text in said for said in texts for text in AUTH_TEXTS) or found["error"].startswith(("401", "403")):
        found["auth_error"] = True
    return found


def _assistant(found: dict, message: dict) -> None:
    """Fold one assistant ``message_end`` into ``found`` (usage, last text, stop reason, error)."""
    found["assistant_messages"] += 1
    usage = message.get("usage")
    keys = ("input", "output", "cacheRead", "cacheWrite")
    counts = [usage.get(key) for key in keys] if isinstance(usage, dict) else []
    if isinstance(usage, dict) and any(counts):  # all 0: pi's placeholder of a failed request, nothing reported
        total = found["usage"] if found["usage"] is not None else {}
        for key in ("input", "output", "cacheRead", "cacheWrite"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
        cost = (usage.get("cost") or {}).get("total") if isinstance(usage.get("cost"), dict) else None
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            total["cost"] = total.get("cost", 0.0) + float(cost)
        found["usage"] = total
    text = _text_of(message.get("content")).strip()
    if text:
        found["last_text"] = text
    found["stop_reason"] = str(message.get("stopReason") or "")
    if found["stop_reason"] in ("error", "aborted"):
        found["error"] = str(message.get("errorMessage") or f"request {found['stop_reason']}")[:2000]
    else:
        found["error"] = ""


def _tool_end(found: dict, event: dict, calls: dict) -> None:
    """Fold one ``tool_execution_end`` into ``found["refusals"]``."""
    name = str(event.get("toolName") or "?")
    args = calls.get(str(event.get("toolCallId")), {})
    path = args.get("path") if isinstance(args.get("path"), str) else None
    if not event.get("isError"):
        if name in WRITE_TOOLS and path:  # a later success on the same file: recovered from
            for refusal in found["refusals"]:
                if refusal.get("path") == path[:1000]:
                    refusal["recovered"] = True
        return
    if len(found["refusals"]) >= MAX_REFUSALS:
        return
    result = event.get("result")
    text = _text_of(result.get("content")) if isinstance(result, dict) else str(result or "")
    command = args.get("command") if isinstance(args.get("command"), str) else ""
    outcome, code = outcome_of(name, text, True, command)
    refusal = {"tool": name, "message": text.strip()[-OUTPUT_CHARS:],
               "unavailable": tool_outcomes.unavailable_tool(name, text),
               "sandbox_denied": any(denial in text for denial in DENIAL_TEXTS), "outcome": outcome}
    if path:
        refusal["path"] = path[:1000]
    if command:
        refusal["command"] = command[:OUTPUT_CHARS]
    if code is not None:
        refusal["exit_code"] = code
    found["refusals"].append(refusal)


def usage_of(reported: dict | None) -> dict:
    """Usage in our keys from pi's summed assistant usage; every field None when not reported.

    input_tokens <- input (pi: without the cached tokens), output_tokens <- output, cached_tokens
    <- cacheRead, cache_creation_tokens <- cacheWrite, cost_usd <- cost (pi's price table; 0.0 for
    a model without prices, such as the scripted one), reasoning_tokens stays None (pi counts
    reasoning in ``output``)."""
    usage = empty_usage()
    if not reported:
        return usage
    usage["input_tokens"] = reported.get("input")
    usage["output_tokens"] = reported.get("output")
    usage["cached_tokens"] = reported.get("cacheRead")
    usage["cache_creation_tokens"] = reported.get("cacheWrite")
    cost = reported.get("cost")
    usage["cost_usd"] = round(cost, 8) if isinstance(cost, float) else cost  # a sum of floats: no 0.015000000000000001
    return usage
