"""The conversation as the model gateway saw it: what the model was sent and what it answered (no Django).

The run page's conversation of an attempt is built from the wire, not from what the CLI prints: a CLI's
stdout is a claim (an agent can write into it: tests/security/test_model_gateway_runs.py), the gateway's
traffic is the engine's own evidence. For each model call (engine/model_gateway/server.py) the gateway
hands this module the request's body and the answer's bytes:

* ``asked``: the tool results the CLI sends back since the model's last turn (Anthropic ``tool_result``
  blocks, Responses ``function_call_output`` items, Gemini ``functionResponse`` parts, Chat ``tool``
  messages), each once;
* ``answered``: the model's answer, its text, thinking and tool calls (Anthropic content blocks,
  streamed or not; Responses ``output`` items; Gemini ``parts``; Chat ``message``/deltas).

Both become Anthropic-shaped blocks written through engine/text/transcript.py's normalizer (the ``claude``
format, whose stream carries the same blocks), so the entries read as the rest of the page's
conversations do; other CLIs' tool names are worded as claude's where they mean the same (``TOOLS``).
The file is ``conversation.jsonl`` beside the attempt's raw log (``FILE_NAME``); every entry is redacted
with the attempt's secrets. ``tool_calls`` keeps the sentences of the calls the model asked for, against
which the CLI's own account is checked (``unasked``).
"""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from ..agents import registry
from ..text import transcript
from ..redaction import Redactor
from .usage import wire_format

FILE_NAME = "conversation.jsonl"
#: An answer longer than this is not read for the conversation (its usage still is: usage.py).
MAX_ANSWER_BYTES = 4 * 1024 * 1024
#: Other CLIs' tool names and input keys, as the claude names the transcript words (the same meaning): each
#: CLI's policy gives its own (engine/agents/<cli>/policy.py TOOL_WORDS).
TOOLS = registry.tool_words()

def conversation_path(raw_path: str) -> Path:
    """The wire conversation's path beside the attempt's raw log."""
    return Path(raw_path).parent / FILE_NAME


def _claude_tool(name: str, given) -> tuple[str, dict]:
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except ValueError:
            given = {"input": given}
    if not isinstance(given, dict):
        given = {"input": given}
    if isinstance(given.get("cmd"), list):  # codex's local shell: an argv
        given = {**given, "cmd": " ".join(str(part) for part in given["cmd"])}
    mapped = TOOLS.get(name)
    if mapped is None:
        return name, given
    claude_name, keys = mapped
    return claude_name, {keys.get(key, key): value for key, value in given.items()}


def _text_of(content) -> str:
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or part.get("output") or "") if isinstance(part, dict) else str(part)
                         for part in content)
    if isinstance(content, dict):
        return json.dumps(content, ensure_ascii=False)[:20000]
    return str(content or "")


#: How each CLI tells its model a command's exit status in a tool result (each CLI's policy: EXIT_SAID).
_EXIT_SAID = re.compile("(?:" + "|".join(registry.bundled("EXIT_SAID")) + r")\s*(-?\d+)")


def _with_exit(block: dict) -> dict:
    """A tool result whose text names a non-zero exit status is an error, said as the transcript's claude
    format reads it ("Exit code N"): only Claude Code flags its failed commands itself, and a result the
    model was told failed must not read as "exit status 0" on the page."""
    found = _EXIT_SAID.search(block["content"][:4000])
    if found and int(found.group(1)) != 0:
        block = {**block, "is_error": True}
        if not block["content"].startswith("Exit code "):
            block["content"] = f"Exit code {int(found.group(1))}\n{block['content']}"
    return block


def results_of(fmt: str, body) -> list[dict]:
    """The tool results at the end of a request (since the model's last turn), as ``tool_result`` blocks
    (``_with_exit``: a non-zero exit status the CLI told its model makes the block an error)."""
    return [_with_exit(block) for block in _results_of(fmt, body)]


def _results_of(fmt: str, body) -> list[dict]:
    if not isinstance(body, dict):
        return []
    found = []
    if fmt == "anthropic":
        # every user message since the model's last turn: a CLI may send its results and then a message of
        # its own (a reminder) after them
        for message in reversed(body.get("messages") or []):
            if not isinstance(message, dict) or message.get("role") != "user":
                break
            blocks = message.get("content") if isinstance(message.get("content"), list) else []
            found[:0] = [{"type": "tool_result", "tool_use_id": str(block.get("tool_use_id") or ""),
                          "content": _text_of(block.get("content")), "is_error": bool(block.get("is_error"))}
                         for block in blocks if isinstance(block, dict) and block.get("type") == "tool_result"]
    elif fmt == "responses":
        items = body.get("input") if isinstance(body.get("input"), list) else []
        for item in reversed(items):
            if not isinstance(item, dict):
                continue
            if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                found.insert(0, {"type": "tool_result", "tool_use_id": str(item.get("call_id") or ""),
                                 "content": _text_of(item.get("output")), "is_error": False})
            elif item.get("type") in ("function_call", "custom_tool_call", "message", "reasoning"):
                break
    elif fmt == "gemini":
        contents = body.get("contents") if isinstance(body.get("contents"), list) else []
        last = contents[-1] if contents and isinstance(contents[-1], dict) else {}
        if last.get("role") in ("user", "function"):
            for index, part in enumerate(last.get("parts") or []):
                if isinstance(part, dict) and isinstance(part.get("functionResponse"), dict):
                    response = part["functionResponse"]
                    found.append({"type": "tool_result", "tool_use_id": f"{response.get('name')}#{len(contents)}.{index}",
                                  "content": _text_of(response.get("response")), "is_error": False})
    elif fmt == "chat":
        for message in reversed(body.get("messages") or []):
            if not isinstance(message, dict) or message.get("role") != "tool":
                break
            found.insert(0, {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id") or ""),
                             "content": _text_of(message.get("content")), "is_error": False})
    return found


def _events(data: bytes, streamed: bool) -> list:
    if not streamed:
        try:
            return [json.loads(data)]
        except ValueError:
            return []
    found = []
    for line in data.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
            try:
                found.append(json.loads(line[5:]))
            except ValueError:
                continue
    return found


def answer_of(fmt: str, data: bytes, streamed: bool, turn: int = 0) -> list[dict]:
    """The model's answer as Anthropic content blocks (``text``, ``thinking``, ``tool_use``)."""
    events = _events(data, streamed)
    if fmt == "anthropic":
        blocks = _anthropic_blocks(events)
    elif fmt in ("responses", "chat"):
        blocks = _openai_blocks(events)
    elif fmt == "gemini":
        blocks = _gemini_blocks(events, turn)
    else:
        blocks = []
    out = []
    for block in blocks:
        if block.get("type") == "tool_use":
            name, given = _claude_tool(str(block.get("name") or ""), block.get("input"))
            block = {"type": "tool_use", "id": str(block.get("id") or ""), "name": name, "input": given}
        out.append(block)
    return out


def _anthropic_blocks(events: list) -> list[dict]:
    """An Anthropic Messages answer's blocks: a plain answer's content, or a stream's blocks put together."""
    blocks: list[dict] = []
    by_index: dict = {}
    for event in events:
        if not isinstance(event, dict):
            continue
        if isinstance(event.get("content"), list):  # a plain answer
            blocks += [block for block in event["content"] if isinstance(block, dict)]
        kind = event.get("type")
        if kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            block["_json"] = ""
            by_index[event.get("index")] = block
        elif kind == "content_block_delta" and by_index.get(event.get("index")) is not None:
            _add_delta(by_index[event.get("index")], event.get("delta") or {})
    for index in sorted(by_index, key=lambda key: str(key).zfill(8)):
        block = by_index[index]
        if block.get("type") == "tool_use" and block.get("_json"):
            try:
                block["input"] = json.loads(block["_json"])
            except ValueError:
                block["input"] = {"input": block["_json"]}
        block.pop("_json", None)
        blocks.append(block)
    return blocks


def _add_delta(block: dict, delta: dict) -> None:
    if delta.get("type") == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text") or "")
    elif delta.get("type") == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking") or "")
    elif delta.get("type") == "input_json_delta":
        block["_json"] += str(delta.get("partial_json") or "")


def _openai_blocks(events: list) -> list[dict]:
    """An OpenAI Responses (its completed response) or Chat Completions answer's blocks."""
    blocks: list[dict] = []
    for event in events:
        if not isinstance(event, dict):
            continue
        response = event.get("response") if isinstance(event.get("response"), dict) else event
        if event.get("type", "").startswith("response.") and event.get("type") not in (
                "response.completed", "response.incomplete", "response.failed"):
            continue
        for item in response.get("output") or []:
            if isinstance(item, dict):
                blocks += _output_item_blocks(item)
        for choice in response.get("choices") or []:
            message = (choice or {}).get("message") or {}
            if message.get("content"):
                blocks.append({"type": "text", "text": str(message["content"])})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": str(call.get("id") or ""),
                               "name": str(function.get("name") or ""), "input": function.get("arguments")})
    return blocks


def _output_item_blocks(item: dict) -> list[dict]:
    """One Responses output item as blocks: a message, a reasoning summary or a tool call."""
    if item.get("type") == "message":
        text = "".join(str(part.get("text") or "") for part in item.get("content") or [] if isinstance(part, dict))
        return [{"type": "text", "text": text}]
    if item.get("type") == "reasoning":
        summary = " ".join(str(part.get("text") or "") for part in item.get("summary") or []
                           if isinstance(part, dict))
        return [{"type": "thinking", "thinking": summary}] if summary else []
    if item.get("type") in ("function_call", "custom_tool_call", "local_shell_call"):
        given = item.get("arguments", item.get("input", item.get("action")))
        return [{"type": "tool_use", "id": str(item.get("call_id") or item.get("id") or ""),
                 "name": str(item.get("name") or item.get("type")), "input": given}]
    return []


def _gemini_blocks(events: list, turn: int) -> list[dict]:
    """A Gemini generateContent answer's blocks: its text (thoughts left out) first, then its function calls."""
    blocks: list[dict] = []
    text = ""
    for event in events:
        for item in (event if isinstance(event, list) else [event]):
            for candidate in (item or {}).get("candidates") or [] if isinstance(item, dict) else []:
                for part in ((candidate or {}).get("content") or {}).get("parts") or []:
                    if not isinstance(part, dict):
                        continue
                    if part.get("text") and not part.get("thought"):
                        text += str(part["text"])
                    elif isinstance(part.get("functionCall"), dict):
                        call = part["functionCall"]
                        blocks.append({"type": "tool_use", "id": f"{call.get('name')}#{turn}.{len(blocks)}",
                                       "name": str(call.get("name")), "input": call.get("args")})
    if text:
        blocks.insert(0, {"type": "text", "text": text})
    return blocks


class WireConversation:
    """The attempt's conversation from its gateway's calls, written to ``path`` (``conversation.jsonl``).
    ``asked`` and ``answered`` are called from the gateway's threads, one call at a time (a lock)."""

    def __init__(self, path: str | Path, workspace: str = "", secrets: list | None = None):
        self.path = Path(path)
        self.transcript = transcript.Transcript(self.path, "messages", workspace, Redactor(secrets or []))
        self.seen_results: set[str] = set()
        #: the sentences of the tool calls the model asked for (engine/text/transcript.py ``tool_sentence``)
        self.tool_calls: list[str] = []
        self.turns = 0
        self.started = False
        #: the ids of the tool calls the model asked for and whose result has not come yet
        self.issued: set[str] = set()
        #: Gemini's calls carry no id: each result answers the oldest unanswered call of its name
        self.unanswered: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def asked(self, path: str, body: bytes) -> None:
        fmt = wire_format(path)
        if not fmt:
            return
        try:
            data = json.loads(body) if body else None
        except ValueError:
            return
        if not self.turns and not self.started and isinstance(data, dict):
            self._start(fmt, path, data)
        results = [block for block in results_of(fmt, data) if block["tool_use_id"] not in self.seen_results]
        if not results:
            return
        with self._lock:
            self.seen_results.update(block["tool_use_id"] for block in results)
            kept = []
            for block in results:  # only the results of calls the model asked for: a made-up id is no result
                if fmt == "gemini":
                    waiting = self.unanswered.get(block["tool_use_id"].split("#", 1)[0]) or []
                    if not waiting:
                        continue
                    block.update(tool_use_id=waiting.pop(0))
                elif block["tool_use_id"] not in self.issued:
                    continue
                self.issued.discard(block["tool_use_id"])
                kept.append(block)
            if kept:
                self._write({"type": "user", "message": {"role": "user", "content": kept}})

    def answered(self, path: str, data: bytes, streamed: bool, usage: dict) -> None:
        fmt = wire_format(path)
        if not fmt or len(data) > MAX_ANSWER_BYTES:
            return
        blocks = answer_of(fmt, data, streamed, self.turns)
        if not blocks:
            return
        with self._lock:
            self.turns += 1
            message = {"id": f"wire-{self.turns}", "content": blocks,
                       "usage": {"input_tokens": usage.get("input_tokens") or 0,
                                 "output_tokens": usage.get("output_tokens") or 0,
                                 "cache_read_input_tokens": usage.get("cached_tokens") or 0}}
            self._write({"type": "assistant", "message": message})
            for block in blocks:
                if block.get("type") == "tool_use":
                    self.issued.add(str(block["id"]))
                if block.get("type") == "tool_use" and fmt == "gemini":
                    self.unanswered.setdefault(str(block["id"]).split("#", 1)[0], []).append(block["id"])
                if block.get("type") == "tool_use":
                    self.tool_calls.append(self.transcript.normalizer.tool_sentence(block["name"], block["input"]
                                                                                    if isinstance(block["input"], dict)
                                                                                    else {}))

    def _start(self, fmt: str, path: str, data: dict) -> None:
        """The first entry: which model the attempt's first call asked, with how many tools offered."""
        from .usage import GEMINI_PATH  # noqa: PLC0415

        found = GEMINI_PATH.search(path) if fmt == "gemini" else None
        model = found.group("model") if found else str(data.get("model") or "?")
        tools = data.get("tools") if isinstance(data.get("tools"), list) else []
        if fmt == "gemini":
            tools = [d for t in tools if isinstance(t, dict) for d in t.get("functionDeclarations") or []]
        if not tools:  # a side call (claude's session title): the conversation starts with the first real one
            return
        with self._lock:
            self.started = True
            self.transcript._write([{"kind": "start", "text": f"The model gateway's record: the first call asks "
                                                              f"{model[:100]}, {len(tools)} tool{'s' if len(tools) != 1 else ''} "
                                                              f"offered ({fmt} API)"}])

    def _write(self, event: dict) -> None:
        self.transcript.feed(json.dumps(event, ensure_ascii=False).encode() + b"\n")

    def close(self, usage: dict | None = None, calls: int = 0, simulated: bool = False) -> None:
        """The last entry (the gateway's count of the attempt's calls and tokens), then close the file."""
        with self._lock:
            if self.turns and usage is not None:
                cost = usage.get("cost_usd")
                said = ("cost not money (simulated)" if simulated else
                        f"cost ${cost:.4f}" if cost is not None else "cost unknown")
                self.transcript._write([{"kind": "result", "text": (
                    f"Finished: {self.turns} model answer{'s' if self.turns != 1 else ''} in {calls} call"
                    f"{'s' if calls != 1 else ''} through the gateway; {int(usage.get('input_tokens') or 0):,} tokens "
                    f"in, {int(usage.get('output_tokens') or 0):,} out; {said}")}])
            self.transcript.close()


def unasked(cli_entries: list[dict], asked: list[str]) -> list[int]:
    """The indexes of the CLI's own ``tool_call`` entries that no call the model asked for explains (each asked
    call explains one entry with its sentence): what the CLI printed and the model never asked for."""
    left: dict[str, int] = {}
    for sentence in asked:
        left[sentence] = left.get(sentence, 0) + 1
    found = []
    for index, entry in enumerate(cli_entries):
        if entry.get("kind") != "tool_call":
            continue
        sentence = str(entry.get("text") or "")
        if left.get(sentence):
            left[sentence] -= 1
        else:
            found.append(index)
    return found
