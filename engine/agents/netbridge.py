"""The network bridge that runs first inside an agent's sandbox (stdlib only; no project imports).

Usage (built by ``engine.agents.sandbox.wrap`` when a ``NetworkPolicy`` is given)::

    python -I -S netbridge.py --socket /run/cp-net/proxy.sock --proxy-port 3128 \
        [--forward 127.0.0.1:PORT ...] -- COMMAND [ARG ...]

The sandbox has a network namespace of its own: only its loopback, nothing of the host. The
one way out is the engine's egress proxy (``engine.agents.netproxy``) on a Unix socket bound into the
sandbox. This bridge makes that socket usable by ordinary programs:

* ``127.0.0.1:<proxy-port>`` inside the namespace is an HTTP proxy: each connection is passed
  byte for byte to the Unix socket (give it as ``HTTPS_PROXY``/``HTTP_PROXY``);
* each ``--forward HOST:PORT`` (a loopback endpoint the policy allows, such as the scripted
  model endpoint on the worker's 127.0.0.1) listens on the same address inside the namespace and
  reaches it through the proxy with ``CONNECT HOST:PORT``: the CLI keeps its base URL as it is.

The proxy decides what is allowed; the bridge decides nothing. It then runs COMMAND as its child
and exits with its status (128 + N when signal N ended it). It ignores SIGINT, SIGTERM and SIGHUP:
the engine signals each process of the tree itself, and the bridge ends when its child does (or by
SIGKILL). An agent that kills the bridge only cuts its own network.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading

_CHUNK = 65536


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF, then half-close ``dst``."""
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways between ``a`` and ``b`` until both ends are done; closes both (also used by
    the engine's egress proxy, engine/agents/netproxy.py)."""
    other = threading.Thread(target=_pipe, args=(b, a), daemon=True)
    other.start()
    _pipe(a, b)
    other.join()
    a.close()
    b.close()


def _open_proxy(path: str) -> socket.socket:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    upstream.connect(path)
    return upstream


def _serve_proxy(client: socket.socket, path: str) -> None:
    try:
        upstream = _open_proxy(path)
    except OSError:
        client.close()
        return
    splice(client, upstream)


def _serve_forward(client: socket.socket, path: str, target: str) -> None:
    """CONNECT ``target`` through the proxy, then splice; the proxy's refusal closes the client."""
    try:
        upstream = _open_proxy(path)
        upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            data = upstream.recv(4096)
            if not data:
                break
            head += data
        status = head.split(b" ", 2)[1:2]
        if status != [b"200"]:
            upstream.close()
            client.close()
            return
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            client.sendall(rest)
    except OSError:
        client.close()
        return
    splice(client, upstream)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(64)
    return server


def _accept_loop(server: socket.socket, handler, *args) -> None:
    while True:
        try:
            client, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=handler, args=(client, *args), daemon=True).start()


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("netbridge: usage: netbridge.py --socket PATH --proxy-port N [--forward HOST:PORT] -- COMMAND",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="netbridge")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--proxy-port", type=int, required=True)
    parser.add_argument("--forward", action="append", default=[])
    options = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        print("netbridge: no command", file=sys.stderr)
        return 2
    servers = [(_listen("127.0.0.1", options.proxy_port), _serve_proxy, (options.socket,))]
    for target in options.forward:
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        servers.append((_listen(host, int(port)), _serve_forward, (options.socket, target)))
    for server, handler, args in servers:
        threading.Thread(target=_accept_loop, args=(server, handler, *args), daemon=True).start()
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"netbridge: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127

    # the engine signals every process of the tree itself (engine/processes/process.py): passing a signal on
    # would give the CLI a second SIGINT (one of the CLIs ends at once on a second one, without cleaning up)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    while True:
        try:
            status = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
            continue
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
