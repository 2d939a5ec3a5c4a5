"""What the model gateway adds to a model call: latency per request, and the speed of a long streamed answer.

Usage::

    .venv/bin/python bench/model_gateway.py                 # 400 requests, a 10 MB answer, 5 rounds
    .venv/bin/python bench/model_gateway.py --requests 100 --mb 2 --rounds 3

The upstream runs in a process of its own on loopback (as a provider is elsewhere): a threaded
``http.server`` with HTTP/1.1 keep-alive that answers ``POST /v1/messages`` with a small Anthropic
Messages event stream (usage in it, as a real answer has) and ``POST /v1/messages?long=1`` with a long event
stream of ``--mb`` megabytes of text deltas. Each is timed directly and through an
``engine.model_gateway.ModelGateway`` in front of the same upstream (the key swapped for its
placeholder, the usage read, the ledger written to a file, a token cap checked before each call),
from one keep-alive client connection each, direct and through the gateway in turn in every round
so that the machine's load falls on both alike.

Targets (issue 18): the median latency the gateway adds to a request under 5 ms; and a long answer
sent at ``--rate`` MB/s (100: faster than any provider streams a model's answer) arrives through the
gateway at least 0.9 as fast as directly (best of the rounds of each). The same answer unthrottled
is measured and printed too: what relaying costs in this one Python process, where the gateway's
threads and the benchmark's client share the interpreter. Prints PASS or FAIL and exits 0 or 1.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.model_gateway import Meter, ModelGateway, caps_of  # noqa: E402

KEY = "sk-bench-upstream-key-0000000000"
SMALL = (b'event: message_start\ndata: {"type":"message_start","message":{"model":"claude-sonnet-4-5","usage":'
         b'{"input_tokens":1000,"output_tokens":1}}}\n\nevent: content_block_delta\ndata: {"type":"content_block_'
         b'delta","index":0,"delta":{"type":"text_delta","text":"ok"}}\n\nevent: message_delta\ndata: {"type":'
         b'"message_delta","usage":{"output_tokens":20}}\n\n')


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    stream_bytes = 10 * 1024 * 1024
    #: bytes a second the long answer is sent at (0: as fast as the loopback takes it)
    rate = 0.0

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if not self.path.endswith("?long=1"):
            self.send_header("Content-Length", str(len(SMALL)))
            self.end_headers()
            self.wfile.write(SMALL)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        frame = b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"' + b"x" * 900 + b'"}}\n\n'
        block = frame * 64
        sent = 0
        start = time.perf_counter()
        while sent < self.stream_bytes:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            sent += len(block)
            if self.rate:
                ahead = sent / self.rate - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
        tail = b'data: {"type":"message_delta","usage":{"output_tokens":5}}\n\n'
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))


def post(connection: http.client.HTTPConnection, path: str, key: str) -> int:
    body = json.dumps({"model": "claude-sonnet-4-5", "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    connection.request("POST", path, body=body, headers={"x-api-key": key, "content-type": "application/json"})
    response = connection.getresponse()
    size = 0
    while True:
        data = response.read1(262144)
        if not data:
            break
        size += len(data)
    size += len(response.read())  # ends the response, so that the connection takes the next request
    assert response.status == 200, response.status
    return size


def timed_requests(port: int, key: str, count: int) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    post(connection, "/v1/messages", key)  # the connection is open before the clock starts
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        post(connection, "/v1/messages", key)
        seconds.append(time.perf_counter() - start)
    connection.close()
    return seconds


def timed_stream(port: int, key: str) -> tuple[float, int]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    post(connection, "/v1/messages", key)
    start = time.perf_counter()
    size = post(connection, "/v1/messages?long=1", key)  # a model call: metered, its usage read as it passes
    elapsed = time.perf_counter() - start
    connection.close()
    return elapsed, size


def serve(mb: float, rate_mb: float) -> None:
    """The upstream, in a process of its own (as a provider is): prints its port, serves until killed."""
    Upstream.stream_bytes, Upstream.rate = int(mb * 1024 * 1024), rate_mb * 1e6
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


def upstream_process(mb: float, rate_mb: float) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen([sys.executable, __file__, "--serve", "--mb", str(mb), "--rate", str(rate_mb)],
                             stdout=subprocess.PIPE, text=True)
    return child, int(child.stdout.readline())


def stream_ratio(port: int, gateway_port: int, placeholder: str, rounds: int) -> tuple[float, float, int]:
    """Best-of-``rounds`` seconds of the long answer, direct and through the gateway, alternating; and its size."""
    direct, through = [], []
    size = 0
    for _ in range(rounds):
        seconds, size = timed_stream(port, KEY)
        direct.append(seconds)
        seconds, size_through = timed_stream(gateway_port, placeholder)
        through.append(seconds)
        assert size_through == size, (size_through, size)
    return min(direct), min(through), size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--mb", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=100.0,
                        help="MB/s the upstream sends the long answer at for the target (a link faster than any "
                             "provider streams); the unthrottled relay is measured and printed as well")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(args.mb, args.rate)
        return 0
    work = Path(tempfile.mkdtemp(prefix="cp-bench-gateway-"))
    children = []
    try:
        fast, fast_port = upstream_process(args.mb, 0)
        paced, paced_port = upstream_process(args.mb, args.rate)
        children = [fast, paced]
        gateways = [ModelGateway(f"http://127.0.0.1:{port}", KEY, Meter(caps=caps_of({"max_tokens": 10 ** 12})),
                                 ledger_path=str(work / f"model-calls-{port}.jsonl")).start()
                    for port in (fast_port, paced_port)]
        ports = [int(gateway.origin.rsplit(":", 1)[1]) for gateway in gateways]
        cpu = time.process_time()
        direct, through = [], []
        per_round = max(1, args.requests // args.rounds)
        for _ in range(args.rounds):
            direct += timed_requests(fast_port, KEY, per_round)
            through += timed_requests(ports[0], gateways[0].placeholder, per_round)
        fast_direct, fast_through, size = stream_ratio(fast_port, ports[0], gateways[0].placeholder, args.rounds)
        paced_direct, paced_through, _ = stream_ratio(paced_port, ports[1], gateways[1].placeholder, args.rounds)
        cpu = time.process_time() - cpu
        for gateway in gateways:
            gateway.stop()
        calls = sum(len(path.read_text().splitlines()) for path in work.glob("model-calls-*.jsonl"))
        expected = len(through) + args.rounds + 2 * args.rounds * 2  # warm-ups, requests, streams
        tokens = sum(gateway.meter.attempt.tokens for gateway in gateways)
    finally:
        for child in children:
            child.kill()
            child.wait()
    added_ms = (statistics.median(through) - statistics.median(direct)) * 1000
    ratio = paced_direct / paced_through
    print(f"requests: {len(direct)} direct, median {statistics.median(direct) * 1000:.3f} ms; {len(through)} through "
          f"the gateway, median {statistics.median(through) * 1000:.3f} ms (p90 "
          f"{statistics.quantiles(through, n=10)[-1] * 1000:.3f} ms); added median {added_ms:.3f} ms")
    print(f"a {size / 1e6:.1f} MB answer sent at {args.rate:g} MB/s: direct {size / paced_direct / 1e6:.1f} MB/s, "
          f"through the gateway {size / paced_through / 1e6:.1f} MB/s (best of {args.rounds}); ratio {ratio:.3f}")
    print(f"the same answer unthrottled on loopback: direct {size / fast_direct / 1e6:.0f} MB/s, through the gateway "
          f"{size / fast_through / 1e6:.0f} MB/s (what relaying costs this Python process: the gateway, the client "
          f"and their GIL share it)")
    print(f"the gateways metered {tokens} tokens in {calls} ledger lines; this process used {cpu:.1f} CPU seconds")
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    problems = []
    if added_ms >= 5.0:
        problems.append(f"the gateway adds {added_ms:.2f} ms a request at the median (target < 5 ms)")
    if ratio < 0.9:
        problems.append(f"a long answer through the gateway runs at {ratio:.2f} of the direct speed (target >= 0.9)")
    if calls != expected:
        problems.append(f"the ledgers have {calls} lines for {expected} calls")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(f"PASS: the model gateway adds {added_ms:.3f} ms a request at the median (< 5 ms) and streams a "
          f"{size / 1e6:.0f} MB answer at {ratio:.2f} of the direct speed (>= 0.9)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
