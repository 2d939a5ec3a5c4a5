"""Regressions found while proving stage context and attempt records: the dependency output
carries the implementer's message (not the reviewer's), a scenario command's output without a
final newline, a credential pasted into a pipeline (docs/field-cases.md C14), and the initial specification index.
Runs are driven in this process (real scripted agent processes), as in tests/test_steps.py.

Also here, because it needs no worker: a profile whose executable does not exist is refused
when the run is created (the run-level case, where it disappears after creation, is in
tests/test_issue3_runs.py).
"""
import json
import secrets
import string
import sys
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from engine import operations
from engine.models import Attempt, Pipeline, Run
from engine.pipeline.format import PipelineFormatError

from .conftest import ANSWER_STEP
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = [{"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
          "gates": [{"name": "unit", "command": "true"}]}]



def test_a_profile_whose_executable_is_missing_is_refused_at_creation(make_pipeline, repo, tmp_path, listed):
    missing = listed(tmp_path / "nowhere" / "claude")  # listed by the operator, and not there
    roles = {"implementer": "cli", "reviewer": "cli", "documenter": "cli"}
    pipeline = make_pipeline(name="cli", stages=QUICK, roles=roles,
                             profiles={"cli": {"adapter": "claude-code", "executable": str(missing)}})
    with pytest.raises(operations.OperationError) as info:
        operations.create_run(pipeline, str(repo), "main")
    assert (info.value.code, info.value.field) == ("agent_unavailable", "profile")
    assert str(missing) in info.value.message and "not found" in info.value.message
    assert not Run.objects.exists()  # nothing half created


def second_stage_prompt(make_pipeline, repo, sent, first_step: dict):
    """Run two stages (the second depends on the first, whose implementer does ``first_step``) to
    success; the run and the second implementer's saved prompt."""
    stages = [QUICK[0], {"key": "double", "requirement": "Add double().", "scope": ["app/**"],
                         "depends_on": ["answer"], "gates": [{"name": "unit", "command": "true"}]}]
    scenario = {"stages": {"answer": {"implement": [first_step]},
                           "double": {"implement": [{"print": "nothing to change"}]}}}
    run = operations.create_run(make_pipeline(stages=stages, scenario=scenario), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    attempt = Attempt.objects.get(run=run, stage__key="double", operation="implement")
    return run, (Path(settings.VAR_DIR) / attempt.prompt_path).read_text()


def test_the_dependency_output_carries_the_implementers_final_message(make_pipeline, repo, sent):
    final = "answer() returns 42 now (FINAL-" + secrets.token_hex(4) + ")"
    run, prompt = second_stage_prompt(make_pipeline, repo, sent, {**ANSWER_STEP, "final_message": final})
    assert f"Agent's final message:\n{final}" in prompt
    # issue 13: the second stage got the first stage's file list and message, not its patch
    first = run.stages.get(key="answer")
    assert ("The accepted patch (1 file, " in prompt and f"`git diff {first.base_commit} {first.checkpoint_commit}` "
            "shows it):\n```diff\ndiff --git a/app/core.py b/app/core.py") in prompt, prompt
    assert "+def answer():\n+    return 42\n```" in prompt


def test_a_long_accepted_patch_is_cut_and_the_rest_named_by_its_git_command(make_pipeline, repo, sent):
    from engine.steps import prompts

    body = "".join(f"LINE_{n:05d} = {n}\n" for n in range(6000))  # ~100 KB of new code
    run, prompt = second_stage_prompt(make_pipeline, repo, sent,
                                      {**ANSWER_STEP, "write": {**ANSWER_STEP["write"], "app/table.py": body}})
    first = run.stages.get(key="answer")
    assert f"[... cut at {prompts.DEPENDENCY_PATCH_BYTES:,} of " in prompt
    assert f"the rest: `git diff {first.base_commit} {first.checkpoint_commit}`]" in prompt
    assert "LINE_00010 = 10" in prompt and "LINE_05999" not in prompt


def test_a_scenario_command_whose_output_ends_without_a_newline_still_succeeds(make_pipeline, repo, sent, tmp_path):
    # inline: the scripted agent runs in the sandbox, where nothing of tmp_path but the worktree is seen
    step = {**ANSWER_STEP, "run": [sys.executable, "-c", "import os; os.write(1, b'progress 100%')"]}
    run = operations.create_run(make_pipeline(stages=QUICK, scenario={"stages": {"answer": {"implement": [step]}}}),
                                str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert (attempt.status, attempt.failure_kind) == ("succeeded", ""), attempt.failure_message
    assert run.status == "succeeded", run.stop_message


def test_c14_a_key_pasted_into_a_requirement_is_stored_nowhere(db, tmp_path):
    key = "sk-" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(48))
    doc = {"name": "pasted", "master_plan": None,
           "roles": {"implementer": "s", "reviewer": "s", "documenter": "s"},
           "profiles": {"s": {"adapter": "scripted", "scenario": {"default": [{}]}}},
           "stages": [{"key": "one", "requirement": f"Call the API with {key} and store the result.",
                       "scope": ["app/**"], "gates": ["true"]}]}
    path = tmp_path / "pasted.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        operations.load_pipelines([str(path)])
    except PipelineFormatError as exc:  # refusing it is fine, as long as the refusal does not repeat it
        assert key[3:] not in json.dumps(exc.errors)
    assert key[3:] not in json.dumps(list(Pipeline.objects.values("definition")), default=str)


def test_a_repository_without_a_specification_index_gets_an_initial_one_and_the_run_says_so(make_pipeline, tmp_path,
                                                                                          sent):
    from engine.models import RunEvent

    from .conftest import make_repo

    repo = make_repo(tmp_path / "origin", {"app/__init__.py": "", "app/core.py": '"""Core."""\n',
                                           "README.md": "# Answer\n", "docs/PLAN.md": "# Plan\nOne stage.\n",
                                           "docs/guide/usage.md": "# Usage\n"})
    run = operations.create_run(make_pipeline(stages=QUICK), str(repo), "main")  # spec_index: docs/INDEX.md
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    prompt = (Path(settings.VAR_DIR) / Attempt.objects.get(run=run, operation="implement").prompt_path).read_text()
    assert "## Specification index (docs/INDEX.md)\n# Specification index" in prompt
    assert "Generated by the Run Engine because the repository has no specification index at `docs/INDEX.md`" in prompt
    assert "- `docs/guide/usage.md`: Usage" in prompt and "- `README.md`: Answer" in prompt
    events = RunEvent.objects.filter(run=run, kind="spec_index_created")
    assert events.count() == 1 and "docs/INDEX.md" in events.get().message
    record = Path(settings.VAR_DIR) / events.get().data["path"]
    assert record.is_file() and record.is_relative_to(Path(settings.VAR_DIR) / run.control_dir)
    assert "docs/guide/usage.md" in record.read_text()
    assert not (Path(run.worktree) / "docs" / "INDEX.md").exists()  # the repository is not written
