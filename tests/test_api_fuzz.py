"""Schemathesis against a real test server: every operation of the OpenAPI schema (``/api/schema/``),
with requests generated from the schema itself, answers as the schema says.

pytest-django's ``live_server`` serves the API on loopback; the schema is read from it, and every
operation gets up to ``EXAMPLES`` generated requests (paths, queries and bodies made by Hypothesis from
the schema, so a wrong type, a missing field and odd values are tried) with a superuser's token. Checked
for each answer: no server error, its status code documented for the operation, and its body valid
against the documented response schema. Runs referred to by id exist (two runs of a scripted pipeline:
one pending, one waiting for approval), so the answers are not only 404s.
"""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings as hypothesis_settings
from rest_framework.authtoken.models import Token
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance
from schemathesis.checks import not_a_server_error

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: Generated requests per operation.
EXAMPLES = 25


@pytest.fixture
def api_schema(live_server, django_user_model, run_row):
    """The schema as the live server serves it, with a superuser's token on every request."""
    user = django_user_model.objects.create_superuser("fuzz", "fuzz@example.invalid", "pw-for-tests-only")
    token = Token.objects.create(user=user).key
    run_row(status="pending")
    run_row(status="waiting_approval", stage_statuses=("waiting_approval",))
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/",
                                           headers={"Authorization": f"Token {token}"})
    schema.config.headers = {"Authorization": f"Token {token}"}
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@hypothesis_settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_the_schema_says(case):
    token = case.operation.schema.config.headers["Authorization"]
    case.call_and_validate(headers={"Authorization": token},
                           checks=[not_a_server_error, status_code_conformance, response_schema_conformance])
