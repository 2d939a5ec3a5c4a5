"""Claude Code's output as the conversation's entries (engine/transcript.py reads each line through
``entries``): ``--output-format stream-json``, checked on 2.1.197: ``system``/``init`` (its version,
model and tools), ``assistant`` and ``user`` messages (Anthropic Messages-shaped: engine/transcript.py
``Normalizer.messages``) and the final ``result``."""
from __future__ import annotations

from ...transcript import Normalizer, cut, first_lines


def entries(n: Normalizer, event: dict) -> list[dict]:
    """The entries of one event of the stream (module docstring)."""
    kind = event.get("type")
    if kind == "system" and event.get("subtype") == "init":
        tools = event.get("tools") if isinstance(event.get("tools"), list) else []
        version = event.get("claude_code_version") or "?"
        model = event.get("model") or "?"
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
