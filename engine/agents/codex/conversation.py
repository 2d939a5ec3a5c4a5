"""The Codex CLI's output as the conversation's entries (engine/transcript.py reads each line through
``entries``): ``codex exec --json``, checked on 0.171.0: ``thread.started``, ``item.*`` events
(``agent_message``, ``reasoning``, ``command_execution``, ``file_change``, ``mcp_tool_call``,
``web_search``, ``todo_list``), ``turn.completed`` with usage, ``turn.failed`` and ``error``."""
from __future__ import annotations

from ... import tool_outcomes
from ...transcript import Normalizer, code as quoted, cut, first_lines


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
                        "text": f"Runs {quoted(item.get('command') or '')}"})
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
        return [{"kind": "error", "ok": False, "text": cut(str(item.get("message") or ""), 400)}]
    return []
