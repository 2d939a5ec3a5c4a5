"""The model gateway of one attempt: the engine's own door to the model (no Django imports).

Every model call of an agent CLI passes through here, so what the model was sent, what it answered
and what it spent is what the engine saw, never what the CLI says about itself. One
``ModelGateway`` serves one attempt, on the worker's loopback (``http://127.0.0.1:PORT``): the
sandbox reaches it through the network bridge's loopback forward (engine/agents/netbridge.py), as
it reaches the scripted model endpoint, and the CLI takes it as its base URL (docs/agents.md
"The model gateway"). It

* **holds the key.** The CLI gets ``placeholder``, a random per-attempt stand-in; the gateway
  puts the real key on the upstream request in its place (in ``x-api-key``, ``Authorization``,
  ``x-goog-api-key``, ``api-key`` or the ``key`` query parameter, wherever the CLI sent it). A
  request without this attempt's placeholder is answered 401 and never forwarded; once the attempt
  ended the gateway is gone, and so is its placeholder.
* **forwards** each request to ``upstream`` (the provider, a gateway the operator listed in
  CP_GATEWAYS, or the scripted endpoint of a simulated run) over HTTPS with certificate checks
  (the default trust store, or ``SSL_CERT_FILE``); a certificate the worker does not trust is
  refused (``stop_kind`` ``gateway_not_allowed``). Responses stream through as they arrive.
* **meters** each answer in the three wire formats (engine/model_gateway/usage.py) into
  ``calls`` (the ledger: one record per call, priced by engine/model_gateway/prices.py), and asks
  the attempt's ``Meter`` (engine/model_gateway/meter.py) before each call leaves: a call that
  would cross a cap is not sent; the gateway answers it with an error and ``stop_kind`` becomes
  ``budget_reached``, which ends the attempt (engine/agents/cli_adapter.py ``supervise``).
* **watches for loops**: the tool calls of each answer go to the attempt's ``LoopWatch``; the same
  calls turn after turn make ``stop_kind`` ``stalled``.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import secrets
import socket
import ssl
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlsplit

from . import prices
from .conversation import MAX_ANSWER_BYTES, results_of
from .meter import IdleWatch, LoopWatch, Meter
from .requests import harmless, key_start, model_call, model_of, number
from .usage import UsageReader

#: Headers that belong to one connection, never forwarded (RFC 9110 7.6.1), and those the gateway sets itself.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
              "trailer", "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"}
#: Headers and the query parameter in which a CLI sends its key.
KEY_HEADERS = ("x-api-key", "authorization", "x-goog-api-key", "api-key")
KEY_PARAM = "key"
#: A request body larger than this is refused (413): a model call is far smaller.
MAX_REQUEST_BYTES = 64 * 1024 * 1024
CONNECT_TIMEOUT_SECONDS = 15.0
#: Seconds an upstream answer may stay silent before the call is cut (a model may think long).
READ_TIMEOUT_SECONDS = 900.0
#: Calls kept in ``calls``; later ones are summed into the meter only (the ledger file keeps all).
MAX_KEPT_CALLS = 2000
_CHUNK = 262144
#: A lower bound of a request's input tokens from its size: no tokenizer gives fewer than one token for this
#: many bytes of a JSON request (English runs at about 4; the estimate must never be above the truth).
BYTES_PER_TOKEN_AT_MOST = 8
#: Connections the gateway serves at once (more are answered 503), and seconds a client has for each read.
MAX_CONNECTIONS = 32
CLIENT_TIMEOUT_SECONDS = 300
#: Seconds a piece of an answer may wait for the CLI to read it; then the CLI is let go and the rest of the
#: answer is read from the upstream and counted only (with a cap, the next call waits for that count).
CLIENT_WRITE_SECONDS = 30


class UpstreamError(Exception):
    """The upstream could not be reached or refused the connection (``kind``: ``untrusted`` for a
    certificate the worker does not trust, ``unreachable`` otherwise)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class ModelGateway:
    """The gateway of one attempt (see the module docstring). ``upstream``: the base URL calls go to
    (``https://api.anthropic.com``, ``http://127.0.0.1:PORT`` of the scripted endpoint...), whose path
    the CLI's base URL keeps (``url``); ``key``: what replaces the placeholder; ``meter``: the caps;
    ``ledger_path``: a file that gets one JSON line per call (outside the sandbox); ``context``: the
    TLS context for an ``https`` upstream (default: certificate and host name checked against the
    default trust store)."""

    def __init__(self, upstream: str, key: str, meter: Meter | None = None, ledger_path: str = "",
                 context: ssl.SSLContext | None = None, simulated: bool = False, watch: LoopWatch | None = None,
                 conversation=None, redact=None, idle: IdleWatch | None = None):
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the gateway's upstream must be an http(s) URL, got {upstream!r}")
        self.upstream = upstream
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        self.key = key
        self.meter = meter or Meter()
        self.watch = watch or LoopWatch()
        #: progress between calls (None: not watched)
        self.idle = idle
        #: the attempt's conversation from the wire (engine/model_gateway/conversation.py), or None
        self.conversation = conversation
        #: what a text the model wrote goes through before the ledger keeps it (the attempt's secrets redacted)
        self.redact = redact or (lambda text: text)
        self.ledger_path = ledger_path
        self.context = context or ssl.create_default_context()
        self.simulated = simulated
        self.placeholder = "cp-gateway-" + secrets.token_urlsafe(24)
        self.calls: list[dict] = []
        self.call_count = 0
        #: why the gateway ended the attempt: ``budget_reached``, ``stalled`` or ``gateway_not_allowed`` ('' while
        #: it may go on)
        self.stop_kind = ""
        self.stop_message = ""
        self.refused_requests = 0
        self.closed = False
        #: held across a model call's check, its forwarding and its count when a cap is set
        self.one_at_a_time = threading.Lock()
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> "ModelGateway":
        gateway = self

        class Handler(_Handler):
            owner = gateway

        class Server(ThreadingHTTPServer):
            def process_request(self, request, client_address):
                if not gateway._connections.acquire(blocking=False):  # bounded threads, whatever the agent opens
                    try:
                        request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                        b"Connection: close\r\n\r\n")
                    except OSError:
                        pass
                    self.shutdown_request(request)
                    return
                super().process_request(request, client_address)

            def process_request_thread(self, request, client_address):
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    gateway._connections.release()

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # never block the serving thread in accept() (a connection gone after select()): stop() would wait
        self._server.socket.setblocking(False)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        daemon=True, name="model-gateway")
        self._thread.start()
        return self

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        """The base URL the CLI is given: the gateway's origin with the upstream's path."""
        return self.origin + self.base_path

    def stop(self) -> None:
        self.closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.conversation is not None:
            self.conversation.close(self.usage(), self.call_count, self.simulated)
        with self._lock:
            for connection in self._idle:
                connection.close()
            self._idle.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ what it saw

    def end(self, kind: str, message: str) -> None:
        """End the attempt: the first reason stays."""
        with self._lock:
            if not self.stop_kind:
                self.stop_kind, self.stop_message = kind, message

    def usage(self) -> dict:
        """The attempt's usage in the adapters' keys (engine/agents/base.py USAGE_KEYS), summed over the
        calls the gateway saw; a key no call reported stays None; ``cost_usd`` is None when a call had
        no known cost, and always for a simulated attempt (the meter still prices its calls, shown as
        ``simulated_cost_usd`` of ``record``, so that a dollar cap acts in a simulated run as in a real one)."""
        with self._lock:
            calls = list(self.calls)
        found = {"input_tokens": None, "output_tokens": None, "cached_tokens": None, "cache_creation_tokens": None,
                 "reasoning_tokens": None, "cost_usd": None}
        priced = True
        for call in calls:
            if not call.get("format") or call.get("refused"):
                continue
            for key in ("input_tokens", "output_tokens", "cached_tokens", "cache_creation_tokens", "reasoning_tokens"):
                value = (call.get("usage") or {}).get(key)
                if value is not None:
                    found[key] = (found[key] or 0) + value
            if call.get("cost_usd") is None and call.get("billed"):
                priced = False
            elif call.get("cost_usd") is not None:
                found["cost_usd"] = round((found["cost_usd"] or 0) + call["cost_usd"], 8)
        if not priced or self.simulated:  # a scripted model's answers cost nobody anything
            found["cost_usd"] = None
        return found

    def record(self) -> dict:
        """What the attempt's record keeps (engine/models.py ``Attempt.gateway``)."""
        with self._lock:
            calls = list(self.calls)
        return {"upstream": _shown(self.upstream), "simulated": self.simulated, "calls": self.call_count,
                "refused_requests": self.refused_requests, "stop_kind": self.stop_kind,
                "stop_message": self.stop_message, "meter": self.meter.summary(), "usage": self.usage(),
                "simulated_cost_usd": self.meter.summary()["attempt"]["cost_usd"] if self.simulated else None,
                "price_table": prices.VERSION, "ledger": calls[-200:]}

    def _note(self, call: dict) -> None:
        with self._lock:
            self.call_count += 1
            call["seq"] = self.call_count
            if len(self.calls) < MAX_KEPT_CALLS:
                self.calls.append(call)
            if self.ledger_path:
                try:
                    with open(self.ledger_path, "a", encoding="utf-8") as ledger:
                        ledger.write(json.dumps(call, sort_keys=True) + "\n")
                except OSError:
                    pass

    # ------------------------------------------------------------------ upstream

    def _connection(self) -> http.client.HTTPConnection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_SECONDS,
                                               context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_SECONDS)

    def _release(self, connection: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                if len(self._idle) < 8:
                    self._idle.append(connection)
                    return
        connection.close()

    def send(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes):
        """``(connection, response)`` of one upstream call; a kept connection the upstream closed is
        tried once more on a new one. Raises UpstreamError."""
        for attempt in (1, 2):
            connection = self._connection()
            fresh = connection.sock is None
            try:
                connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                connection.putheader("Host", self.host if self.port in (80, 443) else f"{self.host}:{self.port}")
                for name, value in headers:
                    connection.putheader(name, value)
                connection.putheader("Accept-Encoding", "identity")
                connection.putheader("Content-Length", str(len(body)))
                connection.endheaders(body)
                connection.sock.settimeout(READ_TIMEOUT_SECONDS)
                connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return connection, connection.getresponse()
            except ssl.SSLCertVerificationError as exc:
                connection.close()
                raise UpstreamError("untrusted", f"the certificate of {self.host}:{self.port} is not trusted by "
                                                 f"the worker ({exc.verify_message or exc.reason}): the gateway "
                                                 "refused to send the call") from None
            except (http.client.RemoteDisconnected, http.client.ImproperConnectionState, ConnectionResetError,
                    BrokenPipeError) as exc:
                connection.close()
                if fresh or attempt == 2:
                    raise UpstreamError("unreachable", f"{self.host}:{self.port} closed the connection ({exc})") from None
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                raise UpstreamError("unreachable", f"{self.host}:{self.port} could not be reached ({exc})") from None
        raise UpstreamError("unreachable", f"{self.host}:{self.port} could not be reached")


def _shown(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{parts.path}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each streamed piece leaves at once
    timeout = CLIENT_TIMEOUT_SECONDS  # a client that stops sending its request is let go
    owner: ModelGateway

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_GET(self):
        self._forward()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    # ------------------------------------------------------------------

    def _answer(self, status: int, message: str, kind: str = "gateway") -> None:
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message, "code": status,
                                                      "status": "FAILED_PRECONDITION"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes | None:
        """The request's body, decoded from its framing and its ``Content-Encoding`` (gzip, deflate), or None
        when it is malformed or larger than MAX_REQUEST_BYTES (the connection is then closed)."""
        codings = [value.strip().lower() for value in self.headers.get_all("Transfer-Encoding") or []]
        if len(self.headers.get_all("Content-Length") or []) > 1 or (codings and codings != ["chunked"]):
            return None  # two lengths, or a transfer coding the gateway does not read: no guessing
        if codings:
            data = bytearray()
            while True:
                size = number(self.rfile.readline(1024).split(b";")[0].strip(), 16)
                if size is None or len(data) + size > MAX_REQUEST_BYTES:
                    return None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data += self.rfile.read(size)
                self.rfile.readline(16)
            raw = bytes(data)
        else:
            length = number((self.headers.get("Content-Length") or "0").strip().encode(), 10)
            if length is None or length > MAX_REQUEST_BYTES:
                return None
            raw = self.rfile.read(length) if length else b""
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding in ("", "identity"):
            return raw
        if encoding not in ("gzip", "deflate"):
            return None
        inflate = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
        try:
            plain = inflate.decompress(raw, MAX_REQUEST_BYTES)
        except zlib.error:
            return None
        return None if inflate.unconsumed_tail else plain

    def _with_key(self) -> tuple[list[tuple[str, str]], str] | None:
        """The headers and target to send upstream, the placeholder replaced by the key; None when the
        request does not carry this attempt's placeholder."""
        gateway = self.owner
        found = False
        headers = []
        for name, value in self.headers.items():
            if name.lower() in HOP_BY_HOP:
                continue
            if name.lower() in KEY_HEADERS and gateway.placeholder in value:
                value, found = value.replace(gateway.placeholder, gateway.key), True
            headers.append((name, value))
        path, _, query = self.path.partition("?")
        if query:
            params = parse_qsl(query, keep_blank_values=True)
            if any(k == KEY_PARAM and v == gateway.placeholder for k, v in params):
                params = [(k, gateway.key if k == KEY_PARAM and v == gateway.placeholder else v) for k, v in params]
                found = True
            query = urlencode(params)
        return (headers, path + (f"?{query}" if query else "")) if found else None

    def _forward(self) -> None:
        gateway = self.owner
        started = time.time()
        path = self.path.split("?", 1)[0]
        if gateway.closed:  # the attempt ended: a connection kept from before opens nothing
            self.close_connection = True
            return self._answer(401, "the attempt has ended: its model gateway is closed", "authentication_error")
        if self.command == "HEAD" and path in ("", "/") and not gateway.stop_kind:
            # an agent CLI's preflight of its base URL (HEAD /): answered here, it needs no key and reaches no model
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        keyed = self._with_key()  # before any body is read: a stranger's request costs nothing
        if keyed is None:
            self.close_connection = True
            with gateway._lock:
                gateway.refused_requests += 1
            return self._answer(401, "this request does not carry the attempt's key: the model gateway serves only "
                                     "its own attempt's CLI", "authentication_error")
        headers, target = keyed
        if any("\r" in value or "\n" in value for _, value in headers) or not path.startswith("/"):
            self.close_connection = True
            return self._answer(400, "a header value or the path holds a line break, or the path is not a path")
        body = self._body()
        if body is None:
            self.close_connection = True
            return self._answer(413, "the request's body is malformed, in an encoding the gateway does not read, or "
                                     "larger than the model gateway takes")
        headers = [(name, value) for name, value in headers if name.lower() != "content-encoding"]
        if gateway.closed:
            self.close_connection = True
            return self._answer(401, "the attempt has ended: its model gateway is closed", "authentication_error")
        fmt = model_call(self.command, path, gateway.base_path)
        if not fmt and not harmless(self.command, path[len(gateway.base_path):] if path.startswith(
                gateway.base_path) else path):
            self.close_connection = True
            gateway._note({"at": round(started, 3), "method": self.command, "path": path[:300], "format": "",
                           "refused": "not_a_model_call", "http_status": None})
            # 404, not 403: a CLI reads a 403 as a refused key and stops; an optional call it may do without
            return self._answer(404, f"{self.command} {path[:200]} is not a model call the gateway forwards: only the "
                                     "model APIs' calls (messages, responses, chat completions, generateContent), "
                                     "their token counts and model lists go upstream", "not_found_error")
        if fmt and gateway.conversation is not None and not gateway.stop_kind:
            gateway.conversation.asked(path, body)
        model = model_of(fmt, path, body)
        call = {"at": round(started, 3), "method": self.command, "path": path, "format": fmt, "model": model,
                "bytes_up": len(body)}
        if gateway.stop_kind:
            call.update(refused=gateway.stop_kind, http_status=None)
            gateway._note(call)
            return self._answer(400, f"the attempt has ended ({gateway.stop_kind}): {gateway.stop_message}",
                                "invalid_request_error")
        if not fmt:
            return self._send_on(target, headers, body, call, fmt, model, started)
        # with a cap, one model call at a time: a call's spend is counted before the next one is weighed
        one = gateway.one_at_a_time if gateway.meter.capped() else contextlib.nullcontext()
        with one:
            if gateway.closed or gateway.stop_kind:  # ended while this call waited for its turn
                self.close_connection = True
                call.update(refused=gateway.stop_kind or "closed", http_status=None)
                gateway._note(call)
                return self._answer(400, f"the attempt has ended ({gateway.stop_kind or 'closed'})",
                                    "invalid_request_error")
            why = gateway.meter.admit(model, least_input=len(body) // BYTES_PER_TOKEN_AT_MOST)
            if why:
                gateway.end("budget_reached", f"A model call was not sent: {why}.")
                call.update(refused="budget_reached", why=why, http_status=None)
                gateway._note(call)
                return self._answer(400, f"budget reached: {why}", "invalid_request_error")
            why = self._idle(fmt, body)
            if why:
                gateway.end("stalled", f"The attempt was stopped by its model gateway: {why}.")
                call.update(refused="stalled", why=why, http_status=None)
                gateway._note(call)
                return self._answer(400, f"stalled: {why}", "invalid_request_error")
            self._send_on(target, headers, body, call, fmt, model, started)

    def _send_on(self, target: str, headers: list, body: bytes, call: dict, fmt: str, model: str,
                 started: float) -> None:
        gateway = self.owner
        try:
            connection, response = gateway.send(self.command, target, headers, body)
        except UpstreamError as exc:
            if exc.kind == "untrusted":
                gateway.end("gateway_not_allowed", f"The model gateway refused its upstream: {exc.message}.")
            call.update(http_status=None, error=exc.message)
            gateway._note(call)
            return self._answer(502, exc.message, "api_error")
        self._relay(connection, response, call, fmt, model, started)

    def _idle(self, fmt: str, body: bytes) -> str:
        """'' or why the attempt made no progress for too long (``IdleWatch``), for a call of the main
        conversation (one that offers tools; a side call, such as a CLI's call for its session title, does
        not count)."""
        watch = self.owner.idle
        if watch is None:
            return ""
        try:
            data = json.loads(body) if body else None
        except ValueError:
            return ""
        if not isinstance(data, dict) or not data.get("tools"):
            return ""
        with self.owner._lock:
            return watch.called([str(block.get("content")) for block in results_of(fmt, data)])

    def _relay(self, connection, response, call: dict, fmt: str, model: str, started: float) -> None:
        gateway = self.owner
        streamed = "text/event-stream" in (response.getheader("Content-Type") or "")
        reader = UsageReader(fmt if 200 <= response.status < 300 else "", streamed)
        if (response.getheader("Content-Encoding") or "identity").strip().lower() not in ("", "identity"):
            # the gateway asked for plain bytes: an answer it cannot read for usage or for the key is not passed on
            response.close()
            gateway._release(connection, False)
            call.update(http_status=None, error="the upstream answered in an encoding the gateway cannot read")
            gateway._note(call)
            return self._answer(502, "the upstream answered in a content encoding the model gateway cannot read",
                                "api_error")
        self.send_response_only(response.status)  # the standard reason: an upstream's own words never pass
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value.replace(gateway.key, gateway.placeholder))
        # always chunked to the CLI, whatever the upstream's framing: the last chunk goes only once the call
        # is counted, so that the CLI's next call never reaches the meter before this one's spend
        chunked = self.command != "HEAD" and response.status not in (204, 304) and not 100 <= response.status < 200
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", "0")
        self.end_headers()
        self.connection.settimeout(CLIENT_WRITE_SECONDS)  # a CLI that stops reading is let go, the count goes on
        down = 0
        complete = False
        kept = bytearray() if (gateway.conversation is not None and fmt and 200 <= response.status < 300) else None
        client = True  # the CLI still reads: a CLI that goes away does not end the count (the provider bills on)
        key, placeholder = gateway.key.encode(), gateway.placeholder.encode()
        held = b""  # an upstream that echoes the key never shows it to the sandbox, even split between two reads
        try:
            while True:
                data = response.read1(_CHUNK) if self.command != "HEAD" else b""
                if not data:
                    response.read()  # ends the response (a length-framed one too): its connection is free again
                    complete = True
                    break
                down += len(data)
                reader.feed(data)
                if kept is not None and len(kept) + len(data) <= MAX_ANSWER_BYTES:
                    kept += data
                shown = (held + data).replace(key, placeholder) if key else held + data
                cut = len(shown) - key_start(shown, key)  # only what could begin the key waits for the next read
                shown, held = shown[:cut], shown[cut:]
                if chunked and client and shown:
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(shown), shown))
                        self.wfile.flush()
                    except OSError:
                        client, self.close_connection = False, True
                        if not fmt:
                            break
            if held and chunked and client:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(held), held))
        except (OSError, http.client.HTTPException):
            self.close_connection = True
        gateway._release(connection, complete and not response.will_close and response.isclosed())
        self._count(call, reader, fmt, model, response.status, started, down, streamed, complete)
        if kept is not None and complete and len(kept) == down:  # before the end: the next call comes after it
            try:
                gateway.conversation.answered(call["path"], bytes(kept), streamed, call.get("usage") or {})
            except Exception:  # noqa: BLE001 - the conversation is evidence for people; the call is served anyway
                call["conversation_error"] = True
        if chunked and not self.close_connection:
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True

    def _count(self, call: dict, reader: UsageReader, fmt: str, model: str, status: int, started: float, down: int,
               streamed: bool, complete: bool) -> None:
        """Put one answered call in the meter and the ledger."""
        gateway = self.owner
        usage, answered = reader.finish()
        billed = bool(fmt) and 200 <= status < 300
        # an answer cut before its end may have been billed past what it said: its cost is unknown
        cost = prices.cost(answered or model, usage) if billed and complete else None
        call.update(http_status=status, seconds=round(time.time() - started, 3), bytes_down=down,
                    streamed=streamed, usage=usage, cost_usd=cost, billed=billed, complete=complete,
                    model=answered or model)
        if billed:
            gateway.meter.spent(usage, cost)
            calls = reader.calls()
            call["tool_calls"] = [{"name": gateway.redact(name[:200]), "input": gateway.redact(given[:2000])}
                                  for name, given in calls[:10]]
            with gateway._lock:
                loop = gateway.watch.answered(calls)
            if loop:
                loop = gateway.redact(loop)
                gateway.end("stalled", f"The attempt was stopped by its model gateway: {loop}.")
                call["stalled"] = loop
        gateway._note(call)
