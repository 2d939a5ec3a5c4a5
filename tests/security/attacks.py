"""Shared pieces of the hostile-agent suite: a run whose implementer is the real ``claude`` CLI
driven by the scripted model endpoint, which makes the tool calls an attacker would.

The model is scripted (no network here, no credentials), the CLI and everything it runs are real:
``claude`` parses the scripted answers, runs the Bash tool inside the engine's sandbox, and the
engine takes the steps as a worker would (``tests.test_steps.drive``).
"""
from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.agents.claude.adapter import find_executable
from engine.models import Attempt, Run

from ..conftest import PASS_REVIEW
from ..support.runs import drive

needs_claude = pytest.mark.skipif(find_executable("claude") is None,
                                  reason="run `make agents` to install the pinned claude CLI")

#: A stage whose gate always passes: the attack, not the code, is what these tests look at.
QUICK_STAGE = {"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
               "gates": [{"name": "unit", "command": "true"}]}


def bash_turns(*commands: str, final: str = "Done.") -> dict:
    """A scripted-endpoint conversation: one Bash tool call per command, then a final answer."""
    turns = [{"tools": [{"tool": "Bash", "input": {"command": command, "description": "step", "timeout": 60000}}]}
             for command in commands]
    return {"turns": [*turns, {"text": final}]}


def claude_attack_pipeline(make_pipeline, commands: list[str], *, stages=None, profile_extra=None, name="attack",
                           **extra):
    """A saved pipeline: the real claude implementer runs ``commands`` with its Bash tool; a
    scripted reviewer passes and a scripted documenter changes nothing. ``extra``: more top-level
    fields of the pipeline (e.g. ``limits``)."""
    stages = stages or [QUICK_STAGE]
    endpoint = {"stages": {stage["key"]: {"implement": bash_turns(*commands)} for stage in stages}}
    scenario = {"stages": {stage["key"]: {"review": [PASS_REVIEW]} for stage in stages}}
    return make_pipeline(
        name=name, stages=stages, reviews=False,
        roles={"implementer": "claude", "reviewer": "scripted", "documenter": "scripted"},
        profiles={"claude": {"adapter": "claude-code", "max_turns": 10, "scripted_endpoint": endpoint,
                             **(profile_extra or {})},
                  "scripted": {"adapter": "scripted", "scenario": scenario}},
        deadlines={"implement": 120, "gate": 60}, **extra)


def start_and_drive(pipeline, repo, sent) -> Run:
    """Create a run of ``pipeline`` on ``repo``, start it and take its steps until it stops."""
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="security-test", source="test")
    return drive(run.pk, sent)


def attempt_output(run: Run, operation: str = "implement") -> str:
    """The raw (redacted) output of the run's first attempt of ``operation``: the CLI's stream,
    tool results included."""
    attempt = Attempt.objects.filter(run=run, operation=operation).order_by("number").first()
    assert attempt is not None, f"run {run.pk} has no {operation} attempt ({run.status}: {run.stop_message})"
    return (Path(settings.VAR_DIR) / attempt.raw_path).read_text(errors="replace")


def tool_results(run: Run, operation: str = "implement") -> str:
    """What the tools of the run's first ``operation`` attempt returned (the Bash tool's stdout and
    stderr), one result after another: what the agent saw, without the commands it was given."""
    found = []
    for line in attempt_output(run, operation).splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") != "user":
            continue
        for block in (event.get("message") or {}).get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                found.append(content if isinstance(content, str) else json.dumps(content))
    return "\n".join(found)


class Listener:
    """A TCP server on 127.0.0.1 standing for a service of the Control Panel: it counts the
    connections it accepts (from any process of this host's network namespace)."""

    def __init__(self, port: int = 0):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        """What is done with an accepted connection before it is closed (subclasses: more)."""

    def close(self) -> None:
        self.sock.close()


def answers_here(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at host:port from the test process."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False
