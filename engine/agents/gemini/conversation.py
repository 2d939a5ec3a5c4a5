"""Gemini CLI's output as the conversation's entries (engine/transcript.py reads each line through
``entries``), and the outcome of its tool calls (``outcome_of``, which engine/agents/gemini/adapter.py
records too)."""
from __future__ import annotations

import re

from ... import tool_outcomes
from ...transcript import Normalizer, cut, first_lines

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
    """``(outcome, exit status)`` of a ``tool_result`` (engine/tool_outcomes.py): ``status``
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
