"""Issue 13: a CLI's stdout and stderr are stored apart, and plain text where its JSON output was
expected is kept as the attempt's final message with ``structured: false`` (engine/processes/process.py
``stderr_path``, engine/agents/lines.py ``PlainText``, the claude and codex parsers)."""
import os
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.agents import AgentRequest, get_adapter
from engine.agents.claude.adapter import parse_stream
from engine.agents.codex.adapter import parse_events
from engine.agents.lines import PlainText
from engine.models import Attempt
from engine.processes.process import run_supervised

from .conftest import make_repo
from .support.claude import stub_claude
from .support.runs import drive

# the stand-in CLIs these tests write in tmp_path are executables the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("stand_ins_listed")

KEY = "sk-ant-api03-" + "Q" * 40


def test_stderr_is_kept_apart_and_redacted_and_the_display_log_shows_both(tmp_path):
    script = f"echo out-1; echo err-1 >&2; echo key {KEY} >&2; echo out-2"
    result = run_supervised(["sh", "-c", script], cwd=tmp_path, env={"PATH": os.environ["PATH"]},
                            deadline_seconds=20, log_path=tmp_path / "log", raw_path=tmp_path / "raw",
                            stderr_path=tmp_path / "err")
    assert result.exit_code == 0 and result.error is None
    assert (tmp_path / "raw").read_text() == "out-1\nout-2\n"
    assert (tmp_path / "err").read_text() == "err-1\nkey [REDACTED]\n"
    shown = (tmp_path / "log").read_text()
    assert all(line in shown.splitlines() for line in ("out-1", "out-2", "err-1", "key [REDACTED]"))
    assert result.redactions == 1 and result.output_bytes == len("out-1\nout-2\n") + len(f"err-1\nkey {KEY}\n")


def test_without_a_stderr_path_both_streams_share_the_raw_log(tmp_path):
    run_supervised(["sh", "-c", "echo out; echo err >&2"], cwd=tmp_path, env={"PATH": os.environ["PATH"]},
                   deadline_seconds=20, log_path=tmp_path / "log", raw_path=tmp_path / "raw")
    assert sorted((tmp_path / "raw").read_text().split()) == ["err", "out"]


def test_plain_text_keeps_its_end_within_its_bound():
    kept = PlainText(limit=100)
    for n in range(50):
        kept.add(f"line {n}\n".encode())
    assert kept.cut and kept.text.endswith("line 49") and len(kept.text) <= 100
    one = PlainText(limit=10)
    one.add(b"x" * 50 + b"END")
    assert one.text == "x" * 7 + "END" and one.cut


def test_the_parsers_tell_plain_text_from_their_json_stream(tmp_path):
    raw, err = tmp_path / "raw", tmp_path / "err"
    raw.write_text("Here is my answer.\nAll tests pass.\n")
    err.write_text("Not logged in · Please run /login\n")
    claude = parse_stream(str(raw), str(err))
    assert claude["structured"] is False and claude["plain_text"] == "Here is my answer.\nAll tests pass."
    assert claude["auth_error"] is True  # read from the stderr capture
    codex = parse_events(str(raw), str(err))
    assert codex["structured"] is False and codex["plain_text"] == "Here is my answer.\nAll tests pass."
    raw.write_text('{"type":"thread.started","thread_id":"t"}\n')
    assert parse_events(str(raw))["structured"] is True and parse_stream(str(raw))["structured"] is True


def _request(tmp_path: Path, adapter: str, executable: str) -> AgentRequest:
    work = tmp_path / "work"
    make_repo(work, {"README.md": "hello\n"})
    control = tmp_path / "control"
    control.mkdir()
    (control / "prompt.md").write_text("Do the task.\n", encoding="utf-8")
    return AgentRequest(
        role="implementer", operation="implement", prompt="Do the task.", workspace=str(work),
        profile={"adapter": adapter, "executable": executable}, deadline_seconds=60,
        log_path=str(control / "out.log"), raw_path=str(control / "out.raw"), env={"PATH": os.environ["PATH"]},
        stage_key="s", attempt_number=1, control_dir=str(control), prompt_path=str(control / "prompt.md"),
        home_dir=str(tmp_path / "home"), marker=f"cp-test-plain-{uuid.uuid4().hex[:12]}",
        stderr_path=str(control / "out.stderr"))


def test_a_codex_that_prints_text_keeps_it_as_its_final_message(tmp_path):
    stub = tmp_path / "codex"
    stub.write_text("#!/bin/sh\necho 'The fix is in app/core.py.'\necho 'warning: no config' >&2\nexit 0\n")
    stub.chmod(0o755)
    request = _request(tmp_path, "codex", str(stub))
    result = get_adapter("codex").run(request)
    assert result.failure_kind == "malformed_result" and "structured: false" in result.failure_message
    assert result.structured is False and result.final_message == "The fix is in app/core.py."
    assert Path(request.raw_path).read_text() == "The fix is in app/core.py.\n"
    assert Path(request.stderr_path).read_text() == "warning: no config\n"


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_a_claude_that_prints_text_is_recorded_structured_false_with_stderr_apart(claude_pipeline, repo, sent,
                                                                                  tmp_path):
    stub = stub_claude(tmp_path / "claude", "echo 'I changed app/core.py.'; echo 'Done.'; "
                       "echo 'deprecation: --verbose' >&2; exit 0")
    run = operations.create_run(claude_pipeline(executable=str(stub)), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert attempt.failure_kind == "malformed_result" and run.stop_reason == "malformed_result"
    assert attempt.structured is False and attempt.final_message == "I changed app/core.py.\nDone."
    var = Path(settings.VAR_DIR)
    assert (var / attempt.raw_path).read_text() == "I changed app/core.py.\nDone.\n"
    assert (var / attempt.stderr_path).read_text() == "deprecation: --verbose\n"
    assert "deprecation: --verbose" in (var / attempt.log_path).read_text()
    record = operations.run_status(run)["stages"][0]["attempts"][0]  # run_status --json, GET /api/runs/ID/
    assert record["structured"] is False and record["final_message"] == "I changed app/core.py.\nDone."
    assert record["stderr"].endswith("output.stderr") and record["raw"].endswith("output.raw")
