"""Stage context, attempt records and process deadlines end to end, through real Celery worker
processes: secrets, process deadlines, a missing executable, and a worker restarted mid-run.

These tests start their own worker processes (``Solo``), each with one pool process and a queue
of its own, so that "the worker takes the next task" and "the worker was killed" are about one
known process; the session's worker pool (tests/conftest.py) is not touched. The test process
sends a run's first message to that queue (``route``); every later message is sent by the
worker itself, to its own queue.

Field cases (docs/field-cases.md): C06 (grandchild holding the pipe), C08 (SIGTERM ignored), C12 (bytes, ANSI,
progress, UTF-8) and C14 (secrets in every store) at run level; the unit-level versions are in
tests/test_process.py and tests/test_redaction.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets as random
import shlex
import signal
import string
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.core import serializers
from django.db import connection
from django.urls import reverse

from engine import operations
from engine.steps import process_marker_prefix
from engine.models import Attempt, Check, Decision, Run, RunEvent
from engine.processes.process import find_marked

from .conftest import ANSWER_STEP, git, make_repo, run_data_dir, wait_for, wait_until
from .support.workers import Solo, gone
from .support.runs import QUICK

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(settings.BASE_DIR)
PINNED_CLAUDE = BASE_DIR / "tools" / "agents" / "node_modules" / ".bin" / "claude"
#: The scripted adapter's grace between the first polite signal and SIGKILL (engine/agents/scripted.py).
GRACE = 5.0
ALNUM = string.ascii_letters + string.digits


def rand(n: int, alphabet: str = ALNUM) -> str:
    return "".join(random.choice(alphabet) for _ in range(n))


# ----------------------------------------------------------------------------- one worker of our own


@pytest.fixture(scope="module")
def solo(django_db_setup, tmp_path_factory):
    """One worker for the tests of this module that do not kill theirs, at DEBUG
    (docs/field-cases.md C14 greps its log)."""
    worker = Solo(tmp_path_factory.mktemp("solo"), f"issue3-{os.getpid()}-{uuid.uuid4().hex[:6]}", loglevel="debug",
                  CP_LOG_LEVEL="DEBUG").start()
    yield worker
    worker.stop()


@pytest.fixture
def on_solo(solo, route):
    route(solo.queue)
    return solo


def start(run, timeout: float = 120.0) -> Run:
    operations.request_start(run, requested_by="test", source="test")
    return wait_for(run.pk, timeout=timeout)


def var(rel: str) -> Path:
    return Path(settings.VAR_DIR) / rel


def claimed_within(run, seconds: float) -> float:
    """Request Start and return how long the run waited before a worker claimed it (fails after ``seconds``)."""
    asked = time.monotonic()
    operations.request_start(run, requested_by="test", source="test")
    while Run.objects.get(pk=run.pk).status in ("pending", "queued"):
        assert time.monotonic() - asked < seconds, f"run {run.pk} was not claimed within {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - asked


# ----------------------------------------------------------------------------- stage context


def test_a_missing_named_doc_stops_the_stage_before_any_agent_starts(on_solo, make_pipeline, repo):
    stages = [{**QUICK[0], "docs": ["docs/PLAN.md", "docs/MISSING.md"]}]
    run = start(operations.create_run(make_pipeline(stages=stages), str(repo), "main"))
    assert (run.status, run.stop_reason) == ("waiting_review", "missing_file")
    assert "docs/MISSING.md" in run.stop_message
    attempt = Attempt.objects.get(run=run)
    assert (attempt.status, attempt.failure_kind) == ("failed", "missing_file")
    assert attempt.pid is None and attempt.exit_code is None and attempt.started_at is None
    assert not attempt.prompt_path and not attempt.patch_path
    folder = var(attempt.log_path).parent
    assert not list(folder.glob("scripted-step-*.json"))  # the adapter never ran
    assert "not launched: missing_file" in var(attempt.log_path).read_text()
    assert run.decisions.get().reason == "missing_file"


@pytest.mark.parametrize("field", ["docs", "master_plan"])
def test_a_symlink_out_of_the_worktree_stops_the_stage_naming_it(on_solo, make_pipeline, tmp_path, field):
    body = f"OUTSIDE-{rand(24)}"
    outside = tmp_path / "outside" / "secret.md"
    outside.parent.mkdir()
    outside.write_text(body + "\n")
    files = {"app/__init__.py": "", "app/core.py": '"""Core."""\n', "docs/INDEX.md": "# Index\n"}
    if field == "docs":
        files["docs/PLAN.md"] = "# Plan\n"
    repo = make_repo(tmp_path / "origin", files)
    link = "docs/extra.md" if field == "docs" else "docs/PLAN.md"
    os.symlink(outside, repo / link)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a symlink out of the repository")
    assert git(repo, "ls-files", "-s", link).startswith("120000")  # committed as a symlink
    stages = [{**QUICK[0], "docs": [link] if field == "docs" else []}]
    run = start(operations.create_run(make_pipeline(stages=stages), str(repo), "main"))
    assert (run.status, run.stop_reason) == ("waiting_review", "path_escapes_workspace")
    assert link in run.stop_message and "symlink" in run.stop_message
    attempt = Attempt.objects.get(run=run)
    assert (attempt.status, attempt.failure_kind) == ("failed", "path_escapes_workspace")
    assert attempt.pid is None and attempt.exit_code is None and not attempt.prompt_path
    assert os.path.islink(Path(run.worktree) / link)  # it was the real checkout that was refused
    # what the link points at was read into nothing
    for path in var(run.control_dir).rglob("*"):
        if path.is_file():
            assert body.encode() not in path.read_bytes(), path


def test_the_saved_prompt_holds_requirement_plan_dependency_output_and_docs(on_solo, make_pipeline, repo, client,
                                                                          django_user_model):
    (repo / "docs" / "design.md").write_text("# Design\nDouble means times two, DESIGN-NOTE-7.\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "design notes")
    final = f"answer() now returns 42 (FINAL-{rand(8)})"
    stages = [QUICK[0], {"key": "double", "requirement": "Add app.core.double() returning twice the answer.",
                         "scope": ["app/**"], "depends_on": ["answer"], "docs": ["docs/design.md"],
                         "gates": [{"name": "unit", "command": "true"}]}]
    double = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 42\n\n\n'
                                       'def double():\n    return 2 * answer()\n'}}
    scenario = {"stages": {"answer": {"implement": [{**ANSWER_STEP, "final_message": final}]},
                           "double": {"implement": [double]}}}
    run = start(operations.create_run(make_pipeline(stages=stages, scenario=scenario), str(repo), "main"))
    assert run.status == "succeeded", run.stop_message
    first, second = (run.stages.get(key=k) for k in ("answer", "double"))
    attempt = second.attempts.get(operation="implement")
    prompt = var(attempt.prompt_path).read_text()
    assert "## Requirement\nAdd app.core.double() returning twice the answer." in prompt
    assert "Make app.core.answer() return 42." not in prompt  # another stage's requirement is not this one's
    assert "## Master plan (docs/PLAN.md)\n# Plan\nOne stage: answer." in prompt
    assert f"### Stage 'answer' (checkpoint {first.checkpoint_commit})" in prompt
    assert "- modified: app/core.py" in prompt
    assert "Agent's final message:" in prompt  # whose: tests/test_attempt_records.py (a known defect)
    assert "## Document docs/design.md\n# Design\nDouble means times two, DESIGN-NOTE-7." in prompt
    assert hashlib.sha256(var(attempt.prompt_path).read_bytes()).hexdigest() == attempt.prompt_sha256
    # the attempt's page links the prompt and shows its sha256; the link serves that very file
    client.force_login(django_user_model.objects.create_superuser("admin", "a@example.invalid", "pw-tests-only"))
    html = client.get(reverse("admin:engine_attempt_change", args=[attempt.pk])).content.decode()
    url = reverse("admin:engine_attempt_file", args=[attempt.pk, "prompt"])
    assert f'href="{url}"' in html and f"sha256 {attempt.prompt_sha256} (matches the file)" in html
    served = b"".join(client.get(url).streaming_content)
    assert served == var(attempt.prompt_path).read_bytes()


# --------------------------------------------------------- secrets (docs/field-cases.md C14)


EMITTER = r'''
import json, os, sys, time

s = json.load(open(sys.argv[1]))


def write(text):
    os.write(1, text.encode())
    time.sleep(0.3)  # each piece is a separate read on the engine's side


# a provider API key, split across two writes
write("calling the provider with key " + s["provider"][:24])
write(s["provider"][24:] + "\n")
# an AWS secret access key (credentials-file form), split
write("[default]\naws_access_key_id = " + s["aws_id"] + "\naws_secret_access_key = " + s["aws_secret"][:17])
write(s["aws_secret"][17:] + "\n")
# a bearer token, split
write("curl -H 'Authorization: Bearer " + s["bearer"][:15])
write(s["bearer"][15:] + "' https://api.example.invalid/v1/models\n")
# C14: `cat .env` reported as a stream-json tool_result (the key JSON-escaped inside a string)
env_file = open(".env").read()
for event in ({"type": "assistant", "message": {"content": [{"type": "tool_use", "name": "Bash",
                                                             "input": {"command": "cat .env"}}]}},
              {"type": "user", "message": {"content": [{"type": "tool_result", "content": env_file}]}}):
    write(json.dumps(event) + "\n")
'''


def grep(haystack: bytes, needles: dict[str, bytes]) -> list[str]:
    return [name for name, needle in needles.items() if needle in haystack]


def test_c14_secrets_an_agent_prints_reach_no_store_and_no_page(solo, route, make_pipeline, tmp_path, client,
                                                               django_user_model):
    route(solo.queue)
    values = {"provider": "sk-ant-api03-" + rand(80) + "-" + rand(10),
              "aws_id": "AKIA" + rand(16, string.ascii_uppercase + string.digits),
              "aws_secret": rand(40, ALNUM + "/+"),
              "bearer": rand(40, ALNUM + "-._"),
              "stripe": "sk_live_" + rand(24),
              "pasted": "sk-" + rand(48)}
    bodies = {"provider": values["provider"][len("sk-ant-api03-"):], "aws_id": values["aws_id"][4:],
              "aws_secret": values["aws_secret"], "bearer": values["bearer"],
              "stripe": values["stripe"][len("sk_live_"):], "pasted": values["pasted"][3:]}
    # every piece of every split secret, too: a half written before the redactor saw the rest is a leak
    needles = {name: body.encode() for name, body in bodies.items()}
    needles.update({"provider[:24] piece": values["provider"][13:24].encode(),
                    "provider[24:] piece": values["provider"][24:40].encode(),
                    "aws_secret[:17] piece": values["aws_secret"][:17].encode(),
                    "aws_secret[17:] piece": values["aws_secret"][17:].encode(),
                    "bearer[:15] piece": values["bearer"][:15].encode(),
                    "bearer[15:] piece": values["bearer"][15:].encode()})
    # in the repository (outside every store: the scans below skip the worktrees), where the agent
    # finds them; the sandbox shows it nothing else of the host
    repo = make_repo(tmp_path / "origin", {
        "tools/secrets.json": json.dumps(values), "tools/emit.py": EMITTER,
        "app/__init__.py": "", "app/core.py": '"""Core."""\n', "docs/PLAN.md": "# Plan\n",
        ".env": f"STRIPE_SECRET_KEY={values['stripe']}\nDEBUG=1\n",
        # a key pasted into a document the stage gives its agent: it goes into the prompt
        "docs/notes.md": f"For the integration use this key: {values['pasted']}\n",
    })
    stages = [{**QUICK[0], "docs": ["docs/notes.md"]}]
    secrets_file = repo / "tools" / "secrets.json"
    step = {**ANSWER_STEP, "run": [sys.executable, "tools/emit.py", "tools/secrets.json"]}
    pipeline = make_pipeline(stages=stages, scenario={"stages": {"answer": {"implement": [step]}}})
    run = start(operations.create_run(pipeline, str(repo), "main"))
    assert run.status == "succeeded", run.stop_message
    attempt = Attempt.objects.get(run=run, operation="implement")
    log = var(attempt.log_path).read_text()
    # the agent really printed them, each split, and each came out redacted whole
    assert "calling the provider with key [REDACTED]\n" in log
    assert "aws_access_key_id = [REDACTED]\naws_secret_access_key = [REDACTED]\n" in log
    assert "Authorization: Bearer [REDACTED]' https://api.example.invalid/v1/models" in log
    assert "STRIPE_SECRET_KEY=[REDACTED]\\nDEBUG=1\\n" in log  # inside the JSON string, escapes intact
    lines = [json.loads(line) for line in var(attempt.raw_path).read_text().splitlines() if '"tool_result"' in line]
    assert lines[0]["message"]["content"][0]["content"] == "STRIPE_SECRET_KEY=[REDACTED]\nDEBUG=1\n"
    assert attempt.redactions >= 6
    prompt = var(attempt.prompt_path).read_text()
    assert "For the integration use this key: [REDACTED]" in prompt

    # the search finds what it looks for (where the agent read them from)
    assert grep(secrets_file.read_bytes(), needles) == list(needles)
    leaks = []
    # 1. every file of the run's control records
    control = var(run.control_dir)
    files = [p for p in control.rglob("*") if p.is_file()]
    assert len(files) >= 6 and {p.name for p in files} >= {"definition.json", "prompt.md", "output.log",
                                                          "output.raw", "patch.diff"}
    for path in files:
        leaks += [f"{path}: {n}" for n in grep(path.read_bytes(), needles)]
    # 2. every other file under CP_VAR_DIR but the worktrees (the repository's own content, .env
    #    included): the database file and its WAL, the broker's folders (task arguments), scratch
    for path in Path(settings.VAR_DIR).rglob("*"):
        if path.is_file() and "worktrees" not in path.relative_to(settings.VAR_DIR).parts[:1]:
            leaks += [f"{path}: {n}" for n in grep(path.read_bytes(), needles)]
    if connection.vendor == "sqlite":  # the database file and its write-ahead log, wherever they are
        database = Path(connection.settings_dict["NAME"])
        assert database.is_file()
        for path in (database, database.with_name(database.name + "-wal")):
            if path.exists():
                leaks += [f"{path}: {n}" for n in grep(path.read_bytes(), needles)]
    # 3. the rows: every field of the run, its attempts, checks, decisions and events
    rows = serializers.serialize("json", [run, *Attempt.objects.filter(run=run), *Check.objects.filter(run=run),
                                          *Decision.objects.filter(run=run), *RunEvent.objects.filter(run=run)])
    leaks += [f"rows: {n}" for n in grep(rows.encode(), needles)]
    leaks += [f"run_status: {n}" for n in grep(json.dumps(operations.run_status(run)).encode(), needles)]
    # 4. the worker's log, at DEBUG (so INFO too): app logs and the Celery task lines
    assert f"run {run.pk} [simulated]: implement step claimed" in solo.text()
    leaks += [f"worker log: {n}" for n in grep(solo.log.read_bytes(), needles)]
    # 5. the Control Panel's pages: the run, its attempts, events, and every stored file served
    client.force_login(django_user_model.objects.create_superuser("admin", "a@example.invalid", "pw-tests-only"))
    urls = [reverse("admin:engine_run_change", args=[run.pk]), reverse("admin:engine_run_changelist"),
            reverse("admin:engine_attempt_changelist"), reverse("admin:engine_runevent_changelist")]
    for a in Attempt.objects.filter(run=run):
        urls.append(reverse("admin:engine_attempt_change", args=[a.pk]))
        urls += [reverse("admin:engine_attempt_file", args=[a.pk, kind]) for kind in ("prompt", "log", "raw", "patch")]
    for c in Check.objects.filter(run=run):  # each check's page and its whole log
        page_url = reverse("admin:engine_run_check_log", args=[run.pk, c.pk])
        urls += [page_url, page_url + "?raw=1"]
    for url in urls:
        response = client.get(url)
        if response.status_code == 404 and "/file/" in url:
            continue  # that attempt has no such file
        assert response.status_code == 200, url
        content = b"".join(response.streaming_content) if response.streaming else response.content
        leaks += [f"{url}: {n}" for n in grep(content, needles)]
    assert leaks == []


# --------------------------------------------------------- deadlines (docs/field-cases.md C06, C08)


STUBBORN = r'''
import os, signal, subprocess, sys, time


def noting(who):
    def handler(signum, frame):
        os.write(1, f"{who} {os.getpid()} got signal {signum} and ignores it\n".encode())
    return handler


if sys.argv[1:] == ["grandchild"]:
    signal.signal(signal.SIGTERM, noting("grandchild"))
    signal.signal(signal.SIGINT, noting("grandchild"))
    os.write(1, f"grandchild {os.getpid()} in its own session {os.getsid(0)} holds the pipe\n".encode())
else:
    signal.signal(signal.SIGTERM, noting("child"))
    signal.signal(signal.SIGINT, noting("child"))
    grand = subprocess.Popen([sys.executable, __file__, "grandchild"], start_new_session=True)
    os.write(1, f"child {os.getpid()} started grandchild {grand.pid}\n".encode())
while True:
    time.sleep(0.2)
'''


def test_c08_a_tree_that_ignores_sigterm_past_its_deadline_is_gone_and_the_worker_moves_on(on_solo, make_pipeline,
                                                                                          repo, tmp_path):
    deadline = 3.0
    # through sh, so that the scripted agent's own clean-up (it kills its direct child on SIGINT)
    # cannot stop the stub: only the engine can; the stub lies in the run's data folder (the
    # sandbox shows the agent nothing else outside its worktree)
    step = {"print": "starting the stubborn child",
            "run": ["sh", "-c", f'{shlex.quote(sys.executable)} "$CP_DATA_DIR/stubborn.py"; echo child-ended']}
    pipeline = make_pipeline(stages=QUICK, scenario={"stages": {"answer": {"implement": [step]}}},
                             deadlines={"implement": deadline, "gate": 60})
    run = operations.create_run(pipeline, str(repo), "main")
    stub = run_data_dir(run) / "stubborn.py"
    stub.write_text(STUBBORN)
    run = start(run)
    attempt = Attempt.objects.get(run=run)
    assert (run.status, run.stop_reason) == ("waiting_review", "timeout")
    assert (attempt.status, attempt.failure_kind) == ("timeout", "timeout")
    # never recorded as a success: the agent's own process (the scripted agent, which obeys SIGINT)
    # ended by a signal; signal 9 for a process that ignores SIGINT too is asserted in test_process.py
    assert attempt.exit_code is None and attempt.signal is not None
    log = var(attempt.log_path).read_text()
    found = re.search(r"child (\d+) started grandchild (\d+)", log)
    assert found, log
    child, grandchild = int(found.group(1)), int(found.group(2))
    # partial output kept, and both really ignored the polite signals (SIGINT 2, then SIGTERM 15; the sandbox's
    # PID namespace may end with the agent's own process before one of them has written that it got SIGTERM)...
    assert "starting the stubborn child" in log and f"grandchild {grandchild} in its own session" in log
    for pid, who in ((child, "child"), (grandchild, "grandchild")):
        assert f"{who} {pid} got signal 2 and ignores it" in log, log
    assert re.search(r"child \d+ got signal 15 and ignores it", log), log
    assert "child-ended" not in log.splitlines()  # sh never got to it
    assert f"deadline of {deadline:g} s reached; the process tree was stopped" in log
    # ...and yet, after the attempt, nothing of the tree is alive: SIGKILL after the grace
    assert gone(child, str(stub)) and gone(grandchild, str(stub)), (child, grandchild, log)
    assert attempt.pid and gone(attempt.pid, "scripted_agent"), (attempt.pid, log)
    assert find_marked(attempt.marker) == []
    # the recorded time runs until the tree was stopped: within the grace. The agent's own process
    # obeys SIGINT; when it ends, its sandbox (a PID namespace) ends, and the stubborn processes in it
    # with it, whatever they ignore
    assert deadline <= attempt.elapsed_seconds < deadline + GRACE + 2, (attempt.elapsed_seconds, log)
    took = (attempt.ended_at - attempt.started_at).total_seconds()
    assert took < deadline + GRACE + 2 + 2, took  # deadline + grace + 2 s, plus 2 s for manifest and patch
    # the same worker (the only one on this queue) takes the next run, and finishes it: it does not wait on
    # the stubborn tree, which would never end by itself (15 s leaves room for a loaded CI machine)
    nxt = operations.create_run(make_pipeline(name="next", stages=QUICK), str(repo), "main")
    assert claimed_within(nxt, 15.0) < 15.0
    assert wait_for(nxt.pk).status == "succeeded"


def test_c06_a_grandchild_holding_the_pipe_at_run_level(on_solo, make_pipeline, repo):
    deadline = 3.0
    step = {"run": ["sh", "-c", "sleep 600 & echo started; wait"]}
    pipeline = make_pipeline(stages=QUICK, scenario={"stages": {"answer": {"implement": [step]}}},
                             deadlines={"implement": deadline, "gate": 60})
    run = start(operations.create_run(pipeline, str(repo), "main"))
    attempt = Attempt.objects.get(run=run)
    assert (attempt.status, run.stop_reason) == ("timeout", "timeout")
    took = (attempt.ended_at - attempt.started_at).total_seconds()
    assert took < deadline + GRACE + 2 + 2  # deadline + grace + 2 s, plus 2 s for manifest and patch
    # close to the deadline: the `sleep` ignores SIGINT (a background job of sh), so it ends at
    # the SIGTERM that follows within 1 s; the grace (5 s) is not waited for
    assert deadline <= attempt.elapsed_seconds < deadline + 2
    assert "started" in var(attempt.log_path).read_text().splitlines()
    assert find_marked(attempt.marker) == []  # the `sleep 600` included
    # a `sleep 600` of this run, marked or not (the other suite of CI may run this same test at the
    # same moment: its sleep carries its own run's marker and is not ours)
    ours = process_marker_prefix(run)

    def foreign(proc) -> bool:
        try:
            marker = proc.environ().get("CP_PROCESS_MARKER", "")
        except (psutil.Error, OSError):
            return False
        return bool(marker) and not marker.startswith(ours)

    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "600"]
                 and p.status() != psutil.STATUS_ZOMBIE and p.create_time() >= attempt.started_at.timestamp() - 1
                 and not foreign(p)]
    assert leftovers == []
    nxt = operations.create_run(make_pipeline(name="next", stages=QUICK), str(repo), "main")
    assert claimed_within(nxt, 5.0) < 5.0
    assert wait_for(nxt.pk).status == "succeeded"


def test_c12_odd_bytes_from_an_agent_neither_crash_the_run_nor_change_the_raw_record(on_solo, make_pipeline, repo,
                                                                                      tmp_path):
    emitted = b"ok \xff\xfe \x1b[31mRED\x1b[0m\r50%\r100%\ncaf\xc3\xa9\n\xc3"
    # a file (an argument would be echoed into the log by the agent), in the run's data folder
    step = {**ANSWER_STEP, "run": ["sh", "-c", f'exec {shlex.quote(sys.executable)} "$CP_DATA_DIR/odd_bytes.py"']}
    run = operations.create_run(make_pipeline(stages=QUICK, scenario={"stages": {"answer": {
        "implement": [step]}}}), str(repo), "main")
    (run_data_dir(run) / "odd_bytes.py").write_text(
        "import os, time\nos.write(1, b'ok \\xff\\xfe \\x1b[31mRED\\x1b[0m\\r50%\\r100%\\n')\n"
        "os.write(1, b'caf\\xc3')\ntime.sleep(0.05)\nos.write(1, b'\\xa9\\n')\nos.write(1, b'\\xc3')\n")
    run = start(run)
    attempt = Attempt.objects.get(run=run, operation="implement")
    # the attempt completed and nothing in the engine raised (a decoding error would be `crashed`);
    # whether it then succeeds is tests/test_issue3_known_defects.py's business (the scripted agent
    # glues its result line to output that ends without a newline)
    assert attempt.ended_at is not None and attempt.status in ("succeeded", "failed")
    assert attempt.failure_kind != "crashed" and run.stop_reason != "crashed", run.stop_message
    assert emitted in var(attempt.raw_path).read_bytes()  # byte-identical
    display = var(attempt.log_path).read_text(encoding="utf-8")
    assert "\x1b" not in display and "\ufffd RED" in display and "café\n" in display
    assert "100%\ufffd RED" in display and "50%" not in display
    assert "\n\ufffd" in display  # the lone trailing \xc3


# ----------------------------------------------------------------------------- a missing executable


def missing_cli_pipeline(make_pipeline, executable: Path):
    profile = {"adapter": "claude-code", "executable": str(executable)}
    roles = {"implementer": "cli", "reviewer": "cli", "documenter": "cli"}
    return make_pipeline(name="cli", stages=QUICK, profiles={"cli": profile}, roles=roles)


@pytest.mark.skipif(not PINNED_CLAUDE.exists(), reason="run `make agents` to install the pinned claude CLI")
def test_an_executable_that_disappears_after_creation_stops_the_run_as_missing_executable(route, make_pipeline, repo,
                                                                                          tmp_path, monkeypatch, listed):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-dummy-for-tests-0000")  # pre-flight: a credential is there
    exe = tmp_path / "bin" / "claude"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(str(PINNED_CLAUDE))} "$@"\n')
    exe.chmod(0o755)
    listed(exe)  # the operator lists it, here and in the worker's environment
    queue = f"gone-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    worker = Solo(tmp_path, queue, CP_AGENT_EXECUTABLES=str(exe)).start()
    try:
        run = operations.create_run(missing_cli_pipeline(make_pipeline, exe), str(repo), "main")  # it exists: accepted
        exe.unlink()
        run = start(run)
    finally:
        worker.stop()
    assert (run.status, run.stop_reason) == ("waiting_review", "missing_executable")
    assert str(exe) in run.stop_message
    attempt = Attempt.objects.get(run=run)
    assert (attempt.status, attempt.failure_kind) == ("failed", "missing_executable")
    assert attempt.pid is None and attempt.exit_code is None and attempt.signal is None
    assert "[run-engine] The claude executable was not found" in var(attempt.log_path).read_text()


# ----------------------------------------------------------------------------- a worker restarted mid-run


@pytest.mark.parametrize("how", ["kill", "warm"])
def test_restarting_the_worker_mid_attempt_keeps_the_active_time(route, make_pipeline, repo, tmp_path, how):
    queue = f"restart-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    first = Solo(tmp_path, queue).start()
    second = None
    try:
        scenario = {"stages": {"answer": {"implement": [{"print": "working", "sleep": 5},
                                                        {**ANSWER_STEP, "sleep": 1.5}]}}}
        run = operations.create_run(make_pipeline(stages=QUICK, scenario=scenario), str(repo), "main")
        operations.request_start(run, requested_by="test", source="test")
        end = time.monotonic() + 30
        while True:
            attempt = Attempt.objects.filter(run=run, status="running").exclude(pid=None).first()
            if attempt is not None and Run.objects.get(pk=run.pk).active_seconds >= 2:
                break
            assert time.monotonic() < end, "the attempt did not start"
            time.sleep(0.1)
        agent = psutil.Process(attempt.pid)
        if how == "kill":
            first.kill()  # the sandbox (bubblewrap --die-with-parent) takes the agent's tree with it
            end_wait = time.monotonic() + 10
            while agent.is_running() and agent.status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < end_wait, "the agent outlived its worker"
                time.sleep(0.1)
        else:
            first.stop()  # warm shutdown: the step in progress finishes first
        kept = Run.objects.get(pk=run.pk).active_seconds
        assert kept >= 2  # persisted while the attempt ran
        time.sleep(1.5)  # no heartbeat for longer than the next worker's CP_HEARTBEAT_STALE
        assert Run.objects.get(pk=run.pk).active_seconds == kept
        second = Solo(tmp_path, queue, CP_HEARTBEAT_STALE=1).start()  # it reconciles when it starts
        if how == "kill":
            run = wait_for(run.pk, timeout=30)
            assert (run.status, run.stop_reason) == ("waiting_review", "interrupted"), run.stop_message
            assert run.active_seconds == kept  # neither reset nor made up
            attempt.refresh_from_db()
            assert attempt.status == "interrupted" and attempt.ended_at is not None
            assert not agent.is_running() or agent.status() == psutil.STATUS_ZOMBIE  # no orphan
            operations.recover(run, run.decisions.get(state="pending").pk, "worker restarted", "retry",
                               reviewer="test")
        seen = [kept]
        end = time.monotonic() + 90
        while (current := Run.objects.get(pk=run.pk)).status in ("queued", "running"):
            seen.append(current.active_seconds)
            assert time.monotonic() < end
            time.sleep(0.2)
        seen.append(current.active_seconds)
        assert current.status == "succeeded", current.stop_message
        assert seen == sorted(seen)  # it only grows
        # plus the new work: a new 1.5 s attempt after a kill; after a warm shutdown only the short
        # verify, review and checkpoint steps remain
        assert current.active_seconds >= kept + 1.5 if how == "kill" else current.active_seconds > kept
    finally:
        first.kill()
        if second is not None:
            second.stop()


def test_a_worker_in_warm_shutdown_takes_no_new_step(route, make_pipeline, repo, tmp_path):
    """A worker told to stop (SIGTERM) while a step runs finishes that step only: a run started
    during its shutdown is not claimed by it (the filesystem transport still hands it messages: they
    go back to the queue), and the next worker runs both to their end, each step once."""
    queue = f"shutdown-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    route(queue)
    first = Solo(tmp_path, queue, concurrency=2).start()
    second = None
    try:
        slow = {"stages": {"answer": {"implement": [{**ANSWER_STEP, "sleep": 4}]}}}
        running = operations.create_run(make_pipeline(stages=QUICK, scenario=slow), str(repo), "main")
        operations.request_start(running, requested_by="test", source="test")
        wait_until(lambda: Attempt.objects.filter(run=running, status="running").exclude(pid=None).exists(),
                   timeout=30, what="the first run's attempt")
        os.kill(first.proc.pid, signal.SIGTERM)
        wait_until(lambda: "Warm shutdown" in first.text(), timeout=10, what="the warm shutdown")
        later = operations.create_run(make_pipeline(stages=QUICK, scenario={}), str(repo), "main")
        operations.request_start(later, requested_by="test", source="test")
        first.proc.wait(timeout=60)
        later.refresh_from_db()
        assert later.status == "queued" and not Attempt.objects.filter(run=later).exists(), later.status
        assert Attempt.objects.filter(run=running).count() == 1  # its step in progress finished
        second = Solo(tmp_path, queue).start()
        for run in (running, later):
            done = wait_for(run.pk, timeout=60)
            assert done.status == "succeeded", done.stop_message
            assert Attempt.objects.filter(run=run, operation="implement").count() == 1
    finally:
        first.kill()
        if second is not None:
            second.stop()
