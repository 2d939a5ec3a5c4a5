"""The pinned codex CLI of the tests (``make agents``; its tests skip without it) and an attempt's
request for it (``make_request``: a git workspace, logs, prompt, HOME and marker under the test's folder)."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.agents import AgentRequest
from engine.agents.cli_adapter import find_executable

from .adapters import attempt_request


CODEX = find_executable("codex")


needs_codex = pytest.mark.skipif(CODEX is None, reason="the pinned codex CLI is not installed: run `make agents`")


def make_request(tmp_path: Path, role: str, scenario=None, deadline: float = 60, **profile) -> AgentRequest:
    """A codex attempt's request (tests/support/adapters.py ``attempt_request``)."""
    return attempt_request(tmp_path, "codex", role, scenario, deadline, **profile)


def stub_codex(path: Path, body: str = "exit 0") -> Path:
    """A stand-in codex answering ``--version`` and ``exec --help`` with the words of 0.171.0 that check() needs."""
    words = ("--sandbox read-only workspace-write --config --json --skip-git-repo-check --ignore-user-config "
             "--ignore-rules --output-last-message --cd")
    path.write_text(f"#!/bin/sh\ncase \"$1 $2\" in\n  '--version '*) echo 'codex-cli 0.171.0';;\n"
                    f"  'exec --help') echo '{words}';;\n  *) {body};;\nesac\n")
    path.chmod(0o755)
    return path
