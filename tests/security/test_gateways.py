"""A pipeline author cannot have the workers' model keys sent anywhere (README.md, "Who decides what").

The attack (issue 17): a profile with a ``base_url`` (or a ``*_BASE_URL`` of its ``env``) and no
``api_key_env`` sent the worker's own ``ANTHROPIC_API_KEY`` to whatever host it named. Now a
gateway must be one the operator listed (``CP_GATEWAYS``, engine/agents/gateways.py), and an
attempt of it gets only the key the operator listed with it. The oracle is a loopback logging
gateway: it counts every connection and keeps every request's bytes; the worker's key must never
be among them, and an unlisted gateway is never even connected to (not by the pre-flight check at
run creation either).
"""
import html

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from engine import boundary, operations
from engine.agents import executables, get_adapter
from engine.models import Attempt, Pipeline, Run
from engine.pipeline.format import PipelineFormatError, validate

from ..support.adapters import request_for
from .attacks import QUICK_STAGE, Listener, drive, needs_claude
from ..support.runs import cli_definition

pytestmark = pytest.mark.django_db

WORKER_KEY = "sk-ant-api03-the-workers-own-key-do-not-send-0000"
GATEWAY_KEY = "sk-gateway-listed-key-0000000000000000"


class LoggingGateway(Listener):
    """A loopback server that counts every connection, keeps the bytes it was sent, and answers 401."""

    def __init__(self):
        self.received = b""
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return self.accepted

    def handle(self, conn):
        conn.settimeout(2)
        try:
            self.received += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def worker_keys(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", WORKER_KEY)
    monkeypatch.setenv("GATEWAY_TEST_KEY", GATEWAY_KEY)


def claude_definition(name="gw", **profile) -> dict:
    doc = cli_definition(str(executables.TOOLS_BIN / "claude"), name=name)
    doc["profiles"]["cli"].update(profile)
    return doc


def test_an_unlisted_gateway_is_refused_in_every_place_a_profile_names_one(worker_keys):
    with LoggingGateway() as gateway:
        for field, profile in (("base_url", {"base_url": gateway.url}),
                               ("env.ANTHROPIC_BASE_URL", {"env": {"ANTHROPIC_BASE_URL": gateway.url}}),
                               ("env.OPENAI_BASE_URL", {"env": {"OPENAI_BASE_URL": gateway.url + "/v1"}}),
                               ("env.ANTHROPIC_BEDROCK_BASE_URL", {"env": {"ANTHROPIC_BEDROCK_BASE_URL": gateway.url}}),
                               ("env.OPENAI_API_BASE", {"env": {"OPENAI_API_BASE": gateway.url}})):
            with pytest.raises(PipelineFormatError) as info:
                validate(claude_definition(**profile), "<test>")
            assert f"profiles.cli.{field}" in str(info.value) and "not a gateway the operator listed" in str(info.value)
    assert gateway.connections == 0


def test_a_listed_gateway_is_matched_by_scheme_host_port_and_path(gateway_listed):
    gateway_listed("https://llm.example.com:8443/proxy")
    validate(claude_definition(base_url="https://llm.example.com:8443/proxy/v1"), "<test>")
    for url in ("http://llm.example.com:8443/proxy", "https://llm.example.com/proxy", "https://llm.example.com:8443/",
                "https://llm.example.com:8443/proxyx", "https://llm.example.com.evil.example:8443/proxy",
                "https://evil.example/llm.example.com:8443/proxy", "https://llm.example.com:8443/proxy?x=1",
                # Node's URL parser (the CLIs') resolves these to /other before it sends: never under /proxy
                "https://llm.example.com:8443/proxy/../other", "https://llm.example.com:8443/proxy/%2e%2e/other",
                "https://llm.example.com:8443/proxy/%2E%2E/other", "https://llm.example.com:8443/proxy%2F..%2Fother",
                "https://llm.example.com:8443/proxy/.\t./other", "https://llm.example.com:8443/proxy\\..\\other"):
        with pytest.raises(PipelineFormatError, match="profiles.cli.base_url"):
            validate(claude_definition(base_url=url), "<test>")


def test_the_operators_list_itself_is_checked():
    from engine.agents import gateways

    for entry, said in (("https://x@evil.example=K", "user part"), ("https://gw.example", "URL=VARIABLE"),
                        ("ftp://gw.example=K", "http:// or https://"), ("https://gw.example/a/../b=K", "'..'")):
        with pytest.raises(ValueError, match=said):
            gateways.parse_entry(entry)


def test_the_web_editor_and_load_pipelines_refuse_an_unlisted_gateway(author, make_pipeline, tmp_path, worker_keys):
    web, _ = author
    with LoggingGateway() as gateway:
        pipeline = make_pipeline(name="edited")
        url = reverse("admin:engine_pipeline_edit_definition", args=[pipeline.pk])
        document = yaml.safe_load(html.unescape(web.get(url).content.decode()).split("<textarea", 1)[1]
                                  .split(">", 1)[1].split("</textarea>", 1)[0])
        document["roles"]["implementer"] = "cli"
        document["profiles"]["cli"] = {"adapter": "claude-code", "base_url": gateway.url}
        response = web.post(url, {"definition": yaml.safe_dump(document), "version": 1})
        text = html.unescape(response.content.decode())
        assert response.status_code == 200 and "profiles.cli.base_url" in text and "CP_GATEWAYS" in text
        assert Pipeline.objects.get(pk=pipeline.pk).version == 1
        path = tmp_path / "evil.yaml"
        path.write_text(yaml.safe_dump(claude_definition(name="from-file", base_url=gateway.url)))
        with pytest.raises(CommandError, match="profiles.cli.base_url"):
            call_command("load_pipelines", str(path))
        assert not Pipeline.objects.filter(name="from-file").exists()
    assert gateway.connections == 0


@pytest.mark.django_db(transaction=True)
def test_a_run_of_a_gateway_the_operator_took_off_the_list_is_refused_without_a_connection(author, gateway_listed,
                                                                                          settings, repo, worker_keys):
    """Saved while listed, then taken off the list: creating a run (the API) refuses it naming the
    profile, and the pre-flight check does not connect to the author's host:port."""
    _, api = author
    with LoggingGateway() as gateway:
        pipeline, _ = operations.save_pipeline(claude_definition(name="once-listed",
                                                                 base_url=gateway_listed(gateway.url)))
        settings.CP_GATEWAYS = []
        response = api.post("/api/runs/", {"pipeline": pipeline.name, "repo": str(repo), "rev": "main"}, format="json")
        assert response.status_code == 400, response.content
        assert response.json()["error"] == "gateway_not_allowed" and "CP_GATEWAYS" in response.json()["message"]
    assert not Run.objects.exists() and gateway.connections == 0


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_real_claude_is_not_launched_for_a_gateway_taken_off_the_list_after_creation(make_pipeline, repo, sent,
                                                                                        gateway_listed, settings,
                                                                                        worker_keys):
    """The run was created while the gateway was listed; the operator took it off before the worker
    launched the attempt: the attempt is not launched (``gateway_not_allowed``), nothing reaches it."""
    with LoggingGateway() as gateway:
        pipeline = make_pipeline(name="gw-late", stages=[QUICK_STAGE], reviews=False,
                                 roles={"implementer": "gw", "reviewer": None, "documenter": None},
                                 profiles={"gw": {"adapter": "claude-code", "max_turns": 4,
                                                  "base_url": gateway_listed(gateway.url)}},
                                 deadlines={"implement": 60, "gate": 60})
        run = operations.create_run(pipeline, str(repo), "main")
        connections_at_creation = gateway.connections  # the pre-flight check's TCP connect, no bytes
        settings.CP_GATEWAYS = []
        operations.request_start(run, requested_by="security-test", source="test")
        run = drive(run.pk, sent)
        attempt = Attempt.objects.filter(run=run, operation="implement").first()
        assert attempt is not None, (run.status, run.stop_reason, run.stop_message)
        assert (attempt.failure_kind, run.stop_reason) == ("gateway_not_allowed", "gateway_not_allowed")
        assert "CP_GATEWAYS" in run.stop_message
    assert gateway.connections == connections_at_creation and gateway.received == b""


@needs_claude
@pytest.mark.slow
def test_the_real_claude_sends_a_listed_gateway_only_its_listed_key(tmp_path, gateway_listed, worker_keys):
    """Through the real CLI: the worker's own key is set, the gateway gets the listed key and never the
    worker's (the logging gateway answers 401, so the attempt ends auth_failed naming the variable)."""
    with LoggingGateway() as gateway:
        profile = {"adapter": "claude-code", "base_url": gateway_listed(gateway.url)}
        request = request_for(tmp_path, profile, boundary.credential_env("claude-code", profile=profile))
        result = get_adapter("claude-code").run(request)
    assert result.failure_kind == "auth_failed" and "GATEWAY_TEST_KEY" in result.failure_message
    assert GATEWAY_KEY.encode() in gateway.received and WORKER_KEY.encode() not in gateway.received
