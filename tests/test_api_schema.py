"""The run list (``GET /api/runs/``) and the OpenAPI schema (``/api/schema/``, drf-spectacular).

The schema is checked against the router itself (every route and method, nothing more) and
against the inputs each action reads; real answers of the endpoints are validated against it
with jsonschema (OpenAPI 3.0's ``nullable`` and ``$ref`` turned into JSON Schema here).
"""
from __future__ import annotations

import re

import jsonschema
import pytest
from django.urls import URLPattern

from controlpanel.api import RunViewSet, router
from engine import operations

from .support.fixtures import client_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(run_row):
    """Five runs of two pipelines: pending, waiting_approval, failed (pipeline p), waiting_review, succeeded (q)."""
    made = [run_row(status="pending"), run_row(status="waiting_approval", stage_statuses=("waiting_approval",)),
            run_row(status="failed", stage_statuses=("failed",))]
    q = {"pipeline_kwargs": {"name": "q"}}
    made += [run_row(status="waiting_review", stage_statuses=("waiting_review",), **q),
             run_row(status="succeeded", stage_statuses=("passed",), **q)]
    return made


@pytest.fixture
def viewer(django_user_model):
    return client_of(django_user_model, "viewer", "view_run")


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def test_the_list_filters_by_status_pipeline_and_waiting_newest_first(viewer, runs):
    every = [run.pk for run in reversed(runs)]
    assert ids(viewer.get("/api/runs/")) == every
    assert ids(viewer.get("/api/runs/?status=failed,succeeded")) == [runs[4].pk, runs[2].pk]
    assert ids(viewer.get("/api/runs/?pipeline=q")) == [runs[4].pk, runs[3].pk]
    assert ids(viewer.get(f"/api/runs/?pipeline={runs[3].pipeline_id}")) == [runs[4].pk, runs[3].pk]
    assert ids(viewer.get("/api/runs/?pipeline=nothing-of-that-name")) == []
    assert ids(viewer.get("/api/runs/?waiting=true")) == [runs[3].pk, runs[1].pk]
    assert ids(viewer.get("/api/runs/?waiting=false&pipeline=q")) == [runs[4].pk]
    row = viewer.get("/api/runs/?status=waiting_approval").json()["results"][0]
    assert row["waiting_for"] == "approval" and row["pipeline"] == runs[1].pipeline_name
    assert set(row["totals"]) >= {"input_tokens", "cost_usd", "active_seconds", "elapsed_seconds"}


def test_the_list_pages_and_refuses_bad_filters(viewer, runs, django_user_model):
    first = viewer.get("/api/runs/?page_size=2").json()
    assert first["count"] == 5 and len(first["results"]) == 2 and first["previous"] is None
    second = viewer.get(first["next"]).json()
    assert [r["id"] for r in second["results"]] == [runs[2].pk, runs[1].pk]
    for query, field in (("status=done", "status"), ("page_size=0", "page_size"), ("page_size=101", "page_size"),
                         ("waiting=maybe", "waiting"), ("page=0", "page")):
        response = viewer.get(f"/api/runs/?{query}")
        assert (response.status_code, response.json()["field"]) == (400, field), query
    assert viewer.get("/api/runs/?page=9").json()["error"] == "not_found"
    blind = client_of(django_user_model, "blind", "add_run")
    response = blind.get("/api/runs/")
    assert (response.status_code, response.json()["permission"]) == (403, "engine.view_run")


def test_run_status_has_stage_totals_and_timestamps(run_row):
    run = run_row(status="running", stage_statuses=("running",))
    stage = operations.run_status(run)["stages"][0]
    assert {"started_at", "finished_at", "totals"} <= set(stage)
    assert set(stage["totals"]) == {"input_tokens", "output_tokens", "cached_tokens", "cost_usd", "attempts",
                                    "active_seconds", "elapsed_seconds"}


# ----------------------------------------------------------------------------- the schema


def router_operations() -> dict[tuple[str, str], str]:
    """``{(OpenAPI path, method): viewset action}`` of every route the router serves."""
    found = {}
    for pattern in router.urls:
        assert isinstance(pattern, URLPattern)
        path = "/" + re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern.pattern.regex.pattern).strip("^$")
        for method, action in pattern.callback.actions.items():
            if method not in ("head", "options"):  # REST framework answers them for any GET route
                found[(path, method)] = action
    return found


def to_json_schema(node, components: dict):
    """An OpenAPI 3.0 schema object as JSON Schema: ``$ref`` resolved, ``nullable`` as a null alternative."""
    if isinstance(node, list):
        return [to_json_schema(item, components) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return to_json_schema(components[node["$ref"].rsplit("/", 1)[1]], components)
    out = {key: to_json_schema(value, components) for key, value in node.items()
           if key not in ("nullable", "example", "readOnly", "writeOnly")}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


@pytest.fixture
def schema(viewer):
    response = viewer.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200, response.content
    return response.json()


def test_the_schema_names_every_route_and_method_and_nothing_else(schema):
    assert schema["openapi"].startswith("3.")
    documented = {(path, method) for path, item in schema["paths"].items() for method in item
                  if method in ("get", "post", "put", "patch", "delete")}
    assert documented == set(router_operations())


def test_each_action_s_request_body_is_its_input_serializer(schema):
    components = schema["components"]["schemas"]
    for (path, method), action in router_operations().items():
        if method != "post":
            continue
        fields = set(RunViewSet.INPUTS[action]().fields)
        body = schema["paths"][path][method].get("requestBody")
        if not fields:
            continue
        ref = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        assert set(components[ref]["properties"]) == fields, path


def test_real_answers_fit_the_schema(schema, viewer, runs, django_user_model):
    components = schema["components"]["schemas"]

    def answer_of(path: str, method: str, code: int) -> dict:
        found = schema["paths"][path][method]["responses"][str(code)]["content"]["application/json"]["schema"]
        return to_json_schema(found, components)

    jsonschema.validate(viewer.get("/api/runs/?page_size=2").json(), answer_of("/api/runs/", "get", 200))
    jsonschema.validate(viewer.get(f"/api/runs/{runs[1].pk}/").json(), answer_of("/api/runs/{run_id}/", "get", 200))
    refused = viewer.get("/api/runs/?status=nope").json()
    jsonschema.validate(refused, answer_of("/api/runs/", "get", 400))
    starter = client_of(django_user_model, "starter", "start_run", "view_run")
    ack = starter.post(f"/api/runs/{runs[0].pk}/start/", {}, format="json")
    assert ack.status_code == 202, ack.content
    jsonschema.validate(ack.json(), answer_of("/api/runs/{run_id}/start/", "post", 202))
    again = starter.post(f"/api/runs/{runs[0].pk}/start/", {}, format="json")
    jsonschema.validate(again.json(), answer_of("/api/runs/{run_id}/start/", "post", 409))
