"""Create A Run: validation, the resolved commit, the frozen definition, nothing half created."""
import hashlib
import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from engine import operations
from engine.models import Run, RunEvent, StageRun
from engine.operations import OperationError

from .conftest import git

pytestmark = pytest.mark.django_db


def assert_nothing_created():
    assert Run.objects.count() == 0
    assert StageRun.objects.count() == 0
    assert RunEvent.objects.count() == 0


def refused(code, field, *args, **kwargs):
    with pytest.raises(OperationError) as info:
        operations.create_run(*args, **kwargs)
    assert info.value.code == code, info.value.message
    assert info.value.field == field
    assert_nothing_created()
    return info.value


def test_it_creates_a_pending_run_with_a_frozen_definition(make_pipeline, repo):
    pipeline = make_pipeline()
    (repo / "notes.txt").write_text("uncommitted\n")
    (repo / "app" / "core.py").write_text("# edited, not committed\n")
    status_before = git(repo, "status", "--porcelain")
    head_before = git(repo, "rev-parse", "HEAD")
    run = operations.create_run(pipeline.name, str(repo / "app"), "main")
    assert run.status == "pending"
    assert run.commit == head_before.strip() and len(run.commit) == 40
    assert run.repo_path == str(repo)
    assert run.simulated is True
    assert run.branch == f"{settings.CP_BRANCH_PREFIX}/run-{run.pk}"
    assert {c["path"] for c in run.not_included} == {"notes.txt", "app/core.py"}
    snapshot = Path(settings.VAR_DIR) / run.control_dir / "definition.json"
    data = json.loads(snapshot.read_text())
    assert data["pipeline"] == pipeline.definition
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(canonical).hexdigest() == run.definition_sha256
    assert list(run.stages.values_list("key", flat=True)) == ["answer"]
    # the original checkout is only read
    assert git(repo, "status", "--porcelain") == status_before
    assert git(repo, "rev-parse", "HEAD") == head_before
    assert git(repo, "branch", "--list").strip() == "* main"
    # a later change of the saved pipeline does not change the frozen run
    pipeline.definition = {**pipeline.definition, "description": "changed"}
    pipeline.save()
    run.refresh_from_db()
    assert run.definition["pipeline"]["description"] != "changed"


def test_it_resolves_a_tag_to_its_commit(make_pipeline, repo):
    pipeline = make_pipeline()
    git(repo, "tag", "-a", "v1", "-m", "release")
    run = operations.create_run(pipeline, str(repo), "v1")
    assert run.commit == git(repo, "rev-parse", "HEAD").strip()


def test_unknown_pipeline_is_refused(repo):
    refused("unknown_pipeline", "pipeline", "no-such-pipeline", str(repo), "main")


def test_missing_path_is_refused(make_pipeline, tmp_path):
    pipeline = make_pipeline()
    error = refused("path_not_found", "repo", pipeline, str(tmp_path / "nope"), "main")
    assert "nope" in error.message


def test_a_directory_that_is_not_a_repository_is_refused(make_pipeline, tmp_path):
    pipeline = make_pipeline()
    plain = tmp_path / "plain"
    plain.mkdir()
    refused("not_a_repository", "repo", pipeline, str(plain), "main")


def test_unknown_revision_is_refused(make_pipeline, repo):
    error = refused("unknown_revision", "rev", make_pipeline(), str(repo), "no-such-branch")
    assert "no-such-branch" in error.message


def test_a_revision_naming_a_tree_or_blob_is_refused(make_pipeline, repo):
    pipeline = make_pipeline()
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    refused("not_a_commit", "rev", pipeline, str(repo), tree)
    refused("not_a_commit", "rev", pipeline, str(repo), "HEAD:app/core.py")


def test_an_option_like_revision_is_refused(make_pipeline, repo):
    refused("unknown_revision", "rev", make_pipeline(), str(repo), "--all")


def test_an_unknown_profile_in_the_override_is_refused(make_pipeline, repo):
    pipeline = make_pipeline()
    error = refused("unknown_profile", "profile", pipeline, str(repo), "main", {"implementer": "gpt-9"})
    assert "gpt-9" in error.message
    refused("unknown_role", "profile", pipeline, str(repo), "main", {"painter": "scripted"})


def test_a_profile_whose_adapter_this_engine_cannot_run_is_refused(make_pipeline, repo):
    """A saved definition naming an adapter this engine does not have (e.g. saved by a newer version)."""
    pipeline = make_pipeline()
    definition = dict(pipeline.definition)
    definition["profiles"] = {**definition["profiles"],
                              "future": {**definition["profiles"]["scripted"], "adapter": "gemini", "scenario": None,
                                         "name": "future"}}
    pipeline.definition = definition
    pipeline.save()
    error = refused("adapter_unavailable", "profile", pipeline, str(repo), "main",
                    {"implementer": "future", "reviewer": "future"})
    assert "gemini" in error.message and "implementer" in error.message and "reviewer" in error.message


def test_create_run_command_prints_the_run_as_json(make_pipeline, repo, capsys):
    pipeline = make_pipeline()
    call_command("create_run", "--pipeline", pipeline.name, "--repo", str(repo), "--rev", "main",
                 "--profile", "implementer=scripted")
    data = json.loads(capsys.readouterr().out)
    for key in ("id", "status", "simulated", "commit", "branch", "worktree", "stop_reason", "stop_message", "stages"):
        assert key in data
    assert data["status"] == "pending" and data["simulated"] is True and data["waiting_for"] == "start"
    assert data["stages"][0]["key"] == "answer"


def test_create_run_command_refuses_with_the_field_named(make_pipeline, repo):
    pipeline = make_pipeline()
    with pytest.raises(CommandError) as info:
        call_command("create_run", "--pipeline", pipeline.name, "--repo", str(repo), "--rev", "main",
                     "--profile", "implementer")
    assert "[profile]" in str(info.value)
    with pytest.raises(CommandError) as info:
        call_command("create_run", "--pipeline", pipeline.name, "--repo", str(repo), "--rev", "nope")
    assert "unknown_revision [rev]" in str(info.value)
    assert_nothing_created()


def test_a_failure_after_the_run_row_leaves_nothing(make_pipeline, repo, monkeypatch):
    """docs/field-cases.md C18 (b), create side: an exception after the Run row is written rolls everything back."""
    pipeline = make_pipeline()

    def explode(*args, **kwargs):
        raise RuntimeError("injected after the run row was created")

    runs_dir = Path(settings.VAR_DIR) / "runs"
    before = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    monkeypatch.setattr(operations.protected, "write_definition", explode)
    with pytest.raises(RuntimeError):
        operations.create_run(pipeline, str(repo), "main")
    assert_nothing_created()
    after = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    assert [p for p in after - before if ".orphan-" not in p.name] == []
    assert git(repo, "branch", "--list").strip() == "* main"


def test_a_pipeline_name_that_looks_like_an_id_wins_over_the_id(make_pipeline, repo):
    first = make_pipeline(name="first")
    numeric = make_pipeline(name=str(first.pk + 1000))
    run = operations.create_run(numeric.name, str(repo), "main")
    assert run.pipeline == numeric
    assert operations.create_run(str(first.pk), str(repo), "main").pipeline == first


def test_the_created_event_says_in_words_why_the_run_is_simulated(make_pipeline, repo):
    from engine.models import RunEvent

    run = operations.create_run(make_pipeline(), str(repo), "main")
    created = RunEvent.objects.get(run=run, kind="created")
    assert "It is simulated: it uses the scripted test adapter." in created.message, created.message
