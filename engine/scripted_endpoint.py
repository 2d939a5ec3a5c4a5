"""A scripted model endpoint on loopback: the real agent CLIs talk to it as if it were the provider.

This machine has no network path to any model provider, so the real ``claude`` and ``codex``
binaries are proven end to end against this server. It speaks just enough of two HTTP APIs:

- the **Anthropic Messages API** as ``claude`` 2.1.197 uses it (``HEAD /`` preflight,
  ``POST /v1/messages`` with or without ``?beta=true``; SSE when the body says ``stream: true``,
  plain JSON otherwise);
- the **OpenAI Responses API** subset that ``codex exec`` 0.171.0 uses with a custom provider
  (``POST /v1/responses``, SSE ``response.created`` … ``response.completed``).
- the **Google Gemini API** as ``gemini`` 0.61.0 uses it with ``GOOGLE_GEMINI_BASE_URL``
  (``POST /v1beta/models/<model>:streamGenerateContent?alt=sse``: ``data: {candidates, usageMetadata}``
  frames, the text first, then the ``functionCall`` parts ``{"functionCall": {"name", "args"}}``
  with ``finishReason: STOP`` and the usage in the last frame; ``:generateContent`` answers one
  such JSON object; a ``status`` turn answers Google's ``{"error": {"code", "message", "status"}}``).

Both shapes were checked against those CLI versions (tests/test_scripted_endpoint.py, which runs
the real binaries).

Scenario format (a mapping, e.g. loaded from YAML; a bare list is taken as ``turns``)::

    model: claude-scripted          # optional; default: echo the request's model
    side_text: "Scripted session"   # optional; the answer to side calls (see below)
    turns:                          # answered in order, per conversation
      - tools:                      # tool calls (one model turn; stop_reason tool_use)
          - {tool: Write, input: {file_path: "{cwd}/hello.txt", content: "hello\\n"}}
          - {tool: Bash, input: {command: "ls"}}
        text: "I will write it."    # optional text block before the calls
        usage: {input_tokens: 1002, output_tokens: 40,
                cache_read_input_tokens: 2001, cache_creation_input_tokens: 300}
      - {tool: exec_command, input: {cmd: "touch x"}}   # shorthand for one call (codex)
      - text: "DONE."               # a final answer (stop_reason end_turn)
      - {status: 401, message: "fake 401"}   # answer this HTTP status with the provider's error JSON
      - {delay: 2.5, text: "late"}  # wait 2.5 s, then answer normally
      - {hang: true}                # accept the request and never answer
      - {status: 529, times: 1, text: "ok"}  # the first request for this turn gets 529, later ones "ok"

Keys of a turn: ``tools`` (list of ``{tool, input}``) or the shorthand ``tool`` + ``input``;
``text``; ``usage``; ``status`` (+ optional ``message``); ``delay`` (seconds); ``hang``;
``times`` (how many requests for this turn get ``status``/``hang`` before it answers normally;
default: every request). Usage keys for claude are the Anthropic names above; for codex
``input_tokens``, ``cached_input_tokens``, ``output_tokens``, ``reasoning_output_tokens`` (the
names of codex's ``turn.completed`` usage); for gemini the Gemini API's ``usageMetadata`` names
``promptTokenCount`` (cached included), ``candidatesTokenCount``, ``cachedContentTokenCount``,
``thoughtsTokenCount`` (``totalTokenCount`` = prompt + candidates + thoughts). Missing usage numbers default to
``DEFAULT_USAGE``. Every string inside ``input`` and ``text`` has ``{cwd}`` replaced by the
working directory the endpoint was given (claude's Write takes absolute paths).

Which turn answers a request: the number of assistant turns already in the request's history
(``messages`` for Anthropic, model output items in ``input`` for Responses, ``role: "model"``
contents for Gemini), skipping
``role: system``/``developer`` items. A stateless count, so retries and claude's non-streaming
fallback get the same turn, and ``--resume`` continues the scenario. When the scenario has no
turn left, the answer is a final text saying so (which ends the CLI's loop). Tool ids are fresh
random ids on every answer: claude loops forever when an id repeats within a session
(seen with the real binary). Anthropic requests with ``tools: []`` are side calls (claude's
session-title generation): they get ``side_text`` and do not consume a turn.

No Django imports: the demo runs this as a process (``python -m engine.scripted_endpoint``).
"""
from __future__ import annotations

import argparse
import copy
import gzip
import json
import re
import signal
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

DEFAULT_USAGE = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 0,
                 "cache_creation_input_tokens": 0, "cached_input_tokens": 0, "reasoning_output_tokens": 0,
                 # Gemini API usageMetadata names (gemini-cli 0.61.0)
                 "promptTokenCount": 100, "candidatesTokenCount": 20, "cachedContentTokenCount": 0,
                 "thoughtsTokenCount": 0}
DEFAULT_SIDE_TEXT = "Scripted session"
TURN_KEYS = {"tools", "tool", "input", "text", "usage", "status", "message", "delay", "hang", "times"}
USAGE_KEYS = set(DEFAULT_USAGE)
SCENARIO_KEYS = {"turns", "model", "side_text", "side_usage"}

ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         500: "api_error", 529: "overloaded_error"}
#: Google API error statuses (``{"error": {"code", "message", "status"}}``) by HTTP status.
GOOGLE_ERROR_STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                         429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
OPENAI_ERROR_CODES = {400: ("invalid_request_error", None), 401: ("invalid_request_error", "invalid_api_key"),
                      403: ("invalid_request_error", "unsupported_country_region_territory"),
                      404: ("invalid_request_error", "model_not_found"), 429: ("requests", "rate_limit_exceeded"),
                      500: ("server_error", None), 503: ("server_error", None)}

#: The Gemini API paths gemini-cli 0.61.0 calls: ``/v1beta/models/<model>:streamGenerateContent``
#: (``?alt=sse``) and ``:generateContent``; ``:countTokens`` is answered too.
GEMINI_PATH = re.compile(r"/v1(?:beta|alpha)?/models/(?P<model>[^/:]+):(?P<method>streamGenerateContent|generateContent"
                         r"|countTokens)$")

# Responses API input items that the model produced (they mark an assistant turn in the history).
MODEL_ITEM_TYPES = {"function_call", "custom_tool_call", "local_shell_call", "reasoning", "web_search_call",
                    "tool_search_call"}


class ScenarioError(ValueError):
    """A scenario that does not follow the format in this module's docstring."""


def normalize_scenario(scenario: dict | list | None) -> dict:
    """Check ``scenario`` and return it as ``{"turns": [turn, ...], "model", "side_text", "side_usage"}``.

    Each returned turn has ``tools`` (list of ``{"tool": str, "input": dict}``), ``text``
    (str or None), ``usage`` (dict), ``status`` (int or None), ``message``, ``delay`` (seconds,
    float), ``hang`` (bool), ``times`` (int or None). Raises ScenarioError on unknown keys or
    wrong types.
    """
    if scenario is None:
        scenario = {}
    if isinstance(scenario, list):
        scenario = {"turns": scenario}
    if not isinstance(scenario, dict):
        raise ScenarioError(f"a scenario is a mapping or a list of turns, not {type(scenario).__name__}")
    unknown = set(scenario) - SCENARIO_KEYS
    if unknown:
        raise ScenarioError(f"unknown scenario keys: {sorted(unknown)} (known: {sorted(SCENARIO_KEYS)})")
    turns = scenario.get("turns") or []
    if not isinstance(turns, list):
        raise ScenarioError("scenario 'turns' must be a list")
    return {"turns": [_normalize_turn(t, n) for n, t in enumerate(turns)],
            "model": scenario.get("model"),
            "side_text": str(scenario.get("side_text") or DEFAULT_SIDE_TEXT),
            "side_usage": _normalize_usage(scenario.get("side_usage") or {"input_tokens": 10, "output_tokens": 3},
                                           "side_usage")}


def _normalize_usage(usage: Any, where: str) -> dict:
    if not isinstance(usage, dict):
        raise ScenarioError(f"{where}: usage must be a mapping")
    unknown = set(usage) - USAGE_KEYS
    if unknown:
        raise ScenarioError(f"{where}: unknown usage keys {sorted(unknown)} (known: {sorted(USAGE_KEYS)})")
    merged = dict(DEFAULT_USAGE)
    for key, value in usage.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ScenarioError(f"{where}: usage {key} must be a whole number >= 0")
        merged[key] = value
    return merged


def _normalize_turn(turn: Any, n: int) -> dict:
    where = f"turn {n}"
    if isinstance(turn, str):
        turn = {"text": turn}
    if not isinstance(turn, dict):
        raise ScenarioError(f"{where}: a turn is a mapping (or a string: a final text)")
    unknown = set(turn) - TURN_KEYS
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(TURN_KEYS)})")
    calls = list(turn.get("tools") or [])
    if "tool" in turn:
        calls.append({"tool": turn["tool"], "input": turn.get("input", {})})
    elif "input" in turn:
        raise ScenarioError(f"{where}: 'input' needs 'tool'")
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("tool"), str) or set(call) - {"tool", "input"}:
            raise ScenarioError(f"{where}: a tool call is {{tool: NAME, input: {{...}}}}, not {call!r}")
        if not isinstance(call.get("input", {}), dict):
            raise ScenarioError(f"{where}: tool {call['tool']} input must be a mapping")
    status = turn.get("status")
    if status is not None and (not isinstance(status, int) or not 100 <= status <= 599):
        raise ScenarioError(f"{where}: status must be an HTTP status number")
    delay = turn.get("delay", 0)
    if not isinstance(delay, (int, float)) or delay < 0:
        raise ScenarioError(f"{where}: delay must be a number of seconds >= 0")
    times = turn.get("times")
    if times is not None and (not isinstance(times, int) or times < 0):
        raise ScenarioError(f"{where}: times must be a whole number >= 0")
    text = turn.get("text")
    if text is not None and not isinstance(text, str):
        raise ScenarioError(f"{where}: text must be a string")
    return {"tools": [{"tool": c["tool"], "input": c.get("input") or {}} for c in calls], "text": text,
            "usage": _normalize_usage(turn.get("usage") or {}, where), "status": status,
            "message": str(turn.get("message") or (f"scripted {status}" if status else "")),
            "delay": float(delay), "hang": bool(turn.get("hang")), "times": times}


def load_scenario(path: str) -> dict:
    """Read a scenario file (YAML or JSON) and return it normalized (see ``normalize_scenario``).

    Raises OSError when the file cannot be read, ScenarioError when its content is not a scenario.
    """
    import yaml  # PyYAML, a project dependency; imported here so the module loads without it

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    return normalize_scenario(data)


def _substitute(value: Any, cwd: str | None) -> Any:
    """``value`` with ``{cwd}`` replaced in every string (recursively); unchanged when cwd is None."""
    if cwd is None:
        return value
    if isinstance(value, str):
        return value.replace("{cwd}", cwd)
    if isinstance(value, list):
        return [_substitute(v, cwd) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, cwd) for k, v in value.items()}
    return value


def anthropic_turn_index(body: dict) -> int:
    """How many assistant turns ``body["messages"]`` (Anthropic Messages API) already holds.

    ``role: system`` items (claude 2.1.197's mid-conversation system messages) are skipped. That
    count is the index of the scenario turn to answer: a request whose messages end in a
    tool_result continues after the last assistant turn.
    """
    return sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant")


def responses_turn_index(body: dict) -> int:
    """How many model turns the Responses API ``body["input"]`` already holds (codex 0.171.0).

    A model turn is a run of consecutive model output items (function calls, reasoning,
    assistant messages): codex 0.171.0 puts all the calls of one response first and their
    ``function_call_output`` items after them (checked with two parallel exec_command calls).
    ``system``/``developer`` messages are skipped.
    """
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    turns, previous_was_model = 0, False
    for item in items:
        if not isinstance(item, dict):
            continue
        kind, role = item.get("type", "message"), item.get("role")
        if kind == "message" and role in ("system", "developer"):
            continue
        is_model = kind in MODEL_ITEM_TYPES or (kind == "message" and role == "assistant")
        if is_model and not previous_was_model:
            turns += 1
        previous_was_model = is_model
    return turns


def gemini_turn_index(body: dict) -> int:
    """How many model turns the Gemini API ``body["contents"]`` already holds (gemini-cli 0.61.0).

    A model turn is a content of ``role: "model"`` (the CLI sends the calls of one answer in one
    model content and their ``functionResponse`` parts in the ``user`` content after it); the
    ``systemInstruction`` is not in ``contents``.
    """
    contents = body.get("contents")
    if not isinstance(contents, list):
        return 0
    return sum(1 for c in contents if isinstance(c, dict) and c.get("role") == "model")


class ScriptedEndpoint:
    """A threaded HTTP server on 127.0.0.1 answering model requests from a scenario.

    ``ScriptedEndpoint(scenario, cwd=None, port=0, record_path=None)``: ``scenario`` is a
    mapping or list (module docstring), ``cwd`` the directory ``{cwd}`` stands for, ``port`` 0
    for any free port, ``record_path`` a file to append every request to as a JSON line.
    ``start()`` binds and serves in a background thread and returns self; ``url`` is then
    ``http://127.0.0.1:PORT`` (give it as ``ANTHROPIC_BASE_URL``, or ``url + "/v1"`` as a codex
    provider's ``base_url``); ``stop()`` closes it and releases hanging requests. Usable as a
    context manager. ``requests`` is the list of recorded requests, each
    ``{"method", "path", "headers": dict, "body": parsed JSON or None, "api": "anthropic" |
    "responses" | None, "kind": "main" | "side" | None, "turn": int | None, "answer": str}``.
    Raises ScenarioError for a bad scenario, OSError when the port cannot be bound.
    """

    def __init__(self, scenario: dict | list | None, cwd: str | None = None, port: int = 0,
                 record_path: str | None = None):
        self.scenario = normalize_scenario(scenario)
        self.cwd = cwd
        self.port = port
        self.record_path = record_path
        self._requests: list[dict] = []
        self._lock = threading.Lock()
        self._failures_given: dict[tuple[str, int], int] = {}
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``; raises RuntimeError before ``start()``."""
        if self._server is None:
            raise RuntimeError("the scripted endpoint is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "ScriptedEndpoint":
        """Bind 127.0.0.1:port and serve in a daemon thread; returns self."""
        if self._server is not None:
            return self
        endpoint = self

        class Handler(_Handler):
            owner = endpoint

        self._stopping.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        # a connection gone between select() and accept() must not block the serving thread in accept():
        # stop() (shutdown) would then wait for it forever (seen in CI: a test's teardown hung)
        self._server.socket.setblocking(False)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="scripted-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, release hanging and delayed requests, close the socket. Safe to call twice."""
        self._stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "ScriptedEndpoint":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def requests(self) -> list[dict]:
        """A copy of the requests recorded so far (see the class docstring for the shape)."""
        with self._lock:
            return copy.deepcopy(self._requests)

    def model_requests(self, api: str | None = None, kind: str = "main") -> list[dict]:
        """The recorded model requests of ``kind`` ("main" or "side"), optionally of one ``api``."""
        return [r for r in self.requests if r["kind"] == kind and (api is None or r["api"] == api)]

    # ------------------------------------------------------------------ answering

    def _record(self, entry: dict) -> None:
        with self._lock:
            self._requests.append(entry)
            if self.record_path:
                with open(self.record_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry, sort_keys=True) + "\n")

    def _turn(self, index: int) -> dict | None:
        turns = self.scenario["turns"]
        return turns[index] if index < len(turns) else None

    def _failure_due(self, api: str, index: int, turn: dict) -> bool:
        """Whether this request for ``turn`` gets its failure mode (status/hang), counting ``times``."""
        if turn["status"] is None and not turn["hang"]:
            return False
        if turn["times"] is None:
            return True
        with self._lock:
            given = self._failures_given.get((api, index), 0)
            if given >= turn["times"]:
                return False
            self._failures_given[(api, index)] = given + 1
            return True

    def _blocks(self, turn: dict | None, index: int) -> tuple[str | None, list[dict]]:
        """(text, [{"name", "input"}]) for a turn, with ``{cwd}`` substituted."""
        if turn is None:
            return (f"(the scripted scenario has no turn {index}: {len(self.scenario['turns'])} turns)", [])
        text = _substitute(turn["text"], self.cwd)
        calls = [{"name": c["tool"], "input": _substitute(c["input"], self.cwd)} for c in turn["tools"]]
        return text, calls


class _Handler(BaseHTTPRequestHandler):
    owner: ScriptedEndpoint
    server_version = "ScriptedEndpoint/1"
    protocol_version = "HTTP/1.0"  # every answer ends by closing the connection (SSE included)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def send_error(self, code, message=None, explain=None) -> None:
        """The server's own refusals (a request line or header it cannot read, a method it does not
        serve: 400, 414, 431, 501) are recorded too: every request that got an answer is in ``requests``."""
        self.owner._record({"method": getattr(self, "command", None), "path": getattr(self, "path", None),
                            "headers": dict(self.headers.items()) if getattr(self, "headers", None) else {},
                            "body": None, "api": None, "kind": None, "turn": None, "answer": str(code),
                            "time": time.time(), "error": message or ""})
        super().send_error(code, message, explain)

    # -------------------------------------------------------------- plumbing

    def _read_body(self) -> tuple[bytes, Any]:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                raw += self.rfile.read(size)
                self.rfile.readline()
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = self.headers.get("Content-Encoding", "").lower()
        if encoding == "gzip":
            raw = gzip.decompress(raw)
        elif encoding == "deflate":
            raw = zlib.decompress(raw)
        try:
            return raw, json.loads(raw) if raw else None
        except ValueError:
            return raw, None

    def _send_json(self, status: int, payload: dict, extra_headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def _event(self, name: str, payload: dict) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def _entry(self, body: Any, api: str | None, kind: str | None, turn: int | None) -> dict:
        return {"method": self.command, "path": self.path, "headers": dict(self.headers.items()), "body": body,
                "api": api, "kind": kind, "turn": turn, "answer": "", "time": time.time()}

    def _hang(self) -> None:
        """Accept and never answer (until the endpoint stops)."""
        self.owner._stopping.wait()
        self.close_connection = True

    # -------------------------------------------------------------- verbs

    def do_HEAD(self) -> None:  # claude's preflight on the base URL; any status is fine
        self.owner._record(self._entry(None, None, None, None) | {"answer": "200"})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.owner._record(self._entry(None, None, None, None) | {"answer": "404"})
        self._send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not scripted"}})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        _, body = self._read_body()
        if path.endswith("/v1/messages"):
            self._anthropic(body if isinstance(body, dict) else {})
        elif path.endswith("/v1/responses") or path == "/responses":
            self._responses(body if isinstance(body, dict) else {})
        elif GEMINI_PATH.search(path):
            found = GEMINI_PATH.search(path)
            self._gemini(body if isinstance(body, dict) else {}, found.group("model"), found.group("method"))
        else:
            self.owner._record(self._entry(body, None, None, None) | {"answer": "404"})
            self._send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not scripted"}})

    def _take_turn(self, body: dict, api: str, index: int) -> tuple[dict | None, bool, bool]:
        """Record the request and apply the turn's delay and hang.

        Returns ``(turn, failure, answered)``: ``failure`` when the turn's ``status`` is due now,
        ``answered`` when nothing more may be sent (a hang, or a delay cut short by ``stop()``).
        """
        owner = self.owner
        turn = owner._turn(index)
        entry = self._entry(body, api, "main", index)
        failure = turn is not None and owner._failure_due(api, index, turn)
        entry["answer"] = ("hang" if turn["hang"] else str(turn["status"])) if failure else "turn"
        owner._record(entry)
        if turn is not None and turn["delay"] and owner._stopping.wait(turn["delay"]):
            return turn, failure, True
        if failure and turn["hang"]:
            self._hang()
            return turn, failure, True
        return turn, failure, False

    # -------------------------------------------------------------- Anthropic Messages API

    def _anthropic(self, body: dict) -> None:
        owner, model = self.owner, self.owner.scenario["model"] or body.get("model") or "claude-scripted"
        stream = bool(body.get("stream"))
        if "tools" in body and not body["tools"]:  # session-title generation side call
            entry = self._entry(body, "anthropic", "side", None)
            entry["answer"] = "side"
            owner._record(entry)
            self._anthropic_answer(model, stream, owner.scenario["side_text"], [], owner.scenario["side_usage"])
            return
        index = anthropic_turn_index(body)
        turn, failure, answered = self._take_turn(body, "anthropic", index)
        if answered:
            return
        if failure:
            status = turn["status"]
            return self._send_json(status, {"type": "error", "error": {
                "type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": turn["message"]}},
                {"request-id": f"req_scripted_{uuid.uuid4().hex[:16]}"})
        text, calls = owner._blocks(turn, index)
        usage = turn["usage"] if turn else DEFAULT_USAGE
        self._anthropic_answer(model, stream, text, calls, usage)

    def _anthropic_answer(self, model: str, stream: bool, text: str | None, calls: list[dict], usage: dict) -> None:
        content = []
        if text:
            content.append({"type": "text", "text": text})
        for call in calls:
            content.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call["name"],
                            "input": call["input"]})
        if not content:
            content.append({"type": "text", "text": ""})
        stop_reason = "tool_use" if calls else "end_turn"
        full_usage = {key: usage[key] for key in ("input_tokens", "cache_creation_input_tokens",
                                                  "cache_read_input_tokens", "output_tokens")}
        message_id = f"msg_scripted_{uuid.uuid4().hex[:20]}"
        if not stream:
            self._send_json(200, {"id": message_id, "type": "message", "role": "assistant", "model": model,
                                  "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                                  "usage": full_usage})
            return
        self._start_sse()
        self._event("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": full_usage}})
        for index, block in enumerate(content):
            if block["type"] == "text":
                self._event("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": {"type": "text", "text": ""}})
                for chunk in _chunks(block["text"]):
                    self._event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                        "delta": {"type": "text_delta", "text": chunk}})
            else:
                self._event("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}})
                self._event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
            self._event("content_block_stop", {"type": "content_block_stop", "index": index})
        self._event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                      "usage": {"output_tokens": usage["output_tokens"]}})
        self._event("message_stop", {"type": "message_stop"})
        self.close_connection = True

    # -------------------------------------------------------------- OpenAI Responses API

    def _responses(self, body: dict) -> None:
        owner = self.owner
        model = owner.scenario["model"] or body.get("model") or "gpt-scripted"
        index = responses_turn_index(body)
        turn, failure, answered = self._take_turn(body, "responses", index)
        if answered:
            return
        if failure:
            status = turn["status"]
            kind, code = OPENAI_ERROR_CODES.get(status, ("server_error", None))
            return self._send_json(status, {"error": {"message": turn["message"], "type": kind, "param": None,
                                                      "code": code}})
        text, calls = owner._blocks(turn, index)
        usage = turn["usage"] if turn else DEFAULT_USAGE
        items = []
        if text:
            items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant",
                          "status": "completed", "content": [{"type": "output_text", "text": text,
                                                              "annotations": []}]})
        for call in calls:
            items.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}",
                          "call_id": f"call_{uuid.uuid4().hex[:24]}", "name": call["name"],
                          "arguments": json.dumps(call["input"]), "status": "completed"})
        response_id = f"resp_scripted_{uuid.uuid4().hex[:20]}"
        cached = usage["cached_input_tokens"]
        resp_usage = {"input_tokens": usage["input_tokens"], "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": usage["output_tokens"],
                      "output_tokens_details": {"reasoning_tokens": usage["reasoning_output_tokens"]},
                      "total_tokens": usage["input_tokens"] + usage["output_tokens"]}
        response = {"id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
                    "model": model, "output": []}
        if not body.get("stream"):
            self._send_json(200, response | {"status": "completed", "output": items, "usage": resp_usage})
            return
        self._start_sse()
        seq = iter(range(1_000_000))
        self._event("response.created", {"type": "response.created", "sequence_number": next(seq),
                                         "response": response})
        for n, item in enumerate(items):
            start = dict(item, status="in_progress")
            if item["type"] == "message":
                start["content"] = []
            self._event("response.output_item.added", {"type": "response.output_item.added",
                                                       "sequence_number": next(seq), "output_index": n, "item": start})
            if item["type"] == "message":
                for chunk in _chunks(item["content"][0]["text"]):
                    self._event("response.output_text.delta", {
                        "type": "response.output_text.delta", "sequence_number": next(seq), "item_id": item["id"],
                        "output_index": n, "content_index": 0, "delta": chunk})
            self._event("response.output_item.done", {"type": "response.output_item.done",
                                                      "sequence_number": next(seq), "output_index": n, "item": item})
        self._event("response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                           "response": response | {"status": "completed", "output": items,
                                                                   "usage": resp_usage}})
        self.close_connection = True

    # -------------------------------------------------------------- Google Gemini API

    def _gemini(self, body: dict, model: str, method: str) -> None:
        owner = self.owner
        if method == "countTokens":  # not seen from gemini-cli 0.61.0; answered so that it never fails
            entry = self._entry(body, "gemini", "side", None)
            entry["answer"] = "countTokens"
            owner._record(entry)
            return self._send_json(200, {"totalTokens": DEFAULT_USAGE["promptTokenCount"]})
        model = owner.scenario["model"] or model or "gemini-scripted"
        index = gemini_turn_index(body)
        turn, failure, answered = self._take_turn(body, "gemini", index)
        if answered:
            return
        if failure:
            status = turn["status"]
            return self._send_json(status, {"error": {"code": status, "message": turn["message"],
                                                      "status": GOOGLE_ERROR_STATUSES.get(status, "UNKNOWN")}})
        text, calls = owner._blocks(turn, index)
        usage = turn["usage"] if turn else DEFAULT_USAGE
        parts = []
        if text:
            parts.append({"text": text})
        for call in calls:
            parts.append({"functionCall": {"name": call["name"], "args": call["input"]}})
        if not parts:
            parts.append({"text": ""})
        metadata = {"promptTokenCount": usage["promptTokenCount"],
                    "candidatesTokenCount": usage["candidatesTokenCount"],
                    "totalTokenCount": usage["promptTokenCount"] + usage["candidatesTokenCount"]
                    + usage["thoughtsTokenCount"]}
        if usage["cachedContentTokenCount"]:
            metadata["cachedContentTokenCount"] = usage["cachedContentTokenCount"]
        if usage["thoughtsTokenCount"]:
            metadata["thoughtsTokenCount"] = usage["thoughtsTokenCount"]
        response_id = f"scripted-{uuid.uuid4().hex[:20]}"
        answer = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                  "usageMetadata": metadata, "modelVersion": model, "responseId": response_id}
        if method == "generateContent":
            return self._send_json(200, answer)
        self._start_sse()
        # text first in deltas (without usage), then the calls with the finish reason and the usage
        texts = [part for part in parts if "text" in part]
        rest = [part for part in parts if "text" not in part]
        chunks = [[{"text": chunk}] for part in texts for chunk in _chunks(part["text"])]
        if rest or not chunks:
            chunks.append(rest or [{"text": ""}])
        for n, chunk_parts in enumerate(chunks):
            frame = {"candidates": [{"content": {"role": "model", "parts": chunk_parts}, "index": 0}],
                     "modelVersion": model, "responseId": response_id}
            if n == len(chunks) - 1:
                frame["candidates"][0]["finishReason"] = "STOP"
                frame["usageMetadata"] = metadata
            self.wfile.write(f"data: {json.dumps(frame)}\r\n\r\n".encode())
            self.wfile.flush()
        self.close_connection = True


def _chunks(text: str, size: int = 64) -> list[str]:
    """``text`` cut into deltas of at most ``size`` characters (at least one, possibly empty)."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.scripted_endpoint --scenario FILE [--port N] [--cwd DIR] [--record FILE]``.

    Prints the URL (one line, flushed) and serves until SIGTERM/SIGINT; returns 0. A bad
    scenario prints the problem to stderr and returns 2.
    """
    parser = argparse.ArgumentParser(prog="python -m engine.scripted_endpoint", description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", required=True, help="scenario file (YAML or JSON)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--cwd", default=None, help="the directory {cwd} in tool inputs stands for")
    parser.add_argument("--record", default=None, help="append every request to this file as JSON lines")
    args = parser.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario)
    except (OSError, ScenarioError) as exc:
        print(f"scripted_endpoint: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with ScriptedEndpoint(scenario, cwd=args.cwd, port=args.port, record_path=args.record) as endpoint:
        print(endpoint.url, flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
