"""The JSON API's contract as its viewset and router keep it (controlpanel/api.py).

tests/test_api.py checks each endpoint's behaviour; these check what the move onto REST
framework's viewset, router and output serializers must not change: the URL names and paths,
the key set of run_status (additions allowed, nothing removed or renamed), the permission
checked before a 405, and the OPTIONS answer naming the endpoint.
"""
from __future__ import annotations

import pytest
from django.urls import reverse

from controlpanel.api import RunStatusSerializer
from engine import operations

from .support.runs import QUICK_SCENARIO, QUICK_STAGE
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
