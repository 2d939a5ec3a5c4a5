"""The OpenAPI 3 schema of the JSON API (controlpanel/api.py), made by drf-spectacular 0.30.0.

``RunViewSet`` is a plain ``ViewSet`` whose actions read their bodies with input serializers
(``RunViewSet.INPUTS``) and answer either a run's record (``operations.run_status``: engine/record.py
``RunRecord``, the contract of docs/run-status.md) or an acknowledgement serializer; so each
action's request, responses and query parameters are declared here (``document``) instead of
guessed. tests/test_api_schema.py checks that the schema names every route of the router with
its methods and inputs, and that real answers of the endpoints fit it.
"""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers

from engine.record import RunRecord, RunSummary


class BearerScheme(OpenApiAuthenticationExtension):
    """``Authorization: Bearer KEY`` (controlpanel/api_auth.py ``BearerTokenAuthentication``): the
    API token in the bearer form, a scheme of its own beside ``Token KEY``."""

    target_class = "controlpanel.api_auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}


class PipelineRef(OpenApiSerializerFieldExtension):
    """controlpanel/api.py ``PipelineField``: a saved pipeline's name, or its id."""

    target_class = "controlpanel.api.PipelineField"

    def map_serializer_field(self, auto_schema, direction):
        return {"oneOf": [{"type": "string"}, {"type": "integer"}], "description": "a saved pipeline's name or id"}


class ErrorSerializer(serializers.Serializer):
    """Every refusal: ``{error, field, message}`` (controlpanel/api_errors.py)."""

    error = serializers.CharField(help_text="a stable code, e.g. stale_decision")
    field = serializers.CharField(allow_blank=True, help_text="the input at fault, or ''")
    message = serializers.CharField()


RUN_RECORD = OpenApiResponse(RunRecord, description="the run's record: what `run_status --json` prints "
                                                   "(docs/run-status.md)")
REFUSALS = {code: OpenApiResponse(ErrorSerializer, description=why) for code, why in (
    (400, "invalid input (`invalid`, naming the field) or a refused operation"),
    (401, "not authenticated"), (403, "permission_denied, naming the permission"),
    (404, "unknown_run / unknown_pipeline"), (409, "not in a state that allows it (e.g. stale_decision)"))}


def document(viewset, list_query, acks: dict):
    """Declare each action of ``viewset`` (controlpanel/api.py ``RunViewSet``) to drf-spectacular:
    its input serializer (``viewset.INPUTS``) as the request, ``list_query`` as the list's query
    parameters, and its answers (``acks``: ``{action: acknowledgement serializer}``, a run's record
    for the others). Returns the viewset."""
    inputs = viewset.INPUTS

    def post(name: str, code: int, summary: str):
        return extend_schema(request=inputs[name], responses={code: acks.get(name, RUN_RECORD), **REFUSALS},
                             summary=summary)

    return extend_schema_view(
        # paged as the viewset's ``pagination_class`` pages it: {count, next, previous, results}
        list=extend_schema(parameters=[list_query], responses={200: RunSummary, **REFUSALS},
                           summary="The runs, newest first, filtered and paged"),
        create=post("create", 201, "Create a run (and start it with start: true)"),
        retrieve=extend_schema(responses={200: RUN_RECORD, **REFUSALS}, summary="A run's record"),
        start=post("start", 202, "Request a pending run's start"),
        approve=post("approve", 200, "Approve a human gate"),
        request_changes=post("request_changes", 200, "Send the files at a human gate back with findings"),
        recheck=post("recheck", 200, "Verify a waiting stage again"),
        recover=post("recover", 200, "Recover a run waiting for review"),
        fail=post("fail", 200, "Fail a run"),
        rerun=post("rerun", 201, "Re-run an ended run"),
        continue_run=post("continue_run", 201, "Continue a run its budget stopped, with a raised budget"),
    )(viewset)
