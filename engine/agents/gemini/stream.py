"""Gemini CLI's output (``-o stream-json``, checked on 0.61.0), read from the same events two ways:
into the facts the attempt's result is built from (``parse_stream``, ``session_tokens``, ``usage_of``:
engine/agents/gemini/adapter.py) and into the conversation's entries (``entries``, which
engine/text/transcript.py calls for each line); both word a tool call's outcome by ``outcome_of``."""
from __future__ import annotations

import json
import os
import re
from collections import deque
from pathlib import Path

from ...text import tool_outcomes
from ...text.transcript import TEXT_CHARS, Normalizer, cut, first_lines
from ..base import empty_usage
from ..lines import BoundedLines, JsonEvents, stderr_lines

#: Its tool names (0.61.0) -> the names ``Normalizer.tool_sentence`` words.
_TOOLS = {"run_shell_command": "Bash", "read_file": "Read", "write_file": "Write", "replace": "Edit",
          "grep_search": "Grep", "glob": "Glob", "list_directory": "LS", "google_web_search": "WebSearch",
          "web_fetch": "WebFetch", "write_todos": "TodoWrite"}
#: 0.61.0's run_shell_command output is what the command printed; with no output it is
#: "Command exited with code: N" (in debug mode "Exit Code: N" follows the output).
EXIT = re.compile(r"^(?:Command exited with code:|Exit Code:)\s*(-?\d+)\s*$", re.MULTILINE)
#: 0.61.0's error types (``ToolErrorType``) of a call its rules refused.
REFUSED = frozenset({"tool_not_registered", "policy_violation", "permission_denied", "path_not_in_workspace",
                     "sandbox_expansion_required"})
#: Its words for a path outside the workspace (an ``invalid_tool_params`` error).
OUTSIDE = re.compile(r"must be within the workspace|outside (?:of )?the workspace", re.IGNORECASE)


def outcome_of(tool: str, status: str, error_type: str, output: str,
               command: str = "") -> tuple[str | None, int | None]:
    """``(outcome, exit status)`` of a ``tool_result`` (engine/text/tool_outcomes.py): ``status``
    success/error, ``error_type`` its ``error.type``, ``output`` its output (or error message). A shell
    command that exited non-zero is a *success* of run_shell_command: its exit status is known only
    when it printed nothing."""
    found = EXIT.search(output) if tool == "run_shell_command" else None
    code = int(found.group(1)) if found else None
    error = status != "success"
    refused = error and (error_type in REFUSED or bool(tool_outcomes.CLI_REFUSAL.search(output[:500]))
                         or bool(OUTSIDE.search(output[:500])))
    if tool == "run_shell_command" and not error and code is None and tool_outcomes.shell_denial(output):
        return "refused", None  # the shell said the sandbox refused it: whatever its exit status, unknown here
    return tool_outcomes.classify(code, output, command, refused=refused, error=error), code


def entries(n: Normalizer, event: dict) -> list[dict]:
    """gemini 0.61.0 ``-o stream-json`` (engine/agents/gemini/adapter.py): ``init``, assistant ``message``
    deltas (each shown as it comes), ``tool_use``, ``tool_result`` (status ``success``/``error``;
    a tool the role does not have is ``tool_not_registered``), ``error`` and the final ``result``
    with its token ``stats``."""
    kind = str(event.get("type") or "")
    if kind == "init":
        return [{"kind": "start", "text": f"Gemini CLI started (model {event.get('model') or '?'}, session "
                                          f"{event.get('session_id') or '?'})"}]
    if kind == "message" and event.get("role") == "assistant" and event.get("delta") and event.get("content"):
        # one streamed piece of a message, kept as it came (spaces too): the page joins the pieces
        # (engine/text/transcript.py ``joined``)
        return [{"kind": "text", "delta": True, "text": str(event["content"])[:TEXT_CHARS]}]
    if kind == "message" and event.get("role") == "assistant" and str(event.get("content") or "").strip():
        return [{"kind": "text", "text": cut(str(event["content"]))}]
    if kind == "tool_use":
        name, call = str(event.get("tool_name") or ""), str(event.get("tool_id") or "")
        args = dict(event.get("parameters")) if isinstance(event.get("parameters"), dict) else {}
        n.called(call, name, args)
        if "dir_path" in args and "path" not in args:
            args["path"] = args["dir_path"]
        entry = {"kind": "tool_call", "tool": name, "call": call,
                 "text": n.tool_sentence(_TOOLS.get(name, name), args)}
        if name == "run_shell_command" and args.get("description"):
            entry["detail"] = cut(str(args["description"]), 200)
        return [entry]
    if kind == "tool_result":
        call = str(event.get("tool_id") or "")
        tool = n.tools.get(call, "")
        error = event.get("error") if isinstance(event.get("error"), dict) else {}
        output = str(event.get("output") or error.get("message") or "")
        entry = {"kind": "tool_result", "tool": tool, "call": call, "ok": event.get("status") == "success",
                 "detail": first_lines(output)}
        outcome, code = outcome_of(tool, str(event.get("status") or ""), str(error.get("type") or ""),
                                                output, n.commands.get(call, ""))
        if code is not None:
            entry["exit"] = code
        if outcome or not entry["ok"]:
            n.unsuccessful(entry, outcome or "failed", output)
        else:
            rows = [row for row in output.splitlines() if row.strip()]
            entry["text"] = "done" if not rows else f"{len(rows)} line{'s' if len(rows) != 1 else ''} of output"
        return [entry]
    if kind == "error":
        return [{"kind": "error", "ok": False, "text": cut(str(event.get("message") or ""), 400)}]
    if kind == "result":
        stats = event.get("stats") if isinstance(event.get("stats"), dict) else {}
        out = []
        if n.add_usage({"input_tokens": stats.get("input_tokens"), "output_tokens": stats.get("output_tokens"),
                            "cached_input_tokens": stats.get("cached")}) is not None and stats:
            out.append(n.usage_entry())
        if event.get("status") != "success":
            error = event.get("error") if isinstance(event.get("error"), dict) else {}
            out.append({"kind": "error", "ok": False, "text": "The agent ended with an error",
                        "detail": first_lines(str(error.get("message") or ""))})
        else:
            calls = stats.get("tool_calls")
            said = f"{calls} tool call{'s' if calls != 1 else ''}" if isinstance(calls, int) else ""
            out.append({"kind": "result", "ok": True, "text": "Finished" + (f": {said}" if said else "")})
        return out
    return []


#: Texts that mean "no usable credentials" (stderr, ``result.error.message``, ``error`` events).
AUTH_PATTERNS = re.compile(
    r'"code":\s*40[13]\b|\bUNAUTHENTICATED\b|\bPERMISSION_DENIED\b|API key not valid|API_KEY_INVALID'
    r"|must specify the GEMINI_API_KEY|Please set an Auth method|Invalid auth method", re.IGNORECASE)


TRUST_TEXT = "not running in a trusted directory"


#: At most this many refused or failed tool calls are recorded; each message cut to OUTPUT_CHARS.
MAX_REFUSALS = 200


OUTPUT_CHARS = 500


def parse_stream(raw_path: str, stderr_path: str | None = None) -> dict:
    """Read a ``gemini -o stream-json`` capture line by line (bounded memory).

    Returns ``{"session_id": str, "model": str, "result": dict | None, "last_text": str,
    "tool_calls": int, "refusals": list[dict], "errors": list[str], "auth_error": bool,
    "trust_error": bool, "stderr_tail": list[str], "truncated_lines": int}``:

    * ``result``: the last ``result`` event (None when missing or cut);
    * ``last_text``: the assistant text after the last tool call (its deltas joined);
    * ``refusals``: tool results with status ``error``, and the run_shell_command results with
      status ``success`` whose command did not succeed as far as gemini says (its program not found,
      "Command exited with code: N"), in call order (at most MAX_REFUSALS): ``{"tool", "message",
      "error_type", "outcome", "path"?, "command"?, "exit_code"?}`` (``outcome``:
      ``outcome_of``; ``path`` when the call named a ``file_path``,
      ``command`` a shell command), ``"recovered": True`` when a later successful call wrote that file;
    * ``errors``: the last five ``error`` event messages; ``stderr_tail`` the last five non-JSON
      lines (without the CLI's colour and ripgrep notices);
    * ``auth_error``/``trust_error``: a line matched AUTH_PATTERNS / the untrusted-folder text;
    * ``truncated_lines``: lines longer than engine/agents/lines.py MAX_LINE_BYTES, not parsed;
    * ``structured``: whether any stdout line was a JSON event; ``plain_text``: the other lines
      (engine/agents/lines.py ``PlainText``), the final message when gemini printed text instead.

    ``stderr_path``: the attempt's stderr capture (engine/processes/process.py), read for the same
    auth/trust texts and ``stderr_tail``; without it the raw log holds both streams.
    """
    found = {"session_id": "", "model": "", "result": None, "last_text": "", "tool_calls": 0, "refusals": [],
             "errors": [], "auth_error": False, "trust_error": False, "stderr_tail": [], "truncated_lines": 0,
             "structured": False, "plain_text": ""}
    errors: deque[str] = deque(maxlen=5)
    stderr_tail: deque[str] = deque(maxlen=5)

    def other_line(said: str) -> None:
        if AUTH_PATTERNS.search(said):
            found["auth_error"] = True
        if TRUST_TEXT in said:
            found["trust_error"] = True
        if not said.startswith(("Warning: 256-color", "Ripgrep is not available", "at ")):
            stderr_tail.append(said[:OUTPUT_CHARS])

    for said in stderr_lines(stderr_path):
        other_line(said)
    calls: dict[str, tuple[str, str, str]] = {}  # tool_id -> (tool name, file path, shell command)
    text: list[str] = []
    stream = JsonEvents(raw_path, on_text=lambda line: other_line(line.decode("utf-8", errors="replace")))
    for event in stream:
        kind = event.get("type")
        if kind == "init":
            found["session_id"] = str(event.get("session_id") or found["session_id"])
            found["model"] = str(event.get("model") or found["model"])
        elif kind == "message" and event.get("role") == "assistant":
            content = event.get("content")
            if isinstance(content, str):
                if not event.get("delta"):
                    text = []
                if sum(len(part) for part in text) < 1024 * 1024:
                    text.append(content)
        elif kind == "tool_use":
            found["tool_calls"] += 1
            text = []
            params = event.get("parameters") if isinstance(event.get("parameters"), dict) else {}
            target, command = params.get("file_path") or params.get("dir_path"), params.get("command")
            if len(calls) < 10_000:
                calls[str(event.get("tool_id"))] = (str(event.get("tool_name") or "?"),
                                                    target[:1000] if isinstance(target, str) else "",
                                                    command[:2000] if isinstance(command, str) else "")
        elif kind == "tool_result":
            _tool_result(found["refusals"], calls, event)
        elif kind == "error":
            message = str(event.get("message") or "")
            errors.append(message[:OUTPUT_CHARS])
            if AUTH_PATTERNS.search(message):
                found["auth_error"] = True
        elif kind == "result":
            found["result"] = event
            error = event.get("error") if isinstance(event.get("error"), dict) else {}
            if AUTH_PATTERNS.search(str(error.get("message") or "")):
                found["auth_error"] = True
    found["last_text"] = "".join(text).strip()
    found["plain_text"], found["structured"] = stream.plain.text, stream.structured
    found["errors"] = list(errors)
    found["stderr_tail"] = list(stderr_tail)
    found["truncated_lines"] = stream.truncated
    return found


def _tool_result(refusals: list[dict], calls: dict[str, tuple[str, str, str]], event: dict) -> None:
    """A ``tool_result`` event: a refusal (or a failed command) added to ``refusals`` (parse_stream), and an
    earlier refusal to write a file marked ``recovered`` once a later call wrote it."""
    tool, path, command = calls.get(str(event.get("tool_id")), ("?", "", ""))
    error = event.get("error") if isinstance(event.get("error"), dict) else {}
    status, output = str(event.get("status") or ""), str(event.get("output") or "")
    outcome, code = outcome_of(tool, status, str(error.get("type") or ""),
                                            output or str(error.get("message") or ""), command)
    if status == "success" and path and tool in ("write_file", "replace"):
        for refusal in refusals:
            if refusal.get("path") == path:
                refusal["recovered"] = True
    if (status == "success" and outcome is None) or len(refusals) >= MAX_REFUSALS:
        return
    message = str(error.get("message") or output or "failed")
    refusal = {"tool": tool, "message": message[:OUTPUT_CHARS], "error_type": str(error.get("type") or ""),
               "outcome": outcome or "failed"}
    if path:
        refusal["path"] = path
    if command:
        refusal["command"] = command[:OUTPUT_CHARS]
    if code is not None:
        refusal["exit_code"] = code
    refusals.append(refusal)


def session_tokens(home: str, session_id: str) -> dict | None:
    """The summed ``tokens`` of the gemini messages of the session record of ``session_id``
    (``HOME/.gemini/tmp/*/chats/session-*.jsonl``, first line ``{"sessionId": ...}``), read line
    by line; a message written again with the same ``id`` (0.61.0 rewrites it as its tool calls
    finish) counts once, as last written. None when no record of that session is found. Keys as the record names them:
    ``input, output, cached, thoughts, tool, total`` (tokens)."""
    if not session_id or not re.fullmatch(r"[0-9A-Za-z-]+", session_id):
        return None
    top = os.path.realpath(home)
    base = Path(home) / ".gemini" / "tmp"
    if base.is_symlink() or not base.is_dir():
        return None
    for path in base.glob(f"*/chats/session-*-{session_id[:8]}*.jsonl"):
        # the HOME was writable to the agent: never a link, never a file outside it
        if path.is_symlink() or not path.is_file() or not os.path.realpath(path).startswith(top + os.sep):
            continue
        by_message: dict[str, dict] = {}  # a message is written again (same id) as its tool calls finish
        matched = False
        with open(path, "rb") as fh:
            for n, line in enumerate(BoundedLines(fh)):
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(entry, dict):
                    continue
                if n == 0:
                    matched = entry.get("sessionId") == session_id
                    if not matched:
                        break
                tokens = entry.get("tokens")
                if entry.get("type") == "gemini" and isinstance(tokens, dict) and len(by_message) < 100_000:
                    by_message[str(entry.get("id") or f"line-{n}")] = tokens
        if matched:
            total: dict[str, int] = {}
            for tokens in by_message.values():
                for key, value in tokens.items():
                    if isinstance(value, int) and not isinstance(value, bool):
                        total[key] = total.get(key, 0) + value
            return total
    return None


def usage_of(result: dict | None, tokens: dict | None = None) -> dict:
    """Usage in our keys; None for what was not reported (never a made-up 0).

    From the ``result`` event's ``stats``: input_tokens <- input_tokens (Gemini's
    promptTokenCount, cached included), output_tokens <- output_tokens (candidatesTokenCount),
    cached_tokens <- cached (cachedContentTokenCount). From the session record's summed
    ``tokens`` (``session_tokens``): reasoning_tokens <- thoughts (thoughtsTokenCount).
    cache_creation_tokens and cost_usd stay None (Gemini reports neither)."""
    usage = empty_usage()
    stats = (result or {}).get("stats")
    if isinstance(stats, dict):
        for ours, theirs in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                             ("cached_tokens", "cached")):
            value = stats.get(theirs)
            if isinstance(value, int) and not isinstance(value, bool):
                usage[ours] = value
    if tokens and isinstance(tokens.get("thoughts"), int) and usage["output_tokens"] is not None:
        usage["reasoning_tokens"] = tokens["thoughts"]
    return usage
