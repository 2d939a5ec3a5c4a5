"""The pinned pi CLI of the tests (``make agents``; its tests skip without it) and an attempt's
request for it (``make_request``: a git workspace, logs, prompt, HOME and marker under the test's folder)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from engine.agents import AgentRequest
from engine.agents.cli_adapter import find_executable

from ..conftest import make_repo


PI = find_executable("pi")


needs_pi = pytest.mark.skipif(PI is None, reason="the pinned pi CLI is not installed: run `make agents`")


def make_request(tmp_path: Path, role: str, scenario=None, deadline: float = 60, env: dict | None = None,
                 **profile) -> AgentRequest:
    """An AgentRequest for one attempt in tmp_path: workspace ``work`` (a git repo), logs, prompt, HOME, marker."""
    work = tmp_path / "work"
    if not work.exists():
        make_repo(work, {"README.md": "hello\n"})
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    (control / "prompt.md").write_text("Do the scripted task.\n", encoding="utf-8")
    if scenario is not None:
        profile["scripted_endpoint"] = {"default": scenario}
    operation = {"reviewer": "review", "documenter": "document"}.get(role, "implement")
    return AgentRequest(
        role=role, operation=operation, prompt="Do the scripted task.", workspace=str(work),
        profile={"adapter": "pi", **profile}, deadline_seconds=deadline, log_path=str(control / "out.log"),
        raw_path=str(control / "out.raw"), env=dict(env if env is not None else {"PATH": os.environ["PATH"]}),
        stage_key="s", attempt_number=1, control_dir=str(control), prompt_path=str(control / "prompt.md"),
        home_dir=str(tmp_path / "attempt-home"), marker=f"cp-test-pi-{uuid.uuid4().hex[:12]}")
