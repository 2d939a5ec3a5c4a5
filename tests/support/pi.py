"""The pinned pi CLI of the tests (``make agents``; its tests skip without it) and an attempt's
request for it (``make_request``: a git workspace, logs, prompt, HOME and marker under the test's folder)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.agents import AgentRequest
from engine.agents.cli_adapter import find_executable

from .adapters import attempt_request


PI = find_executable("pi")


needs_pi = pytest.mark.skipif(PI is None, reason="the pinned pi CLI is not installed: run `make agents`")


def make_request(tmp_path: Path, role: str, scenario=None, deadline: float = 60, env: dict | None = None,
                 **profile) -> AgentRequest:
    """A pi attempt's request (tests/support/adapters.py ``attempt_request``), with only PATH of the test
    process's environment unless ``env`` is given."""
    return attempt_request(tmp_path, "pi", role, scenario, deadline,
                           env=env if env is not None else {"PATH": os.environ["PATH"]}, **profile)
