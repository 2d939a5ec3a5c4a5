"""The pinned codex CLI of the tests (``make agents``; its tests skip without it) and an attempt's
request for it (``make_request``: a git workspace, logs, prompt, HOME and marker under the test's folder)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from engine.agents import AgentRequest
from engine.agents.cli_adapter import find_executable

from ..conftest import make_repo


CODEX = find_executable("codex")


needs_codex = pytest.mark.skipif(CODEX is None, reason="the pinned codex CLI is not installed: run `make agents`")


def make_request(tmp_path: Path, role: str, scenario=None, deadline: float = 60, **profile) -> AgentRequest:
    """An AgentRequest for one attempt in tmp_path: workspace ``work`` (a git repo), logs, prompt, HOME, marker."""
    work = tmp_path / "work"
    if not work.exists():
        make_repo(work, {"README.md": "hello\n"})
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    (control / "prompt.md").write_text("Do the scripted task.\n", encoding="utf-8")
    if scenario is not None:
        profile["scripted_endpoint"] = {"default": scenario}
    return AgentRequest(
        role=role, operation="review" if role == "reviewer" else "implement", prompt="Do the scripted task.",
        workspace=str(work), profile={"adapter": "codex", **profile}, deadline_seconds=deadline,
        log_path=str(control / "out.log"), raw_path=str(control / "out.raw"), env=dict(os.environ), stage_key="s",
        attempt_number=1, control_dir=str(control), prompt_path=str(control / "prompt.md"),
        home_dir=str(tmp_path / "attempt-home"), marker=f"cp-test-codex-{uuid.uuid4().hex[:12]}")


def stub_codex(path: Path, body: str = "exit 0") -> Path:
    """A stand-in codex answering ``--version`` and ``exec --help`` with the words of 0.171.0 that check() needs."""
    words = ("--sandbox read-only workspace-write --config --json --skip-git-repo-check --ignore-user-config "
             "--ignore-rules --output-last-message --cd")
    path.write_text(f"#!/bin/sh\ncase \"$1 $2\" in\n  '--version '*) echo 'codex-cli 0.171.0';;\n"
                    f"  'exec --help') echo '{words}';;\n  *) {body};;\nesac\n")
    path.chmod(0o755)
    return path
