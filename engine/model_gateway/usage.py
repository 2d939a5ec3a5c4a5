"""Usage read from the wire: what a model provider's answer says it consumed (no Django imports).

The engine's model gateway (engine/model_gateway/server.py) feeds every response body it passes
to the CLI through a ``UsageReader`` as the bytes go by, so usage is what the engine saw, never
what a CLI reports about itself. Three wire formats, streamed (``text/event-stream``) and not:

* **Anthropic Messages** (``/v1/messages``): ``message_start`` carries ``message.usage``
  (``input_tokens``, ``cache_read_input_tokens``, ``cache_creation_input_tokens``), each
  ``message_delta`` the cumulative ``usage.output_tokens``; a plain answer has ``usage`` at its top.
* **OpenAI Responses** (``/v1/responses``): ``response.completed`` (or ``.incomplete``/``.failed``)
  carries ``response.usage`` (``input_tokens`` with ``input_tokens_details.cached_tokens`` among
  them, ``output_tokens`` with ``output_tokens_details.reasoning_tokens`` among them);
  **Chat Completions**: ``usage`` (``prompt_tokens``, ``completion_tokens``, their ``_details``).
* **Gemini** (``:generateContent``, ``:streamGenerateContent``): each frame's ``usageMetadata``
  (``promptTokenCount`` with ``cachedContentTokenCount`` among them, ``candidatesTokenCount``,
  ``thoughtsTokenCount``); the last one seen counts.

Usage in the ledger's keys (one convention for every provider, so that caps mean the same):
``input_tokens`` (input read at the full price: cached reads and cache writes not included),
``cached_tokens`` (input read from the provider's cache), ``cache_creation_tokens`` (input written
to it), ``output_tokens`` (everything generated, reasoning included) and ``reasoning_tokens``
(the part of it spent on reasoning). ``total(usage)`` is what a token cap counts: the four inputs
and outputs summed. A key the answer did not carry stays None (unknown, never 0).
"""
from __future__ import annotations

import json
import re

USAGE_KEYS = ("input_tokens", "cached_tokens", "cache_creation_tokens", "output_tokens", "reasoning_tokens")
#: A plain (not streamed) answer is parsed when it is at most this long; a longer one is passed on
#: unread and its usage is unknown (a model's answer is far shorter).
MAX_PLAIN_BYTES = 16 * 1024 * 1024
#: An event-stream line longer than this is skipped (a frame holding usage is a few hundred bytes).
MAX_LINE_BYTES = 4 * 1024 * 1024

GEMINI_PATH = re.compile(r"/models/(?P<model>[^/:?]+):(?:stream)?[gG]enerateContent")


def wire_format(path: str) -> str:
    """``anthropic``, ``responses``, ``chat``, ``gemini`` or '' (a path that is none of the model
    calls: a model list, a token count, a preflight)."""
    path = path.split("?", 1)[0]
    if path.endswith("/messages"):
        return "anthropic"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/chat/completions"):
        return "chat"
    if GEMINI_PATH.search(path):
        return "gemini"
    return ""


def empty() -> dict:
    return {key: None for key in USAGE_KEYS}


def total(usage: dict) -> int:
    """The tokens a cap counts: input, cached input, cache writes and output (unknown counts 0 here;
    the ledger says when a call's usage was unknown)."""
    return sum(int(usage.get(key) or 0) for key in ("input_tokens", "cached_tokens", "cache_creation_tokens",
                                                       "output_tokens"))


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def from_anthropic(found: dict, usage: dict) -> None:
    if not isinstance(found, dict):
        return
    for ours, theirs in (("input_tokens", "input_tokens"), ("cached_tokens", "cache_read_input_tokens"),
                         ("cache_creation_tokens", "cache_creation_input_tokens"), ("output_tokens", "output_tokens")):
        value = _int(found.get(theirs))
        if value is not None:
            usage[ours] = value


def from_openai(found: dict, usage: dict) -> None:
    """Responses (``input_tokens``/``output_tokens``) or Chat Completions (``prompt_tokens``/
    ``completion_tokens``): OpenAI counts cached input among the input, reasoning among the output."""
    if not isinstance(found, dict):
        return
    inputs = _int(found.get("input_tokens", found.get("prompt_tokens")))
    details = found.get("input_tokens_details") or found.get("prompt_tokens_details") or {}
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    if inputs is not None:
        usage["cached_tokens"] = cached or 0
        usage["input_tokens"] = max(0, inputs - (cached or 0))
    output = _int(found.get("output_tokens", found.get("completion_tokens")))
    if output is not None:
        usage["output_tokens"] = output
    details = found.get("output_tokens_details") or found.get("completion_tokens_details") or {}
    reasoning = _int(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    if reasoning is not None:
        usage["reasoning_tokens"] = reasoning


def from_gemini(found: dict, usage: dict) -> None:
    """``usageMetadata``: the prompt count includes the cached part; thoughts are output beside the candidates."""
    if not isinstance(found, dict):
        return
    prompt = _int(found.get("promptTokenCount"))
    cached = _int(found.get("cachedContentTokenCount")) or 0
    if prompt is not None:
        usage["input_tokens"], usage["cached_tokens"] = max(0, prompt - cached), cached
    candidates = _int(found.get("candidatesTokenCount"))
    thoughts = _int(found.get("thoughtsTokenCount"))
    if candidates is not None or thoughts is not None:
        usage["output_tokens"] = (candidates or 0) + (thoughts or 0)
    if thoughts is not None:
        usage["reasoning_tokens"] = thoughts


def read_object(fmt: str, data, usage: dict) -> str:
    """Take the usage (and the model's name, returned; '' when absent) out of one decoded JSON value
    of format ``fmt``: an event's data, or a whole plain answer."""
    if isinstance(data, list):  # Gemini's streamGenerateContent without alt=sse: a JSON array of frames
        model = ""
        for item in data:
            model = read_object(fmt, item, usage) or model
        return model
    if not isinstance(data, dict):
        return ""
    model = ""
    if fmt == "anthropic":
        message = data.get("message") if data.get("type") == "message_start" else data
        if isinstance(message, dict):
            from_anthropic(message.get("usage"), usage)
            model = str(message.get("model") or "")
        if data.get("type") == "message_delta":
            from_anthropic(data.get("usage"), usage)
    elif fmt in ("responses", "chat"):
        response = data.get("response") if isinstance(data.get("response"), dict) else data
        if isinstance(response.get("usage"), dict):
            from_openai(response["usage"], usage)
        model = str(response.get("model") or "")
    elif fmt == "gemini":
        from_gemini(data.get("usageMetadata"), usage)
        model = str(data.get("modelVersion") or "")
    return model


#: The event lines that carry a tool call, by format (the rest of a long answer is not decoded).
CALL_MARKERS = {"anthropic": (b"tool_use", b"input_json_delta"), "responses": (b"response.completed",
                b"response.incomplete"), "chat": (b"tool_calls",), "gemini": (b"functionCall",)}


def _canonical(value) -> str:
    """A tool call's input as one string, whatever the order of its keys (JSON given as a string is decoded)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def calls_of(fmt: str, data, calls: dict) -> None:
    """Add the tool calls of one decoded event or plain answer to ``calls`` (``{index: {"name", "input"}}``;
    streamed Anthropic and Chat calls arrive in pieces, joined by their index)."""
    if isinstance(data, list):
        for item in data:
            calls_of(fmt, item, calls)
        return
    if not isinstance(data, dict):
        return
    if fmt == "anthropic":
        if data.get("type") == "content_block_start" and (data.get("content_block") or {}).get("type") == "tool_use":
            block = data["content_block"]
            calls[data.get("index", len(calls))] = {"name": str(block.get("name")), "input": "", "given": block.get("input")}
        elif data.get("type") == "content_block_delta" and (data.get("delta") or {}).get("type") == "input_json_delta":
            found = calls.get(data.get("index"))
            if found is not None:
                found["input"] += str(data["delta"].get("partial_json") or "")
        for block in data.get("content") if isinstance(data.get("content"), list) else []:  # a plain answer
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls[len(calls)] = {"name": str(block.get("name")), "input": _canonical(block.get("input"))}
    elif fmt == "responses":
        response = data.get("response") if isinstance(data.get("response"), dict) else data
        for item in response.get("output") or []:
            if isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call", "local_shell_call"):
                given = item.get("arguments", item.get("input", item.get("action")))
                calls[len(calls)] = {"name": str(item.get("name") or item.get("type")), "input": _canonical(given)}
    elif fmt == "chat":
        for choice in data.get("choices") or []:
            part = (choice or {}).get("delta") or (choice or {}).get("message") or {}
            for position, call in enumerate(part.get("tool_calls") or []):
                index = call.get("index", position)
                function = call.get("function") or {}
                found = calls.setdefault(index, {"name": "", "input": ""})
                found["name"] += str(function.get("name") or "")
                found["input"] += str(function.get("arguments") or "")
    elif fmt == "gemini":
        for candidate in data.get("candidates") or []:
            for part in ((candidate or {}).get("content") or {}).get("parts") or []:
                if isinstance(part, dict) and isinstance(part.get("functionCall"), dict):
                    call = part["functionCall"]
                    calls[len(calls)] = {"name": str(call.get("name")), "input": _canonical(call.get("args"))}


class UsageReader:
    """Reads the usage and the tool calls of one response of wire format ``fmt`` from its body, fed in
    pieces as it passes (``feed``), then ``finish()``: ``(usage, model answered or '')``, and ``calls()``:
    the tool calls the model asked for, ``[(name, input as canonical JSON)]``. ``streamed``: an event
    stream (``data:`` lines); otherwise the body is one JSON value, read at the end when not too long."""

    def __init__(self, fmt: str, streamed: bool):
        self.fmt, self.streamed = fmt, streamed
        self.usage = empty()
        self.model = ""
        self._calls: dict = {}
        self._markers = (b"usage",) + CALL_MARKERS.get(fmt, ())
        self._pending = b""
        self._plain = bytearray()
        self._too_long = False

    def feed(self, data: bytes) -> None:
        if not self.fmt:
            return
        if not self.streamed:
            if len(self._plain) + len(data) > MAX_PLAIN_BYTES:
                self._too_long, self._plain = True, bytearray()
            elif not self._too_long:
                self._plain += data
            return
        if b"\n" not in data:
            self._pending += data
        else:
            lines = (self._pending + data).split(b"\n")
            self._pending = lines.pop()
            for line in lines:
                self._line(line)
        if len(self._pending) > MAX_LINE_BYTES:
            self._pending = b""

    def _line(self, line: bytes) -> None:
        # only an event that names usage is decoded (the text deltas between them are most of a long answer)
        if not line.startswith(b"data:") or not any(marker in line for marker in self._markers):
            return
        line = line.rstrip(b"\r")
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]" or len(payload) > MAX_LINE_BYTES:
            return
        try:
            data = json.loads(payload)
        except ValueError:
            return
        if b"usage" in line:
            self.model = read_object(self.fmt, data, self.usage) or self.model
        calls_of(self.fmt, data, self._calls)

    def calls(self) -> list[tuple[str, str]]:
        """The tool calls of the answer, in order (after ``finish``)."""
        found = []
        for _, call in sorted(self._calls.items(), key=lambda item: str(item[0]).zfill(8)):
            given = call["input"] if call["input"] else call.get("given", "")
            found.append((call["name"], _canonical(given) if given != "" else ""))
        return found

    def finish(self) -> tuple[dict, str]:
        if self.streamed and self._pending:
            self._line(self._pending)
            self._pending = b""
        if not self.streamed and self._plain:
            try:
                data = json.loads(bytes(self._plain))
            except ValueError:
                data = None
            self.model = read_object(self.fmt, data, self.usage) or self.model
            calls_of(self.fmt, data, self._calls)
            self._plain = bytearray()
        return self.usage, self.model
