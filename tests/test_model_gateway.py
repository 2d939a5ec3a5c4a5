"""The model gateway of an attempt (engine/model_gateway), against real loopback servers.

What the gateway forwards is checked where it arrives: the scripted model endpoint records every
request it receives (headers and body), and a small streaming server shows that an answer passes
through as it is made. No Django: the gateway is the engine's, the attempt's records come later
(tests/security/test_model_gateway_runs.py runs the four CLIs through it).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.model_gateway import Meter, ModelGateway, caps_of, prices, spend_of
from engine.model_gateway.usage import UsageReader, total, wire_format
from engine.scripted_endpoint import ScriptedEndpoint

KEY = "sk-upstream-real-key-never-in-the-sandbox-1234"


def call(gateway: ModelGateway, path: str, body: dict, key: str | None = None, header: str = "x-api-key",
         query: str = "") -> tuple[int, bytes]:
    """POST ``body`` to the gateway as a CLI would; ``(status, body)``."""
    connection = http.client.HTTPConnection("127.0.0.1", int(gateway.origin.rsplit(":", 1)[1]), timeout=30)
    headers = {"content-type": "application/json"}
    if key is not None:
        headers[header] = f"Bearer {key}" if header == "authorization" else key
    connection.request("POST", path + query, body=json.dumps(body).encode(), headers=headers)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


@contextlib.contextmanager
def upstream(handler):
    """A loopback upstream served by ``handler`` (a BaseHTTPRequestHandler class); yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def post_raw(gateway: ModelGateway):
    """POST ``{}`` to the gateway with its placeholder; ``(connection, response)`` with the answer unread."""
    connection = http.client.HTTPConnection("127.0.0.1", int(gateway.origin.rsplit(":", 1)[1]), timeout=10)
    connection.request("POST", "/v1/messages", body=b"{}", headers={"x-api-key": gateway.placeholder})
    return connection, connection.getresponse()


def messages(turns: int, model: str = "claude-sonnet-4-5", stream: bool = True) -> dict:
    """An Anthropic Messages request whose history holds ``turns`` assistant turns (the scripted endpoint
    answers its turn number ``turns``)."""
    history = []
    for _ in range(turns):
        history += [{"role": "user", "content": "go on"}, {"role": "assistant", "content": "working"}]
    return {"model": model, "max_tokens": 100, "stream": stream, "tools": [{"name": "Bash"}],
            "messages": history + [{"role": "user", "content": "go on"}]}


def looping(n: int, input_tokens: int = 1000, output_tokens: int = 20) -> dict:
    """A scenario that asks for a command ``n`` times, each answer reporting the same usage."""
    return {"turns": [{"tool": "Bash", "input": {"command": "true"},
                       "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}] * n}


def test_the_key_goes_upstream_in_place_of_the_placeholder_and_a_request_without_it_goes_nowhere():
    with ScriptedEndpoint(looping(5)) as endpoint, ModelGateway(endpoint.url, KEY).start() as gateway:
        assert gateway.placeholder.startswith("cp-gateway-") and KEY not in gateway.placeholder
        for key in (None, "sk-ant-something-else", KEY):  # no key, another key, even the real key itself
            status, body = call(gateway, "/v1/messages", messages(0), key)
            assert status == 401 and b"does not carry the attempt's key" in body
        assert endpoint.requests == [] and gateway.refused_requests == 3
        for header in ("x-api-key", "authorization"):
            status, _ = call(gateway, "/v1/messages", messages(0), gateway.placeholder, header)
            assert status == 200
        # Gemini sends its key as x-goog-api-key or as ?key=
        status, _ = call(gateway, "/v1beta/models/gemini-2.5-flash:generateContent", {"contents": []},
                         gateway.placeholder, "x-goog-api-key")
        assert status == 200
        status, _ = call(gateway, "/v1beta/models/gemini-2.5-flash:generateContent", {"contents": []},
                         query=f"?key={gateway.placeholder}")
        assert status == 200
        sent = [{**found, "headers": {k.lower(): v for k, v in found["headers"].items()}} for found in endpoint.requests]
        assert sent[0]["headers"]["x-api-key"] == KEY and sent[1]["headers"]["authorization"] == f"Bearer {KEY}"
        assert sent[2]["headers"]["x-goog-api-key"] == KEY and sent[3]["path"].endswith(f"?key={KEY}")
        assert gateway.placeholder not in json.dumps(sent)
    # once the attempt ended, its placeholder opens nothing: the gateway is gone
    with pytest.raises(OSError):
        call(gateway, "/v1/messages", messages(0), gateway.placeholder)


def test_usage_is_read_from_each_wire_format_streamed_and_not():
    scenario = {"turns": [{"tool": "Bash", "input": {"command": "true"},
                           "usage": {"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 5,
                                     "cache_creation_input_tokens": 3, "cached_input_tokens": 4,
                                     "reasoning_output_tokens": 2, "promptTokenCount": 30,
                                     "candidatesTokenCount": 6, "cachedContentTokenCount": 10,
                                     "thoughtsTokenCount": 1}}]}
    with ScriptedEndpoint(scenario) as endpoint, ModelGateway(endpoint.url, KEY).start() as gateway:
        for stream in (True, False):
            assert call(gateway, "/v1/messages", messages(0, stream=stream), gateway.placeholder)[0] == 200
        responses = {"model": "gpt-5", "stream": True, "input": [{"role": "user", "content": "go"}]}
        assert call(gateway, "/v1/responses", responses, gateway.placeholder, "authorization")[0] == 200
        assert call(gateway, "/v1beta/models/gemini-2.5-flash:streamGenerateContent", {"contents": []},
                    query=f"?alt=sse&key={gateway.placeholder}")[0] == 200
        record = gateway.record()
    anthropic = {"input_tokens": 11, "cached_tokens": 5, "cache_creation_tokens": 3, "output_tokens": 7,
                 "reasoning_tokens": None}
    assert [c["usage"] for c in record["ledger"][:2]] == [anthropic, anthropic]
    assert [c["streamed"] for c in record["ledger"][:2]] == [True, False]
    # OpenAI counts the cached input among its input_tokens; the ledger keeps them apart
    assert record["ledger"][2]["format"] == "responses" and record["ledger"][2]["usage"] == {
        "input_tokens": 11 - 4, "cached_tokens": 4, "cache_creation_tokens": None, "output_tokens": 7,
        "reasoning_tokens": 2}
    # Gemini: the prompt count includes the cached part; thoughts are output beside the candidates
    assert record["ledger"][3]["model"] == "gemini-2.5-flash" and record["ledger"][3]["usage"] == {
        "input_tokens": 20, "cached_tokens": 10, "cache_creation_tokens": None, "output_tokens": 7,
        "reasoning_tokens": 1}
    assert record["calls"] == 4 and record["usage"]["output_tokens"] == 28
    # Chat Completions, streamed with its usage in the last chunk
    reader = UsageReader(wire_format("/v1/chat/completions"), streamed=True)
    for piece in (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\nda', b'ta: {"model":"gpt-4.1","usage":{"prompt_'
                  b'tokens":50,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":20}}}\n\ndata: [DONE]\n'):
        reader.feed(piece)
    usage, model = reader.finish()
    assert model == "gpt-4.1" and usage["input_tokens"] == 30 and usage["cached_tokens"] == 20
    assert total(usage) == 59


def test_a_call_that_would_cross_a_token_cap_never_leaves():
    meter = Meter(caps=caps_of({"attempt": {"max_tokens": 3500}}))
    with ScriptedEndpoint(looping(10)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        answered = []
        for turn in range(10):
            status, body = call(gateway, "/v1/messages", messages(turn), gateway.placeholder)
            answered.append(status)
            if status != 200:
                break
        # 1,020 tokens a call: the fourth would read at least 1,000 more on top of 3,060
        assert answered == [200, 200, 200, 400] and b"budget reached" in body
        assert len(endpoint.requests) == 3
        assert gateway.stop_kind == "budget_reached" and "budgets.attempt.max_tokens: 3500" in gateway.stop_message
        # nothing more leaves once a cap was reached
        assert call(gateway, "/v1/messages", messages(3), gateway.placeholder)[0] == 400
        assert len(endpoint.requests) == 3
        record = gateway.record()
    assert record["meter"]["attempt"]["tokens"] == 3060 and record["ledger"][3]["refused"] == "budget_reached"


def test_the_run_and_stage_caps_count_what_earlier_attempts_spent():
    meter = Meter(caps=caps_of({"max_tokens": 5000}), before={"run": spend_of(None, {"input_tokens": 4000})})
    meter.before = {name: type(meter.attempt)(**found) for name, found in
                    {"run": {"tokens": 4000, "cost_usd": 0.0, "unpriced_calls": 0}}.items()}
    with ScriptedEndpoint(looping(5)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        assert call(gateway, "/v1/messages", messages(0), gateway.placeholder)[0] == 200
        assert call(gateway, "/v1/messages", messages(1), gateway.placeholder)[0] == 400
        assert len(endpoint.requests) == 1 and "budgets.max_tokens: 5000" in gateway.stop_message


def test_a_dollar_cap_prices_each_call_and_refuses_a_model_without_a_price():
    # claude-sonnet-4-5: $3 in, $15 out a million tokens: 1,000 in and 20 out cost $0.0033
    meter = Meter(caps=caps_of({"stage": {"max_cost_usd": 0.01}}))
    with ScriptedEndpoint(looping(10)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        statuses = [call(gateway, "/v1/messages", messages(turn), gateway.placeholder)[0] for turn in range(4)]
        assert statuses == [200, 200, 200, 400] and len(endpoint.requests) == 3
        assert "budgets.stage.max_cost_usd" in gateway.stop_message
        assert gateway.usage()["cost_usd"] == pytest.approx(3 * 0.0033)
    meter = Meter(caps=caps_of({"max_cost_usd": 5}))
    with ScriptedEndpoint(looping(3)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        status, body = call(gateway, "/v1/messages", messages(0, model="claude-unreleased-9"), gateway.placeholder)
        assert status == 400 and b"has no price" in body and endpoint.requests == []
    # a token cap bounds the same spend: the unpriced model may run, its cost unknown (never 0)
    meter = Meter(caps=caps_of({"max_cost_usd": 5, "attempt": {"max_tokens": 100000}}))
    with ScriptedEndpoint(looping(3)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        assert call(gateway, "/v1/messages", messages(0, model="claude-unreleased-9"), gateway.placeholder)[0] == 200
        assert gateway.usage()["cost_usd"] is None and gateway.usage()["input_tokens"] == 1000


def test_the_price_table_names_its_version_and_knows_dated_names_only():
    assert prices.VERSION and prices.table()["sources"]["anthropic"].startswith("https://")
    assert prices.price_of("claude-sonnet-4-5-20250929") == prices.price_of("claude-sonnet-4-5")
    assert prices.price_of("gpt-5-2025-08-07")["output"] == 10.0
    assert prices.price_of("claude-sonnet-4-5-evil") is None and prices.price_of("gpt-5-turbo-x") is None
    assert prices.cost("no-such-model", {"input_tokens": 10}) is None
    assert prices.cost("gpt-5", {"input_tokens": 1_000_000, "cached_tokens": 1_000_000, "output_tokens": 0}) == 1.375


class _Slow(BaseHTTPRequestHandler):
    """An upstream that streams two events a second apart."""

    protocol_version = "HTTP/1.1"
    second = threading.Event()

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in (b'data: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":5}}}\n\n',
                      b'data: {"type":"message_delta","usage":{"output_tokens":2}}\n\n'):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            _Slow.second.wait(10)
        self.wfile.write(b"0\r\n\r\n")


def test_an_answer_streams_through_as_it_is_made():
    with upstream(_Slow) as url:
        with ModelGateway(url, KEY).start() as gateway:
            connection, response = post_raw(gateway)
            first = response.read1(65536)
            # the first event arrived while the upstream still holds back the second one
            assert b"message_start" in first and not _Slow.second.is_set()
            _Slow.second.set()
            rest = response.read()
            assert b"message_delta" in first + rest
            connection.close()
            time.sleep(0.2)
            assert gateway.usage()["output_tokens"] == 2 and gateway.usage()["input_tokens"] == 5


def _tls_server(tmp_path):
    """A loopback HTTPS server with a self-signed certificate (openssl, a package of every machine of this
    kind: .ci/fresh-machine.txt); returns ``(server, certificate path)``."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl is part of the fresh machine (.ci/fresh-machine.txt)"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    endpoint = ScriptedEndpoint(looping(3)).start()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    endpoint._server.socket = context.wrap_socket(endpoint._server.socket, server_side=True)
    return endpoint, cert


def test_an_https_upstream_whose_certificate_the_worker_does_not_trust_is_refused(tmp_path):
    endpoint, cert = _tls_server(tmp_path)
    try:
        upstream = endpoint.url.replace("http://", "https://")
        with ModelGateway(upstream, KEY).start() as gateway:
            status, body = call(gateway, "/v1/messages", messages(0), gateway.placeholder)
            assert status == 502 and b"not trusted" in body
            assert gateway.stop_kind == "gateway_not_allowed" and "certificate" in gateway.stop_message
        assert endpoint.requests == []  # nothing was sent: the key never left on that connection
        # the same server, its certificate trusted (as SSL_CERT_FILE would make it): the call goes through
        with ModelGateway(upstream, KEY, context=ssl.create_default_context(cafile=str(cert))).start() as gateway:
            assert call(gateway, "/v1/messages", messages(0), gateway.placeholder)[0] == 200
        assert len(endpoint.requests) == 1 and endpoint.requests[0]["headers"]["x-api-key"] == KEY
    finally:
        endpoint.stop()


class _KeepAlive(BaseHTTPRequestHandler):
    """An upstream that keeps its connections open and frames each answer by its length (as providers do)."""

    protocol_version = "HTTP/1.1"
    peers: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _KeepAlive.peers.append(self.client_address)
        body = json.dumps({"model": "claude-haiku-4-5", "usage": {"input_tokens": 10, "output_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_calls_reuse_the_upstream_connection_after_a_length_framed_answer():
    with upstream(_KeepAlive) as url:
        with ModelGateway(url, KEY).start() as gateway:
            statuses = [call(gateway, "/v1/messages", messages(0, stream=False), gateway.placeholder)[0]
                        for _ in range(3)]
            assert statuses == [200, 200, 200]
            assert len(_KeepAlive.peers) == 3 and len(set(_KeepAlive.peers)) == 1  # one kept connection
            assert gateway.usage()["input_tokens"] == 30


@pytest.mark.parametrize("wire", ["anthropic", "anthropic-plain", "responses", "gemini"])
def test_the_same_tool_call_turn_after_turn_is_a_loop_that_ends_the_attempt(wire):
    from engine.model_gateway import LoopWatch

    tool = {"anthropic": "Bash", "anthropic-plain": "Bash", "responses": "exec_command", "gemini": "run_shell_command"}
    given = {"cmd" if wire == "responses" else "command": "pytest -q", "timeout": 5}
    scenario = {"turns": [{"tool": tool[wire], "input": given}] * 6}

    def ask(gateway, turn):
        if wire.startswith("anthropic"):
            return call(gateway, "/v1/messages", messages(turn, stream=wire == "anthropic"), gateway.placeholder)
        if wire == "responses":
            body = {"model": "gpt-5", "stream": True, "input": [{"role": "user", "content": "go"}] + [
                {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": str(i)}
                for i in range(turn)]}
            return call(gateway, "/v1/responses", body, gateway.placeholder, "authorization")
        body = {"contents": [{"role": "user", "parts": [{"text": "go"}]}] + [
            {"role": "model", "parts": [{"text": "x"}]} for _ in range(turn)]}
        return call(gateway, "/v1beta/models/gemini-2.5-flash:streamGenerateContent", body,
                    query=f"?alt=sse&key={gateway.placeholder}")

    with ScriptedEndpoint(scenario) as endpoint, \
            ModelGateway(endpoint.url, KEY, watch=LoopWatch(repeated=3)).start() as gateway:
        statuses = [ask(gateway, turn)[0] for turn in range(4)]
        assert statuses == [200, 200, 200, 400] and len(endpoint.requests) == 3
        assert gateway.stop_kind == "stalled" and "3 turns in a row" in gateway.stop_message
        assert "pytest -q" in gateway.stop_message and tool[wire] in gateway.stop_message
        record = gateway.record()
    assert [c["tool_calls"][0]["name"] for c in record["ledger"][:3]] == [tool[wire]] * 3
    assert record["ledger"][2]["stalled"] and record["ledger"][3]["refused"] == "stalled"
    # different inputs are progress, not a loop
    watch = LoopWatch(repeated=3)
    assert not any(watch.answered([("Bash", f'{{"command":"step {i}"}}')]) for i in range(10))
    assert not watch.answered([]) and LoopWatch(repeated=None).answered([("Bash", "x")]) == ""


def test_the_spend_is_said_against_the_run_caps():
    from engine.answers import spend_sentence

    assert spend_sentence({"tokens": 4100, "cost_usd": 0.0135, "caps": {"max_tokens": 5000, "max_cost_usd": 10}}) == (
        "4,100 tokens of 5,000 (budgets.max_tokens), $0.0135 of $10.00 (budgets.max_cost_usd)")
    assert spend_sentence({"tokens": 10, "cost_usd": None, "caps": {"max_tokens": None, "max_cost_usd": 2}}) == (
        "cost unknown, cap $2.00 (budgets.max_cost_usd)")
    assert spend_sentence({"tokens": 10, "caps": {"max_tokens": None, "max_cost_usd": None}}) == ""


@pytest.mark.django_db
def test_the_spend_so_far_shows_on_the_home_page_and_the_run_page(run_row, admin_client):
    from django.urls import reverse

    from engine.models import Attempt

    run = run_row(status="running", stage_statuses=("running",),
                  pipeline_kwargs={"budgets": {"max_tokens": 5000, "max_cost_usd": 10}})
    Run = type(run)
    Run.objects.filter(pk=run.pk).update(simulated=False)
    run.refresh_from_db()
    stage = run.stages.get()
    Attempt.objects.create(run=run, stage=stage, number=1, operation="implement", role="implementer",
                           profile_name="scripted", adapter="claude-code", status="running", deadline_seconds=60,
                           usage={"input_tokens": 4000, "output_tokens": 100, "cost_usd": 0.0135},
                           spend={"tokens": 4100, "cost_usd": 0.0135, "unpriced_calls": 0})
    home = admin_client.get("/admin/").content.decode()
    assert "4,100 tokens · $0.0135" in home
    header = admin_client.get(reverse("admin:engine_run_header", args=[run.pk])).content.decode()
    assert "4,100 tokens of 5,000 (budgets.max_tokens), $0.0135 of $10.00 (budgets.max_cost_usd)" in header


def test_calls_that_bring_no_new_result_and_change_no_file_are_a_stall(tmp_path):
    from engine.model_gateway import IdleWatch

    (tmp_path / "a.py").write_text("one\n")
    watch = IdleWatch(str(tmp_path), turns=4, minutes=None)
    assert [watch.called(["exit 0: ok"]) for _ in range(3)] == ["", "", ""]  # a new result, then the same twice
    (tmp_path / "a.py").write_text("two, longer\n")  # a file changed: progress
    assert watch.called(["exit 0: ok"]) == "" and watch.idle == 0
    assert watch.called(["something new"]) == "" and watch.idle == 0
    said = [watch.called(["exit 0: ok"]) for _ in range(4)]
    assert said[:3] == ["", "", ""] and "4 model calls in a row brought no new tool result" in said[3]
    assert "stall.idle_turns: 4" in said[3]
    # the minutes: measured from the last progress
    watch = IdleWatch(str(tmp_path), turns=None, minutes=2)
    assert watch.called(["first"], now=100.0) == "" and watch.called(["first"], now=150.0) == ""
    assert "minutes brought no new tool result" in watch.called(["first"], now=221.0)
    assert IdleWatch("", turns=None, minutes=None).called([]) == ""


def test_a_call_after_too_long_without_progress_is_not_sent(tmp_path):
    from engine.model_gateway import IdleWatch

    body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "stream": True, "tools": [{"name": "Bash"}],
            "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]}]}
    with ScriptedEndpoint({"turns": [{"text": "again"}] * 5}) as endpoint, \
            ModelGateway(endpoint.url, KEY, idle=IdleWatch(str(tmp_path), turns=3, minutes=None)).start() as gateway:
        # the first call brings a result the model had not seen; the next three bring it again, nothing changed
        statuses = [call(gateway, "/v1/messages", body, gateway.placeholder)[0] for _ in range(4)]
        assert statuses == [200, 200, 200, 400] and len(endpoint.requests) == 3
        assert gateway.stop_kind == "stalled" and "3 model calls in a row" in gateway.stop_message


def raw(gateway: ModelGateway, data: bytes) -> bytes:
    """Send ``data`` as it is to the gateway and read what it answers until it closes (or 5 s)."""
    import socket as sockets

    with sockets.create_connection(("127.0.0.1", int(gateway.origin.rsplit(":", 1)[1])), timeout=5) as conn:
        conn.sendall(data)
        got = b""
        try:
            while chunk := conn.recv(65536):
                got += chunk
        except OSError:
            pass
    return got


def test_what_is_not_a_model_call_a_bad_length_or_a_line_break_never_goes_upstream():
    meter = Meter(caps=caps_of({"attempt": {"max_tokens": 1500}}))
    with ScriptedEndpoint(looping(10)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        for path in ("/v1/messages/", "/v1/messages/batches", "/v1/completions", "/v1/embeddings"):
            status, body = call(gateway, path, messages(0), gateway.placeholder)
            assert status == 404 and b"not a model call the gateway forwards" in body, path
        key = gateway.placeholder.encode()
        for head in (b"Content-Length: -1", b"Content-Length: abc", b"Transfer-Encoding: chunked\r\nX: y"):
            answer = raw(gateway, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: " + key + b"\r\n" + head
                         + b"\r\n\r\n-1\r\nxx\r\n")
            assert answer.startswith((b"HTTP/1.1 413", b"HTTP/1.0 413")), (head, answer[:100])
        # without the key, nothing of the body is even read
        assert raw(gateway, b"POST /v1/messages HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n").startswith(b"HTTP/1.1 401")
        assert endpoint.requests == []
        # a gzip body is read for what it holds (and sent on decoded)
        import gzip as gzips

        packed = gzips.compress(json.dumps(messages(0)).encode())
        answer = raw(gateway, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-api-key: " + key +
                     b"\r\nContent-Encoding: gzip\r\nContent-Length: " + str(len(packed)).encode() + b"\r\n\r\n" + packed)
        assert answer.startswith(b"HTTP/1.1 200") and endpoint.requests[0]["body"]["model"] == "claude-sonnet-4-5"
        assert gateway.record()["ledger"][-1]["usage"]["input_tokens"] == 1000


def test_calls_sent_at_once_are_weighed_one_after_another_and_the_first_by_its_size():
    meter = Meter(caps=caps_of({"attempt": {"max_tokens": 3500}}))
    with ScriptedEndpoint(looping(20)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(
            call(gateway, "/v1/messages", messages(0), gateway.placeholder)[0])) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(answers).count(200) == 3 and len(endpoint.requests) == 3  # 3 x 1,020 tokens, then refused
        assert gateway.meter.attempt.tokens == 3060
    # a first call whose own size says it reads more than the cap is not sent
    meter = Meter(caps=caps_of({"attempt": {"max_tokens": 500}}))
    with ScriptedEndpoint(looping(2)) as endpoint, ModelGateway(endpoint.url, KEY, meter).start() as gateway:
        big = messages(0)
        big["messages"][0]["content"] = "word " * 20000  # 100 KB: at least 12,500 tokens
        status, body = call(gateway, "/v1/messages", big, gateway.placeholder)
        assert status == 400 and b"reads at least" in body and endpoint.requests == []


def test_a_kept_connection_opens_nothing_once_the_attempt_ended():
    with ScriptedEndpoint(looping(3)) as endpoint:
        gateway = ModelGateway(endpoint.url, KEY).start()
        connection = http.client.HTTPConnection("127.0.0.1", int(gateway.origin.rsplit(":", 1)[1]), timeout=10)
        body = json.dumps(messages(0)).encode()
        connection.request("POST", "/v1/messages", body=body, headers={"x-api-key": gateway.placeholder})
        first = connection.getresponse()
        first.read()
        assert first.status == 200
        gateway.stop()
        connection.request("POST", "/v1/messages", body=body, headers={"x-api-key": gateway.placeholder})
        assert connection.getresponse().status == 401 and len(endpoint.requests) == 1
        connection.close()


def test_a_made_up_tool_result_is_not_in_the_conversation(tmp_path):
    from engine.model_gateway.conversation import WireConversation

    said = WireConversation(tmp_path / "conversation.jsonl")
    with ScriptedEndpoint({"turns": [{"tool": "Bash", "input": {"command": "ls"}}, {"text": "done"}]}) as endpoint, \
            ModelGateway(endpoint.url, KEY, conversation=said).start() as gateway:
        assert call(gateway, "/v1/messages", messages(0), gateway.placeholder)[0] == 200
        issued = next(iter(said.issued))
        for tool_id, text in (("toolu_made_up", "42 passed in 0.31s"), (issued, "app.py")):
            body = messages(0)
            body["messages"] += [{"role": "assistant", "content": "x"}, {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tool_id, "content": text}]}]
            assert call(gateway, "/v1/messages", body, gateway.placeholder)[0] == 200
    entries = [json.loads(line) for line in (tmp_path / "conversation.jsonl").read_text().splitlines()]
    shown = " ".join(str(entry.get("detail", "")) + entry["text"] for entry in entries)
    assert "42 passed" not in shown and "app.py" in shown


class _Echo(BaseHTTPRequestHandler):
    """An upstream that echoes the key it was sent, in a header and split across two pieces of its body."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        sent = self.headers.get("x-api-key", "").encode()
        self.send_response(401)
        self.send_header("X-Echo", sent.decode())
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in (b'{"error": "bad key ' + sent[:10], sent[10:] + b'"}'):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            time.sleep(0.2)
        self.wfile.write(b"0\r\n\r\n")


def test_a_key_the_upstream_echoes_reaches_the_cli_as_the_placeholder():
    with upstream(_Echo) as url:
        with ModelGateway(url, KEY).start() as gateway:
            connection, response = post_raw(gateway)
            body = response.read()
            assert KEY.encode() not in body and KEY not in str(response.getheaders())
            assert gateway.placeholder.encode() in body and response.getheader("X-Echo") == gateway.placeholder
            connection.close()


def test_only_a_post_to_a_whole_model_path_goes_upstream_and_no_call_after_the_end():
    from engine.model_gateway import LoopWatch

    with ScriptedEndpoint(looping(10)) as endpoint, ModelGateway(endpoint.url, KEY).start() as gateway:
        key = gateway.placeholder.encode()
        for line in (b"GET /v1/chat/completions?limit=100", b"POST /v1/threads/t1/messages", b"DELETE /v1/messages",
                     b"POST /v1/./messages", b"GET /v1/models/x:generateContent/../../../v1/files"):
            answer = raw(gateway, line + b" HTTP/1.1\r\nHost: x\r\nx-api-key: " + key + b"\r\nContent-Length: 2\r\n\r\n{}")
            assert answer.startswith(b"HTTP/1.1 404"), (line, answer[:80])
        for head in (b"Content-Length: 2\r\nContent-Length: 40", b"Transfer-Encoding: gzip, chunked"):
            answer = raw(gateway, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: " + key + b"\r\n" + head
                         + b"\r\n\r\n{}")
            assert answer.startswith(b"HTTP/1.1 413"), (head, answer[:80])
        assert endpoint.requests == []
    # calls waiting for their turn are not sent once the attempt ended (here: a loop)
    meter = Meter(caps=caps_of({"attempt": {"max_tokens": 10 ** 9}}))
    with ScriptedEndpoint(looping(10)) as endpoint, \
            ModelGateway(endpoint.url, KEY, meter, watch=LoopWatch(repeated=2)).start() as gateway:
        answers = []
        threads = [threading.Thread(target=lambda turn=turn: answers.append(
            call(gateway, "/v1/messages", messages(turn), gateway.placeholder)[0])) for turn in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert gateway.stop_kind == "stalled" and len(endpoint.requests) == 2 and answers.count(200) == 2


@pytest.mark.parametrize("fmt, body, exit_code", [
    ("gemini", {"contents": [{"role": "user", "parts": [{"functionResponse": {
        "name": "run_shell_command", "response": {"output": "Output: hi\nExit Code: 3\nProcess Group PGID: 22"}}}]}]}, 3),
    ("gemini", {"contents": [{"role": "user", "parts": [{"functionResponse": {
        "name": "run_shell_command", "response": {"output": "Output: (empty)\nProcess Group PGID: 22"}}}]}]}, 0),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "c1",
                              "output": "Wall time: 0.1 seconds\nProcess exited with code 127\nOutput:\nnope"}]}, 127),
    ("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                              "content": "out\n\nCommand exited with code 2"}]}]}, 2),
])
def test_the_wire_conversation_says_the_exit_status_each_cli_told_its_model(fmt, body, exit_code, tmp_path):
    """Only Claude Code flags a failed command itself: the status codex, gemini and pi tell their model in
    the result's text makes the wire conversation's entry a failure with that status, never "exit status 0"."""
    from engine.text import transcript
    from engine.model_gateway.conversation import results_of

    blocks = results_of(fmt, body)
    assert len(blocks) == 1 and blocks[0]["is_error"] == (exit_code != 0)
    normalizer = transcript.Normalizer("claude")
    normalizer.tools[blocks[0]["tool_use_id"]] = "Bash"
    entries = normalizer.line(json.dumps({"type": "user", "message": {"content": blocks}}).encode())
    results = [e for e in entries if e["kind"] in ("tool_result", "refusal")]
    assert [(e.get("exit"), e["ok"]) for e in results] == [(exit_code, exit_code == 0)], results


def test_the_wire_conversation_keeps_tool_results_followed_by_a_message_of_the_clis_own():
    """From a fresh try of issue 20: a request whose results are followed by another user message (a CLI's
    reminder) lost them from the conversation (only the last message was read). Every user message since the
    model's last turn is read; those before it are not read again."""
    from engine.model_gateway.conversation import results_of

    body = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Write hello.txt."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t0", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "old"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "one"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "Exit code 3",
                                      "is_error": True},
                                     {"type": "text", "text": "<system-reminder>...</system-reminder>"}]},
        {"role": "user", "content": "a reminder of the CLI's own"},
    ]}
    blocks = results_of("anthropic", body)
    assert [(b["tool_use_id"], b["content"], b["is_error"]) for b in blocks] == [
        ("t1", "one", False), ("t2", "Exit code 3", True)]
