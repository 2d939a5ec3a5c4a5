"""Driving a run in the test's own process (``drive``: the steps a worker would take, from the hand-off
tokens the ``sent`` fixture collected) and the one-stage pipelines most tests drive (``stage``,
``run_with``, ``gated_run``, ``QUICK_STAGE``), and ``full``: a pipeline that sets every field of the format."""
from __future__ import annotations

from pathlib import Path

import pytest

from django.conf import settings

from engine import operations, runner
from engine.agents import executables
from engine.models import Attempt, Run

from ..conftest import ANSWER_STEP, pipeline_definition
from .claude import stub_claude
from .codex import stub_codex

#: One stage whose gate is `true`: these tests are about context, records and processes, not gates.
QUICK = [{"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
          "gates": [{"name": "unit", "command": "true"}]}]


def drive(run_id: int, sent: list, limit: int = 30) -> Run:
    """Take steps the way a worker would, following the hand-off tokens, until the run stops."""
    for _ in range(limit):
        if not sent:
            break
        run_id, token = sent.pop(0)
        runner.advance(run_id, token)
    return Run.objects.get(pk=run_id)


PASS = {"verdict": {"verdict": "pass", "findings": []}}


#: The gate of most tests here: the same check as tests/test_core.py without pytest's start-up time.
QUICK_GATE = "python -c 'from app import core; assert core.answer() == 42, core.answer()'"


def stage(**extra) -> list[dict]:
    return [{"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**", "tests/**"],
             "gates": [{"name": "unit", "command": QUICK_GATE}], **extra}]


def run_with(make_pipeline, repo, sent, ops: dict, stages=None, **extra):
    pipeline = make_pipeline(stages=stages or stage(), scenario={"stages": {"answer": ops}}, **extra)
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    return drive(run.pk, sent, limit=30)


def var(rel: str) -> Path:
    return Path(settings.VAR_DIR) / rel


def operations_of(run) -> list[str]:
    return [a.operation for a in Attempt.objects.filter(run=run).order_by("number")]


def gated_run(make_pipeline, repo, sent, ops=None):
    run = run_with(make_pipeline, repo, sent, ops or {"implement": [ANSWER_STEP]}, stages=stage(human_gate=True))
    assert (run.status, run.stop_reason) == ("waiting_approval", "human_gate"), run.stop_message
    return run


QUICK_STAGE = [{"key": "answer", "requirement": "say hello", "scope": ["**"],
                "gates": [{"name": "ok", "command": "test -f hello.txt"}]}]


QUICK_SCENARIO = {"stages": {"answer": {"implement": [{"write": {"hello.txt": "hi\n"}}]}}}


def full():
    """A valid pipeline that writes every level, with an inline scenario using every step key."""
    return {
        "format": 1,
        "name": "full",
        "description": "every level",
        "master_plan": "docs/PLAN.md",
        "spec_index": "docs/INDEX.md",
        "protected_paths": ["tests/**"],
        "documentation_paths": ["docs/**"],
        "exclude": ["build/"],
        "baseline_checks": ["true", {"name": "base", "command": "make check", "deadline": 60, "network_allow": ["pypi.org"]}],
        "budgets": {"max_active_seconds": 600, "max_attempts": 4, "max_cost_usd": 2.5},
        "deadlines": {"implement": 100, "review": 100, "repair": 100, "document": 100, "gate": 100},
        "roles": {"implementer": "claude", "reviewer": "claude", "documenter": "claude"},
        "profiles": {
            "claude": {"adapter": "claude-code", "model": "m", "max_turns": 5, "executable": str(executables.TOOLS_BIN / "claude"),
                       "extra_args": ["--verbose"], "env": {"LANG": "C"}, "base_url": "https://example.org",
                       "network_allow": ["pypi.org"], "description": "d"},
            "sim": {"adapter": "scripted", "scenario": {
                "description": "a scenario",
                "default": [{"write": {"a.py": "x"}, "delete": ["b.py"], "print": ["hi"], "sleep": 0.5, "exit": 0,
                             "run": ["true"], "verdict": {"verdict": "pass"}, "final_message": "done",
                             "usage": {"input_tokens": 1, "output_tokens": 1, "cached_tokens": 0,
                                       "reasoning_tokens": 0, "cost_usd": 0.1}}],
                "stages": {"one": {"implement": [{"exit": 0}]}},
            }},
        },
        "stages": [
            {"key": "one", "title": "One", "requirement": "Do one.", "scope": ["src/**"], "docs": ["README.md"],
             "depends_on": [], "gates": ["pytest -q", {"name": "unit", "command": "pytest"}],
             "repair_allowance": 1, "human_gate": True},
        ],
    }


def cli_pipeline(make_pipeline, tmp_path, adapter: str, **profile):
    """A pipeline whose every role is played by a real-CLI profile ``cli`` (a stand-in executable)."""
    stub = stub_claude(tmp_path / "claude", "exit 0") if adapter == "claude-code" else stub_codex(tmp_path / "codex")
    return make_pipeline(name=f"pf-{adapter}", stages=QUICK, roles={role: "cli" for role in operations.ROLES},
                         profiles={"cli": {"adapter": adapter, "executable": str(stub), **profile}})


def refused(pipeline, repo, code: str) -> operations.OperationError:
    """Creating a run of ``pipeline`` is refused with ``code`` on field ``profile``, and nothing is created."""
    control = Path(settings.VAR_DIR) / "runs"
    before = sorted(control.iterdir()) if control.exists() else []
    with pytest.raises(operations.OperationError) as info:
        operations.create_run(pipeline, str(repo), "main")
    assert (info.value.code, info.value.field) == (code, "profile"), info.value.message
    assert not Run.objects.exists()
    assert (sorted(control.iterdir()) if control.exists() else []) == before  # no control folder either
    return info.value


def cli_definition(executable: str, name="evil") -> dict:
    doc = pipeline_definition(name=name)
    doc["roles"] = {"implementer": "cli", "reviewer": None, "documenter": None}
    doc["profiles"]["cli"] = {"adapter": "claude-code", "executable": executable}
    return doc
