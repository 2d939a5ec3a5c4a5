"""The setup step (engine/steps/setup.py, engine/environments.py), driven in this process: the
environment is made once per repository and cache key, reused by later runs, shown read-only to
agents and gates (first on PATH, login shells included), and a failing setup stops the run."""
import http.server
import json
import threading
from pathlib import Path

import pytest
from django.conf import settings

from engine import environments, operations
from engine.models import Check

from .conftest import git
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

#: An offline setup: a venv without pip at $CP_ENV, and a kept node_modules with a program in .bin.
MAKE_ENV = ['python -m venv --without-pip "$CP_ENV"',
            "mkdir -p node_modules/.bin && printf '#!/bin/sh\\necho js-tool-ran\\n' > node_modules/.bin/js-tool "
            "&& chmod +x node_modules/.bin/js-tool",
            'echo "made from $(pwd)"']
SETUP = {"commands": MAKE_ENV, "keep": ["node_modules"], "cache_key": ["app/core.py"]}

#: What the gate asserts: the setup's python and node_modules/.bin first on PATH, neither writable.
ENV_GATE = ('test "$(command -v python)" = /cp/env/bin/python && test "$CP_ENV" = /cp/env '
            '&& python -c "import sys; assert sys.prefix == \'/cp/env\', sys.prefix" '
            '&& test "$(js-tool)" = js-tool-ran && test "$(bash -lc \'command -v python\')" = /cp/env/bin/python '
            '&& ! touch "$CP_ENV/planted" 2>/dev/null && ! touch node_modules/planted 2>/dev/null')

#: The scripted agent looks at its shells (a login shell, as codex runs its commands) and tries to
#: plant a file in the shared environment.
AGENT_LOOKS = {"run": ["bash", "-c",
                       "mkdir -p app && { bash -lc 'command -v python'; sh -lc 'command -v js-tool'; "
                       "if touch \"$CP_ENV/bin/pip\" 2>/dev/null || touch node_modules/.bin/planted 2>/dev/null; "
                       "then echo planted; else echo refused; fi; } > app/seen.txt"],
               "write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 42\n'}}

STAGES = [{"key": "answer", "requirement": "r", "scope": ["app/**"], "repair_allowance": 0,
           "gates": [{"name": "env", "command": ENV_GATE},
                     {"name": "agent-saw", "command": "cat app/seen.txt && test \"$(cat app/seen.txt)\" = "
                                                      "\"$(printf '/cp/env/bin/python\\n%s/node_modules/.bin/js-tool"
                                                      "\\nrefused' \"$PWD\")\""}]}]


def _start(pipeline, repo, sent):
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    return drive(run.pk, sent)


def _setup_check(run) -> Check:
    return Check.objects.get(run=run, kind="setup")


@pytest.mark.pipeline
def test_the_setup_environment_is_made_once_and_every_shell_and_gate_sees_it_read_only(make_pipeline, repo, sent):
    pipeline = make_pipeline(stages=STAGES, setup=SETUP,
                             scenario={"stages": {"answer": {"implement": [AGENT_LOOKS]}}})
    first = _start(pipeline, repo, sent)
    assert first.status == "succeeded", first.stop_message
    made = _setup_check(first)
    assert made.passed and made.exit_code == 0 and not made.setup["reused"]
    log = Path(settings.VAR_DIR, made.log_path).read_text()
    assert "+ python -m venv --without-pip" in log and "made from" in log
    env = environments.of_run(first)
    assert env is not None and Path(env.env_dir, "bin", "python").exists()
    assert not Path(env.env_dir, "planted").exists() and not Path(env.env_dir, "bin", "pip").exists()
    assert Path(env.keep_dir("node_modules"), ".bin", "js-tool").exists()
    # the setup ran on a checkout of its own: its echo names that folder, not the run's worktree
    assert first.worktree not in log
    # nothing of the environment reached the run's branch
    files = git(repo, "ls-tree", "-r", "--name-only", first.branch).split()
    assert not any(name.startswith("node_modules") for name in files), files

    second = _start(pipeline, repo, sent)
    assert second.status == "succeeded", second.stop_message
    again = _setup_check(second)
    assert again.passed and again.setup["reused"] and again.setup["made_by"] == {"run": first.pk, "check": made.pk}
    assert again.setup["key"] == made.setup["key"] and second.environment["key"] == first.environment["key"]
    assert "Reused the environment" in Path(settings.VAR_DIR, again.log_path).read_text()
    assert again.elapsed_seconds < made.elapsed_seconds
    events = [e.message for e in second.events.filter(kind="setup")]
    assert events and "reused the environment" in events[0]


@pytest.mark.pipeline
def test_a_changed_cache_key_file_makes_a_new_environment(make_pipeline, repo, sent):
    pipeline = make_pipeline(stages=[{"key": "answer", "requirement": "r", "scope": ["app/**"],
                                      "gates": [{"name": "env", "command": "test -x /cp/env/bin/python"}]}],
                             setup={"commands": MAKE_ENV[:1], "cache_key": ["requirements.txt"]})
    (repo / "requirements.txt").write_text("six==1.15.0\n")
    git(repo, "add", "requirements.txt")
    git(repo, "commit", "-qm", "requirements")
    first = _start(pipeline, repo, sent)
    (repo / "requirements.txt").write_text("six==1.16.0\n")
    git(repo, "add", "requirements.txt")
    git(repo, "commit", "-qm", "pin")
    second = _start(pipeline, repo, sent)
    assert first.status == second.status == "succeeded", (first.stop_message, second.stop_message)
    assert first.environment["key"] != second.environment["key"]
    assert not _setup_check(second).setup["reused"]


@pytest.mark.pipeline
def test_a_failing_setup_stops_the_run_with_its_log_and_keeps_no_environment(make_pipeline, repo, sent):
    pipeline = make_pipeline(setup={"commands": ['python -m venv --without-pip "$CP_ENV"',
                                                 "echo 'resolving dependencies'; echo 'no matching version' >&2; exit 3"]})
    run = _start(pipeline, repo, sent)
    assert run.status == "waiting_review" and run.stop_reason == "setup_failed", (run.status, run.stop_message)
    assert "exited 3" in run.stop_message and "no matching version" in run.stop_message
    check = _setup_check(run)
    assert not check.passed and check.exit_code == 3 and check.failure_kind == "nonzero_exit"
    assert run.stop_evidence["check"] == check.pk
    assert not run.attempts.exists()  # no agent ran without its environment
    # and nothing half-made is kept for another run
    assert not [e for e in environments.listing() if (e.get("made_by") or {}).get("run") == run.pk]
    assert not list(environments.root().glob(f".building-*-{run.pk}"))


class _Registry(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the base class's name
        body = b"package index\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.pipeline
def test_the_setup_reaches_the_listed_registries_only_and_agents_and_gates_none(make_pipeline, repo, sent, settings):
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    listed, other = (f"127.0.0.1:{server.server_address[1]}" for server in servers)
    settings.CP_SETUP_REGISTRIES = [listed]
    fetch = ("python - <<'EOF'{after}\nimport urllib.request\nfor host in ['{listed}', '{other}']:\n"
             "    try:\n        print(host, urllib.request.urlopen('http://' + host + '/simple/', timeout=5).read())\n"
             "    except Exception as exc:\n        print(host, 'unreachable', type(exc).__name__)\nEOF")
    fetch = fetch.replace("{listed}", listed).replace("{other}", other)
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"], "repair_allowance": 0,
               "gates": [{"name": "no-network",
                          "command": fetch.replace("{after}", " | tee /dev/stderr | grep -c unreachable | grep -qx 2")}]}]
    try:
        pipeline = make_pipeline(stages=stages, setup={"commands": [fetch.replace("{after}", "")]})
        run = _start(pipeline, repo, sent)
    finally:
        for server in servers:
            server.shutdown()
    assert run.status == "succeeded", run.stop_message
    check = _setup_check(run)
    log = Path(settings.VAR_DIR, check.log_path).read_text()
    assert f"{listed} b'package index\\n'" in log and f"{other} unreachable" in log
    assert check.network["allow"] == [listed]
    assert [f"{c['host']}:{c['port']}" for c in check.network["connected"]] == [listed]
    assert run.events.filter(kind="network_refused").exists() or not check.network["refused"]


@pytest.mark.pipeline
def test_the_setup_is_part_of_the_run_status(make_pipeline, repo, sent):
    # the gates' python is the setup's now (no pytest in it): the stage's gate reads the file instead
    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
               "gates": [{"name": "unit", "command": "python -c 'import app.core as c; assert c.answer() == 42'"}]}]
    pipeline = make_pipeline(stages=stages, setup={"commands": ['python -m venv --without-pip "$CP_ENV"']})
    run = _start(pipeline, repo, sent)
    data = operations.run_status(run)
    assert data["status"] == "succeeded", data["stop_message"]
    assert data["setup"]["passed"] and data["setup"]["environment"]["key"] == run.environment["key"]
    assert json.dumps(data)  # the API's and run_status --json's shape


@pytest.mark.pipeline
def test_eviction_removes_environments_no_unfinished_run_uses_and_a_later_run_makes_them_again(make_pipeline, repo,
                                                                                               sent):
    from django.core.management import call_command

    setup = {"commands": ['python -m venv --without-pip "$CP_ENV"'], "cache_key": ["app/__init__.py"]}
    failing = [{"key": "answer", "requirement": "r", "scope": ["app/**"], "repair_allowance": 0,
                "gates": [{"name": "no", "command": "false"}]}]
    waiting = _start(make_pipeline(name="waits", stages=failing, setup=setup), repo, sent)
    assert waiting.status == "waiting_review" and waiting.stop_reason == "gate_failed", waiting.stop_message
    ok = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
           "gates": [{"name": "env", "command": "test -x /cp/env/bin/python"}]}]
    done = _start(make_pipeline(name="done", stages=ok, setup={**setup, "commands": [*setup["commands"], "true"]}),
                  repo, sent)
    assert done.status == "succeeded", done.stop_message
    out = __import__("io").StringIO()
    call_command("environments", stdout=out)
    assert waiting.environment["key"][:12] in out.getvalue() and done.environment["key"][:12] in out.getvalue()

    removed = environments.evict(max_age_days=0)
    assert str(environments.root() / done.environment["key"]) in removed  # a finished run's
    assert environments.is_made(waiting) and not environments.is_made(done)  # not the waiting run's
    again = _start(make_pipeline(name="done", stages=ok, setup={**setup, "commands": [*setup["commands"], "true"]}),
                   repo, sent)
    assert again.status == "succeeded" and not _setup_check(again).setup["reused"], again.stop_message


@pytest.mark.pipeline
def test_the_run_page_shows_the_setup_first_and_its_check_page_the_environment(make_pipeline, repo, sent, admin_client):
    from django.urls import reverse

    pipeline = make_pipeline(stages=[{"key": "answer", "requirement": "r", "scope": ["app/**"],
                                      "gates": [{"name": "env", "command": "test -x /cp/env/bin/python"}]}],
                             setup={"commands": ['python -m venv --without-pip "$CP_ENV"']})
    run = _start(pipeline, repo, sent)
    assert run.status == "succeeded", run.stop_message
    page = admin_client.get(reverse("admin:engine_run_detail", args=[run.pk])).content.decode()
    assert page.index('id="setup"') < page.index("id=\"stage-") and "<h2>Setup</h2>" in page
    assert run.environment["key"][:12] in page
    check = _setup_check(run)
    detail = admin_client.get(reverse("admin:engine_run_check_log", args=[run.pk, check.pk])).content.decode()
    assert "made by this check" in detail and "the run&#x27;s setup step" in detail and "+ python -m venv" in detail


@pytest.mark.pipeline
def test_recovering_a_run_whose_setup_failed_runs_the_setup_again(make_pipeline, repo, sent):
    pipeline = make_pipeline(setup={"commands": ["echo 'the registry did not answer'; exit 1"]})
    run = _start(pipeline, repo, sent)
    assert run.stop_reason == "setup_failed", run.stop_message
    decision = run.decisions.get(state="pending")
    operations.recover(run, decision.pk, "the registry is back", "retry", reviewer="t")
    run = drive(run.pk, sent)
    assert run.status == "waiting_review" and run.stop_reason == "setup_failed", run.stop_message
    assert Check.objects.filter(run=run, kind="setup").count() == 2  # it ran again, and said so again


@pytest.mark.pipeline
def test_run_status_says_what_the_setup_did(make_pipeline, repo, sent):
    import io

    from django.core.management import call_command

    stages = [{"key": "answer", "requirement": "r", "scope": ["app/**"],
               "gates": [{"name": "env", "command": "test -x /cp/env/bin/python"}]}]
    pipeline = make_pipeline(stages=stages, setup={"commands": ['python -m venv --without-pip "$CP_ENV"']})
    first, second = _start(pipeline, repo, sent), _start(pipeline, repo, sent)
    said = []
    for run in (first, second):
        out = io.StringIO()
        call_command("run_status", str(run.pk), stdout=out)
        said.append([line for line in out.getvalue().splitlines() if line.startswith("  setup:")])
    assert said[0] and said[0][0].startswith("  setup: pass (exit 0), ") and first.environment["key"][:12] in said[0][0]
    # the key's start and the commit it was made at: environments of one key at two commits differ
    name = environments.short(first.environment["key"])
    assert name == f"{first.environment['key'][:12]}@{first.commit[:12]}"
    assert said[1] == [f"  setup: reused environment {name} made by run {first.pk} (check "
                       f"{_setup_check(first).pk}); nothing ran"]


def test_a_setup_step_evicts_old_environments_but_never_those_of_the_key_it_looks_up(tmp_path, settings):
    import os
    import time as clock

    settings.VAR_DIR = tmp_path
    for name in ("aaaa-111111111111", "bbbb-222222222222"):
        folder = environments.root() / name
        (folder / "env").mkdir(parents=True)
        (folder / environments.RECORD).write_text(json.dumps({"key": name, "commit": "1" * 40}))
        (folder / "used").write_text("")
        old = clock.time() - 30 * 86400
        os.utime(folder / "used", (old, old))
    removed = environments.evict_now_and_then(keep_key="aaaa")
    assert removed == [str(environments.root() / "bbbb-222222222222")]
    assert (environments.root() / "aaaa-111111111111" / "env").is_dir()
    assert environments.evict_now_and_then(keep_key="") == []  # at most once an hour
