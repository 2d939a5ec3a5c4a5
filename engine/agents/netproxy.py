"""The egress proxy of one attempt: the only way out of an agent's network namespace.

An agent and its gates run in a network namespace of their own (engine/agents/sandbox.py):
loopback only. When a profile needs its model, the engine starts an ``EgressProxy`` for the
attempt on a Unix socket in a folder bound into the sandbox, and the bridge inside
(engine/agents/netbridge.py) makes it an ordinary HTTP proxy on the sandbox's 127.0.0.1. The
design follows Anthropic's sandbox-runtime (``@anthropic-ai/sandbox-runtime`` on npm:
bubblewrap, a network namespace, an HTTP proxy over a Unix socket with a domain allow-list),
built here on our own bubblewrap layer so that one sandbox serves the agent CLIs, the test
adapter and the gates alike.

What it speaks: ``CONNECT host:port`` (HTTPS through ``HTTPS_PROXY``; the bridge's port
forwards), and absolute-form requests (``GET http://host:port/path HTTP/1.1``, plain HTTP
through ``HTTP_PROXY``), which it turns into origin-form on a direct connection. Everything
else gets ``400``.

What it allows (``allowed``): a host on the allow-list, by exact name or ``*.suffix``, on any
port, or ``host:port`` on that port only. A loopback or private address is allowed only when
listed with its port. Never, whatever the list says: an address in ``deny`` (the database, the
broker and the Control Panel, ``engine.boundary.service_addresses``), checked on every address
the name resolves to, in canonical form (an IPv4-mapped IPv6 address is its IPv4 address); a
service on this host (a loopback, unspecified or own interface address) is denied on every local
form of the address (``127.0.0.2``, ``0.0.0.0``, ``[::ffff:127.0.0.1]``, the host's own IPs).
The connection goes to the address that was checked, never to a second resolution of the name.
A refusal answers ``403`` and is kept in ``refused`` (host, port, why, seconds since the proxy
started), which the engine records on the attempt.

No Django imports.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil

from .netbridge import splice

_HEAD_LIMIT = 65536
#: Seconds to wait for a connection to an allowed host.
CONNECT_TIMEOUT_SECONDS = 15.0
#: Seconds a client has, in all, to send its request head.
HEAD_DEADLINE_SECONDS = 20.0
#: Seconds one direction of a proxied connection may stay silent before that direction is closed
#: (an hour: a model's streamed answer, with its request long sent, must not be cut; the number
#: of connections is bounded by MAX_CONNECTIONS, and they end with the attempt's sandbox).
IDLE_TIMEOUT_SECONDS = 3600.0
#: Connections one proxy serves at once; more are answered 503 at once (threads, descriptors
#: and memory of the worker stay bounded whatever the agent opens).
MAX_CONNECTIONS = 64
#: At most this many refusals are kept (an agent looping on a refused host stays bounded).
MAX_RECORDED = 200


def split_host_port(text: str, default_port: int | None = None) -> tuple[str, int | None]:
    """``"host:443"`` -> ``("host", 443)``, ``"[::1]:80"`` -> ``("::1", 80)``, ``"host"`` -> ``("host", default_port)``.

    Raises ValueError for a port that is not a number from 1 to 65535.
    """
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if not port:
        return host.lower(), default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port in {text!r}")
    return host.lower(), int(port)


def numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a numeric host text names in any form the C library accepts (``127.1``,
    ``2130706433``, ``0x7f000001``, ``0177.0.0.1``), or None."""
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def is_internal(address) -> bool:
    """Whether an ip_address is loopback, private, link-local or unspecified."""
    return address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified


def is_internal_host(host: str) -> bool:
    """Whether ``host`` is a loopback, private, link-local or unspecified address (IPv4-mapped and
    numeric forms included), or ``localhost``."""
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    address = canonical(host) or numeric_ipv4(host)
    return address is not None and is_internal(address)


def canonical(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``address`` as an ip_address, an IPv4-mapped IPv6 address as its IPv4 one (zone dropped);
    None for what is no IP address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def host_addresses() -> set:
    """The canonical addresses of this host's own interfaces (psutil.net_if_addrs)."""
    found = set()
    try:
        for addresses in psutil.net_if_addrs().values():
            for item in addresses:
                if item.family in (socket.AF_INET, socket.AF_INET6):
                    ip = canonical(item.address)
                    if ip is not None:
                        found.add(ip)
    except OSError:
        pass
    return found


def _resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (an IP literal is itself); empty when it does not resolve."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError):
        return []


@dataclass
class EgressProxy:
    """An HTTP proxy on a Unix socket that connects only to allowed hosts.

    ``allow``: entries ``host``, ``*.suffix``, ``host:port`` or ``*.suffix:port`` (names lower
    case; a loopback or private address must name its port). ``deny``: ``(address, port)`` pairs
    never connected to, whatever the name; port 0 denies every port of that address.
    ``resolver(host, port) -> [address]`` is ``socket.getaddrinfo`` by default (tests pass
    their own). ``start()`` makes a private folder (``socket_dir``, mode 0700) with
    ``proxy.sock`` in it and serves from a daemon thread; ``stop()`` closes it and removes the
    folder. ``refused`` and ``connected`` are lists of ``{"host", "port", "why"?, "at"}``
    (``at``: seconds since start), at most MAX_RECORDED each.
    """

    allow: list[str]
    deny: set[tuple[str, int]] = field(default_factory=set)
    resolver: Callable[[str, int], list[str]] = _resolve
    refused: list[dict] = field(default_factory=list)
    connected: list[dict] = field(default_factory=list)
    socket_dir: str = ""

    def __post_init__(self) -> None:
        self._rules = []
        for entry in self.allow:
            host, port = split_host_port(entry)
            self._rules.append((host, port))
        self._own = host_addresses()
        self._deny_exact = set()  # (canonical ip, port); port 0: every port
        self._deny_local_ports = set()  # ports of services on this host: denied on every local address
        for address, port in self.deny:
            ip = canonical(address)
            if ip is None:
                continue
            self._deny_exact.add((ip, port))
            if self._is_local(ip):
                self._deny_local_ports.add(port)
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    # ------------------------------------------------------------------ policy

    def _is_local(self, ip) -> bool:
        return ip.is_loopback or ip.is_unspecified or ip in self._own

    def _denied(self, address: str, port: int) -> bool:
        ip = canonical(address)
        if ip is None:
            return True  # what does not parse is not connected to
        if (ip, port) in self._deny_exact or (ip, 0) in self._deny_exact:
            return True
        return self._is_local(ip) and (port in self._deny_local_ports or 0 in self._deny_local_ports)

    def allowed(self, host: str, port: int) -> tuple[bool, str]:
        """``(True, "")`` when ``host:port`` may be reached, else ``(False, why)``."""
        ok, why, _address = self.check(host, port)
        return ok, why

    def check(self, host: str, port: int) -> tuple[bool, str, str | None]:
        """``(True, "", address to connect to)`` when ``host:port`` may be reached, else
        ``(False, why, None)``. Every address the name resolves to must pass."""
        host = host.lower().strip("[]").rstrip(".")
        internal = is_internal_host(host)
        listed, with_port = False, False
        for rule_host, rule_port in self._rules:
            if rule_port is not None and rule_port != port:
                continue
            if internal and rule_port is None:
                continue  # an internal address is allowed only with its port named
            if rule_host == host or (rule_host.startswith("*.") and host.endswith(rule_host[1:])):
                listed, with_port = True, with_port or rule_port is not None
        if not listed:
            return False, f"{host}:{port} is not on the attempt's network allow-list", None
        addresses = self.resolver(host, port)
        if not addresses:
            return False, f"{host} does not resolve", None
        for address in addresses:
            ip = canonical(address)
            if ip is not None and is_internal(ip) and not with_port:
                return (False, f"{host} resolves to {address}, a loopback or private address: it is allowed only "
                               f"when listed with its port", None)
            if self._denied(address, port):
                return (False, f"{host}:{port} ({address}) is a service of the Control Panel (database, broker or web)",
                        None)
        return True, "", addresses[0]

    def _record(self, bucket: list[dict], host: str, port: int, why: str = "") -> None:
        with self._lock:
            if len(bucket) < MAX_RECORDED:
                item = {"host": host, "port": port, "at": round(time.monotonic() - self._started, 3)}
                if why:
                    item["why"] = why
                bucket.append(item)

    # ------------------------------------------------------------------ lifecycle

    @property
    def socket_path(self) -> str:
        """The Unix socket's path (``<socket_dir>/proxy.sock``); raises RuntimeError before ``start()``."""
        if not self.socket_dir:
            raise RuntimeError("the egress proxy is not started")
        return os.path.join(self.socket_dir, "proxy.sock")

    def start(self) -> "EgressProxy":
        """Bind the socket (in a new short folder under /tmp: a Unix socket path has at most 107 bytes) and serve."""
        if self._server is not None:
            return self
        self.socket_dir = tempfile.mkdtemp(prefix="cp-net-", dir="/tmp")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.socket_path)
        server.listen(64)
        self._server = server
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._accept_loop, name="egress-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close the socket and remove its folder. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            try:
                server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            server.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.socket_dir:
            for name in ("proxy.sock",):
                try:
                    os.unlink(os.path.join(self.socket_dir, name))
                except OSError:
                    pass
            try:
                os.rmdir(self.socket_dir)
            except OSError:
                pass

    def __enter__(self) -> "EgressProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while True:
            server = self._server
            if server is None:
                return
            try:
                client, _ = server.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                self._record(self.refused, "", 0, f"more than {MAX_CONNECTIONS} connections at once")
                threading.Thread(target=self._answer, args=(client, 503, "too many connections at once"),
                                 daemon=True).start()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            self._handle(client)
        finally:
            self._slots.release()

    # ------------------------------------------------------------------ one connection

    def _handle(self, client: socket.socket) -> None:
        try:
            deadline = time.monotonic() + HEAD_DEADLINE_SECONDS
            head = b""
            while b"\r\n\r\n" not in head:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ValueError(f"no complete request head within {HEAD_DEADLINE_SECONDS:g} s")
                client.settimeout(left)
                data = client.recv(4096)
                if not data:
                    client.close()
                    return
                head += data
                if len(head) > _HEAD_LIMIT:
                    self._answer(client, 431, "request head too large")
                    return
            head, _, rest = head.partition(b"\r\n\r\n")
            first, _, headers = head.partition(b"\r\n")
            parts = first.decode("latin-1").split(" ")
            if len(parts) != 3:
                self._answer(client, 400, "not an HTTP proxy request")
                return
            method, target, version = parts
            if method.upper() == "CONNECT":
                host, port = split_host_port(target)
                if port is None:
                    raise ValueError("CONNECT needs host:port")
                origin_head = None
            elif target.lower().startswith("http://"):
                authority, slash, path = target[7:].partition("/")
                host, port = split_host_port(authority, 80)
                origin = f"{method} {slash}{path or ''} {version}\r\n".encode("latin-1")
                origin_head = origin + headers + b"\r\n\r\n" + rest
            else:
                self._answer(client, 400, "only CONNECT and http:// absolute-form requests are proxied")
                return
        except (OSError, ValueError, UnicodeError) as exc:
            self._answer(client, 400, f"bad proxy request: {exc}")
            return
        ok, why, address = self.check(host, port)
        if not ok:
            self._record(self.refused, host, port, why)
            self._answer(client, 403, f"refused by the Control Panel's sandbox: {why}")
            return
        try:  # the address that was checked: a second lookup of the name could answer another
            upstream = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_SECONDS)
            for end in (client, upstream):  # a direction silent this long is closed
                end.settimeout(IDLE_TIMEOUT_SECONDS)
        except OSError as exc:
            self._answer(client, 502, f"cannot reach {host}:{port}: {exc}")
            return
        self._record(self.connected, host, port)
        try:
            if origin_head is None:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if rest:
                    upstream.sendall(rest)
            else:
                upstream.sendall(origin_head)
        except OSError:
            client.close()
            upstream.close()
            return
        splice(client, upstream)

    @staticmethod
    def _answer(client: socket.socket, status: int, text: str) -> None:
        reason = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large",
                  502: "Bad Gateway"}.get(status, "Error")
        body = (text + "\n").encode("utf-8", "replace")
        try:
            client.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                           f"Connection: close\r\n\r\n".encode() + body)
        except OSError:
            pass
        client.close()
