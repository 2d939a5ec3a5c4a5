"""Real worker and beat processes of the tests (``Solo``, ``Beat``, ``engine_env``), the scripted agent
steps they run (``stub``; the one-stage pipeline they drive is tests/support/runs.py ``QUICK``) and what
the tests ask of the processes (``live_attempt``, ``agent_tree``, ``gone``, ``dead``, ``tree_gone``)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
from django.conf import settings

from engine.models import Attempt
from engine.processes.process import find_marked
from engine.processes.worker_process import stop_worker, worker_argv

from ..conftest import ANSWER_STEP, Workers, wait_until
from .runs import var

BASE_DIR = Path(settings.BASE_DIR)


class Solo:
    """A real ``celery -A controlpanel worker`` with one pool process (or ``concurrency``), listening to
    its own queue."""

    def __init__(self, log_dir: Path, queue: str, loglevel: str = "info", concurrency: int = 1, **env):
        self.queue, self.loglevel, self.concurrency = queue, loglevel, concurrency
        self.log = log_dir / f"worker-{queue}-{uuid.uuid4().hex[:6]}.log"
        self.env = {**Workers(1, log_dir).env(), "CP_QUEUE": queue, "CP_HEARTBEAT_INTERVAL": "0.5",
                    **{k: str(v) for k, v in env.items()}}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Solo":
        argv = worker_argv(self.concurrency, queue=self.queue, loglevel=self.loglevel)
        argv[argv.index("-n") + 1] = f"solo-{uuid.uuid4().hex[:8]}@%h"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=str(BASE_DIR), env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while b" ready." not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"worker did not start:\n{self.text()[-4000:]}")
            time.sleep(0.1)
        return self

    def kill(self) -> None:
        """SIGKILL to the worker's process group: the main process and its pool process die at once."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_worker(self.proc)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def gone(pid: int, cmd_part: str) -> bool:
    """True when no live process ``pid`` runs a command containing ``cmd_part`` (a reused pid does not count)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE or cmd_part not in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return True


class Beat:
    """A real ``celery -A controlpanel beat`` process; it runs each reconciliation pass itself
    (controlpanel/beat.py), and would send any other entry of the schedule to ``queue``."""

    def __init__(self, log_dir: Path, queue: str, url: str, **env):
        tag = uuid.uuid4().hex[:6]
        self.log = log_dir / f"beat-{queue}-{tag}.log"
        self.schedule = log_dir / f"beat-{queue}-{tag}.schedule"
        self.env = {**Workers(1, log_dir).env(), "CP_QUEUE": queue, **engine_env(url, **env)}
        self.proc: subprocess.Popen | None = None

    def launch(self) -> "Beat":
        argv = [sys.executable, "-m", "celery", "-A", "controlpanel", "beat", "-l", "info", "-s", str(self.schedule),
                "--max-interval", "1"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=str(BASE_DIR), env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> "Beat":
        deadline = time.monotonic() + timeout
        while "beat: Starting..." not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"beat did not start:\n{self.text()[-4000:]}")
            time.sleep(0.1)
        return self

    def start(self) -> "Beat":
        return self.launch().wait_ready()

    def sent(self) -> int:
        """How many reconciliation passes this beat has made (in its own process: controlpanel/beat.py)."""
        return len(self.results())

    def results(self) -> list[dict]:
        """The counts of every reconciliation pass this beat made, from its log."""
        found = re.findall(r"reconciliation pass \(reconcile\) in the beat process: (\{[^}]*\})", self.text())
        return [json.loads(item) for item in found]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def stub(text: str, seconds: float, side: str | None = None) -> dict:
    """A scenario step: print ``text``, write app/core.py, then (optionally) append one line to
    ``side``, a file in the run's data folder (outside the worktree: the sandbox lets the agent
    write there, and the test read it), and keep a small process tree (sh and a sleep) alive for
    ``seconds``."""
    launch = f'echo launch $$ >> "$CP_DATA_DIR/{side}"; ' if side else ""
    return {**ANSWER_STEP, "print": [text], "run": ["sh", "-c", f"{launch}sleep {seconds} & wait"]}


def live_attempt(run_id: int, text: str | None = None) -> Attempt | None:
    """The run's running attempt once its agent started (and, with ``text``, printed it to its log)."""
    attempt = Attempt.objects.filter(run_id=run_id, status="running").exclude(pid=None).first()
    if attempt is None:
        return None
    if text is not None and (not var(attempt.log_path).exists() or text not in var(attempt.log_path).read_text()):
        return None
    return attempt


def dead(proc: psutil.Process) -> bool:
    """``proc`` has exited (a zombie not yet reaped counts: none of its threads runs)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def agent_tree(attempt: Attempt) -> list[psutil.Process]:
    """The live processes of an attempt's agent: the scripted agent, its sh and the sh's sleep
    (all carry the attempt's CP_PROCESS_MARKER)."""
    tree = wait_until(lambda: len(found := find_marked(attempt.marker)) >= 3 and found, 10, "the agent's tree")
    assert attempt.pid in {proc.pid for proc in tree}
    return tree


def tree_gone(attempt: Attempt) -> bool:
    """The attempt's agent and every process carrying its CP_PROCESS_MARKER are gone."""
    return gone(attempt.pid, "scripted_agent.py") and not find_marked(attempt.marker)


#: Seconds without a heartbeat before a step counts as interrupted (every worker's CP_HEARTBEAT_STALE).
STALE = 3.0


#: Seconds between the beats' reconciliation passes (CP_RECONCILE_PERIOD).
PERIOD = 2.0


#: Seconds a queued run or a handed-off step may wait unclaimed before it is sent again (CP_QUEUED_STALE).
QUEUED_STALE = 3.0


def engine_env(url: str, **extra) -> dict:
    """The environment every engine process of these tests gets on top of its base one."""
    return {"CELERY_BROKER_URL": url, "CP_HEARTBEAT_INTERVAL": "0.5", "CP_HEARTBEAT_STALE": str(STALE),
            "CP_RECONCILE_PERIOD": str(PERIOD), "CP_QUEUED_STALE": str(QUEUED_STALE),
            **{k: str(v) for k, v in extra.items()}}
