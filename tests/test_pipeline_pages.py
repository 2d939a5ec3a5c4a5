"""The pipeline's pages in the Control Panel (controlpanel/admin.py PipelineAdmin), through the Django test client:
creating a run from a saved pipeline, and editing its definition into a new version (two editors never undo each
other's change unseen, even when their saves cross)."""
from __future__ import annotations

import html
import re

import pytest
import yaml
from django.urls import reverse

from engine import operations
from engine.pipeline.format import validate
from engine.models import Pipeline, Run

from .support.pages import buttons, detail_url, messages_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_a_run_from_a_pipeline_page(staff, staff_with, make_pipeline, repo):
    pipeline = make_pipeline()
    create_url = reverse("admin:engine_pipeline_create_run", args=[pipeline.pk])
    pipeline_page = staff.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert f'href="{create_url}" class="cp-create-run">Create a run</a>' in pipeline_page
    form = staff.get(create_url).content.decode()
    assert 'name="repo"' in form and 'name="rev"' in form and 'value="main"' in form
    for role in ("implementer", "reviewer", "documenter"):
        assert f'name="profile_{role}"' in form and "the pipeline&#x27;s: scripted" in form

    def create(**fields) -> tuple[int, str]:
        response = staff.post(create_url, {"repo": str(repo), "rev": "main", **fields}, follow=True)
        return response.status_code, response.content.decode()

    # refusals: an error message naming the field, the form again with what was typed, and no run
    for fields, code, field in (({"repo": ""}, "path_not_found", "repo"),
                                ({"repo": str(repo / "missing")}, "path_not_found", "repo"),
                                ({"rev": "no-such-branch"}, "unknown_revision", "rev")):
        status, text = create(**fields)
        refused = messages_of(text, "error")
        assert status == 200 and len(refused) == 1, (fields, refused)
        assert code in refused[0] and f"field “{field}”" in refused[0], refused
        assert 'id="create-run-form"' in text and html.escape(fields.get("rev", "main")) in text
    status, text = create(profile_implementer="nobody")
    refused = messages_of(text, "error")
    assert len(refused) == 1 and "field “profile_implementer”" in refused[0] and "nobody" in refused[0]
    assert not Run.objects.exists()
    # success: a pending run with the profile chosen, and its page with a success message
    response = staff.post(create_url, {"repo": str(repo), "rev": "main", "profile_reviewer": "scripted"},
                          follow=True)
    run = Run.objects.get()
    assert response.redirect_chain == [(detail_url(run), 302)]
    assert (run.status, run.pipeline_id, run.revision, run.profile_override) == (
        "pending", pipeline.pk, "main", {"reviewer": "scripted"})
    done = messages_of(response.content.decode(), "success")
    assert done == [f"Run {run.pk} created from pipeline {pipeline.name} at commit {run.commit[:12]} by admin. "
                    f"It is simulated ({run.simulated_reason}). Press Start to run it."]
    assert buttons(response.content.decode()) == {"start", "fail"}
    # without engine.add_run: no button, and the form is refused (view or post)
    viewer = staff_with("pipeline-viewer", "view_pipeline", "view_run")
    assert "cp-create-run" not in viewer.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert viewer.get(create_url).status_code == 403
    assert viewer.post(create_url, {"repo": str(repo), "rev": "main"}).status_code == 403
    assert Run.objects.count() == 1
    assert staff.get(reverse("admin:engine_pipeline_create_run", args=[424242])).status_code == 404


def test_a_pipeline_definition_is_edited_with_validation_and_saved_as_a_new_version(staff, staff_with, make_pipeline,
                                                                                    repo):
    pipeline = make_pipeline()
    run_before = operations.create_run(pipeline, str(repo), "main")
    url = reverse("admin:engine_pipeline_edit_definition", args=[pipeline.pk])
    page_text = staff.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert url in page_text  # the button, for a user with engine.change_pipeline
    form_text = staff.get(url).content.decode()
    shown = html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", form_text, re.S).group(1))
    document = yaml.safe_load(shown)
    assert 'name="version" value="1"' in form_text
    assert document["name"] == pipeline.name and document["stages"][0]["key"] == "answer"

    # a bad definition: every problem named with its field, nothing saved
    bad = dict(document, stages=[dict(document["stages"][0], gates=[{"name": "unit"}])], budgets={"max_attempts": -1})
    response = staff.post(url, {"definition": yaml.safe_dump(bad), "version": 1})
    assert response.status_code == 200
    text = html.unescape(response.content.decode())
    assert "stages[0].gates[0].command" in text and "budgets.max_attempts" in text and "was not saved" in text
    assert staff.post(url, {"definition": "name: [unclosed", "version": 1}).status_code == 200
    renamed = staff.post(url, {"definition": yaml.safe_dump(dict(document, name="another")), "version": 1})
    assert "cannot change here" in html.unescape(renamed.content.decode())
    assert Pipeline.objects.get(pk=pipeline.pk).version == 1

    # a good change: a new version; the run created before keeps the definition it froze
    better = dict(document, stages=[dict(document["stages"][0], requirement="Make answer() return 42, documented.")])
    response = staff.post(url, {"definition": yaml.safe_dump(better), "version": 1}, follow=True)
    assert "saved as version 2" in response.content.decode()
    pipeline.refresh_from_db()
    assert pipeline.version == 2 and pipeline.definition["stages"][0]["requirement"].endswith("documented.")
    run_before.refresh_from_db()
    assert run_before.definition["pipeline"]["stages"][0]["requirement"] == "Make app.core.answer() return 42."
    assert operations.create_run(pipeline, str(repo), "main").definition["pipeline_version"] == 2
    # the same again changes nothing
    response = staff.post(url, {"definition": yaml.safe_dump(better), "version": 2}, follow=True)
    assert "nothing changed" in response.content.decode() and Pipeline.objects.get(pk=pipeline.pk).version == 2
    # a second editor who opened version 1 cannot undo that change unseen
    stale = dict(document, budgets={"max_attempts": 9})
    response = staff.post(url, {"definition": yaml.safe_dump(stale), "version": 1})
    assert "saved as version 2 since you opened version 1" in html.unescape(response.content.decode())
    pipeline.refresh_from_db()
    assert pipeline.version == 2 and pipeline.definition["stages"][0]["requirement"].endswith("documented.")
    # the pipeline's page shows the definition as YAML
    page_text = html.unescape(staff.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode())
    assert "requirement: Make answer() return 42, documented." in page_text

    viewer = staff_with("viewer", "view_pipeline")
    assert url not in viewer.get(reverse("admin:engine_pipeline_change", args=[pipeline.pk])).content.decode()
    assert viewer.get(url).status_code == 403
    assert viewer.post(url, {"definition": yaml.safe_dump(better), "version": 2}).status_code == 403


def test_a_save_that_lands_after_another_since_the_form_was_checked_is_refused(staff, make_pipeline, monkeypatch):
    """The version is compared again under the pipeline's row lock: a competing save that lands between the form's
    check and this save (two editors pressing Save at once) is not undone."""
    pipeline = make_pipeline()
    url = reverse("admin:engine_pipeline_edit_definition", args=[pipeline.pk])
    document = yaml.safe_load(html.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>",
                                                      staff.get(url).content.decode(), re.S).group(1)))
    theirs = dict(document, stages=[dict(document["stages"][0], requirement="Theirs: saved first.")])
    mine = dict(document, stages=[dict(document["stages"][0], requirement="Mine: saved second.")])
    real_save = operations.save_pipeline

    def crossing(definition, *args, **kwargs):  # the other editor's save commits just before this one
        real_save(validate(theirs, "<other editor>"))
        return real_save(definition, *args, **kwargs)

    monkeypatch.setattr(operations, "save_pipeline", crossing)
    response = staff.post(url, {"definition": yaml.safe_dump(mine), "version": 1})
    assert response.status_code == 200  # the form again, with the refusal
    assert "saved as version 2 since you opened version 1: nothing was saved" in html.unescape(
        response.content.decode())
    pipeline.refresh_from_db()
    assert pipeline.version == 2 and pipeline.definition["stages"][0]["requirement"] == "Theirs: saved first."


def test_the_save_operation_refuses_a_version_that_is_not_the_saved_one(make_pipeline):
    pipeline = make_pipeline()
    changed = dict(pipeline.definition, description="changed")
    with pytest.raises(operations.OperationError) as info:
        operations.save_pipeline(changed, expected_version=2)
    assert (info.value.code, info.value.field) == ("version_conflict", "version")
    assert Pipeline.objects.get(pk=pipeline.pk).version == 1
    saved, outcome = operations.save_pipeline(changed, expected_version=1)
    assert (outcome, saved.version) == ("updated", 2)
