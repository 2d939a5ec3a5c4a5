"""The Codex CLI's output (``codex exec --json``, checked on 0.171.0), read from the same events two
ways: into the facts the attempt's result is built from (``parse_events``, ``usage_of``, and the
session record's refusals, ``refusals_of``: engine/agents/codex/adapter.py) and into the
conversation's entries (``entries``, which engine/text/transcript.py calls for each line):
``thread.started``, ``item.*`` events (``agent_message``, ``reasoning``, ``command_execution``,
``file_change``, ``mcp_tool_call``, ``web_search``, ``todo_list``), ``turn.completed`` with usage,
``turn.failed`` and ``error``."""
from __future__ import annotations

import json
import os
import re
from collections import deque
from pathlib import Path

from ...text import tool_outcomes
from ...text.transcript import Normalizer, cut, first_lines, shell_sentence
from ..base import empty_usage
from ..lines import BoundedLines, JsonEvents, stderr_lines

def entries(n: Normalizer, event: dict) -> list[dict]:
    """The entries of one event of the stream (module docstring)."""
    kind = str(event.get("type") or "")
    if kind == "thread.started":
        return [{"kind": "start", "text": f"Codex started (thread {event.get('thread_id') or '?'})"}]
    if kind == "turn.completed":
        if n.add_usage(event.get("usage")) is None:
            return []
        return [n.usage_entry()]
    if kind == "turn.failed":
        error = event.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return [{"kind": "error", "ok": False, "text": f"The turn failed: {cut(str(message or ''), 400)}"}]
    if kind == "error":
        message = str(event.get("message") or "")
        return [{"kind": "error", "ok": False, "text": cut(message, 400)}]
    if kind not in ("item.started", "item.completed", "item.updated"):
        return []
    item = event.get("item")
    if not isinstance(item, dict):
        return []
    what = item.get("type")
    call = str(item.get("id") or "")
    done = kind == "item.completed"
    if what == "agent_message" and done and str(item.get("text") or "").strip():
        return [{"kind": "text", "text": cut(str(item["text"]))}]
    if what == "reasoning" and done and str(item.get("text") or "").strip():
        return [{"kind": "thinking", "text": cut(str(item["text"]), 600)}]
    if what == "command_execution":
        out = []
        if kind == "item.started" or (done and call not in n.tools):
            n.called(call, "shell", item)
            out.append({"kind": "tool_call", "tool": "shell", "call": call,
                        "text": shell_sentence(n, item.get("command") or "")})
        if done:
            status = str(item.get("status") or "")
            code = item.get("exit_code")
            entry = {"kind": "tool_result", "tool": "shell", "call": call,
                     "detail": first_lines(str(item.get("aggregated_output") or ""))}
            if isinstance(code, int) and not isinstance(code, bool):
                entry["exit"] = code
            output = str(item.get("aggregated_output") or "")
            outcome = tool_outcomes.classify(entry.get("exit"), output, str(item.get("command") or ""),
                                             refused=status == "declined",
                                             error=status in ("failed", "declined") or entry.get("exit", 0) != 0)
            if outcome:
                n.unsuccessful(entry, outcome, output, "The command was refused (declined by the sandbox "
                                                           "policy)" if status == "declined" else "")
            else:
                entry["ok"] = code == 0 and status != "failed"
                entry["text"] = (f"exit status {code}" if isinstance(code, int) else status or "ended")
            out.append(entry)
        return out
    if what == "file_change" and done:
        changes = item.get("changes") if isinstance(item.get("changes"), list) else []
        names = ", ".join(f"{n.path(c.get('path'))} ({c.get('kind', 'changed')})" for c in changes
                          if isinstance(c, dict))
        status = str(item.get("status") or "")
        if status == "failed":  # not applied, or declined: codex's exec schema says "failed" for both
            return [{"kind": "tool_result", "ok": False, "tool": "apply_patch", "call": call,
                     "text": f"A change of files failed (not applied, or declined): {cut(names, 400)}"}]
        return [{"kind": "tool_call", "tool": "apply_patch", "call": call, "ok": True,
                 "text": f"Changed {cut(names, 400) or 'files'}"}]
    if what == "mcp_tool_call" and kind == "item.started":
        return [{"kind": "tool_call", "tool": "mcp", "call": call,
                 "text": f"Calls {item.get('server') or '?'}.{item.get('tool') or '?'}"}]
    if what == "web_search" and kind == "item.started":
        return [{"kind": "tool_call", "tool": "web_search", "call": call,
                 "text": f"Searches the web for “{cut(str(item.get('query') or ''), 160)}”"}]
    if what == "todo_list" and done:
        items = item.get("items") if isinstance(item.get("items"), list) else []
        return [{"kind": "tool_call", "tool": "todo_list", "call": call,
                 "text": f"Updates its to-do list ({len(items)} item{'s' if len(items) != 1 else ''})"}]
    if what == "error" and done:
        message = str(item.get("message") or "")
        if START_NOTICE.search(message):  # start-up noise: folded under a quiet start entry
            return [{"kind": "start", "text": "Codex's start-up notice (not an error)", "detail": cut(message, 400)}]
        return [{"kind": "error", "ok": False, "text": cut(message, 400)}]
    return []


#: An ``error`` item codex prints at start that is no failure (seen with 0.171.0: an unknown model's
#: "Model metadata for `x` not found. Defaulting to fallback metadata").
START_NOTICE = re.compile(r"^Model metadata for .* not found", re.IGNORECASE)


#: Failure texts (in ``turn.failed``/``error`` messages and stderr) that mean "no usable credentials".
AUTH_PATTERNS = re.compile(
    r"status 40[13]\b|\b401 Unauthorized|\b403 Forbidden|Missing environment variable|invalid_api_key"
    r"|Incorrect API key|invalid api key|Not logged in|Please (?:run `?codex )?login", re.IGNORECASE)


#: Texts in a command's output that say the sandbox refused it (0.171.0, bwrap-based sandbox).
DENIAL_PATTERNS = ("Read-only file system", "Operation not permitted", "Permission denied")


#: At most this many failed or refused commands are recorded per attempt; each output is cut to OUTPUT_CHARS.
MAX_REFUSALS = 200


OUTPUT_CHARS = 500


#: The status line codex puts in an exec_command output (0.171.0): "Process exited with code N".
EXIT_LINE = re.compile(r"^Process exited with code (-?\d+)$", re.MULTILINE)


def parse_events(raw_path: str, stderr_path: str | None = None) -> dict:
    """Read a ``codex exec --json`` capture line by line (bounded memory).

    Returns ``{"session_id": str, "turns_completed": int, "usage": dict | None,
    "last_text": str, "failure": str, "errors": list[str], "auth_error": bool,
    "reconnects": int, "last_reconnect": str, "commands": int, "stderr_tail": list[str]}``:

    * ``usage``: the ``turn.completed`` usages summed key by key in codex's names
      (tokens); None when no turn reported usage; a key absent from every turn is absent;
    * ``last_text``: the text of the last ``item.completed`` of type ``agent_message``;
    * ``failure``: the message of the last ``turn.failed`` ('' when none);
    * ``errors``: the last five top-level ``error`` messages that are not reconnect notices;
    * ``auth_error``: a failure/error message or a stderr line matches AUTH_PATTERNS;
    * ``reconnects``: how many "Reconnecting..." error events there were (no network);
    * ``stderr_tail``: the last five lines of ``stderr_path`` (the attempt's stderr capture) and
      the non-JSON lines of the raw log (stderr too when it is not kept apart), without the
      PATH-aliases warning;
    * ``structured``: whether any line of the raw log was a JSON event; ``plain_text``: the raw
      log's other lines (engine/agents/lines.py ``PlainText``, bounded), the final message when
      codex printed text instead of its JSONL;
    * ``rejected``: what the stream itself reports as refused (``rejected_item``): a
      ``command_execution`` with status ``declined`` and a ``file_change`` with status ``failed``
      (codex's exec schema folds a declined patch into ``failed``); at most MAX_REFUSALS;
    * ``truncated_lines``: lines longer than engine/agents/lines.py MAX_LINE_BYTES, not parsed
      (whole in the raw log);
    * ``failed_outputs``: the output of each completed ``command_execution`` with a non-zero exit
      status (stripped, its last OUTPUT_CHARS): the conversation shows those already, so the
      adapter adds only the session record's refusals the stream left out.
    """
    found = {"session_id": "", "turns_completed": 0, "usage": None, "last_text": "", "failure": "", "errors": [],
             "auth_error": False, "reconnects": 0, "last_reconnect": "", "commands": 0, "stderr_tail": [],
             "rejected": [], "truncated_lines": 0, "structured": False, "plain_text": "", "failed_outputs": []}
    errors: deque[str] = deque(maxlen=5)
    stderr_tail: deque[str] = deque(maxlen=5)

    def other_line(said: str) -> None:
        if "could not create PATH aliases" not in said:
            stderr_tail.append(said[:OUTPUT_CHARS])
            if AUTH_PATTERNS.search(said):
                found["auth_error"] = True

    for text in stderr_lines(stderr_path):
        other_line(text)
    stream = JsonEvents(raw_path, on_text=lambda line: other_line(line.decode("utf-8", errors="replace")))
    for event in stream:
        kind = event.get("type")
        if kind == "thread.started":
            found["session_id"] = str(event.get("thread_id") or found["session_id"])
        elif kind == "turn.completed":
            found["turns_completed"] += 1
            usage = event.get("usage")
            if isinstance(usage, dict):
                total = found["usage"] if found["usage"] is not None else {}
                for key, value in usage.items():
                    if isinstance(value, int) and not isinstance(value, bool):
                        total[key] = total.get(key, 0) + value
                found["usage"] = total
        elif kind == "turn.failed":
            error = event.get("error")
            message = str((error or {}).get("message") if isinstance(error, dict) else error or "")
            found["failure"] = message or "turn failed (no message)"
            if AUTH_PATTERNS.search(message):
                found["auth_error"] = True
        elif kind == "error":
            message = str(event.get("message") or "")
            if message.startswith("Reconnecting"):
                found["reconnects"] += 1
                found["last_reconnect"] = message
            else:
                errors.append(message)
                if AUTH_PATTERNS.search(message):
                    found["auth_error"] = True
        elif kind == "item.completed":
            item = event.get("item")
            if not isinstance(item, dict):
                continue
            if item.get("type") == "agent_message" and item.get("text"):
                found["last_text"] = str(item["text"])
            elif item.get("type") == "command_execution":
                found["commands"] += 1
                if item.get("exit_code") not in (0, None) and len(found["failed_outputs"]) < 10_000:
                    found["failed_outputs"].append(str(item.get("aggregated_output") or "").strip()[-OUTPUT_CHARS:])
            rejected = rejected_item(item)
            if rejected and len(found["rejected"]) < MAX_REFUSALS:
                found["rejected"].append(rejected)
    found["errors"] = list(errors)
    found["stderr_tail"] = list(stderr_tail)
    found["truncated_lines"], found["structured"] = stream.truncated, stream.structured
    found["plain_text"] = stream.plain.text
    return found


def rejected_item(item: dict) -> dict | None:
    """A refusal record for a completed JSONL item that codex reports as refused, else None.

    * ``command_execution`` with ``status: "declined"`` (exec schema ``CommandExecutionStatus``):
      ``{"tool": "exec_command", "command", "exit_code", "message": its output,
      "sandbox_denied": True, "outcome": "refused"}``;
    * ``file_change`` with ``status: "failed"`` (``PatchApplyStatus``; a declined patch is
      reported as failed too): ``{"tool": "apply_patch", "command": "update a.py, add b.py",
      "exit_code": None, "message": ..., "sandbox_denied": False, "outcome": "failed"}``.

    Not seen from codex 0.171.0 offline: with ``approval_policy=never`` (codex exec) nothing is
    declined, a command its sandbox refused is left out of the stream altogether (it is in the
    session record: ``refusals_of``), and without model metadata no apply_patch tool is offered.
    """
    kind, status = item.get("type"), item.get("status")
    if kind == "command_execution" and status == "declined":
        code = item.get("exit_code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        command, output = str(item.get("command") or ""), str(item.get("aggregated_output") or "declined")
        return {"tool": "exec_command", "command": command[:OUTPUT_CHARS], "exit_code": code,
                "message": output[-OUTPUT_CHARS:], "sandbox_denied": True,
                "outcome": tool_outcomes.classify(code, output, command, refused=True)}
    if kind == "file_change" and status == "failed":
        changes = item.get("changes") if isinstance(item.get("changes"), list) else []
        files = ", ".join(f"{change.get('kind', '?')} {change.get('path', '?')}" for change in changes
                          if isinstance(change, dict))
        return {"tool": "apply_patch", "command": files[:OUTPUT_CHARS], "exit_code": None,
                "message": "codex reported the patch as failed (not applied, or declined)", "sandbox_denied": False,
                "outcome": "failed"}
    return None


def usage_of(reported: dict | None) -> dict:
    """Usage in our keys from codex's summed ``turn.completed`` usage; every field None when not reported.

    input_tokens <- input_tokens (includes the cached ones), cached_tokens <- cached_input_tokens,
    output_tokens <- output_tokens, reasoning_tokens <- reasoning_output_tokens,
    cache_creation_tokens <- cache_write_input_tokens; cost_usd stays None (codex reports none).
    """
    usage = empty_usage()
    if not reported:
        return usage
    usage["input_tokens"] = reported.get("input_tokens")
    usage["cached_tokens"] = reported.get("cached_input_tokens")
    usage["output_tokens"] = reported.get("output_tokens")
    usage["reasoning_tokens"] = reported.get("reasoning_output_tokens")
    usage["cache_creation_tokens"] = reported.get("cache_write_input_tokens")
    return usage


def session_record(home: str, thread_id: str) -> Path | None:
    """codex's session record of ``thread_id`` under ``home/sessions`` (rollout-*-<id>.jsonl), or None."""
    if not thread_id or not re.fullmatch(r"[0-9A-Za-z-]+", thread_id):
        return None
    top = os.path.realpath(home)
    sessions = Path(home) / "sessions"
    if sessions.is_symlink() or not sessions.is_dir():
        return None
    for path in sessions.rglob(f"rollout-*{thread_id}.jsonl"):
        # the HOME was writable to the agent: never a link, never a file outside it
        if not path.is_symlink() and path.is_file() and os.path.realpath(path).startswith(top + os.sep):
            return path
    return None


def refusals_of(record: Path | None) -> list[dict]:
    """The commands that failed or that the sandbox refused, from a session record (bounded memory).

    Returns up to MAX_REFUSALS ``{"tool": "exec_command", "command": str, "exit_code": int,
    "message": str, "sandbox_denied": bool, "outcome": str}`` in call order: every ``exec_command``
    whose output says "Process exited with code N" with N != 0; ``message`` is the command's output
    cut to OUTPUT_CHARS characters; ``sandbox_denied`` is set when it names a DENIAL_PATTERNS text;
    ``outcome`` (engine/text/tool_outcomes.py): ``command_not_found`` for exit status 127 (whatever the
    output says), ``refused`` for a sandbox denial, else ``failed``.
    ``codex exec --json`` 0.171.0 shows the failed commands but not the refused ones.
    """
    if record is None:
        return []
    calls: dict[str, str] = {}
    found: list[dict] = []
    try:
        fh = open(record, "rb")
    except OSError:
        return []
    with fh:
        for line in BoundedLines(fh):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            payload = entry.get("payload") if isinstance(entry, dict) else None
            if entry.get("type") != "response_item" or not isinstance(payload, dict):
                continue
            if payload.get("type") == "function_call" and payload.get("name") == "exec_command":
                try:
                    arguments = json.loads(payload.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                command = arguments.get("cmd") if isinstance(arguments, dict) else None
                if len(calls) < 10_000:
                    calls[str(payload.get("call_id"))] = str(command or payload.get("arguments") or "")[:OUTPUT_CHARS]
            elif payload.get("type") == "function_call_output" and str(payload.get("call_id")) in calls:
                output = payload.get("output")
                if not isinstance(output, str):
                    output = json.dumps(output)
                status = EXIT_LINE.search(output)
                if not status or status.group(1) == "0" or len(found) >= MAX_REFUSALS:
                    continue
                body = output.split("Output:\n", 1)[-1].strip()
                command, code = calls[str(payload.get("call_id"))], int(status.group(1))
                denied = any(text in output for text in DENIAL_PATTERNS)
                found.append({"tool": "exec_command", "command": command, "exit_code": code,
                              "message": body[-OUTPUT_CHARS:], "sandbox_denied": denied,
                              "outcome": tool_outcomes.classify(code, body, command, refused=denied)})
    return found
