"""Start and stop a Celery worker of the Run Engine as a separate process (demo and tests).

The worker is the real one (``celery -A controlpanel worker``); this only launches it with
``WORKER_FLAGS`` (the flags of ``make worker`` and docker-compose.yml too; a test keeps the three
equal) and waits until it says it is ready.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


#: The flags every Run Engine worker starts with: here, in the Makefile's ``worker`` line and in
#: docker-compose.yml's worker command (tests/test_crash_recovery.py asserts they are the same).
#: The engine uses none of these Celery features (its liveness is its own heartbeat in the
#: database and the reconciliation): no gossip (worker-to-worker events; Celery 5.7 also logs an
#: error with a traceback on every broker reconnect while restarting it), no mingle (a 1 s
#: neighbour sync at every start and reconnect), no worker event heartbeat. Fewer fanout
#: channels on the broker, and the configuration the tests run is the one deployed.
WORKER_FLAGS: tuple[str, ...] = ("--without-gossip", "--without-mingle", "--without-heartbeat")


def worker_argv(concurrency: int = 2, queue: str | None = None, loglevel: str = "info",
                beat: bool = False) -> list[str]:
    """The argument array of a worker: a prefork pool of ``concurrency`` processes consuming
    ``queue`` (default: CP_QUEUE or "runs"), with ``WORKER_FLAGS``; ``beat`` embeds the beat
    scheduler (one per system)."""
    queue = queue or os.environ.get("CP_QUEUE", "runs")
    argv = [sys.executable, "-m", "celery", "-A", "controlpanel", "worker", "-l", loglevel, "-c", str(concurrency),
            "-Q", queue, *WORKER_FLAGS, "-n", f"engine-{os.getpid()}@%h"]
    if beat:
        schedule = os.path.join(os.environ.get("CP_VAR_DIR", str(BASE_DIR / "var")), f"celerybeat-schedule-{os.getpid()}")
        argv += ["-B", "-s", schedule]
    return argv


def start_worker(log_path: str, env: dict | None = None, concurrency: int = 2, ready_timeout: float = 60.0,
                 beat: bool = False, queue: str | None = None) -> subprocess.Popen:
    """Launch a worker (``worker_argv(concurrency, queue)``) in its own session writing to ``log_path``;
    returns once it logged 'ready'.

    Raises RuntimeError (with the log's tail) when it exits or is not ready within ``ready_timeout`` seconds.
    """
    log = open(log_path, "ab")
    proc = subprocess.Popen(worker_argv(concurrency, queue=queue, beat=beat), cwd=str(BASE_DIR),
                            env=env or os.environ.copy(), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}:\n{_tail(log_path)}")
        if b" ready." in Path(log_path).read_bytes():
            return proc
        time.sleep(0.2)
    stop_worker(proc)
    raise RuntimeError(f"the worker was not ready after {ready_timeout:.0f} s:\n{_tail(log_path)}")


def stop_worker(proc: subprocess.Popen, timeout: float = 60.0) -> int | None:
    """Warm shutdown: SIGTERM to the worker's main process only (Celery then lets the steps in
    progress finish; a SIGTERM to the pool processes would kill them mid-step), then SIGKILL
    to its process group after ``timeout`` seconds."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
    return proc.returncode


def _tail(path: str, size: int = 4000) -> str:
    data = Path(path).read_bytes()
    return data[-size:].decode("utf-8", errors="replace")
