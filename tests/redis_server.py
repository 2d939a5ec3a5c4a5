"""A private ``redis-server`` for tests that stop and restart their broker.

The shared Redis on 6379 is never touched: ``RedisServer`` starts its own server on a free
loopback port, keeping nothing on disk (``--save "" --appendonly no``), so a restart loses
every message and binding, as a crashed broker without persistence would.
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: What to install when there is no redis-server binary (the tests skip with this reason).
INSTALL_HINT = "needs the redis-server binary on PATH (Debian/Ubuntu: apt-get install redis-server)"


def redis_binary() -> str | None:
    """The path of ``redis-server`` on PATH, or None."""
    return shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1:``port`` (a free port when None), logging to ``log_dir``.

    ``start()`` returns once the server answers PING; ``stop()`` sends SIGTERM and waits; a
    stopped server can be started again on the same port (it comes back empty). Raises
    RuntimeError when there is no binary or the server does not answer within 10 s.
    """

    def __init__(self, log_dir: Path, port: int | None = None):
        self.binary = redis_binary()
        self.port = port or free_port()
        self.log = Path(log_dir) / f"redis-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        """The broker URL of database 0 of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        if self.binary is None:
            raise RuntimeError(INSTALL_HINT)
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.log.parent), "--protected-mode", "yes"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + 10
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{self.text()[-2000:]}")
            time.sleep(0.05)
        self.starts += 1
        return self

    def ping(self) -> bool:
        """True when the server answers PING (a raw RESP exchange, no client library)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (redis-server's clean shutdown), then SIGKILL after ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
