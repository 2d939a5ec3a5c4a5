"""Issue 13: the specification index names every note the documentation agent changed
(engine/context.py ``unindexed_notes``); a documentation attempt that leaves one out is refused
(``index_incomplete``) and stops the run for review (``docs_failed``), the note named."""
import pytest

from engine import context
from engine.models import Attempt

from .conftest import ANSWER_STEP, make_repo
from .support.runs import PASS, run_with, stage


def test_an_index_names_a_note_by_its_repository_path_or_its_path_from_the_index(tmp_path):
    root = make_repo(tmp_path / "r", {
        "docs/INDEX.md": "# Index\n\n- [auth](auth.md)\n- docs/api/errors.rst: the errors\n- [x](./x.txt)\n",
        "docs/auth.md": "a\n", "docs/api/errors.rst": "b\n", "docs/x.txt": "c\n", "docs/new.md": "d\n",
        "docs/sub/auth.md": "e\n", "docs/data.json": "{}\n", "README.md": "r\n"})
    changed = ["docs/INDEX.md", "docs/auth.md", "docs/api/errors.rst", "docs/x.txt", "docs/new.md",
               "docs/sub/auth.md", "docs/data.json", "docs/gone.md"]
    # new.md is not named; sub/auth.md is not auth.md; a .json file is no note; a deleted note needs no entry
    assert context.unindexed_notes(str(root), "docs/INDEX.md", changed) == ["docs/new.md", "docs/sub/auth.md"]
    assert context.unindexed_notes(str(root), "docs/MISSING.md", ["docs/auth.md"]) == ["docs/auth.md"]


def test_a_longer_name_is_not_the_note():
    assert not context._names_path("see auth.md.bak and xauth.md and auth.mdx", "auth.md")
    assert context._names_path("see (auth.md).", "auth.md") and context._names_path("auth.md", "auth.md")
    assert not context._names_path("see [it](../auth.md)", "auth.md")  # another folder's auth.md
    assert context._names_path("see [it](./auth.md)", "auth.md")


def test_a_root_relative_link_names_the_note(tmp_path):
    root = make_repo(tmp_path / "r", {"docs/INDEX.md": "- [auth](/docs/auth.md)\n", "docs/auth.md": "a\n"})
    assert context.unindexed_notes(str(root), "docs/INDEX.md", ["docs/auth.md"]) == []


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_a_documentation_attempt_that_leaves_a_note_out_of_the_index_stops_the_run(make_pipeline, repo, sent):
    doc = {"write": {"docs/answer.md": "# answer\n\n`answer()` returns 42.\n",
                     "docs/INDEX.md": "# Specification index\n\n- [PLAN.md](PLAN.md)\n"}}
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [PASS], "document": [doc]})
    assert (run.status, run.stop_reason) == ("waiting_review", "docs_failed"), run.stop_message
    assert "docs/answer.md" in run.stop_message and "docs/INDEX.md" in run.stop_message
    attempt = Attempt.objects.get(run=run, operation="document")
    assert attempt.exit_code == 0 and attempt.failure_kind == "index_incomplete"
    assert "docs/answer.md" in attempt.failure_message


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_a_documentation_attempt_that_indexes_its_note_is_checkpointed(make_pipeline, repo, sent):
    doc = {"write": {"docs/answer.md": "# answer\n\n`answer()` returns 42.\n",
                     "docs/INDEX.md": "# Specification index\n\n- [answer.md](answer.md): answer()\n"}}
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [PASS], "document": [doc]},
                   stages=stage())
    assert run.status == "succeeded", run.stop_message
    assert Attempt.objects.get(run=run, operation="document").failure_kind == ""
