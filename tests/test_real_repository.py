"""Issue 13: a saved pipeline on a real public library, run with each of the four agent CLIs.

pipelines/inflection.yaml adds two functions to inflection 0.5.1 (its sdist from PyPI, fetched
and sha256-checked by `make samples`: scripts/fetch-sample-repos.sh): each stage is accepted
only when the library's own 455 tests (protected) and the stage's check pass. Every role is
played by the real claude, codex, gemini or pi binary against the scripted model endpoint
(pipelines/scenarios/inflection-<cli>.yaml): the runs are simulated, the CLIs, their sandboxes,
the gates and git are real. What it showed: docs/real-repositories.md.
"""
import shutil
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.agents.cli_adapter import find_executable
from engine.models import Attempt, Check
from engine.pipeline.format import load_file

from .conftest import git
from .support.runs import drive

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tools" / "repos" / "inflection-0.5.1"
PIPELINE = ROOT / "pipelines" / "inflection.yaml"
#: adapter name, executable, the version its pinned install reports (scripts/agents/package.json)
CLIS = {"claude": ("claude-code", "claude", "2.1.197"), "codex": ("codex", "codex", "0.171.0"),
        "gemini": ("gemini-cli", "gemini", "0.61.0"), "pi": ("pi", "pi", "0.73.1")}


def library_checkout(tmp_path: Path) -> Path:
    """The unpacked sdist, committed on main as a person's checkout of it would be."""
    if not (SAMPLE / "test_inflection.py").is_file():
        pytest.skip("run `make samples` to fetch the inflection sdist (scripts/fetch-sample-repos.sh)")
    repo = tmp_path / "inflection"
    shutil.copytree(SAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__", ".sdist-sha256"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "inflection 0.5.1 (sdist)")
    return repo


def logs_of(run) -> str:
    """The end of each attempt's display log, for a failure's message."""
    from engine.processes.process import tail_text

    return "\n".join(f"--- attempt {a.number} ({a.operation}):\n{tail_text(Path(settings.VAR_DIR) / a.log_path, 3000)}"
                     for a in Attempt.objects.filter(run=run).order_by("number") if a.log_path)


@pytest.mark.slow
@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
@pytest.mark.backend("sqlite")  # CI runs it in its SQLite job only (.ci/suites): its subject is the CLIs
@pytest.mark.parametrize("cli", sorted(CLIS))
def test_the_inflection_pipeline_runs_to_the_end_with_each_cli(cli, tmp_path, sent):
    adapter, executable, version = CLIS[cli]
    if find_executable(executable) is None:
        pytest.skip(f"run `make agents` to install the pinned {executable} CLI")
    repo = library_checkout(tmp_path)
    pipeline, _ = operations.save_pipeline(load_file(PIPELINE), str(PIPELINE))
    profile = f"{cli}-offline"
    run = operations.create_run(pipeline, str(repo), "main", {role: profile for role in operations.ROLES})
    assert run.simulated and run.simulated_reason == "scripted model endpoint"
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent, limit=60)
    assert run.status == "succeeded", (run.stop_reason, run.stop_message, logs_of(run))

    attempts = list(Attempt.objects.filter(run=run).order_by("stage__order", "number"))
    assert [(a.stage.key, a.operation) for a in attempts] == [
        ("acronym", "implement"), ("acronym", "review"), ("acronym", "document"), ("acronym", "review"),
        ("is-acronym", "implement"), ("is-acronym", "review"), ("is-acronym", "document")]
    assert all(a.adapter == adapter and a.status == "succeeded" and not a.failure_kind for a in attempts)
    assert all(version in a.cli_version for a in attempts), [a.cli_version for a in attempts]
    assert all(a.structured and a.usage["input_tokens"] for a in attempts), [a.usage for a in attempts]
    # the library's own tests ran, for real, on each stage's files and again at the end
    tests = Check.objects.filter(run=run, name="library-tests")
    assert tests.count() >= 3 and all(c.exit_code == 0 for c in tests)

    first = (Path(settings.VAR_DIR) / attempts[0].prompt_path).read_text()
    assert "docs/index.rst" in first and "Inflection" in first and "README.rst" in first  # reST docs indexed
    second = (Path(settings.VAR_DIR) / attempts[4].prompt_path).read_text()
    assert "def acronym(phrase: str) -> str:" in second  # the first stage's accepted patch

    assert "def is_acronym(word: str) -> bool:" in git(repo, "show", f"{run.branch}:inflection/__init__.py")
    index = git(repo, "show", f"{run.branch}:docs/INDEX.md")
    assert "acronym.rst" in index and "index.rst" in index
    assert git(repo, "status", "--porcelain") == ""  # the original checkout untouched
