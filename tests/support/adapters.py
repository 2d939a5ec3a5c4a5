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


def attempt_request(tmp_path: Path, adapter: str, role: str, scenario=None, deadline: float = 60, *,
                    env: dict | None = None, files: dict | None = None, **profile) -> AgentRequest:
    """An AgentRequest of ``adapter`` for one attempt in tmp_path: workspace ``work`` (a git repo holding
    README.md and ``files``), logs, prompt, HOME, marker; ``scenario``: the scripted endpoint's turns; ``env``:
    the attempt's environment (the test process's by default)."""
    work = tmp_path / "work"
    if not work.exists():
        make_repo(work, {"README.md": "hello\n", **(files or {})})
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    (control / "prompt.md").write_text("Do the scripted task.\n", encoding="utf-8")
    if scenario is not None:
        profile["scripted_endpoint"] = {"default": scenario}
    operation = {"reviewer": "review", "documenter": "document"}.get(role, "implement")
    return AgentRequest(
        role=role, operation=operation, prompt="Do the scripted task.", workspace=str(work),
        profile={"adapter": adapter, **profile}, deadline_seconds=deadline, log_path=str(control / "out.log"),
        raw_path=str(control / "out.raw"), env=dict(os.environ if env is None else env), stage_key="s",
        attempt_number=1, control_dir=str(control), prompt_path=str(control / "prompt.md"),
        home_dir=str(tmp_path / "attempt-home"), marker=f"cp-test-{adapter}-{uuid.uuid4().hex[:12]}")


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
