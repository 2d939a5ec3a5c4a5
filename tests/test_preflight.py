"""Pre-flight at run creation (engine/agents/cli_adapter.py ``CliAdapter.preflight``,
engine/operations.py ``_refuse_preflight``), the auth_failed message naming what to set, and Recheck /
Recover-verify offered only when the stage produced a result (engine/answers.py ``stage_has_result``).

Stand-in CLIs answer ``--version`` and ``--help`` like the pinned ones; the environment's credential
variables are cleared and HOME is an empty folder, so nothing of the machine running the tests counts.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from controlpanel.forms import CreateRunForm, RecoverForm
from engine import answers, operations
from engine.agents import get_adapter
from engine.agents.codex.adapter import CodexAdapter
from engine.management.commands.run_status import waiting_hint
from engine.models import Attempt, Decision, Manifest
from engine.processes.process import ProcessResult

from .support.claude import stub_claude
from .support.adapters import write_jsonl
from .support.codex import make_request
from .support.runs import QUICK, drive
from .support.runs import cli_pipeline, refused

# the stand-in CLIs these tests write in tmp_path are executables the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("stand_ins_listed")



# ----------------------------------------------------------------------------- credentials


@pytest.mark.parametrize("adapter, variable", [("claude-code", "ANTHROPIC_API_KEY"), ("codex", "CODEX_API_KEY")])
def test_a_profile_without_credentials_is_refused_naming_role_profile_and_variable(
        make_pipeline, repo, tmp_path, bare, adapter, variable):
    error = refused(cli_pipeline(make_pipeline, tmp_path, adapter), repo, "credentials_missing")
    assert "implementer, reviewer, documenter (profile 'cli')" in error.message
    assert f"set {variable}" in error.message and "process that creates the run" in error.message
    login = ".credentials.json" if adapter == "claude-code" else "auth.json"
    assert login in error.message


@pytest.mark.parametrize("adapter, variable", [("claude-code", "ANTHROPIC_API_KEY"), ("claude-code",
                                                                                       "CLAUDE_CODE_OAUTH_TOKEN"),
                                               ("codex", "CODEX_API_KEY"), ("codex", "OPENAI_API_KEY")])
def test_a_credential_variable_of_the_environment_is_enough(make_pipeline, repo, tmp_path, bare, monkeypatch,
                                                            adapter, variable):
    monkeypatch.setenv(variable, "dummy-credential-for-tests-0000")
    run = operations.create_run(cli_pipeline(make_pipeline, tmp_path, adapter), str(repo), "main")
    assert run.status == "pending" and not run.simulated


@pytest.mark.parametrize("adapter, variable", [("claude-code", "ANTHROPIC_API_KEY"), ("codex", "OPENAI_API_KEY")])
def test_a_blank_credential_variable_is_no_credential(make_pipeline, repo, tmp_path, bare, monkeypatch, adapter,
                                                      variable):
    monkeypatch.setenv(variable, "   ")
    refused(cli_pipeline(make_pipeline, tmp_path, adapter), repo, "credentials_missing")


def test_a_login_file_is_enough(make_pipeline, repo, tmp_path, bare, monkeypatch):
    (bare / ".claude").mkdir()
    (bare / ".claude" / ".credentials.json").write_text('{"claudeAiOauth": {}}')
    assert operations.create_run(cli_pipeline(make_pipeline, tmp_path, "claude-code"), str(repo), "main")
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    (codex_home / "auth.json").write_text('{"OPENAI_API_KEY": null}')
    monkeypatch.setenv("CODEX_HOME", str(codex_home))  # worker_codex_home: $CODEX_HOME, else ~/.codex
    assert operations.create_run(cli_pipeline(make_pipeline, tmp_path, "codex"), str(repo), "main")


def test_a_scripted_endpoint_profile_and_the_scripted_adapter_need_nothing(make_pipeline, repo, tmp_path, bare):
    endpoint = {"default": [{"text": "done"}]}
    run = operations.create_run(cli_pipeline(make_pipeline, tmp_path, "claude-code", scripted_endpoint=endpoint),
                                str(repo), "main")
    assert run.simulated
    assert get_adapter("codex").preflight({"adapter": "codex", "scripted_endpoint": endpoint}) == []
    assert operations.create_run(make_pipeline(name="plain"), str(repo), "main").simulated


def test_the_create_form_labels_a_profile_that_would_be_refused(make_pipeline, tmp_path, bare):
    pipeline = cli_pipeline(make_pipeline, tmp_path, "claude-code")
    definition = dict(pipeline.definition)
    definition["profiles"] = {**definition["profiles"], "sim": {"adapter": "scripted", "scenario": {}}}
    pipeline.definition = definition
    form = CreateRunForm(pipeline=pipeline)
    choices = dict(form.fields["profile_implementer"].choices)
    assert choices["cli"] == "cli (no credentials: set ANTHROPIC_API_KEY)"
    assert choices["sim"] == "sim"
    assert choices[""] == "the pipeline's: cli (no credentials: set ANTHROPIC_API_KEY)"


# ----------------------------------------------------------------------------- gateways


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_gateway_that_does_not_answer_is_refused(make_pipeline, repo, tmp_path, bare, monkeypatch, gateway_listed):
    monkeypatch.setenv("GATEWAY_TEST_KEY", "dummy-credential-for-tests-0000")
    port = closed_port()
    url = gateway_listed(f"http://127.0.0.1:{port}")
    error = refused(cli_pipeline(make_pipeline, tmp_path, "claude-code", base_url=f"{url}/v1"),
                    repo, "gateway_unreachable")
    assert f"127.0.0.1:{port}" in error.message and "TCP connect" in error.message


def test_a_gateway_that_answers_is_accepted_and_one_the_proxy_refuses_is_not(make_pipeline, repo, tmp_path, bare,
                                                                              monkeypatch, gateway_listed):
    monkeypatch.setenv("GATEWAY_TEST_KEY", "dummy-credential-for-tests-0000")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        profile = {"adapter": "claude-code", "env": {"ANTHROPIC_BASE_URL": gateway_listed(f"http://127.0.0.1:{port}")}}
        assert get_adapter("claude-code").preflight(profile) == []
        # the same address as a Control Panel service: the egress proxy never connects there
        problems = get_adapter("claude-code").preflight(profile, deny=[("127.0.0.1", port)])
        assert [p.code for p in problems] == ["gateway_not_allowed"]
        assert "service of the Control Panel" in problems[0].message
        # a user part is never a listed gateway, and the refusal does not repeat it
        profile["env"]["ANTHROPIC_BASE_URL"] = f"http://user:secret@127.0.0.1:{port}"
        problems = get_adapter("claude-code").preflight(profile)
        assert [p.code for p in problems] == ["gateway_not_allowed"] and "secret" not in problems[0].message


# ----------------------------------------------------------------------------- auth_failed says what to set


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_please_run_login_names_the_variable_in_the_attempt_and_the_stop_message(make_pipeline, repo, tmp_path,
                                                                                 bare, monkeypatch, sent):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "dummy-credential-for-tests-0000")  # passes pre-flight; the CLI refuses
    stub = stub_claude(tmp_path / "claude", "echo 'Invalid API key · Please run /login'; exit 1")
    pipeline = make_pipeline(name="login", stages=QUICK, roles={role: "cli" for role in operations.ROLES},
                             profiles={"cli": {"adapter": "claude-code", "executable": str(stub)}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert (attempt.failure_kind, run.stop_reason) == ("auth_failed", "auth_failed"), attempt.failure_message
    assert "Set ANTHROPIC_API_KEY" in attempt.failure_message and "/login" in attempt.failure_message
    assert "ANTHROPIC_API_KEY" in run.stop_message
    # the stage never produced a result: no Recheck, and Recover offers only retry
    found = answers.actions(run)
    assert not found["recheck"].applies and "never produced a result" in found["recheck"].why
    assert found["recover"].applies and found["recover"].initial["verify"] is False


def test_a_codex_401_names_the_variable_unless_the_endpoint_is_scripted(tmp_path):
    events = [{"type": "thread.started", "thread_id": "t"},
              {"type": "turn.failed", "error": {"message": "unexpected status 401 Unauthorized: bad key"}}]
    real = make_request(tmp_path, "implementer")
    write_jsonl(Path(real.raw_path), events)
    process = {"argv": ["codex"], "cwd": real.workspace, "exit_code": 1, "elapsed_seconds": 1.0}
    result = CodexAdapter()._result(ProcessResult(**process), real, "codex-cli 0.171.0")
    assert result.failure_kind == "auth_failed" and "401 Unauthorized" in result.failure_message
    assert "Set CODEX_API_KEY" in result.failure_message and "codex login" in result.failure_message
    real.profile["scripted_endpoint"] = {"default": []}
    result = CodexAdapter()._result(ProcessResult(**process), real, "codex-cli 0.171.0")
    assert result.failure_kind == "auth_failed" and "CODEX_API_KEY" not in result.failure_message


# ----------------------------------------------------------------------------- Recheck and Recover-verify


def waiting_run(run_row, attempt_status: str, changed: bool):
    """A run waiting for review whose implement attempt ended ``attempt_status``, leaving the files
    changed or not (its result manifest's digest against the one it started on)."""
    run = run_row(status="waiting_review", stage_statuses=("running",))
    stage = run.stages.get()
    manifest = Manifest.objects.create(run=run, stage=stage, digest=("b" if changed else "a") * 40,
                                       base_commit="0" * 40, path="m.json", sha256="0" * 64)
    Attempt.objects.create(run=run, stage=stage, operation="implement", number=1, role="implementer",
                           profile_name="scripted", adapter="scripted", deadline_seconds=60, status=attempt_status,
                           start_manifest="a" * 40, result_manifest=manifest,
                           failure_kind="" if attempt_status == "succeeded" else "auth_failed")
    decision = Decision.objects.create(run=run, stage=stage, kind=Decision.Kind.REVIEW, reason="auth_failed")
    return run, decision


def test_without_a_result_recheck_and_recover_verify_are_not_offered(run_row):
    run, decision = waiting_run(run_row, "failed", changed=False)
    found = answers.actions(run)
    assert not found["recheck"].applies and "stage 'answer' never produced a result" in found["recheck"].why
    assert found["recover"].applies
    assert found["recover"].initial == {"decision": decision.pk, "action": "retry", "verify": False,
                                        "verify_why": "stage 'answer' never produced a result: only retry applies"}
    record = {a["action"]: a for a in operations.run_status(run)["actions"]}  # the API's and run_status's list
    assert record["recheck"]["applies"] is False and record["recover"]["initial"]["verify"] is False
    form = RecoverForm(initial=found["recover"].initial)
    assert [value for value, _ in form.fields["action"].choices] == ["retry"]
    assert "only retry" in form.fields["action"].help_text
    for call in (lambda: operations.recheck(run, "fixed it"),
                 lambda: operations.recover(run, decision.pk, "why", "verify")):
        with pytest.raises(operations.OperationError) as info:
            call()
        assert info.value.code == "nothing_to_verify"
    assert Decision.objects.get(pk=decision.pk).state == "pending"  # nothing changed
    # what a person reads says so too: the waiting sentence (the page, the notices) and run_status's line
    assert "recover it with a retry" in answers.waiting_sentence(run) and "verify" not in \
        answers.waiting_sentence(run).replace("to verify or recheck", "")
    assert "--action retry (" in waiting_hint(operations.run_status(run))


@pytest.mark.parametrize("attempt_status, changed", [("succeeded", False), ("timeout", True)])
def test_with_a_result_recheck_and_recover_verify_are_offered(run_row, attempt_status, changed):
    run, decision = waiting_run(run_row, attempt_status, changed)
    found = answers.actions(run)
    assert found["recheck"].applies and found["recover"].applies
    assert found["recover"].initial == {"decision": decision.pk, "action": "retry", "verify": True}
    form = RecoverForm(initial=found["recover"].initial)
    assert [value for value, _ in form.fields["action"].choices] == ["retry", "verify"]
    assert json.dumps(operations.run_status(run)["actions"])  # the API's list stays JSON


def test_a_run_stopped_in_its_final_verification_is_offered_the_final_verification_again(run_row):
    run = run_row(status="waiting_review", stage_statuses=("passed", "passed"), stop_reason="interrupted")
    decision = Decision.objects.create(run=run, stage=None, kind=Decision.Kind.REVIEW, reason="interrupted")
    said = answers.waiting_sentence(run)
    assert said == answers.FINAL_REVIEW_SENTENCE and "never produced a result" not in said
    found = answers.actions(run)
    assert found["recover"].applies and found["recover"].initial["verify"] is True
    assert not found["recheck"].applies and "every stage passed: there is no stage to recheck" in found["recheck"].why
    assert "never produced" not in waiting_hint(operations.run_status(run))
    operations.recover(run, decision.pk, "the worker died in the final verification", "verify", reviewer="t")
    assert Decision.objects.get(pk=decision.pk).state == "recovered"
