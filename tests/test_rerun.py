"""Re-run of an ended run, and create-and-start in one step (issue 16, "The person in the loop").

engine/operations.py ``rerun`` and ``create_run(start=True)``, through the operation itself, the
``rerun`` and ``create_run --start`` commands, the JSON API and the admin's pages. In-process and
fast: runs are created on a real repository but never driven; a start is captured (``sent``).
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from engine import operations
from engine.models import Run, RunEvent, StartRequest

from .conftest import git, pipeline_definition
from .support.fixtures import client_of

pytestmark = pytest.mark.django_db


def two_profiles(requirement: str = "Make app.core.answer() return 42.", alt: bool = True) -> dict:
    """Keyword arguments of ``make_pipeline``: the usual scripted pipeline, with a second profile ``alt``."""
    base = pipeline_definition(name="again")
    stages = [{**base["stages"][0], "requirement": requirement}]
    profiles = dict(base["profiles"])
    if alt:
        profiles["alt"] = {**profiles["scripted"], "name": "alt"}
    return {"name": "again", "stages": stages, "profiles": profiles}


@pytest.fixture
def failed(make_pipeline, repo):
    """A failed run with a profile override, whose revision ``main`` has moved on since it was created."""
    run = operations.create_run(make_pipeline(**two_profiles()), str(repo), "main", {"reviewer": "alt"})
    (repo / "later.txt").write_text("a later commit\n", encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "later")
    return operations.fail_run(run, "the requirement was wrong", requested_by="tester")


def refused(call, *args, **kwargs) -> operations.OperationError:
    with pytest.raises(operations.OperationError) as info:
        call(*args, **kwargs)
    return info.value


# ----------------------------------------------------------------------------- the operation


def test_a_rerun_of_a_failed_run_keeps_its_frozen_inputs_and_links_both_ways(failed, repo):
    head = git(repo, "rev-parse", "HEAD").strip()
    assert head != failed.commit  # "main" names another commit now: the re-run keeps the old one
    new = operations.rerun(failed, requested_by="tester", source="test")
    assert new.pk != failed.pk and new.status == "pending"
    assert new.definition == failed.definition and new.definition_sha256 == failed.definition_sha256
    assert (new.repo_path, new.revision, new.commit) == (failed.repo_path, "main", failed.commit)
    assert new.profile_override == {"reviewer": "alt"} and new.definition["roles"]["reviewer"] == "alt"
    assert new.rerun_of_id == failed.pk and list(failed.reruns.all()) == [new]
    assert new.stages.count() == failed.stages.count() and new.branch.endswith(f"run-{new.pk}")
    frozen = Path(settings.VAR_DIR) / new.control_dir / "definition.sha256"
    assert frozen.read_text().strip() == failed.definition_sha256
    created = new.events.get(kind="created")
    assert created.message.startswith(f"Re-run of run {failed.pk} (the same pipeline version v1). ")
    told = failed.events.get(kind="rerun")
    assert f"Re-run as run {new.pk}" in told.message and "tester" in told.message and told.data["rerun"] == new.pk
    assert not StartRequest.objects.filter(run=new).exists()
    # the record says it both ways
    assert (operations.run_status(new)["rerun_of"], operations.run_status(new)["reruns"]) == (failed.pk, [])
    assert (operations.run_status(failed)["rerun_of"], operations.run_status(failed)["reruns"]) == (None, [new.pk])


def test_latest_pipeline_takes_the_new_version_with_the_old_profile_choices(failed, make_pipeline):
    latest = make_pipeline(**two_profiles("Make app.core.answer() return 42, documented."))
    assert latest.pk == failed.pipeline_id and latest.version == 2
    new = operations.rerun(failed.pk, latest_pipeline=True, requested_by="tester")
    assert new.definition["pipeline_version"] == 2 and new.definition["pipeline"] == latest.definition
    assert new.definition_sha256 != failed.definition_sha256
    assert new.definition["roles"]["reviewer"] == "alt" and new.commit == failed.commit
    assert "the latest pipeline version v2" in new.events.get(kind="created").message
    # the same version is still the old one's, unchanged
    same = operations.rerun(failed.pk)
    assert same.definition == failed.definition and same.definition["pipeline_version"] == 1
    assert sorted(failed.reruns.values_list("id", flat=True)) == [new.pk, same.pk]


def test_a_latest_version_without_the_overridden_profile_is_refused_and_nothing_is_created(failed, make_pipeline):
    make_pipeline(**two_profiles("Another requirement.", alt=False))
    count, events = Run.objects.count(), RunEvent.objects.count()
    error = refused(operations.rerun, failed, latest_pipeline=True, start=True)
    assert (error.code, error.field) == ("unknown_profile", "profile") and "'alt'" in error.message
    assert (Run.objects.count(), RunEvent.objects.count()) == (count, events)


@pytest.mark.parametrize("status", ["pending", "queued", "running", "waiting_review", "waiting_approval"])
def test_a_run_that_has_not_ended_is_refused_and_nothing_is_created(run_row, status, sent):
    run = run_row(status=status)
    error = refused(operations.rerun, run, start=True)
    assert (error.code, error.field) == ("not_ended", "run") and status in error.message
    assert Run.objects.count() == 1 and not RunEvent.objects.exists() and sent == []
    assert not operations.answers.actions(run)["rerun"].applies


def test_a_commit_gone_from_the_repository_is_refused_on_rev(make_pipeline, repo):
    git(repo, "checkout", "-q", "-b", "gone")
    (repo / "gone.txt").write_text("soon gone\n", encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "soon gone")
    old = operations.fail_run(operations.create_run(make_pipeline(), str(repo), "gone"), "x", "tester")
    git(repo, "checkout", "-q", "main")
    git(repo, "branch", "-q", "-D", "gone")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "-q", "--prune=now")
    before = sorted(p.name for p in (Path(settings.VAR_DIR) / "runs").iterdir())
    error = refused(operations.rerun, old, start=True)
    assert (error.code, error.field) == ("unknown_revision", "rev") and old.commit in error.message
    assert Run.objects.count() == 1 and not old.events.filter(kind="rerun").exists()
    assert sorted(p.name for p in (Path(settings.VAR_DIR) / "runs").iterdir()) == before  # no control records left


def test_start_requests_the_start_in_the_same_call(failed, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        new = operations.rerun(failed, start=True, requested_by="tester", source="test")
    new.refresh_from_db()
    assert new.status == "queued" and sent == [(new.pk, None)]
    start = StartRequest.objects.get(run=new)
    assert (start.requested_by, start.source) == ("tester", "test")
    assert new.events.filter(kind="start_requested").count() == 1
    assert "its start was requested at once" in failed.events.get(kind="rerun").message


def test_create_and_start_in_one_step_and_nothing_half_created_when_refused(make_pipeline, repo, sent,
                                                                            django_capture_on_commit_callbacks):
    pipeline = make_pipeline()
    with django_capture_on_commit_callbacks(execute=True):
        run = operations.create_run(pipeline, str(repo), "main", start=True, requested_by="tester", source="test")
    run.refresh_from_db()
    assert run.status == "queued" and sent == [(run.pk, None)] and run.rerun_of_id is None
    assert StartRequest.objects.get(run=run).requested_by == "tester"
    error = refused(operations.create_run, pipeline, str(repo), "no-such-branch", start=True)
    assert (error.code, error.field) == ("unknown_revision", "rev")
    assert Run.objects.count() == 1 and StartRequest.objects.count() == 1 and len(sent) == 1


# ----------------------------------------------------------------------------- the commands


def test_the_rerun_and_create_run_start_commands(failed, make_pipeline, repo, sent,
                                                 django_capture_on_commit_callbacks):
    make_pipeline(**two_profiles("A newer requirement."))
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("rerun", str(failed.pk), "--latest-pipeline", "--start", "--by", "carol", stdout=out)
    record = json.loads(out.getvalue())
    assert record["rerun_of"] == failed.pk and record["status"] == "queued" and sent == [(record["id"], None)]
    assert Run.objects.get(pk=record["id"]).definition["pipeline_version"] == 2
    assert StartRequest.objects.get(run_id=record["id"]).requested_by == "carol"
    with pytest.raises(CommandError) as info:
        call_command("rerun", str(record["id"]), stdout=io.StringIO())  # queued: not ended
    assert str(info.value).startswith("not_ended [run]:")
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("create_run", "--pipeline", "again", "--repo", str(repo), "--rev", "main", "--start", stdout=out)
    created = json.loads(out.getvalue())
    assert created["status"] == "queued" and created["rerun_of"] is None and sent[-1] == (created["id"], None)


# ----------------------------------------------------------------------------- the API


def test_the_api_reruns_and_creates_and_starts(failed, repo, sent, django_user_model,
                                               django_capture_on_commit_callbacks):
    adder = client_of(django_user_model, "adder", "add_run", "view_run")
    path = f"/api/runs/{failed.pk}/rerun/"
    # asking to start it needs engine.start_run as well: refused before anything is made
    response = adder.post(path, {"start": True}, format="json")
    assert (response.status_code, response.json()["permission"]) == (403, "engine.start_run")
    response = adder.post(path, {"start": "yes"}, format="json")
    assert (response.status_code, response.json()["error"], response.json()["field"]) == (400, "invalid", "start")
    assert adder.post(path, {"latest": True}, format="json").json()["field"] == "latest"
    assert Run.objects.count() == 1
    response = adder.post(path, {}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["rerun_of"] == failed.pk and body["status"] == "pending" and response["Location"] == \
        f"/api/runs/{body['id']}/"
    assert adder.get(f"/api/runs/{failed.pk}/").json()["reruns"] == [body["id"]]
    conflict = adder.post(f"/api/runs/{body['id']}/rerun/", {}, format="json")
    assert (conflict.status_code, conflict.json()["error"], conflict.json()["field"]) == (409, "not_ended", "run")
    starter = client_of(django_user_model, "starter", "add_run", "start_run")
    with django_capture_on_commit_callbacks(execute=True):
        response = starter.post(path, {"latest_pipeline": False, "start": True}, format="json")
    assert response.status_code == 201 and response.json()["status"] == "queued"
    assert StartRequest.objects.get(run_id=response.json()["id"]).requested_by == "starter"
    with django_capture_on_commit_callbacks(execute=True):
        response = starter.post("/api/runs/", {"pipeline": "again", "repo": str(repo), "rev": "main", "start": True},
                                format="json")
    assert response.status_code == 201 and response.json()["status"] == "queued"
    assert sent[-1] == (response.json()["id"], None) and len(sent) == 2
    no_start = adder.post("/api/runs/", {"pipeline": "again", "repo": str(repo), "rev": "main", "start": True},
                          format="json")
    assert (no_start.status_code, no_start.json()["permission"]) == (403, "engine.start_run")
    assert Run.objects.count() == 4


# ----------------------------------------------------------------------------- the admin's pages


@pytest.fixture
def staff(django_user_model):
    user = django_user_model.objects.create_superuser("admin", "admin@example.invalid", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


def detail(run_id) -> str:
    return reverse("admin:engine_run_detail", args=[run_id])


def test_the_run_page_reruns_an_ended_run_and_links_the_two(staff, failed, sent, django_user_model,
                                                             django_capture_on_commit_callbacks):
    text = staff.get(detail(failed.pk)).content.decode()
    assert 'data-cp-action="rerun"' in text and 'value="Re-run"' in text
    assert re.search(r'name="start"[^>]*checked', text) and not re.search(r'name="latest_pipeline"[^>]*checked', text)
    with django_capture_on_commit_callbacks(execute=True):
        response = staff.post(reverse("admin:engine_run_action", args=[failed.pk, "rerun"]), {"start": "on"},
                              follow=True)
    new = Run.objects.get(rerun_of=failed)
    assert response.redirect_chain == [(detail(new.pk), 302)]  # on to the new run's page
    text = response.content.decode()
    assert f"Run {new.pk} created by admin as a re-run of run {failed.pk}" in text
    assert f'<a href="{detail(failed.pk)}">Re-run of run {failed.pk}</a>' in text
    assert Run.objects.get(pk=new.pk).status == "queued" and sent == [(new.pk, None)]
    assert f'<a href="{detail(new.pk)}">Re-run as run {new.pk}</a>' in staff.get(detail(failed.pk)).content.decode()
    # a person who may create but not start: the box is unchecked, and checking it is refused
    creator = django_user_model.objects.create_user("creator", "c@example.invalid", "pw-for-tests-only",
                                                    is_staff=True)
    creator.user_permissions.add(*Permission.objects.filter(codename__in=["view_run", "add_run"]))
    client = Client()
    client.force_login(creator)
    text = client.get(detail(failed.pk)).content.decode()
    assert 'data-cp-action="rerun"' in text and not re.search(r'name="start"[^>]*checked', text)
    response = client.post(reverse("admin:engine_run_action", args=[failed.pk, "rerun"]), {"start": "on"},
                           follow=True)
    assert "permission_denied" in response.content.decode() and failed.reruns.count() == 1


def test_the_create_form_creates_and_starts(staff, make_pipeline, repo, sent, django_capture_on_commit_callbacks):
    pipeline = make_pipeline()
    url = reverse("admin:engine_pipeline_create_run", args=[pipeline.pk])
    text = staff.get(url).content.decode()
    assert 'name="_create"' in text and 'name="_start" value="Create and start"' in text
    with django_capture_on_commit_callbacks(execute=True):
        response = staff.post(url, {"repo": str(repo), "rev": "main", "_start": "Create and start"}, follow=True)
    run = Run.objects.get()
    assert response.redirect_chain == [(detail(run.pk), 302)] and run.status == "queued" and sent == [(run.pk, None)]
    assert "Its start is requested: it is queued for a worker." in response.content.decode()
    staff.post(url, {"repo": str(repo), "rev": "main", "_create": "Create the run"})
    assert Run.objects.order_by("-id").first().status == "pending" and len(sent) == 1


def test_a_double_click_on_re_run_makes_one_run(staff, failed, sent, django_user_model,
                                                django_capture_on_commit_callbacks):
    text = staff.get(detail(failed.pk)).content.decode()
    assert re.search(r'name="seen"[^>]*value="0"', text)  # the page says how many re-runs it saw
    url = reverse("admin:engine_run_action", args=[failed.pk, "rerun"])
    with django_capture_on_commit_callbacks(execute=True):
        staff.post(url, {"start": "on", "seen": "0"})
        second = staff.post(url, {"start": "on", "seen": "0"}, follow=True)  # the second click of the same page
    assert "already_rerun" in second.content.decode()
    assert failed.reruns.count() == 1 and len(sent) == 1
    failed.refresh_from_db()
    assert failed.rerun_count == 1
    # the API: a retried request with the count it saw makes no second run either
    api = client_of(django_user_model, "api-user", "add_run", "view_run")
    answer = api.post(f"/api/runs/{failed.pk}/rerun/", {"expect_reruns": 0}, format="json")
    assert (answer.status_code, answer.json()["error"], answer.json()["field"]) == (409, "already_rerun", "run")
    error = refused(operations.rerun, failed, expect_reruns=0)
    assert (error.code, error.field) == ("already_rerun", "run") and failed.reruns.count() == 1
    assert operations.rerun(failed, expect_reruns=1).rerun_of_id == failed.pk
