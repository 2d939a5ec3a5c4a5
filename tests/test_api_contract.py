"""The JSON API's contract as its viewset and router keep it (controlpanel/api.py).

tests/test_api.py checks each endpoint's behaviour; these check what the move onto REST
framework's viewset, router and output serializers must not change: the URL names and paths,
the key set of run_status and of each part of it (stages, attempts, checks, a run list's line: additions
allowed, nothing removed or renamed; the keys written out here, not read from engine/record.py), the permission
checked before a 405, and the OPTIONS answer naming the endpoint.
"""
from __future__ import annotations

import json

import pytest
from django.urls import reverse

from controlpanel.api import RunStatusSerializer
from engine import operations

from .support.runs import QUICK_SCENARIO, QUICK_STAGE, drive
from .support.fixtures import client_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending(make_pipeline, repo):
    return operations.create_run(make_pipeline(stages=QUICK_STAGE, scenario=QUICK_SCENARIO), str(repo), "main")


def test_the_url_names_and_paths_are_the_ones_the_api_always_had():
    assert reverse("api-run-create") == "/api/runs/"
    assert reverse("api-run", args=["7"]) == "/api/runs/7/"
    for verb in ("start", "approve", "recheck", "recover", "fail"):
        assert reverse(f"api-run-{verb}", args=["7"]) == f"/api/runs/7/{verb}/"
    assert reverse("api-run-request-changes", args=["7"]) == "/api/runs/7/request-changes/"


def test_run_status_keeps_every_contract_key(django_user_model, pending):
    data = client_of(django_user_model, "viewer", "view_run").get(f"/api/runs/{pending.pk}/").json()
    missing = RunStatusSerializer.CONTRACT_KEYS - set(data)
    assert not missing, f"run_status lost public keys: {sorted(missing)}"
    assert RunStatusSerializer(pending).data == operations.run_status(pending)


def test_a_method_a_route_does_not_take_is_checked_against_the_routes_permission(django_user_model, pending):
    weak = client_of(django_user_model, "weak", "view_run")
    response = weak.get(f"/api/runs/{pending.pk}/start/")
    assert (response.status_code, response.json()["permission"]) == (403, "engine.start_run")
    strong = client_of(django_user_model, "strong", "start_run")
    response = strong.get(f"/api/runs/{pending.pk}/start/")
    assert (response.status_code, response.json()["error"]) == (405, "method_not_allowed")
    assert response["Allow"] == "POST, OPTIONS"


def test_options_names_each_endpoint(django_user_model, pending):
    client = client_of(django_user_model, "all", "add_run", "view_run", "fail_run")
    assert client.options("/api/runs/").json()["name"] == "Run Create"
    detail = client.options(f"/api/runs/{pending.pk}/").json()
    assert detail["name"] == "Run Detail" and detail["description"].startswith("GET /api/runs/<id>/")
    assert client.options(f"/api/runs/{pending.pk}/fail/").json()["name"] == "Run Fail"


#: The keys of each part of a run's record a client reads (docs/run-status.md "Keys"), as they were when the
#: record moved onto DRF serializers (engine/record.py): a later version adds keys, never removes or renames one.
#: Written out here, not read from the serializers, so that a change to them cannot change what is checked.
STAGE_KEYS = {"key", "status", "phase", "base_commit", "checkpoint", "accepted_manifest", "repairs_used",
              "repair_allowance", "last_defect", "started_at", "finished_at", "totals", "attempts", "checks"}
ATTEMPT_KEYS = {"id", "operation", "number", "status", "adapter", "profile", "simulated", "exit_code", "signal",
                "elapsed_seconds", "usage", "failure_kind", "failure_message", "session_id", "final_message",
                "structured", "cli_version", "prompt", "prompt_sha256", "log", "raw", "stderr", "patch",
                "patch_sha256", "start_commit", "start_manifest", "manifest", "deadline_seconds", "late", "redactions",
                "refusals", "tool_outcomes", "network", "verdict", "verdict_problem", "started_at", "ended_at"}
CHECK_KEYS = {"id", "name", "kind", "command", "cwd", "exit_code", "signal", "passed", "failure_kind", "stale", "log",
              "manifest", "started_at", "ended_at", "elapsed_seconds", "network", "tests"}
SUMMARY_KEYS = {"id", "uid", "status", "simulated", "pipeline", "repo", "revision", "commit", "stop_reason",
                "waiting_for", "waiting_sentence", "current_stage", "rerun_of", "created_at", "started_at",
                "finished_at", "totals"}


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_every_part_of_a_finished_run_s_record_keeps_its_keys(django_user_model, make_pipeline, repo, sent):
    run = operations.create_run(make_pipeline(stages=QUICK_STAGE, scenario=QUICK_SCENARIO), str(repo), "main")
    operations.request_start(run)
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    client = client_of(django_user_model, "viewer", "view_run")
    data = client.get(f"/api/runs/{run.pk}/").json()
    # the API and run_status --json alike, but for the ages read at each call (the run's host beats on)
    ages = ("host_beat_age_seconds", "heartbeat_age_seconds")
    assert {k: v for k, v in data.items() if k not in ages} == {
        k: v for k, v in json.loads(json.dumps(operations.run_status(run))).items() if k not in ages}
    stage = data["stages"][0]
    assert STAGE_KEYS <= set(stage), STAGE_KEYS - set(stage)
    assert stage["attempts"] and stage["checks"]
    for attempt in stage["attempts"]:
        assert ATTEMPT_KEYS <= set(attempt), ATTEMPT_KEYS - set(attempt)
    for check in stage["checks"]:
        assert CHECK_KEYS <= set(check), CHECK_KEYS - set(check)
    listed = client.get("/api/runs/").json()
    line = next(item for item in (listed["results"] if isinstance(listed, dict) else listed) if item["id"] == run.pk)
    assert SUMMARY_KEYS <= set(line), SUMMARY_KEYS - set(line)
    assert {key: line[key] for key in SUMMARY_KEYS if key != "totals"} == {
        key: data[key] for key in SUMMARY_KEYS if key != "totals"}  # each key as in the whole record
