"""An attempt's stored files through the Control Panel: linked from its page with the prompt's
sha256, served to staff only, from the attempt's own recorded paths inside its run's control
records and nowhere else; earlier attempts' logs stay reachable from a later attempt's page.

Runs are driven in this process (real scripted agent processes, real git, real gates), the
way a worker would (tests/test_steps.py); the end-to-end versions through real workers are in
tests/test_issue3_runs.py.
"""
import hashlib
import os
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from engine import operations
from engine.models import Attempt

from .conftest import ANSWER_STEP
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)



@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create_superuser("admin", "admin@example.invalid", "pw-for-tests-only")
    client.force_login(user)
    return client


def file_url(attempt, kind):
    return reverse("admin:engine_attempt_file", args=[attempt.pk, kind])


def page(client, attempt) -> str:
    response = client.get(reverse("admin:engine_attempt_change", args=[attempt.pk]))
    assert response.status_code == 200
    return response.content.decode()


def served(response) -> bytes:
    return b"".join(response.streaming_content)


#: One stage whose gate is `true`: these tests are about the records, not the gates.
QUICK = [{"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
          "gates": [{"name": "unit", "command": "true"}]}]


@pytest.fixture
def finished_run(make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(stages=QUICK), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    return run


@pytest.mark.pipeline
def test_the_attempt_page_links_its_files_and_shows_the_prompts_sha256(staff, finished_run):
    attempt = Attempt.objects.get(run=finished_run, operation="implement")
    html = page(staff, attempt)
    prompt_file = Path(settings.VAR_DIR) / attempt.prompt_path
    assert attempt.prompt_sha256 == hashlib.sha256(prompt_file.read_bytes()).hexdigest()
    assert f"sha256 {attempt.prompt_sha256} (matches the file)" in html
    for kind in ("prompt", "log", "raw", "patch"):
        assert f'href="{file_url(attempt, kind)}"' in html, kind
    # following the link gives the stored prompt, byte for byte
    response = staff.get(file_url(attempt, "prompt"))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    body = served(response)
    assert body == prompt_file.read_bytes()
    assert hashlib.sha256(body).hexdigest() == attempt.prompt_sha256
    assert b"Make app.core.answer() return 42." in body
    assert b"writing app/core.py" in served(staff.get(file_url(attempt, "log")))
    assert b"return 42" in served(staff.get(file_url(attempt, "patch")))
    # the run's page lists the attempt with a link to it
    run_html = staff.get(reverse("admin:engine_run_change", args=[finished_run.pk])).content.decode()
    assert reverse("admin:engine_attempt_change", args=[attempt.pk]) in run_html


@pytest.mark.pipeline
def test_a_changed_prompt_file_shows_as_differing(staff, finished_run):
    attempt = Attempt.objects.get(run=finished_run, operation="implement")
    with open(Path(settings.VAR_DIR) / attempt.prompt_path, "a", encoding="utf-8") as fh:
        fh.write("edited afterwards\n")
    assert f"sha256 {attempt.prompt_sha256} (DIFFERS from the file now)" in page(staff, attempt)


@pytest.mark.pipeline
def test_the_files_are_for_staff_only(client, django_user_model, finished_run):
    attempt = Attempt.objects.get(run=finished_run, operation="implement")
    url = file_url(attempt, "prompt")
    anonymous = client.get(url)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    user = django_user_model.objects.create_user("someone", "s@example.invalid", "pw-for-tests-only")
    client.force_login(user)
    assert client.get(url).status_code == 302  # not staff: back to the login page
    user.is_staff = True
    user.save()
    assert client.get(url).status_code == 403  # staff without the permission to view attempts


@pytest.mark.parametrize("recorded", [
    "/etc/passwd",
    "../../../../../../etc/passwd",
    "runs/../../../../../../etc/passwd",
    "controlpanel.sqlite3",
    "test.sqlite3",
])
@pytest.mark.pipeline
def test_only_the_recorded_paths_inside_the_runs_control_records_are_served(staff, finished_run, recorded):
    attempt = Attempt.objects.get(run=finished_run, operation="implement")
    Attempt.objects.filter(pk=attempt.pk).update(prompt_path=recorded)
    attempt.refresh_from_db()
    assert staff.get(file_url(attempt, "prompt")).status_code == 404
    assert "missing from the control records" in page(staff, attempt)
    assert f'href="{file_url(attempt, "prompt")}"' not in page(staff, attempt)


@pytest.mark.pipeline
def test_another_runs_files_and_unknown_kinds_are_not_served(staff, finished_run, make_pipeline, repo, sent):
    other = operations.create_run(make_pipeline(name="other", stages=QUICK), str(repo), "main")
    operations.request_start(other, requested_by="t", source="test")
    other = drive(other.pk, sent)
    theirs = Attempt.objects.get(run=other, operation="implement")
    mine = Attempt.objects.get(run=finished_run, operation="implement")
    assert (Path(settings.VAR_DIR) / theirs.log_path).is_file()
    Attempt.objects.filter(pk=mine.pk).update(log_path=theirs.log_path)
    assert staff.get(file_url(mine, "log")).status_code == 404
    for kind in ("definition", "..", "prompt_path"):
        assert staff.get(f"/admin/engine/attempt/{mine.pk}/file/{kind}/").status_code == 404
    assert staff.get(f"/admin/engine/attempt/{mine.pk + 10_000}/file/log/").status_code == 404


@pytest.mark.pipeline
def test_a_symlink_in_the_control_records_pointing_out_is_not_followed(staff, finished_run, tmp_path):
    attempt = Attempt.objects.get(run=finished_run, operation="implement")
    outside = tmp_path / "outside.txt"
    outside.write_text("NOT A CONTROL RECORD\n")
    log = Path(settings.VAR_DIR) / attempt.log_path
    log.unlink()
    os.symlink(outside, log)
    response = staff.get(file_url(attempt, "log"))
    assert response.status_code == 404
    assert b"NOT A CONTROL RECORD" not in response.content


@pytest.mark.pipeline
def test_earlier_attempts_logs_stay_linked_from_a_later_attempt(staff, make_pipeline, repo, sent):
    first = {"print": "first try, giving up", "exit": 3}
    pipeline = make_pipeline(stages=QUICK, scenario={"stages": {"answer": {"implement": [first, ANSWER_STEP]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "waiting_review", run.stop_message
    operations.recover(run, run.decisions.get(state="pending").pk, "try again", "retry", reviewer="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    one, two = Attempt.objects.filter(run=run, operation="implement").order_by("number")
    assert (one.number, two.number) == (1, 2) and one.log_path != two.log_path
    section = earlier_section(page(staff, two))
    assert reverse("admin:engine_attempt_change", args=[one.pk]) in section
    assert f'href="{file_url(one, "log")}"' in section
    assert re.search(r"attempt 1</a> \(implement, failed\)", section)
    assert b"first try, giving up" in served(staff.get(file_url(one, "log")))
    assert re.fullmatch(r"\s*none\s*", re.sub(r"<[^>]+>", "", earlier_section(page(staff, one))))


def earlier_section(html: str) -> str:
    """The content of the page's 'earlier attempts of this stage' field."""
    found = re.search(r"Earlier attempts of this stage:?</label>\s*<div class=\"readonly\">(.*?)</div>", html, re.S)
    assert found, html
    return found.group(1)
