"""The JSON API under /api/: authentication, permissions, validation, the operations' refusals
with their HTTP statuses, and Start under load over real HTTP and from real processes."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from engine import operations
from engine.models import Attempt, Decision, Run, StartRequest

from .conftest import ANSWER_STEP, new_log_text, wait_for
from .support.runs import QUICK_SCENARIO, QUICK_STAGE
from .support.runs import drive, gated_run, run_with

ALL_PERMISSIONS = ("add_run", "view_run", "start_run", "approve_run", "recheck_run", "recover_run", "fail_run")

#: (method, path under /api/runs/<id>/ or None for the collection, a valid-looking body, the permission).
ENDPOINTS = [
    ("post", None, {"pipeline": "p", "repo": "/nowhere", "rev": "main"}, "engine.add_run"),
    ("get", "", None, "engine.view_run"),
    ("get", None, None, "engine.view_run"),
    ("post", "start/", {}, "engine.start_run"),
    ("post", "approve/", {"decision": 1, "artifact": "0" * 40}, "engine.approve_run"),
    ("post", "request-changes/", {"decision": 1, "artifact": "0" * 40, "note": "n"}, "engine.approve_run"),
    ("post", "recheck/", {"note": "fixed"}, "engine.recheck_run"),
    ("post", "recover/", {"decision": 1, "note": "why", "action": "retry"}, "engine.recover_run"),
    ("post", "fail/", {"reason": "not needed"}, "engine.fail_run"),
]


def url(run_id, tail) -> str:
    return "/api/runs/" if tail is None else f"/api/runs/{run_id}/{tail}"


def send(client, method: str, path: str, body=None):
    if method == "get":
        return client.get(path)
    return client.post(path, body if body is not None else {}, format="json")


def assert_error(response, status: int, code: str, field: str | None = None) -> dict:
    """The response is JSON ``{"error": code, "field": field, "message": ...}`` with ``status``."""
    assert response["Content-Type"].startswith("application/json"), response.content[:300]
    data = response.json()
    assert (response.status_code, data["error"]) == (status, code), data
    if field is not None:
        assert data["field"] == field, data
    assert data["message"], data
    return data


@pytest.fixture
def api_user(django_user_model):
    """``make(name, *codenames)``: a user holding those engine permissions; returns (user, APIClient with its token)."""
    def make(name="alice", *codenames):
        user = django_user_model.objects.create_user(name, f"{name}@example.invalid", "pw-for-tests-only")
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="engine",
                                                              codename__in=codenames))
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
        return user, client
    return make


@pytest.fixture
def operator(api_user):
    """An APIClient of a user holding every permission the API checks."""
    return api_user("operator", *ALL_PERMISSIONS)[1]


@pytest.fixture
def pending(run_row):
    """A pending run of a quick simulated pipeline, built as database rows only (no repository,
    no git): what these tests check is the HTTP layer and the operations' answers; the tests of
    real runs below create theirs with ``operations.create_run``."""
    return run_row(pipeline_kwargs={"stages": QUICK_STAGE, "scenario": QUICK_SCENARIO})


@pytest.fixture
def real_pending(make_pipeline, repo):
    """A pending run created by ``operations.create_run`` on a real repository: a worker runs it."""
    return operations.create_run(make_pipeline(stages=QUICK_STAGE, scenario=QUICK_SCENARIO), str(repo), "main")


def refusal(operation, *args, **kwargs) -> dict:
    """The OperationError ``as_dict()`` of calling ``operation`` directly (it must be refused)."""
    with pytest.raises(operations.OperationError) as info:
        operation(*args, **kwargs)
    return info.value.as_dict()


# ----------------------------------------------------------------------------- authentication


@pytest.mark.django_db
@pytest.mark.parametrize("method, tail, body, perm", ENDPOINTS)
def test_every_endpoint_needs_authentication(pending, method, tail, body, perm):
    response = send(APIClient(), method, url(pending.pk, tail), body)
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Token"
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert_error(send(bad, method, url(pending.pk, tail), body), 401, "authentication_failed")
    assert Run.objects.get(pk=pending.pk).status == "pending" and Run.objects.count() == 1


@pytest.mark.django_db
def test_api_token_prints_one_token_and_it_authenticates(django_user_model, pending, capsys):
    user = django_user_model.objects.create_user("bob", "bob@example.invalid", "pw-for-tests-only")
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    call_command("api_token", "bob")
    key = capsys.readouterr().out.strip()
    assert Token.objects.get(user=user).key == key and len(key) == 40
    call_command("api_token", "bob")
    assert capsys.readouterr().out.strip() == key  # the same token again, not a new one
    client = Client()
    response = client.get(f"/api/runs/{pending.pk}/", headers={"Authorization": f"Token {key}"})
    assert response.status_code == 200 and response.json()["id"] == pending.pk
    response = client.get(f"/api/runs/{pending.pk}/", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200 and response.json()["id"] == pending.pk  # the other common form
    with pytest.raises(CommandError) as info:
        call_command("api_token", "nobody")
    assert str(info.value).startswith("unknown_user [username]:") and "'nobody'" in str(info.value)
    user.is_active = False
    user.save()
    with pytest.raises(CommandError) as info:
        call_command("api_token", "bob")
    assert str(info.value).startswith("inactive_user [username]:")
    response = client.get(f"/api/runs/{pending.pk}/", headers={"Authorization": f"Token {key}"})
    assert_error(response, 401, "authentication_failed")  # the token of an inactive user no longer works


@pytest.mark.django_db
def test_a_logged_in_admin_uses_the_session_and_writes_need_the_csrf_token(django_user_model, pending, sent):
    admin = django_user_model.objects.create_superuser("admin", "admin@example.invalid", "pw-for-tests-only")
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)
    assert client.get(f"/api/runs/{pending.pk}/").json()["status"] == "pending"
    start = f"/api/runs/{pending.pk}/start/"
    data = assert_error(client.post(start, "{}", content_type="application/json"), 403, "permission_denied")
    assert "CSRF" in data["message"]
    assert Run.objects.get(pk=pending.pk).status == "pending" and sent == []
    assert client.get("/admin/").status_code == 200  # the admin's pages hand out the CSRF cookie
    response = client.post(start, "{}", content_type="application/json",
                           headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert response.status_code == 202, response.content
    assert StartRequest.objects.get(run=pending).requested_by == "admin"


# ----------------------------------------------------------------------------- permissions


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("method, tail, body, perm", ENDPOINTS)
def test_each_endpoint_needs_its_permission(api_user, pending, sent, method, tail, body, perm):
    codename = perm.partition(".")[2]
    _, without = api_user("carol", *[p for p in ALL_PERMISSIONS if p != codename])
    data = assert_error(send(without, method, url(pending.pk, tail), body), 403, "permission_denied")
    assert data["permission"] == perm and perm in data["message"] and "'carol'" in data["message"]
    assert Run.objects.get(pk=pending.pk).status == "pending" and Run.objects.count() == 1 and sent == []
    # with that one permission alone the request is let through to the operation (whatever it says)
    _, only = api_user("dave", codename)
    response = send(only, method, url(pending.pk, tail), body)
    assert response.status_code != 403 and response.status_code < 500, response.content


# ----------------------------------------------------------------------------- validation

INVALID = [
    (None, {"repo": "/r", "rev": "main"}, "pipeline"),
    (None, {"pipeline": True, "repo": "/r", "rev": "main"}, "pipeline"),
    (None, {"pipeline": "p", "repo": 12, "rev": "main"}, "repo"),
    (None, {"pipeline": "p", "repo": "/r"}, "rev"),
    (None, {"pipeline": "p", "repo": "/r", "rev": ["main"]}, "rev"),
    (None, {"pipeline": "p", "repo": "/r", "rev": "main", "profiles": ["scripted"]}, "profiles"),
    (None, {"pipeline": "p", "repo": "/r", "rev": "main", "profiles": {"implementer": 3}}, "profiles.implementer"),
    (None, {"pipeline": "p", "repo": "/r", "revision": "main"}, "revision"),
    ("start/", {"now": True}, "now"),
    ("approve/", {"artifact": "0" * 40}, "decision"),
    ("approve/", {"decision": "seven", "artifact": "0" * 40}, "decision"),
    ("approve/", {"decision": True, "artifact": "0" * 40}, "decision"),
    ("approve/", {"decision": 1.5, "artifact": "0" * 40}, "decision"),
    ("approve/", {"decision": 1}, "artifact"),
    ("approve/", {"decision": 1, "artifact": {"digest": "x"}}, "artifact"),
    ("approve/", {"decision": 1, "artifact": "0" * 40, "reviewer": 5}, "reviewer"),
    ("request-changes/", {"decision": 1, "artifact": "0" * 40}, "note"),
    ("request-changes/", {"decision": 1, "artifact": "0" * 40, "note": "n", "comments": "x"}, "comments"),
    ("recheck/", {}, "note"),
    ("recheck/", {"note": None}, "note"),
    ("recover/", {"note": "n", "action": "retry"}, "decision"),
    ("recover/", {"decision": 1, "action": "retry"}, "note"),
    ("recover/", {"decision": 1, "note": "n"}, "action"),
    ("recover/", {"decision": 1, "note": "n", "action": "redo"}, "action"),
    ("fail/", {}, "reason"),
    ("fail/", {"reason": ["a"]}, "reason"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("tail, body, field", INVALID)
def test_bad_input_is_400_invalid_naming_the_field(operator, pending, sent, tail, body, field):
    data = assert_error(send(operator, "post", url(pending.pk, tail), body), 400, "invalid", field)
    assert data["message"].startswith(f"{field}: ")
    assert Run.objects.get(pk=pending.pk).status == "pending" and Run.objects.count() == 1 and sent == []


@pytest.mark.django_db
@pytest.mark.parametrize("tail", [None, "start/", "approve/", "request-changes/", "recheck/", "recover/", "fail/"])
@pytest.mark.parametrize("raw, content_type", [
    ('{"note": ', "application/json"),  # cut short
    ("[1, 2]", "application/json"),  # JSON, but not an object
    ('"text"', "application/json"),
    ("note=fixed", "application/x-www-form-urlencoded"),  # a form, not JSON
    ("note: fixed", "text/plain"),
])
def test_a_body_that_is_not_a_json_object_is_400(operator, pending, sent, tail, raw, content_type):
    response = operator.post(url(pending.pk, tail), raw, content_type=content_type)
    assert_error(response, 400, "invalid", "body")
    assert Run.objects.get(pk=pending.pk).status == "pending" and Run.objects.count() == 1 and sent == []


@pytest.mark.django_db
def test_unknown_paths_and_methods_answer_json(operator, pending):
    assert_error(operator.get("/api/"), 404, "not_found")
    assert_error(operator.get("/api/pipelines/"), 404, "not_found")
    assert_error(operator.get(f"/api/runs/{pending.pk}/start/"), 405, "method_not_allowed")
    assert_error(operator.delete(f"/api/runs/{pending.pk}/"), 405, "method_not_allowed")
    assert_error(operator.delete("/api/runs/"), 405, "method_not_allowed")


@pytest.mark.django_db
def test_a_post_to_a_path_that_names_no_endpoint_is_the_json_404(operator, pending):
    """The API client enforces CSRF checks like a browser: a token-authenticated POST to a wrong
    path must get the JSON 404, never Django's HTML CSRF page."""
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=operator._credentials["HTTP_AUTHORIZATION"])
    for path in ("/api/runs", f"/api/runs/{pending.pk}", f"/api/runs/{pending.pk}/frob/"):
        assert_error(client.post(path, {}, format="json"), 404, "not_found")


# ----------------------------------------------------------------------------- create and status


@pytest.mark.django_db
def test_create_returns_the_run_status_of_a_simulated_pending_run(api_user, make_pipeline, repo):
    user, client = api_user("erin", "add_run", "view_run")
    pipeline = make_pipeline(stages=QUICK_STAGE, scenario=QUICK_SCENARIO)
    response = client.post("/api/runs/", {"pipeline": pipeline.name, "repo": str(repo), "rev": "main",
                                          "profiles": {"implementer": "scripted"}}, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    run = Run.objects.get()
    assert data == json.loads(json.dumps(operations.run_status(run)))  # the same contract as run_status --json
    assert response["Location"] == f"/api/runs/{run.pk}/"
    assert (data["status"], data["waiting_for"], data["simulated"]) == ("pending", "start", True)
    assert data["simulated_reason"] == "scripted test adapter" and run.profile_override == {"implementer": "scripted"}
    assert client.get(f"/api/runs/{run.pk}/").json() == data
    # by id as well as by name
    response = client.post("/api/runs/", {"pipeline": pipeline.pk, "repo": str(repo), "rev": "main"}, format="json")
    assert response.status_code == 201 and response.json()["pipeline"] == pipeline.name


@pytest.mark.django_db
def test_create_refusals_are_the_operations_own(operator, make_pipeline, repo, tmp_path):
    pipeline = make_pipeline().name
    cases = [
        (404, {"pipeline": "no-such-pipeline", "repo": str(repo), "rev": "main"}),
        (400, {"pipeline": pipeline, "repo": str(tmp_path / "missing"), "rev": "main"}),
        (400, {"pipeline": pipeline, "repo": str(repo), "rev": "no-such-branch"}),
        (400, {"pipeline": pipeline, "repo": str(repo), "rev": "main", "profiles": {"tester": "scripted"}}),
        (400, {"pipeline": pipeline, "repo": str(repo), "rev": "main", "profiles": {"reviewer": "nobody"}}),
    ]
    for status, body in cases:
        expected = refusal(operations.create_run, body["pipeline"], body["repo"], body["rev"], body.get("profiles"))
        response = operator.post("/api/runs/", body, format="json")
        assert (response.status_code, response.json()) == (status, expected), body
    assert Run.objects.count() == 0


@pytest.mark.django_db
def test_status_of_an_unknown_run_is_404_naming_the_run(operator):
    for ref in ("424242", "abc", "-1"):
        assert assert_error(operator.get(f"/api/runs/{ref}/"), 404, "unknown_run", "run") == \
            refusal(operations.run_status, ref)
        assert_error(operator.post(f"/api/runs/{ref}/start/", {}, format="json"), 404, "unknown_run", "run")


# ----------------------------------------------------------------------------- start


@pytest.mark.django_db(transaction=True)
def test_start_is_202_once_then_409_already_started(api_user, pending, sent):
    _, client = api_user("frank", "start_run", "view_run")
    response = client.post(f"/api/runs/{pending.pk}/start/", {}, format="json")
    assert response.status_code == 202, response.content
    start = StartRequest.objects.get(run=pending)
    assert response.json() == {"run": pending.pk, "status": "queued", "simulated": True, "start_request": start.pk}
    assert (start.requested_by, start.source) == ("frank", "api")
    assert sent == [(pending.pk, None)]  # one wake-up, sent after the commit
    again = client.post(f"/api/runs/{pending.pk}/start/", format="json")  # an empty body is {} too
    assert assert_error(again, 409, "already_started", "run") == refusal(operations.request_start, pending.pk)
    assert StartRequest.objects.filter(run=pending).count() == 1 and sent == [(pending.pk, None)]
    assert client.get(f"/api/runs/{pending.pk}/").json()["waiting_for"] == "worker"


# ----------------------------------------------------------------------------- approve, recheck, recover, fail


@pytest.mark.django_db
def test_actions_on_a_pending_run_are_refused_with_the_operations_codes(operator, pending, sent):
    cases = [
        ("approve/", {"decision": 999, "artifact": "0" * 40}, 400,
         lambda: operations.approve(pending.pk, 999, "0" * 40, "operator")),
        ("approve/", {"decision": 999, "artifact": "0" * 40, "reviewer": "  "}, 400,  # blank: the user's name
         lambda: operations.approve(pending.pk, 999, "0" * 40, "operator")),
        ("recheck/", {"note": "fixed"}, 409, lambda: operations.recheck(pending.pk, "fixed", "operator")),
        ("recheck/", {"note": " "}, 400, lambda: operations.recheck(pending.pk, " ", "operator")),
        ("recover/", {"decision": 999, "note": "why", "action": "retry"}, 409,
         lambda: operations.recover(pending.pk, 999, "why", "retry", "operator")),
        ("recover/", {"decision": 999, "note": "", "action": "verify"}, 400,
         lambda: operations.recover(pending.pk, 999, "", "verify", "operator")),
    ]
    for tail, body, status, direct in cases:
        expected = refusal(direct)
        response = operator.post(url(pending.pk, tail), body, format="json")
        assert (response.status_code, response.json()) == (status, expected), (tail, body)
    codes = [refusal(direct)["error"] for _, _, _, direct in cases]
    assert codes == ["unknown_decision", "unknown_decision", "not_waiting", "note_required", "not_waiting_review",
                     "note_required"]
    assert Run.objects.get(pk=pending.pk).status == "pending" and sent == []


@pytest.mark.django_db(transaction=True)
def test_fail_a_run_then_every_action_on_it_is_refused(operator, pending, sent):
    """Needs operations.fail_run (the lead's): reason_required [reason], already_finished [run]."""
    blank = operator.post(f"/api/runs/{pending.pk}/fail/", {"reason": "  "}, format="json")
    assert (blank.status_code, blank.json()) == (400, refusal(operations.fail_run, pending.pk, "  ", "operator"))
    assert blank.json()["error"] == "reason_required" and blank.json()["field"] == "reason"
    response = operator.post(f"/api/runs/{pending.pk}/fail/", {"reason": "not needed any more"}, format="json")
    assert response.status_code == 200, response.content
    run = Run.objects.get(pk=pending.pk)
    assert run.status == "failed" and run.finished_at is not None
    assert response.json() == {"run": run.pk, "status": "failed", "simulated": True,
                               "stop_reason": run.stop_reason or None}
    again = operator.post(f"/api/runs/{pending.pk}/fail/", {"reason": "twice"}, format="json")
    assert (again.status_code, again.json()) == (409, refusal(operations.fail_run, pending.pk, "twice", "operator"))
    assert again.json()["error"] == "already_finished"
    assert_error(operator.post(f"/api/runs/{pending.pk}/start/", {}, format="json"), 409, "already_started")
    assert_error(operator.post(f"/api/runs/{pending.pk}/recheck/", {"note": "n"}, format="json"), 409, "not_waiting")
    assert_error(operator.post(f"/api/runs/{pending.pk}/fail/", {"reason": "x"}, format="json"), 409,
                 "already_finished", "run")
    assert_error(operator.post("/api/runs/424242/fail/", {"reason": "x"}, format="json"), 404, "unknown_run", "run")
    assert sent == []


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_approve_through_the_api_on_a_real_human_gate(operator, make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    decision = run.decisions.get(state="pending")
    approve = f"/api/runs/{run.pk}/approve/"
    for artifact in ("0" * 40, decision.artifact[:6]):
        body = {"decision": decision.pk, "artifact": artifact}
        expected = refusal(operations.approve, run.pk, decision.pk, artifact, "operator")
        response = operator.post(approve, body, format="json")
        assert (response.status_code, response.json()) == (400, expected)
        assert expected["error"] == "artifact_mismatch" and expected["field"] == "artifact"
    status = operator.get(f"/api/runs/{run.pk}/").json()
    assert status["waiting_for"] == "approval" and status["pending_decision"]["artifact"] == decision.artifact
    response = operator.post(approve, {"decision": decision.pk, "artifact": decision.artifact[:12]}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["decision"] == {"id": decision.pk, "state": "approved", "decided_by": "operator"}
    assert response.json()["run"] == run.pk and response.json()["simulated"] is True
    again = operator.post(approve, {"decision": decision.pk, "artifact": decision.artifact, "reviewer": "pat"},
                          format="json")
    assert_error(again, 409, "stale_decision", "decision")
    assert again.json() == refusal(operations.approve, run.pk, decision.pk, decision.artifact, "pat")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert Decision.objects.get(pk=decision.pk).decided_by == "operator"


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_recheck_through_the_api_asks_for_a_new_approval(operator, make_pipeline, repo, sent):
    run = gated_run(make_pipeline, repo, sent)
    old = run.decisions.get(state="pending")
    recheck = f"/api/runs/{run.pk}/recheck/"
    assert_error(operator.post(recheck, {"note": ""}, format="json"), 400, "note_required", "note")
    response = operator.post(recheck, {"note": "looked again"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["stage"] == "answer" and response.json()["status"] in ("queued", "running")
    assert Decision.objects.get(pk=old.pk).state == "superseded"
    assert_error(operator.post(recheck, {"note": "again"}, format="json"), 409, "not_waiting", "run")
    run = drive(run.pk, sent)
    assert run.status == "waiting_approval" and run.decisions.get(state="pending").pk != old.pk


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_recover_through_the_api_on_a_run_waiting_for_review(operator, make_pipeline, repo, sent):
    finding = {"file": "app/core.py", "line": 4, "severity": "major", "text": "Is 42 the right answer?"}
    escalate = {"verdict": {"verdict": "escalate", "findings": [finding]}}
    run = run_with(make_pipeline, repo, sent, {"implement": [ANSWER_STEP], "review": [escalate, {"verdict": {
        "verdict": "pass", "findings": []}}]})
    assert (run.status, run.stop_reason) == ("waiting_review", "review_escalated"), run.stop_message
    decision = run.decisions.get(state="pending")
    recover = f"/api/runs/{run.pk}/recover/"
    wrong = {"decision": decision.pk + 100, "note": "why", "action": "verify"}
    assert operator.post(recover, wrong, format="json").json() == refusal(
        operations.recover, run.pk, decision.pk + 100, "why", "verify", "operator")
    assert_error(operator.post(recover, wrong, format="json"), 400, "unknown_decision", "decision")
    response = operator.post(recover, {"decision": decision.pk, "note": "the requirement is clear",
                                       "action": "verify"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["decision"] == {"id": decision.pk, "state": "recovered", "action": "verify",
                                           "decided_by": "operator"}
    again = operator.post(recover, {"decision": decision.pk, "note": "again", "action": "retry"}, format="json")
    assert_error(again, 409, "not_waiting_review", "run")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    assert Attempt.objects.filter(run=run, operation="implement").count() == 1  # verify: no new attempt


# ----------------------------------------------------------------------------- Start under load (slow)

STARTS = 50


@pytest.fixture
def roomy_live_server(live_server):
    """pytest-django's live server, with a listen queue long enough for STARTS connections at once.

    Django's test server (like runserver) listens with a queue of 10 (WSGIServer.request_queue_size):
    beyond that the kernel resets a new connection before the server ever reads it, which is the
    queue's doing, not the API's. Listening again on the same socket only lengthens the queue.
    """
    live_server.thread.httpd.socket.listen(STARTS * 2)
    return live_server


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_50_api_starts_at_once_over_http_one_202_and_49_conflicts(workers, roomy_live_server, api_user, real_pending):
    pending = real_pending
    user, _ = api_user("load", "start_run")
    key = f"Token {Token.objects.get(user=user).key}"
    barrier = threading.Barrier(STARTS)
    results = []

    def start():
        request = urllib.request.Request(f"{roomy_live_server.url}/api/runs/{pending.pk}/start/", data=b"{}",
                                         method="POST", headers={"Authorization": key,
                                                                 "Content-Type": "application/json"})
        barrier.wait()
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                results.append((response.status, response.read().decode()))
        except urllib.error.HTTPError as exc:
            results.append((exc.code, exc.read().decode()))
        except Exception as exc:  # a refused connection or a timeout is a failure too
            results.append(("no answer", repr(exc)))

    threads = [threading.Thread(target=start) for _ in range(STARTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(results) == STARTS, results
    codes = sorted(str(code) for code, _ in results)
    assert codes == ["202"] + ["409"] * (STARTS - 1), [r for r in results if r[0] != 409]
    refusals = [json.loads(body) for code, body in results if code == 409]
    assert {(r["error"], r["field"]) for r in refusals} == {("already_started", "run")}
    accepted = json.loads(next(body for code, body in results if code == 202))
    assert accepted["run"] == pending.pk and accepted["start_request"] == StartRequest.objects.get(run=pending).pk
    run = wait_for(pending.pk, timeout=300)
    assert run.status == "succeeded", (run.stop_reason, run.stop_message)
    assert Attempt.objects.filter(run=run, operation="implement").count() == 1
    assert StartRequest.objects.get(run=run).enqueued_times == 1
    logs = new_log_text(workers)
    assert "OperationalError" not in logs and "database is locked" not in logs and "Traceback" not in logs


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_50_start_run_processes_at_once_one_accepted(workers, real_pending):
    pending = real_pending
    argv = [sys.executable, "manage.py", "start_run", str(pending.pk)]
    env = workers.env()
    procs = [subprocess.Popen(argv, cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(STARTS)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        results.append((proc.returncode, out, err))
    for _, out, err in results:
        for bad in ("OperationalError", "database is locked", "Traceback"):
            assert bad not in out + err, (out, err)
    assert sorted(code != 0 for code, _, _ in results) == [False] + [True] * (STARTS - 1), results
    refused = [err for code, _, err in results if code != 0]
    assert all("already_started [run]" in err for err in refused), refused
    accepted = next(out for code, out, _ in results if code == 0)
    assert f"run {pending.pk} [simulated]: start request recorded" in accepted
    run = wait_for(pending.pk, timeout=300)
    assert run.status == "succeeded", (run.stop_reason, run.stop_message)
    assert Attempt.objects.filter(run=run, operation="implement").count() == 1
    start = StartRequest.objects.get(run=run)
    assert (start.source, start.enqueued_times) == ("cli", 1)
    logs = new_log_text(workers)
    assert "OperationalError" not in logs and "database is locked" not in logs and "Traceback" not in logs
