"""The real ``codex`` CLI in the same boundary: it reaches the scripted endpoint and a gateway
through its egress proxy, and a request to any other host is refused and recorded."""
from __future__ import annotations

import shlex

import pytest

from engine.agents.codex.adapter import CodexAdapter
from engine.scripted_endpoint import ScriptedEndpoint

from ..support.adapters import log_of
from ..support.codex import CODEX, make_request

needs_codex = pytest.mark.skipif(CODEX is None, reason="the pinned codex CLI is not installed: run `make agents`")
pytestmark = [needs_codex, pytest.mark.slow]

REACH_OUT = ("python3 -c " + shlex.quote(
    "import os, urllib.request\n"
    "proxy = os.environ.get('HTTPS_PROXY', '')\n"
    "opener = urllib.request.build_opener(urllib.request.ProxyHandler({'http': proxy, 'https': proxy}))\n"
    "for url in ('http://example.com/', 'https://api.github.com/'):\n"
    "    try:\n"
    "        opener.open(url, timeout=5); print('REA' + 'CHED', url)\n"  # split: the command is echoed
    "    except Exception as exc:\n"
    "        print('REF' + 'USED', url, getattr(exc, 'code', type(exc).__name__))\n"))


def test_codex_reaches_the_scripted_endpoint_and_nothing_else(tmp_path):
    scenario = {"turns": [{"tool": "exec_command", "input": {"cmd": REACH_OUT}}, {"text": "done"}]}
    request = make_request(tmp_path, "implementer", scenario)
    result = CodexAdapter().run(request)
    assert result.exit_code == 0 and result.failure_kind is None, (result.failure_message, log_of(request)[-3000:])
    network = result.extra["network"]
    # its model, through the proxy; a simulated attempt's allow-list is the scripted endpoint alone
    assert any(item["host"] == "127.0.0.1" for item in network["connected"]), network
    assert len(network["allow"]) == 1 and network["allow"][0].startswith("127.0.0.1:"), network
    # its commands reach nothing (codex's own sandbox gives them no network, ours no way out), and
    # what codex itself asked for beyond its model (0.171.0: its feature-flag host) was refused and recorded
    assert "REFUSED http://example.com/" in log_of(request) and "REACHED" not in log_of(request)
    assert network["refused"] and all(f"{i['host']}:{i['port']}" not in network["allow"] for i in network["refused"])
    assert all("not on the attempt's network allow-list" in item["why"] for item in network["refused"])


def test_codex_reaches_a_listed_gateway_through_its_model_gateway(tmp_path, monkeypatch, gateway_listed):
    """codex's calls go to the attempt's model gateway (engine/model_gateway), the only model address its
    sandbox reaches; the model gateway forwards them to the listed gateway from the worker, with the key."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-gateway-test-0000000000000000000000")
    with ScriptedEndpoint({"turns": [{"text": "Done through the gateway."}]}) as gateway:
        request = make_request(tmp_path, "implementer", None, base_url=gateway_listed(gateway.url) + "/v1")
        result = CodexAdapter().run(request)
        paths = [r["path"] for r in gateway.requests]
        port = int(gateway.url.rsplit(":", 1)[1])
        upstream = gateway.url + "/v1"
    assert result.final_message == "Done through the gateway.", (result.failure_message, log_of(request)[-3000:])
    assert any(path.startswith("/v1/responses") for path in paths), paths
    assert f"127.0.0.1:{port}" not in result.extra["network"]["allow"] and len(result.extra["network"]["allow"]) == 1
    assert not any(item["port"] == port for item in result.extra["network"]["connected"])
    forwarded = [call["path"] for call in result.extra["gateway"]["ledger"] if not call.get("refused")]
    assert forwarded == paths and result.extra["gateway"]["upstream"] == upstream
    # codex 0.171.0 first asks for the Responses API over a WebSocket (GET with an upgrade); the gateway, which
    # forwards only model calls it can read, answers 404, and codex goes on over HTTP
    refused = {call["method"] for call in result.extra["gateway"]["ledger"] if call.get("refused")}
    assert refused <= {"GET"}
