"""A hostile agent reaches for the database, the broker, the Control Panel and the internet
(issue: "Database takeover", "Broker"), and gates share a port.

The agent is the real ``claude`` CLI; its scripted model makes it run a probe with its Bash tool.
Stand-in services listen on the host's 127.0.0.1 (a database port, a broker port and the Control
Panel's web port, as the settings name them) and count what reaches them; the real PostgreSQL
and Redis of this machine kind are probed too when they answer on the host.
"""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from django.conf import settings

from engine import boundary, operations
from engine.agents import sandbox
from engine.models import Attempt, Check, RunEvent
from engine.agents.netproxy import EgressProxy
from engine.scripted_endpoint import ScriptedEndpoint

from ..conftest import wait_for
from ..support.runs import drive
from .attacks import (QUICK_STAGE, Listener, answers_here, attempt_output, claude_attack_pipeline, needs_claude,
                      start_and_drive)

pytestmark = pytest.mark.django_db(transaction=True)

def probe_command(targets: list[tuple[str, int]], proxied: list[str]) -> str:
    """Shell for the agent: connect to each target directly, then ask its egress proxy for each URL."""
    script = (
        "import json, os, socket, urllib.request\n"
        "proxy = os.environ.get('HTTPS_PROXY', '')  # its own proxy, even for loopback (NO_PROXY dropped)\n"
        "os.environ.pop('NO_PROXY', None); os.environ.pop('no_proxy', None)\n"
        "opener = urllib.request.build_opener(urllib.request.ProxyHandler({'http': proxy, 'https': proxy}))\n"
        f"targets = {json.dumps(targets)}\n"
        f"urls = {json.dumps(proxied)}\n"
        "out = {}\n"
        "for host, port in targets:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2).close(); out[f'{host}:{port}'] = 'CONNECTED'\n"
        "    except OSError as exc:\n"
        "        out[f'{host}:{port}'] = 'refused ' + type(exc).__name__\n"
        "for url in urls:\n"
        "    try:\n"
        "        opener.open(url, timeout=5); out[url] = 'CONNECTED'\n"
        "    except Exception as exc:\n"
        "        out[url] = 'refused ' + str(getattr(exc, 'code', type(exc).__name__))\n"
        "print('PROBE ' + json.dumps(out, sort_keys=True))\n"
    )
    return f"python3 -c {shlex.quote(script)}"


def probe_result(run) -> dict:
    text = attempt_output(run)
    found = re.findall(r"PROBE (\{[^\n]*?\})(?:\\n|\")", text)
    assert found, text[-3000:]
    return json.loads(found[-1].replace('\\"', '"'))


@pytest.fixture
def services(settings):
    """Stand-ins for the Control Panel's web port, its database and its broker on 127.0.0.1."""
    web, db, broker = Listener(), Listener(), Listener()
    settings.CP_WEB_ADDRESS = f"127.0.0.1:{web.port}"
    yield {"web": web, "db": db, "broker": broker}
    for listener in (web, db, broker):
        listener.close()


@needs_claude
@pytest.mark.slow
def test_the_agent_reaches_no_service_of_the_host_directly_or_through_its_proxy(make_pipeline, repo, sent, services):
    web, db, broker = services["web"], services["db"], services["broker"]
    targets = [("127.0.0.1", web.port), ("127.0.0.1", db.port), ("127.0.0.1", broker.port), ("::1", web.port)]
    real = [("127.0.0.1", port) for port in (5432, 6379) if answers_here("127.0.0.1", port)]
    targets += real
    # the web port is even on the profile's allow-list: the proxy refuses a Control Panel service anyway
    proxied = [f"http://127.0.0.1:{web.port}/admin/", f"http://127.0.0.1:{db.port}/", "http://example.com/",
               "https://api.github.com/"]
    pipeline = claude_attack_pipeline(make_pipeline, [probe_command(targets, proxied)],
                                      profile_extra={"network_allow": [f"127.0.0.1:{web.port}"]})
    run = start_and_drive(pipeline, repo, sent)
    result = probe_result(run)
    assert set(result) == {f"{h}:{p}" for h, p in targets} | set(proxied), result
    assert all(value.startswith("refused") for value in result.values()), result
    assert (web.accepted, db.accepted, broker.accepted) == (0, 0, 0)
    attempt = Attempt.objects.get(run=run, operation="implement")
    refused = {(item["host"], item["port"]) for item in attempt.network["refused"]}
    assert {("127.0.0.1", web.port), ("127.0.0.1", db.port), ("example.com", 80), ("api.github.com", 443)} <= refused
    why = {item["host"] + ":" + str(item["port"]): item["why"] for item in attempt.network["refused"]}
    assert "service of the Control Panel" in why[f"127.0.0.1:{web.port}"]
    assert "not on the attempt's network allow-list" in why["example.com:80"]
    event = RunEvent.objects.get(run=run, kind="network_refused")
    assert "example.com:80" in event.message and event.attempt_id == attempt.pk
    shown = operations.run_status(run)["stages"][0]["attempts"][0]["network"]  # what run_status --json says
    assert {(i["host"], i["port"]) for i in shown["refused"]} == refused
    # the scripted endpoint, on the worker's loopback, was reached through the same proxy
    assert any(item["host"] == "127.0.0.1" for item in attempt.network["connected"]), attempt.network
    assert run.status == "succeeded", run.stop_message


@needs_claude
@pytest.mark.slow
def test_a_listed_gateway_is_reached_by_the_model_gateway_and_never_from_the_sandbox(make_pipeline, repo, sent,
                                                                                    monkeypatch, gateway_listed):
    """A profile pointed at a gateway the operator listed (``base_url``, CP_GATEWAYS) reaches it through the
    attempt's model gateway (engine/model_gateway), with the key of the variable listed with it and never the
    worker's own key; the sandbox's egress proxy reaches the model gateway only: neither the listed gateway
    nor the provider is on its allow-list."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-worker-own-key-never-sent-000000")
    monkeypatch.setenv("GATEWAY_TEST_KEY", "sk-ant-gateway-test-key-0000000000000000")
    with ScriptedEndpoint({"turns": [{"text": "Done through the gateway."}]}) as gateway:
        gateway_listed(gateway.url)
        port = int(gateway.url.rsplit(":", 1)[1])
        pipeline = make_pipeline(
            name="gateway", stages=[QUICK_STAGE], reviews=False,
            roles={"implementer": "gw", "reviewer": "scripted", "documenter": "scripted"},
            profiles={"gw": {"adapter": "claude-code", "max_turns": 4, "base_url": gateway.url},
                      "scripted": {"adapter": "scripted", "scenario": {"stages": {"answer": {"review": [
                          {"verdict": {"verdict": "pass", "findings": []}}]}}}}},
            deadlines={"implement": 60, "gate": 60})
        run = start_and_drive(pipeline, repo, sent)
        attempt = Attempt.objects.get(run=run, operation="implement")
        assert attempt.final_message == "Done through the gateway.", attempt.failure_message
        assert any(r["path"].startswith("/v1/messages") for r in gateway.requests)
        assert {r["headers"].get("x-api-key") for r in gateway.requests} == {"sk-ant-gateway-test-key-0000000000000000"}
        upstream, received = gateway.url, gateway.requests
    connected = {(i["host"], i["port"]) for i in attempt.network["connected"]}
    model_gateway = attempt.gateway["ledger"] and f"127.0.0.1:{port}" not in attempt.network["allow"]
    assert model_gateway and ("127.0.0.1", port) not in connected and len(attempt.network["allow"]) == 1
    assert "api.anthropic.com" not in attempt.network["allow"] and attempt.gateway["upstream"] == upstream
    # every call the upstream answered is one the endpoint received (a call the gateway refused, or one the
    # upstream never answered, is in the ledger with its reason or error)
    answered = [call for call in attempt.gateway["ledger"] if call.get("http_status") is not None]
    assert len(answered) == len(received) and not attempt.gateway["simulated"], (
        [(r["method"], r["path"], r["headers"].get("Content-Length")) for r in received],
        [{k: call.get(k) for k in ("method", "path", "format", "bytes_up", "http_status", "refused", "error")}
         for call in attempt.gateway["ledger"]])


@pytest.mark.slow
def test_two_runs_gates_bind_the_same_loopback_port_at_the_same_time(workers, make_pipeline, repo):
    """Each run's gates have a loopback of their own: both bind 127.0.0.1:8000 while the other holds it."""
    hold = (f"{sys.executable} -c \"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 8000)); "
            "s.listen(); print('bound', time.time(), flush=True); time.sleep(6); print('released', time.time())\"")
    stage = {**QUICK_STAGE, "gates": [{"name": "serve", "command": hold}]}
    pipeline = make_pipeline(stages=[stage])
    runs = [operations.create_run(pipeline, str(repo), "main") for _ in range(2)]
    for run in runs:
        operations.request_start(run, requested_by="t", source="test")
    finished = [wait_for(run.pk, timeout=180) for run in runs]
    assert [run.status for run in finished] == ["succeeded", "succeeded"], [r.stop_message for r in finished]
    spans = []
    for run in finished:
        check = Check.objects.filter(run=run, name="serve", kind="gate").order_by("id").first()
        assert check.passed and check.exit_code == 0
        text = (Path(settings.VAR_DIR) / check.log_path).read_text()
        bound = float(re.search(r"bound (\S+)", text).group(1))
        released = float(re.search(r"released (\S+)", text).group(1))
        spans.append((bound, released))
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, f"the two gates did not hold the port at the same time: {spans}"


def test_a_gate_has_no_network_unless_it_names_its_hosts(make_pipeline, repo, sent, services):
    web = services["web"]
    reach = (f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', {web.port}), timeout=2)\"")
    stage = {**QUICK_STAGE, "gates": [{"name": "reach", "command": reach}]}
    run = operations.create_run(make_pipeline(stages=[stage]), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    check = Check.objects.filter(run=run, name="reach", kind="gate").order_by("id").first()
    assert not check.passed and "ConnectionRefusedError" in (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert web.accepted == 0


def test_the_proxy_allows_listed_hosts_only_and_never_a_service(tmp_path):
    resolved = {"api.anthropic.com": ["160.79.104.10"], "gw.example": ["127.0.0.1"], "evil.example": ["10.0.0.5"],
                "x.example": ["93.184.216.34"]}
    proxy = EgressProxy(allow=["api.anthropic.com", "*.example:8443", "127.0.0.1:9999", "gw.example:5432"],
                        deny={("127.0.0.1", 5432)}, resolver=lambda host, port: resolved.get(host, [host]))
    assert proxy.allowed("api.anthropic.com", 443) == (True, "")
    assert proxy.allowed("API.Anthropic.com.", 443)[0]
    assert proxy.allowed("x.example", 8443)[0] and not proxy.allowed("x.example", 443)[0]
    assert proxy.allowed("127.0.0.1", 9999)[0] and not proxy.allowed("127.0.0.1", 9998)[0]
    assert not proxy.allowed("localhost", 9999)[0]  # not listed by that name
    ok, why = proxy.allowed("gw.example", 5432)  # listed, but it is the database
    assert not ok and "service of the Control Panel" in why
    assert not proxy.allowed("example.com", 443)[0] and not proxy.allowed("anthropic.com", 443)[0]
    wildcard = EgressProxy(allow=["*.example"], resolver=lambda host, port: resolved.get(host, [host]))
    assert wildcard.allowed("x.example", 80)[0]
    # an internal address needs its port named, whether written as such or resolved from a name
    assert not wildcard.allowed("10.0.0.5", 80)[0] and not wildcard.allowed("evil.example", 80)[0]


def test_the_self_check_refuses_agents_when_a_service_answers_from_inside(make_pipeline, repo, sent, services,
                                                                        monkeypatch):
    """Were the network namespace missing (simulated here by a sandbox without one), the probe finds
    the Control Panel's web port answering and no agent or gate is launched."""
    real_wrap = sandbox.wrap

    def leaky(argv, **kwargs):  # the same sandbox without its network namespace
        return [arg for arg in real_wrap(argv, **kwargs) if arg != "--unshare-net"]

    monkeypatch.setattr(sandbox, "wrap", leaky)
    monkeypatch.setattr(boundary, "_checked", {"at": 0.0, "problems": None})
    problems = boundary.probe()
    assert any(f"127.0.0.1:{services['web'].port}" in problem for problem in problems), problems
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.stop_reason == "boundary_not_enforced", run.stop_message
    assert f"127.0.0.1:{services['web'].port}" in run.stop_message
    attempt = Attempt.objects.get(run=run)
    assert attempt.pid is None and attempt.failure_kind == "boundary_not_enforced"
    monkeypatch.setattr(sandbox, "wrap", real_wrap)
    monkeypatch.setattr(boundary, "_checked", {"at": 0.0, "problems": None})
    assert boundary.probe() == []


def test_a_gate_that_names_a_host_reaches_it_and_only_it(make_pipeline, repo, sent):
    allowed, other = Listener(), Listener()
    try:
        script = (f"import os, socket, urllib.request\n"
                  f"socket.create_connection(('127.0.0.1', {allowed.port}), timeout=2).close()\n"
                  f"try:\n    socket.create_connection(('127.0.0.1', {other.port}), timeout=2)\n"
                  f"except OSError:\n    print('other refused')\nelse:\n    raise SystemExit('reached the other')\n"
                  f"proxy = os.environ['HTTP_PROXY']\n"
                  f"opener = urllib.request.build_opener(urllib.request.ProxyHandler({{'http': proxy}}))\n"
                  f"os.environ.pop('NO_PROXY'); os.environ.pop('no_proxy')\n"
                  f"try:\n    opener.open('http://127.0.0.1:{other.port}/', timeout=5)\n"
                  f"except Exception as exc:\n    print('proxy said', getattr(exc, 'code', exc))\n")
        reach = f"{sys.executable} -c {shlex.quote(script)}"
        stage = {**QUICK_STAGE, "gates": [{"name": "reach", "command": reach,
                                           "network_allow": [f"127.0.0.1:{allowed.port}"]}]}
        run = operations.create_run(make_pipeline(stages=[stage]), str(repo), "main")
        operations.request_start(run, requested_by="t", source="test")
        run = drive(run.pk, sent)
        check = Check.objects.filter(run=run, name="reach", kind="gate").order_by("id").first()
        log = (Path(settings.VAR_DIR) / check.log_path).read_text()
        assert check.passed and "other refused" in log and "proxy said 403" in log, log
        assert allowed.accepted >= 1 and other.accepted == 0
        assert check.network["refused"][0]["port"] == other.port
        event = RunEvent.objects.filter(run=run, kind="network_refused", gate_check=check).get()
        assert f"127.0.0.1:{other.port}" in event.message
        assert check.network["allow"] == [f"127.0.0.1:{allowed.port}"]
        assert {"host": "127.0.0.1", "port": allowed.port} in [
            {k: item[k] for k in ("host", "port")} for item in check.network["connected"]]
    finally:
        allowed.close()
        other.close()


@pytest.mark.slow
def test_a_worker_answers_no_remote_control(workers):
    """Worker remote control is off: a broker message cannot shut a worker down or read its tasks."""
    from controlpanel.celery import app

    # and each worker checked its boundary when it started (engine/tasks.py), and said so
    assert workers.log_text().count("sandbox boundary enforced") >= len(workers.procs), workers.log_text()[-2000:]
    assert app.conf.worker_enable_remote_control is False
    if settings.CELERY_BROKER_IS_FILESYSTEM:
        pytest.skip("the filesystem broker carries no broadcast; the Redis suite (CI) asks the real workers")
    assert app.control.ping(timeout=2.0) == []
    assert all(proc.poll() is None for proc in workers.procs)


def test_no_local_form_of_a_service_address_gets_through_the_proxy():
    """Every way of writing this host's address names the same service: 0.0.0.0, 127.0.0.2,
    the IPv4-mapped IPv6 form and the host's own interface addresses are refused like 127.0.0.1,
    even when the allow-list names them (a fresh-eyes tester reached Redis through 0.0.0.0)."""
    from engine.agents.netproxy import host_addresses

    own = sorted(str(ip) for ip in host_addresses() if not ip.is_loopback)
    forms = ["127.0.0.1", "127.0.0.2", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1", "0:0:0:0:0:ffff:7f00:1", *own]
    allow = [f"[{form}]:6379" if ":" in form else f"{form}:6379" for form in forms]
    proxy = EgressProxy(allow=allow + ["127.0.0.1:7000"], deny={("127.0.0.1", 6379), ("::1", 6379)},
                        resolver=lambda host, port: [host])
    for form in forms:
        ok, why = proxy.allowed(form, 6379)
        assert not ok and "service of the Control Panel" in why, (form, why)
    assert proxy.allowed("127.0.0.1", 7000) == (True, "")  # another port of this host, listed: allowed
    # a name checked once is connected to at the address that was checked, not looked up again
    answers = iter([["10.9.9.9"], ["127.0.0.1"]])
    rebinding = EgressProxy(allow=["gw.example:6379"], deny={("127.0.0.1", 6379)},
                            resolver=lambda host, port: next(answers))
    assert rebinding.check("gw.example", 6379) == (True, "", "10.9.9.9")


def test_a_name_or_number_for_this_host_without_a_port_reaches_nothing():
    """``127.1``, ``2130706433``, ``0x7f000001`` or a host name that resolves to loopback, listed
    without a port, would open every port of the host (its PostgreSQL, its Redis): the port rule
    applies to what the name resolves to, and the pipeline refuses such entries when it is loaded."""
    from engine.pipeline.format import PipelineFormatError

    from ..conftest import pipeline_definition

    proxy = EgressProxy(allow=["127.1", "2130706433", "0x7f000001", "vm.local"],
                        resolver=lambda host, port: ["127.0.0.1"])
    for host in ("127.1", "2130706433", "0x7f000001", "vm.local"):
        ok, why = proxy.allowed(host, 5432)
        assert not ok, host
    assert "listed with its port" in proxy.allowed("vm.local", 5432)[1]
    for entry in ("127.1", "2130706433", "0177.0.0.1", "localhost", "10.0.0.5"):
        with pytest.raises(PipelineFormatError) as err:
            pipeline_definition(profiles={"scripted": {"adapter": "scripted", "scenario": {"default": [{}]},
                                                       "network_allow": [entry]}})
        assert "name its port" in str(err.value), entry


def test_the_proxy_serves_a_bounded_number_of_connections_and_drops_a_slow_head(monkeypatch):
    """An agent opening thousands of connections to its proxy's socket must not grow the worker
    without bound (a fresh-eyes tester reached 8000 threads and 741 MB): past MAX_CONNECTIONS the
    proxy answers 503 at once, and a request head that does not come in time is dropped."""
    import socket as socketlib
    import threading
    import time as timelib

    from engine.agents import netproxy

    monkeypatch.setattr(netproxy, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(netproxy, "HEAD_DEADLINE_SECONDS", 2.0)
    with EgressProxy(allow=[]) as proxy:
        before = threading.active_count()
        held = []
        for _ in range(40):  # each sends half a head and waits
            conn = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            conn.connect(proxy.socket_path)
            conn.sendall(b"CONNECT example.com:443 HTTP/1.1\r\n")
            held.append(conn)
        timelib.sleep(0.5)
        assert threading.active_count() - before <= 8 + 2  # the served ones and the accept loop
        answers = []
        for conn in held:
            conn.settimeout(5)
            try:
                answers.append(conn.recv(100))
            except OSError:
                answers.append(b"")
            conn.close()
        busy = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(busy) >= 40 - 8, answers
        assert all(a.startswith((b"HTTP/1.1 503", b"HTTP/1.1 400")) for a in answers), answers  # 400: too slow
        assert any("connections at once" in item["why"] for item in proxy.refused)
