"""Issue 13: a profile's gateway (``base_url``) and the worker variable that holds its key
(``api_key_env``, engine/boundary.py ``credential_env``): the real claude reaches a loopback server
standing in for the gateway through the attempt's egress proxy, with the key from ``api_key_env``
and no other credential, and the key is in no stored record (docs/pipeline-format.md, "Gateways")."""
import json
import os
import uuid

import pytest
from engine import boundary, operations
from engine.agents import AgentRequest, get_adapter
from engine.models import Run
from engine.pipeline_format import PipelineFormatError, validate
from engine.redaction import secret_env_values
from engine.scripted_endpoint import ScriptedEndpoint

from .conftest import make_repo
from .test_pipeline_schema import full
from .test_preflight import bare, cli_pipeline, refused  # noqa: F401 - the fixture

KEY = "gw-" + uuid.uuid4().hex + "-Zq9"
WORKER_OWN_KEY = "sk-ant-api03-worker-own-" + "k" * 30


@pytest.mark.parametrize("name", ["DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SECRET_KEY", "CP_VAR_DIR",
                                  "PGPASSWORD", "EMAIL_HOST_PASSWORD", "PATH", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"])
def test_api_key_env_never_names_a_control_panel_variable(name):
    data = full()
    data["profiles"]["claude"]["api_key_env"] = name
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "profiles.claude.api_key_env" in str(info.value) and "never an agent's key" in str(info.value)


def test_api_key_env_is_a_variable_name_of_a_real_cli_profile():
    data = full()
    data["profiles"]["claude"]["api_key_env"] = "GATEWAY_API_KEY"
    assert validate(data)["profiles"]["claude"]["api_key_env"] == "GATEWAY_API_KEY"
    data["profiles"]["claude"]["api_key_env"] = "not a name"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "not a valid environment variable name" in str(info.value)
    data = full()
    data["profiles"]["sim"]["api_key_env"] = "GATEWAY_API_KEY"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "profiles.sim.api_key_env" in str(info.value) and "send an API key" in str(info.value)
    data = full()
    data["profiles"]["sim"]["base_url"] = "https://gw.example"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "profiles.sim.base_url" in str(info.value)


def test_the_attempt_gets_the_named_key_under_the_clis_name_and_no_other_credential():
    worker = {"GATEWAY_TEST_KEY": KEY, "ANTHROPIC_API_KEY": WORKER_OWN_KEY, "OPENAI_API_KEY": WORKER_OWN_KEY,
              "CP_GATEWAY_KEYS": "OTHER_KEY, GATEWAY_TEST_KEY"}
    profile = {"api_key_env": "GATEWAY_TEST_KEY"}
    assert boundary.credential_env("claude-code", worker, profile) == {"ANTHROPIC_API_KEY": KEY}
    assert boundary.credential_env("codex", worker, profile) == {"CODEX_API_KEY": KEY}
    assert boundary.credential_env("claude-code", {"ANTHROPIC_API_KEY": WORKER_OWN_KEY}, profile) == {}
    assert boundary.credential_env("claude-code", worker) == {"ANTHROPIC_API_KEY": WORKER_OWN_KEY}
    # a variable the operator did not list in CP_GATEWAY_KEYS is never handed over
    unlisted = {**worker, "CP_GATEWAY_KEYS": "OTHER_KEY"}
    assert boundary.credential_env("claude-code", unlisted, profile) == {}


@pytest.mark.django_db
def test_a_missing_api_key_env_is_refused_at_creation_naming_it(make_pipeline, repo, tmp_path, bare, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", WORKER_OWN_KEY)  # the CLI's usual key is no substitute
    monkeypatch.setenv("GATEWAY_TEST_KEY", KEY)
    error = refused(cli_pipeline(make_pipeline, tmp_path, "claude-code", api_key_env="GATEWAY_TEST_KEY"), repo,
                    "credentials_missing")  # set, but not listed by the operator
    assert "CP_GATEWAY_KEYS" in error.message and "GATEWAY_TEST_KEY" in error.message
    monkeypatch.setenv("CP_GATEWAY_KEYS", "GATEWAY_TEST_KEY")
    monkeypatch.delenv("GATEWAY_TEST_KEY")
    error = refused(cli_pipeline(make_pipeline, tmp_path, "claude-code", api_key_env="GATEWAY_TEST_KEY"), repo,
                    "credentials_missing")
    assert "GATEWAY_TEST_KEY" in error.message and "not set" in error.message
    monkeypatch.setenv("GATEWAY_TEST_KEY", KEY)
    run = operations.create_run(cli_pipeline(make_pipeline, tmp_path, "claude-code", api_key_env="GATEWAY_TEST_KEY"),
                                str(repo), "main")
    assert run.definition["profiles"]["cli"]["api_key_env"] == "GATEWAY_TEST_KEY"
    assert KEY not in json.dumps(run.definition) and KEY not in json.dumps(list(Run.objects.values()), default=str)


@pytest.mark.slow
def test_a_real_claude_reaches_a_loopback_gateway_through_its_proxy_with_the_key_from_api_key_env(tmp_path):
    work = make_repo(tmp_path / "work", {"README.md": "hello\n"})
    control = tmp_path / "control"
    control.mkdir()
    (control / "prompt.md").write_text("Write hello.txt.\n", encoding="utf-8")
    turns = [{"tool": "Write", "input": {"file_path": "{cwd}/hello.txt", "content": f"hello {KEY}\n"}},
             {"text": f"Wrote hello.txt; the key was {KEY}."}]
    with ScriptedEndpoint({"turns": turns}, cwd=str(work)) as gateway:
        profile = {"adapter": "claude-code", "base_url": gateway.url, "api_key_env": "GATEWAY_TEST_KEY"}
        worker = {"PATH": os.environ["PATH"], "GATEWAY_TEST_KEY": KEY, "ANTHROPIC_API_KEY": WORKER_OWN_KEY,
                  "CP_GATEWAY_KEYS": "GATEWAY_TEST_KEY"}
        env = {"PATH": os.environ["PATH"], **boundary.credential_env("claude-code", worker, profile)}
        request = AgentRequest(
            role="implementer", operation="implement", prompt="Write hello.txt.", workspace=str(work),
            profile=profile, deadline_seconds=120, log_path=str(control / "out.log"),
            raw_path=str(control / "out.raw"), stderr_path=str(control / "out.stderr"), env=env, stage_key="s",
            attempt_number=1, control_dir=str(control), prompt_path=str(control / "prompt.md"),
            home_dir=str(tmp_path / "home"), marker=f"cp-test-gateway-{uuid.uuid4().hex[:12]}",
            secrets=secret_env_values(env), deny_addresses=boundary.service_addresses())
        result = get_adapter("claude-code").run(request)
        calls = gateway.model_requests("anthropic")
        port = int(gateway.url.rsplit(":", 1)[1])
    assert result.failure_kind is None, (result.failure_message, (control / "out.log").read_text())
    assert (work / "hello.txt").exists() and calls
    assert {call["headers"].get("x-api-key") or call["headers"].get("X-Api-Key") for call in calls} == {KEY}
    connected = {(c["host"], int(c["port"])) for c in result.extra["network"]["connected"]}
    assert ("127.0.0.1", port) in connected  # through the attempt's egress proxy
    stored = json.dumps(result.as_dict())
    assert KEY not in stored and WORKER_OWN_KEY not in stored and "[REDACTED]" in result.final_message
    for path in control.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert KEY.encode() not in data and WORKER_OWN_KEY.encode() not in data, path


@pytest.mark.slow
def test_a_key_the_gateway_refuses_is_auth_failed_naming_the_api_key_env(tmp_path):
    work = make_repo(tmp_path / "work", {"README.md": "hello\n"})
    control = tmp_path / "control"
    control.mkdir()
    (control / "prompt.md").write_text("Say hello.\n", encoding="utf-8")
    with ScriptedEndpoint({"turns": [{"status": 401, "message": "invalid gateway key"}]}, cwd=str(work)) as gateway:
        profile = {"adapter": "claude-code", "base_url": gateway.url, "api_key_env": "GATEWAY_TEST_KEY"}
        worker = {"GATEWAY_TEST_KEY": KEY, "CP_GATEWAY_KEYS": "GATEWAY_TEST_KEY"}
        env = {"PATH": os.environ["PATH"], **boundary.credential_env("claude-code", worker, profile)}
        request = AgentRequest(
            role="implementer", operation="implement", prompt="Say hello.", workspace=str(work), profile=profile,
            deadline_seconds=60, log_path=str(control / "out.log"), raw_path=str(control / "out.raw"),
            stderr_path=str(control / "out.stderr"), env=env, stage_key="s", attempt_number=1,
            control_dir=str(control), prompt_path=str(control / "prompt.md"), home_dir=str(tmp_path / "home"),
            marker=f"cp-test-gateway-{uuid.uuid4().hex[:12]}", secrets=secret_env_values(env))
        result = get_adapter("claude-code").run(request)
    assert result.failure_kind == "auth_failed", result.failure_message
    assert "GATEWAY_TEST_KEY" in result.failure_message and "ANTHROPIC_API_KEY" not in result.failure_message
    assert KEY not in json.dumps(result.as_dict())
