"""What the adapter tests of every CLI read and write: an attempt's log (``log_of``) and a JSONL capture
(``write_jsonl``)."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from engine import boundary
from engine.agents import AgentRequest
from engine.redaction import secret_env_values

from ..conftest import make_repo


def log_of(request: AgentRequest) -> str:
    return Path(request.log_path).read_text(encoding="utf-8", errors="replace")


def write_jsonl(path: Path, events: list) -> None:
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events), encoding="utf-8")


def request_for(tmp_path, profile: dict, credentials: dict, prompt: str = "Write hello.txt.",
                deadline: int = 120) -> AgentRequest:
    """An implementer's request of ``profile`` in a new repository under ``tmp_path`` (work/), with
    PATH and ``credentials`` (what engine/boundary.py ``credential_env`` gave) as its environment; a
    repository already made there is kept."""
    work = tmp_path / "work"
    if not work.exists():
        make_repo(work, {"README.md": "hello\n"})
    control = tmp_path / "control"
    control.mkdir()
    (control / "prompt.md").write_text(prompt + "\n", encoding="utf-8")
    env = {"PATH": os.environ["PATH"], **credentials}
    return AgentRequest(
        role="implementer", operation="implement", prompt=prompt, workspace=str(work), profile=profile,
        deadline_seconds=deadline, log_path=str(control / "out.log"), raw_path=str(control / "out.raw"),
        stderr_path=str(control / "out.stderr"), env=env, stage_key="s", attempt_number=1,
        control_dir=str(control), prompt_path=str(control / "prompt.md"), home_dir=str(tmp_path / "home"),
        marker=f"cp-test-gateway-{uuid.uuid4().hex[:12]}", secrets=secret_env_values(env),
        deny_addresses=boundary.service_addresses())
