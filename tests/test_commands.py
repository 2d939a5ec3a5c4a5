"""The management commands: load_pipelines, create_run (see test_create_run), start_run, run_status,
recover and demo. Every command has a test here or in the module named after its operation."""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from engine import operations
from .conftest import database_url
from .redis_server import free_port
from engine.models import Pipeline, Profile, StartRequest


BASE = Path(settings.BASE_DIR)
EXAMPLE = BASE / "pipelines" / "example.yaml"


@pytest.mark.django_db
def test_load_pipelines_creates_then_updates(tmp_path, capsys):
    call_command("load_pipelines", str(EXAMPLE))
    assert "created: pipeline 'textstats-example'" in capsys.readouterr().out
    pipeline = Pipeline.objects.get(name="textstats-example")
    assert set(Profile.objects.filter(pipeline=pipeline).values_list("name", flat=True)) == {
        "claude-code", "codex", "claude-scripted", "scripted"}
    assert pipeline.profiles.get(name="scripted").simulated
    call_command("load_pipelines", str(EXAMPLE))
    assert "unchanged" in capsys.readouterr().out
    changed = tmp_path / "example.yaml"
    changed.write_text(EXAMPLE.read_text().replace("Build textstats.core.word_count", "Build word_count"))
    shutil.copytree(BASE / "pipelines" / "scenarios", tmp_path / "scenarios")
    call_command("load_pipelines", str(changed))
    assert "updated" in capsys.readouterr().out
    pipeline.refresh_from_db()
    assert pipeline.version == 2 and pipeline.description.startswith("Build word_count")


@pytest.mark.django_db
def test_load_pipelines_refuses_a_bad_file_whole(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("name: good\nstages:\n  - key: a\n    requirement: r\n    scope: ['**']\n    gates: ['true']\n"
                    "roles: {implementer: s, reviewer: s, documenter: s}\n"
                    "profiles:\n  s: {adapter: scripted, scenario: {default: [{print: hi}]}}\n")
    malformed = tmp_path / "bad.yaml"
    malformed.write_text("name: bad\nstages: [\n  - key: a\n")
    with pytest.raises(CommandError) as info:
        call_command("load_pipelines", str(good), str(malformed))
    message = str(info.value)
    assert "nothing was loaded" in message and str(malformed) in message and "(yaml)" in message
    assert "line" in message
    assert Pipeline.objects.count() == 0
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(good.read_text().replace("adapter: scripted", "adapter: scriptd"))
    with pytest.raises(CommandError) as info:
        call_command("load_pipelines", str(wrong))
    assert f"{wrong}: profiles.s.adapter:" in str(info.value)
    assert Pipeline.objects.count() == 0
    call_command("load_pipelines", str(good))
    assert Pipeline.objects.count() == 1


@pytest.mark.django_db
def test_run_status_says_a_pending_run_needs_start(make_pipeline, repo, capsys):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    call_command("run_status", str(run.pk))
    out = capsys.readouterr().out
    assert "pending" in out and f"needs Start: .venv/bin/python manage.py start_run {run.pk}" in out
    assert "[SIMULATED]" in out
    call_command("run_status", str(run.pk), json=True)
    data = json.loads(capsys.readouterr().out)
    assert data["waiting_for"] == "start"
    with pytest.raises(CommandError) as info:
        call_command("run_status", "999999")
    assert "unknown_run" in str(info.value)


#: An attempt's records of its tool calls that did not succeed, as the adapters leave them (the last
#: one written before outcomes existed: it still counts, as what it meant then).
TOOL_CALLS = [
    {"tool": "exec_command", "command": "python -m pytest", "exit_code": 127, "sandbox_denied": False,
     "message": "bash: python: command not found", "outcome": "command_not_found"},
    {"tool": "exec_command", "command": "false", "exit_code": 1, "message": "", "sandbox_denied": False,
     "outcome": "failed"},
    {"tool": "Bash", "message": "Exit code 1\nF", "exit_code": 1, "outcome": "failed"},
    {"tool": "exec_command", "command": "touch /etc/x", "exit_code": 1, "sandbox_denied": True,
     "message": "touch: cannot touch '/etc/x': Read-only file system", "outcome": "refused"},
    {"tool": "Write", "message": "written before outcomes existed"}]


@pytest.mark.django_db
def test_run_status_says_what_happened_to_each_tool_call(make_pipeline, repo, capsys):
    from .support.pages import live_attempt

    run = operations.create_run(make_pipeline(), str(repo), "main")
    live_attempt(run, "done\n", status="succeeded", exit_code=0, refusals=TOOL_CALLS)
    live_attempt(run, "done\n", status="succeeded", exit_code=0, refusals=[])
    call_command("run_status", str(run.pk))
    out = capsys.readouterr().out
    first, second = [line for line in out.splitlines() if line.strip().startswith("attempt ")]
    assert first.endswith(", tool calls: 1 command not found, 2 failed, 1 refused, 1 tool call refused or failed")
    assert "tool call" not in second  # an attempt whose calls all succeeded says nothing of them
    assert "tool call(s) refused" not in out
    call_command("run_status", str(run.pk), json=True)
    attempts = json.loads(capsys.readouterr().out)["stages"][0]["attempts"]
    assert attempts[0]["tool_outcomes"] == {"command_not_found": 1, "failed": 2, "refused": 1, "refused_or_failed": 1}
    assert attempts[0]["refusals"] == TOOL_CALLS  # the records themselves, unchanged
    assert attempts[1]["tool_outcomes"] == {"command_not_found": 0, "failed": 0, "refused": 0, "refused_or_failed": 0}


@pytest.mark.django_db(transaction=True)
def test_start_run_queues_and_run_status_says_it_waits_for_a_worker(make_pipeline, repo, capsys, monkeypatch):
    from engine import runner

    sent = []
    monkeypatch.setattr(runner, "enqueue", lambda run_id, token: sent.append((run_id, token)))
    run = operations.create_run(make_pipeline(), str(repo), "main")
    call_command("start_run", str(run.pk))
    out = capsys.readouterr().out
    assert "start request recorded" in out and "[simulated]" in out
    assert sent == [(run.pk, None)]
    call_command("run_status", str(run.pk))
    said = capsys.readouterr().out
    # why no worker claims it when that is known (none alive here, unless the suite's own workers beat),
    # else that it waits for one
    assert "queued, and not claimed: No worker is alive" in said or "queued: waiting for a worker" in said, said
    with pytest.raises(CommandError) as info:
        call_command("start_run", str(run.pk))
    assert "already_started [run]" in str(info.value)
    assert sent == [(run.pk, None)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_status_follow_prints_progress_until_the_run_stops(workers, make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    env = workers.env()
    result = subprocess.run([sys.executable, "manage.py", "run_status", str(run.pk), "--follow", "--timeout", "120"],
                            cwd=BASE, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"following run {run.pk}") and "SIMULATED" in lines[0]
    text = result.stdout
    for kind in ("attempt_intent", "workspace", "check_passed", "checkpoint", "succeeded"):
        assert kind in text
    assert lines[-1] == f"run {run.pk} is succeeded"


@pytest.mark.django_db(transaction=True)
def test_recover_command_refuses_without_a_pending_decision(make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    with pytest.raises(CommandError) as info:
        call_command("recover", str(run.pk), "--decision", "1", "--note", "x", "--action", "retry")
    assert "not_waiting_review" in str(info.value)
    with pytest.raises(CommandError) as info:
        call_command("recover", str(run.pk), "--decision", "1", "--note", " ", "--action", "retry")
    assert "note_required [note]" in str(info.value)


@pytest.mark.slow
def test_make_web_serves_the_control_panel_on_cp_web_address(tmp_path):
    """README's settings table: the web server listens on CP_WEB_ADDRESS, `make web` too."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "MAKEFLAGS")}
    env.update({"CP_VAR_DIR": str(tmp_path / "var"), "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
                "CP_WEB_ADDRESS": f"127.0.0.1:{port}"})
    web = subprocess.Popen(["make", "--no-print-directory", "web"], cwd=BASE, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, answer = time.monotonic() + 120, None
        while time.monotonic() < deadline and web.poll() is None and answer is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=5) as response:
                    answer = (response.status, response.read().decode())
            except OSError:
                time.sleep(0.5)
        assert answer is not None, f"nothing answered on port {port}: " + (web.stdout.read() if web.poll() else "")
        assert answer[0] == 200 and "Control Panel" in answer[1]
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)


@pytest.mark.slow
def test_make_demo_runs_the_main_job(tmp_path):
    """The README's first command, on its own var directory: a real worker process, two stages."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "ANTHROPIC_API_KEY", "CP_QUEUE")}
    env.update({"CP_VAR_DIR": str(tmp_path / "var"), "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
                "HOME": str(tmp_path / "home")})
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=BASE, env=env, check=True, timeout=120)
    result = subprocess.run([sys.executable, "manage.py", "demo"], cwd=BASE, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "SIMULATED (scripted model endpoint)" in out and "REAL claude CLI" in out
    assert "Run 1: succeeded" in out
    assert "original checkout" in out and "unchanged" in out
    assert "http://127.0.0.1:8000/admin/engine/run/1/detail/" in out
    # each command under "Where to look:", typed as printed into a new shell in the project's folder (no virtual
    # environment active, the machine's PATH; the same CP_VAR_DIR as the demo, as the hint says)
    where = out.split("Where to look:", 1)[1].splitlines()
    status = re.split(r"\s{2,}\(", where[1].strip())[0]
    log = where[2].strip()
    superuser = where[3].split("Control Panel: ", 1)[1].split(",", 1)[0]
    assert (status, superuser) == (".venv/bin/python manage.py run_status 1", ".venv/bin/python manage.py createsuperuser")
    shell_env = {"PATH": "/usr/bin:/bin", "HOME": env["HOME"], "CP_VAR_DIR": env["CP_VAR_DIR"]}
    typed = subprocess.run(["bash", "-c", status], cwd=BASE, env=shell_env, capture_output=True, text=True, timeout=120)
    assert typed.returncode == 0 and typed.stdout.startswith("run 1 of textstats-example [SIMULATED]: succeeded"), (
        typed.stdout + typed.stderr)
    typed = subprocess.run(["bash", "-c", log], cwd=BASE, env=shell_env, capture_output=True, text=True, timeout=60)
    assert typed.returncode == 0 and len(typed.stdout.splitlines()) >= 3, typed.stdout + typed.stderr
    said = typed_at_a_terminal(superuser, shell_env, [("Username", "demo-admin"), ("Email", ""),
                                                      ("Password:", "a-long-demo-password-1"),
                                                      ("Password (again)", "a-long-demo-password-1")])
    assert "Superuser created successfully." in said, said


def typed_at_a_terminal(command: str, env: dict, answers: list[tuple[str, str]], timeout: float = 120) -> str:
    """Run ``command`` in ``bash -c`` on a pseudo-terminal in the project's folder, as a person at a terminal does:
    each ``(prompt, answer)`` is typed once the prompt was printed. Returns everything it printed."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        os.chdir(BASE)
        os.execve("/bin/bash", ["bash", "-c", command], env)
    said, pending, deadline = b"", list(answers), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break  # the command ended and closed the terminal
                if not chunk:
                    break
                said += chunk
            if pending and pending[0][0].encode() in said.rsplit(b"\n", 1)[-1]:
                os.write(fd, pending.pop(0)[1].encode() + b"\r")
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    return said.decode("utf-8", errors="replace")


@pytest.mark.django_db(transaction=True)
def test_a_printed_command_works_as_printed_in_a_new_shell(make_pipeline, repo, capsys):
    """run_status's "needs Start: ..." is typed as printed into a new shell in the project's folder (no virtual
    environment active, the machine's PATH): it starts the run, and start_run's own hint is the same kind."""
    run = operations.create_run(make_pipeline(), str(repo), "main")
    call_command("run_status", str(run.pk))
    hint = capsys.readouterr().out.split("needs Start: ", 1)[1].splitlines()[0]
    assert hint == f".venv/bin/python manage.py start_run {run.pk}"
    # the operator's settings, as their shell profile would give them; the message goes to a queue no worker reads
    shell_env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "DATABASE_URL": database_url(),
                 "DJANGO_SETTINGS_MODULE": "controlpanel.test_settings", "CP_VAR_DIR": str(settings.VAR_DIR),
                 "CP_QUEUE": f"{settings.CELERY_TASK_DEFAULT_QUEUE}-hint-{run.pk}"}
    if os.environ.get("CELERY_BROKER_URL"):
        shell_env["CELERY_BROKER_URL"] = os.environ["CELERY_BROKER_URL"]
    # the machine's own interpreter, which a hint saying "python3 manage.py" would reach, has no Django there
    bare = subprocess.run(["bash", "-c", hint.replace(".venv/bin/python", "python3", 1)], cwd=BASE, env=shell_env,
                          capture_output=True, text=True, timeout=120)
    assert bare.returncode != 0 and "No module named 'django'" in bare.stderr, (bare.returncode, bare.stderr[-500:])
    typed = subprocess.run(["bash", "-c", hint], cwd=BASE, env=shell_env, capture_output=True, text=True, timeout=120)
    assert typed.returncode == 0, typed.stderr
    assert f"run {run.pk} [simulated]: start request recorded" in typed.stdout
    assert f"(.venv/bin/python manage.py run_status {run.pk} --follow)" in typed.stdout
    assert StartRequest.objects.filter(run=run, source="cli").exists()


@pytest.mark.django_db(transaction=True)
def test_run_status_follow_says_what_a_pending_run_waits_for(make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    out, err = io.StringIO(), io.StringIO()
    call_command("run_status", str(run.pk), follow=True, json=True, timeout=0.5, interval=0.1, stdout=out,
                 stderr=err)
    assert json.loads(out.getvalue())["status"] == "pending"  # stdout is one JSON document
    progress = err.getvalue()
    assert f"needs Start: .venv/bin/python manage.py start_run {run.pk}" in progress
    assert progress.count("needs Start") == 1 and "still pending after" in progress


def test_every_command_the_readme_and_the_docs_print_exists_as_printed():
    """Issue 22: each ``manage.py NAME`` of README.md and docs/ is a command of this project, reached as printed
    (``.venv/bin/python manage.py …`` in a new shell: no virtual environment active, the machine's PATH), and each
    ``make NAME`` is a target of the Makefile."""
    texts = [(BASE / "README.md").read_text()] + [p.read_text() for p in sorted((BASE / "docs").glob("*.md"))]
    named = {name for text in texts for name in re.findall(r"manage\.py ([a-z_]+)(?![.\w])", text)}
    shell_env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    listed = subprocess.run(["bash", "-c", ".venv/bin/python manage.py help --commands"], cwd=BASE, env=shell_env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert named and named <= set(listed.stdout.split()), sorted(named - set(listed.stdout.split()))
    targets = {name for text in texts for name in re.findall(r"(?:^|`|\n)make ([a-z][a-z-]*)", text)}
    assert {"demo", "test", "web", "worker", "beat"} <= targets
    for target in sorted(targets):
        known = subprocess.run(["make", "-n", target], cwd=BASE, env=shell_env, capture_output=True, text=True,
                               timeout=60)
        assert known.returncode == 0, (target, known.stderr)
