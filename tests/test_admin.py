"""The Control Panel's admin pages render for staff, show simulated runs as such, and keep evidence read-only."""
import pytest
from django.urls import reverse

from engine import operations
from engine.models import Attempt, Check, Decision, JournalEntry, Manifest, Pipeline, Profile, Run, RunEvent, StageRun

pytestmark = pytest.mark.django_db


def test_every_admin_page_renders(staff, make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    for model in (Pipeline, Profile, Run, StageRun, Attempt, Check, Manifest, Decision, JournalEntry, RunEvent):
        url = reverse(f"admin:engine_{model._meta.model_name}_changelist")
        response = staff.get(url)
        assert response.status_code == 200, url
    response = staff.get(reverse("admin:engine_run_changelist"))
    assert b"SIMULATED" in response.content and b"Control Panel" in response.content
    response = staff.get(reverse("admin:engine_run_change", args=[run.pk]))
    assert response.status_code == 200 and run.commit.encode() in response.content


def test_evidence_cannot_be_edited_or_deleted(staff, make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    response = staff.post(reverse("admin:engine_run_delete", args=[run.pk]), {"post": "yes"})
    assert response.status_code == 403
    assert Run.objects.filter(pk=run.pk).exists()
    assert staff.get(reverse("admin:engine_attempt_add")).status_code == 403
