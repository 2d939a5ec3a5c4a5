"""The pinned gemini CLI of the tests (``make agents``; its tests skip without it) and an attempt's
request for it (``make_request``: a git workspace, logs, prompt, HOME and marker under the test's folder)."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.agents import AgentRequest
from engine.agents.cli_adapter import find_executable

from .adapters import attempt_request


GEMINI = find_executable("gemini")


needs_gemini = pytest.mark.skipif(GEMINI is None, reason="the pinned gemini CLI is not installed: run `make agents`")


def make_request(tmp_path: Path, role: str, scenario=None, deadline: float = 90, files=None, **profile) -> AgentRequest:
    """A gemini attempt's request (tests/support/adapters.py ``attempt_request``)."""
    return attempt_request(tmp_path, "gemini-cli", role, scenario, deadline, files=files, **profile)
