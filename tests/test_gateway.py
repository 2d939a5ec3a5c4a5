"""Issue 13: a profile's gateway (``base_url``), one the operator listed with the worker variable
that holds its key (``CP_GATEWAYS``, engine/agents/gateways.py; engine/boundary.py ``credential_env``):
the real claude reaches a loopback server standing in for the gateway through the attempt's egress
proxy, with the key of that variable and no other credential, and the key is in no stored record
(docs/pipeline-format.md, "Gateways")."""
import json
import os
import socket
import uuid

import pytest
from engine import boundary, operations
from engine.agents import get_adapter
from engine.models import Run
from engine.pipeline.format import PipelineFormatError, validate
from engine.scripted_endpoint import ScriptedEndpoint

from .conftest import make_repo
from .support.runs import full
from .support.runs import cli_pipeline, refused
from .support.adapters import request_for

# the stand-in CLIs these tests write in tmp_path are executables the operator listed, and full()'s
# base_url a gateway the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("stand_ins_listed", "example_gateway")

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
    data["profiles"]["claude"]["api_key_env"] = "GATEWAY_TEST_KEY"  # the variable listed with https://example.org
    assert validate(data)["profiles"]["claude"]["api_key_env"] == "GATEWAY_TEST_KEY"
    data["profiles"]["claude"]["api_key_env"] = "not a name"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "not a valid environment variable name" in str(info.value)
    data = full()
    data["profiles"]["sim"]["api_key_env"] = "GATEWAY_TEST_KEY"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "profiles.sim.api_key_env" in str(info.value) and "send an API key" in str(info.value)
    data = full()
    data["profiles"]["sim"]["base_url"] = "https://example.org"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "profiles.sim.base_url" in str(info.value)


def test_api_key_env_names_only_the_variable_the_operator_listed_with_the_gateway():
    data = full()
    data["profiles"]["claude"]["api_key_env"] = "OTHER_GATEWAY_KEY"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "profiles.claude.api_key_env" in str(info.value) and "GATEWAY_TEST_KEY" in str(info.value)
    data["profiles"]["claude"].pop("base_url")  # a gateway's key without a gateway would go to the provider
    data["profiles"]["claude"]["api_key_env"] = "GATEWAY_TEST_KEY"
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    assert "profiles.claude.api_key_env" in str(info.value) and "names no gateway" in str(info.value)


def test_the_attempt_gets_the_listed_key_under_the_clis_name_and_no_other_credential(gateway_listed):
    gateway_listed("http://127.0.0.1:4000")
    worker = {"GATEWAY_TEST_KEY": KEY, "ANTHROPIC_API_KEY": WORKER_OWN_KEY, "OPENAI_API_KEY": WORKER_OWN_KEY}
    profile = {"base_url": "http://127.0.0.1:4000/v1"}
    assert boundary.credential_env("claude-code", worker, profile) == {"ANTHROPIC_API_KEY": KEY}
    assert boundary.credential_env("codex", worker, profile) == {"CODEX_API_KEY": KEY}
    assert boundary.credential_env("claude-code", {"ANTHROPIC_API_KEY": WORKER_OWN_KEY}, profile) == {}
    assert boundary.credential_env("claude-code", worker) == {"ANTHROPIC_API_KEY": WORKER_OWN_KEY}
    # a gateway the operator did not list gets no key at all: not its own, not the worker's
    for other in ({"base_url": "http://127.0.0.1:4001"}, {"base_url": "https://127.0.0.1:4000"},
                  {"env": {"ANTHROPIC_BASE_URL": "http://evil.example"}}, {"api_key_env": "GATEWAY_TEST_KEY"}):
        assert boundary.credential_env("claude-code", worker, other) == {}, other


@pytest.mark.django_db
def test_an_unset_gateway_key_is_refused_at_creation_naming_it(make_pipeline, repo, tmp_path, bare, monkeypatch,
                                                               gateway_listed):
    monkeypatch.setenv("ANTHROPIC_API_KEY", WORKER_OWN_KEY)  # the CLI's usual key is no substitute
    url = gateway_listed("http://127.0.0.1:9")
    error = refused(cli_pipeline(make_pipeline, tmp_path, "claude-code", base_url=url), repo, "credentials_missing")
    assert "GATEWAY_TEST_KEY" in error.message and "not set" in error.message
    monkeypatch.setenv("GATEWAY_TEST_KEY", KEY)
    error = refused(cli_pipeline(make_pipeline, tmp_path, "claude-code", base_url=url), repo, "gateway_unreachable")
    assert "127.0.0.1:9" in error.message
    with socket.socket() as listening:  # a gateway that answers: the run is created, the key in no record
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = gateway_listed(f"http://127.0.0.1:{listening.getsockname()[1]}")
        run = operations.create_run(cli_pipeline(make_pipeline, tmp_path, "claude-code", base_url=url + "/v1"),
                                    str(repo), "main")
    assert run.definition["profiles"]["cli"]["base_url"] == url + "/v1"
    assert KEY not in json.dumps(run.definition) and KEY not in json.dumps(list(Run.objects.values()), default=str)


@pytest.mark.slow
def test_a_real_claude_reaches_a_loopback_gateway_through_its_model_gateway_with_the_key_listed_for_it(
        tmp_path, gateway_listed):
    work = make_repo(tmp_path / "work", {"README.md": "hello\n"})
    control = tmp_path / "control"
    turns = [{"tool": "Write", "input": {"file_path": "{cwd}/hello.txt", "content": f"hello {KEY}\n"}},
             {"text": f"Wrote hello.txt; the key was {KEY}."}]
    with ScriptedEndpoint({"turns": turns}, cwd=str(work)) as gateway:
        profile = {"adapter": "claude-code", "base_url": gateway_listed(gateway.url)}
        worker = {"PATH": os.environ["PATH"], "GATEWAY_TEST_KEY": KEY, "ANTHROPIC_API_KEY": WORKER_OWN_KEY}
        request = request_for(tmp_path, profile, boundary.credential_env("claude-code", worker, profile))
        result = get_adapter("claude-code").run(request)
        calls = gateway.model_requests("anthropic")
        port = int(gateway.url.rsplit(":", 1)[1])
        upstream = gateway.url
    assert result.failure_kind is None, (result.failure_message, (control / "out.log").read_text())
    assert (work / "hello.txt").exists() and calls
    assert {call["headers"].get("x-api-key") or call["headers"].get("X-Api-Key") for call in calls} == {KEY}
    connected = {(c["host"], int(c["port"])) for c in result.extra["network"]["connected"]}
    # the attempt's model gateway (engine/model_gateway) reached it from the worker; the sandbox reached only that
    assert ("127.0.0.1", port) not in connected and result.extra["gateway"]["upstream"] == upstream
    stored = json.dumps(result.as_dict())
    assert KEY not in stored and WORKER_OWN_KEY not in stored and "[REDACTED]" in result.final_message
    for path in control.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert KEY.encode() not in data and WORKER_OWN_KEY.encode() not in data, path


@pytest.mark.slow
def test_a_key_the_gateway_refuses_is_auth_failed_naming_its_variable(tmp_path, gateway_listed):
    work = make_repo(tmp_path / "work", {"README.md": "hello\n"})
    with ScriptedEndpoint({"turns": [{"status": 401, "message": "invalid gateway key"}]}, cwd=str(work)) as gateway:
        profile = {"adapter": "claude-code", "base_url": gateway_listed(gateway.url), "api_key_env": "GATEWAY_TEST_KEY"}
        worker = {"GATEWAY_TEST_KEY": KEY}
        request = request_for(tmp_path, profile, boundary.credential_env("claude-code", worker, profile),
                              prompt="Say hello.", deadline=60)
        result = get_adapter("claude-code").run(request)
    assert result.failure_kind == "auth_failed", result.failure_message
    assert "GATEWAY_TEST_KEY" in result.failure_message and "ANTHROPIC_API_KEY" not in result.failure_message
    assert KEY not in json.dumps(result.as_dict())
