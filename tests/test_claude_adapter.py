"""The Claude Code adapter with the real ``claude`` binary against the scripted model endpoint."""
import json
import subprocess
import os
import time
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from engine import operations
from engine.agents import AgentRequest
from engine.agents.claude.adapter import ClaudeCodeAdapter, find_executable, parse_stream, usage_of
from engine.models import Attempt

from .conftest import ANSWER_STEP, git
from .support.claude import REVIEW_TURNS, WRITE_ANSWER, claude_profile, stub_claude
from .support.runs import drive

# the stand-in CLIs these tests write in tmp_path are executables the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("stand_ins_listed")

CLAUDE = find_executable("claude")
needs_claude = pytest.mark.skipif(CLAUDE is None, reason="run `make agents` to install the pinned claude CLI")


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stage_run_by_the_real_cli_against_the_scripted_endpoint(claude_pipeline, repo, sent):
    run = operations.create_run(claude_pipeline(), str(repo), "main")
    assert run.simulated and run.simulated_reason == "scripted model endpoint"
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert run.status == "succeeded", (run.stop_message, (Path(settings.VAR_DIR) / attempt.log_path).read_text())
    assert attempt.adapter == "claude-code" and attempt.simulated
    assert attempt.cli_version.startswith("2.1.197")
    assert attempt.usage["input_tokens"] == 2500 and attempt.usage["output_tokens"] == 345
    assert attempt.usage["cached_tokens"] == 5000 and attempt.usage["cache_creation_tokens"] == 100
    # usage is what the engine's model gateway read on the wire; the scripted model has no price, so the cost
    # is unknown, while the CLI's own claim of a cost is kept as a claim beside it
    assert attempt.usage["cost_usd"] is None and attempt.gateway["simulated"]
    assert attempt.gateway["cli_usage"]["cost_usd"] > 0 and attempt.gateway["calls"] >= 3
    assert attempt.gateway["usage"] == attempt.usage
    assert attempt.session_id and attempt.final_message == "Done: answer() returns 42."
    assert "return 42" in git(repo, "show", f"{run.stages.get().checkpoint_commit}:app/core.py")
    assert "SIMULATED" in (Path(settings.VAR_DIR) / attempt.log_path).read_text()
    # the review: a fresh read-only session of the real CLI; its writes are refused and recorded,
    # nothing is created, and the run proceeds on its verdict
    review = Attempt.objects.get(run=run, operation="review")
    assert review.role == "reviewer" and review.status == "succeeded" and review.session_id != attempt.session_id
    assert {r["tool"] for r in review.refusals} == {"Write", "Edit", "Bash"}, review.refusals
    assert {r["outcome"] for r in review.refusals} == {"refused"}, review.refusals
    assert review.verdict == {"verdict": "pass", "summary": "answer() returns 42", "findings": []}
    assert not (Path(run.worktree) / "review-was-here.txt").exists()
    assert not (Path(run.worktree) / "made-by-reviewer.txt").exists()
    assert "return 42" in (Path(run.worktree) / "app" / "core.py").read_text()
    # the conversations, normalized from the real CLI's stream-json (engine/text/transcript.py)
    said = conversation(attempt)
    assert ("tool_call", "Reads app/core.py") in said and ("tool_call", "Writes app/core.py (5 lines)") in said
    assert ("text", "Done: answer() returns 42.") in said and said[0][0] == "start"
    assert said[-1][0] == "result" and said[-1][1].startswith("Finished: 3 turns; 2,500 tokens in, 345 out; cost $")
    refused = [text for kind, text in conversation(review) if kind == "refusal"]
    assert len(refused) == 3 and all("was refused" in text for text in refused), refused


def conversation(attempt) -> list[tuple[str, str]]:
    """``(kind, sentence)`` of every entry of an attempt's transcript (beside its raw log)."""
    path = Path(settings.VAR_DIR) / attempt.raw_path
    entries = [json.loads(line) for line in (path.parent / "transcript.jsonl").read_text().splitlines()]
    return [(entry["kind"], entry["text"]) for entry in entries]


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_401_is_auth_failed_within_seconds(claude_pipeline, repo, sent):
    run = operations.create_run(claude_pipeline({"turns": [{"status": 401, "message": "fake 401"}]}), str(repo),
                                "main")
    operations.request_start(run, requested_by="t", source="test")
    started = time.monotonic()
    run = drive(run.pk, sent)
    assert time.monotonic() - started < 30
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert attempt.failure_kind == "auth_failed" and run.stop_reason == "auth_failed"
    assert attempt.exit_code == 1


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_hanging_endpoint_is_a_timeout_with_nothing_left(claude_pipeline, repo, sent):
    run = operations.create_run(claude_pipeline({"turns": [{"hang": True}]}, deadline=4),
                                str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    started = time.monotonic()
    run = drive(run.pk, sent)
    assert time.monotonic() - started < 4 + 5 + 10
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert attempt.status == "timeout" and attempt.failure_kind == "timeout" and run.stop_reason == "timeout"
    left = [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("CP_PROCESS_MARKER")
            == attempt.marker]
    assert left == []


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_a_missing_binary_is_refused_at_creation_and_missing_executable_at_launch(claude_pipeline, repo, sent,
                                                                                  tmp_path):
    with pytest.raises(operations.OperationError) as info:
        operations.create_run(claude_pipeline(executable=str(tmp_path / "no-such-claude")), str(repo), "main")
    assert info.value.code == "agent_unavailable" and "implementer (profile 'claude')" in info.value.message
    stub = stub_claude(tmp_path / "claude", "exit 0")
    run = operations.create_run(claude_pipeline(executable=str(stub)), str(repo), "main")
    stub.unlink()  # gone between creation and launch
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert attempt.failure_kind == "missing_executable" and run.stop_reason == "missing_executable"
    assert attempt.usage["input_tokens"] is None


@pytest.mark.django_db
def test_a_cli_without_the_boundary_flags_is_refused_naming_role_profile_and_boundary(claude_pipeline, repo,
                                                                                      tmp_path):
    weak = tmp_path / "claude"
    weak.write_text("#!/bin/sh\ncase \"$1\" in --version) echo '1.0.0 (Claude Code)';; --help) echo '--print';; "
                    "esac\n")
    weak.chmod(0o755)
    with pytest.raises(operations.OperationError) as info:
        operations.create_run(claude_pipeline(executable=str(weak)), str(repo), "main")
    message = info.value.message
    assert "reviewer (profile 'claude')" in message and "read-only" in message
    assert "implementer (profile 'claude')" in message and "--permission-mode" in message


@pytest.mark.pipeline
@pytest.mark.django_db(transaction=True)
def test_c11_output_cut_mid_json_is_malformed_with_unknown_usage(claude_pipeline, repo, sent, tmp_path):
    big = json.dumps({"type": "result", "is_error": False, "result": "x" * 200_000,
                      "usage": {"input_tokens": 5, "output_tokens": 6}, "total_cost_usd": 0.1})
    (tmp_path / "big.json").write_text(big)
    stub = stub_claude(tmp_path / "claude", f"head -c 65536 {tmp_path / 'big.json'}; exit 0")
    run = operations.create_run(claude_pipeline(executable=str(stub)), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert attempt.exit_code == 0
    assert attempt.failure_kind == "malformed_result" and run.stop_reason == "malformed_result"
    assert all(value is None for value in attempt.usage.values())
    assert attempt.output_bytes == 65536 and not attempt.final_message
    raw = (Path(settings.VAR_DIR) / attempt.raw_path).read_bytes()
    assert raw == big.encode()[:65536]  # the raw bytes are kept and viewable


def test_c29_usage_paths_and_final_message_fallback(tmp_path):
    lines = [
        {"type": "system", "subtype": "init", "session_id": "s-1", "claude_code_version": "2.1.197"},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "Done: fixed 2 files"}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "", "session_id": "s-1",
         "usage": {"input_tokens": 1200, "output_tokens": 345, "cache_read_input_tokens": 5000,
                   "cache_creation_input_tokens": 100}, "total_cost_usd": 0.0421},
    ]
    raw = tmp_path / "out.raw"
    raw.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    parsed = parse_stream(str(raw))
    assert usage_of(parsed["result"]) == {"input_tokens": 1200, "output_tokens": 345, "cached_tokens": 5000,
                                          "cache_creation_tokens": 100, "reasoning_tokens": None, "cost_usd": 0.0421}
    assert (parsed["result"]["result"] or parsed["last_text"]) == "Done: fixed 2 files"
    del lines[2]["usage"]
    raw.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert all(value is None for value in usage_of(parse_stream(str(raw))["result"]).values())


@needs_claude
@pytest.mark.slow
def test_c28_a_permissive_worker_home_does_not_loosen_the_reviewer(tmp_path, monkeypatch):
    """The worker's own ~/.claude/settings.json allows everything; the reviewer still writes nothing."""
    worker_home = tmp_path / "worker-home"
    (worker_home / ".claude").mkdir(parents=True)
    (worker_home / ".claude" / "settings.json").write_text(json.dumps(
        {"permissions": {"allow": ["Write", "Edit", "Bash"], "defaultMode": "bypassPermissions"}}))
    monkeypatch.setenv("HOME", str(worker_home))
    work = tmp_path / "work"
    work.mkdir()
    (work / "important.txt").write_text("keep me\n")
    scenario = {"turns": [
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/new.txt", "content": "x"}},
                   {"tool": "Edit", "input": {"file_path": "{cwd}/important.txt", "old_string": "keep",
                                              "new_string": "lost"}},
                   {"tool": "Bash", "input": {"command": "rm important.txt; touch made.txt"}}]},
        {"text": '{"verdict": "pass", "findings": []}'}]}
    home = tmp_path / "attempt-home"
    request = AgentRequest(
        role="reviewer", operation="review", prompt="review", workspace=str(work),
        profile=claude_profile({"default": scenario}), deadline_seconds=60, log_path=str(tmp_path / "out.log"),
        raw_path=str(tmp_path / "out.raw"), env=dict(os.environ), stage_key="s", attempt_number=1,
        control_dir=str(tmp_path), prompt_path=str(tmp_path / "prompt.md"), home_dir=str(home))
    (tmp_path / "prompt.md").write_text("Review the change.\n")
    result = ClaudeCodeAdapter().run(request)
    assert result.exit_code == 0, (tmp_path / "out.log").read_text()[-2000:]
    assert sorted(p.name for p in work.iterdir()) == ["important.txt"]
    assert (work / "important.txt").read_text() == "keep me\n"
    assert str(home) != str(worker_home) and (home / ".claude" / "settings.json").exists()
    assert result.final_message == '{"verdict": "pass", "findings": []}'
    refused = {r["tool"] for r in result.extra["refusals"]}
    assert refused == {"Write", "Edit", "Bash"}, result.extra["refusals"]


@needs_claude
@pytest.mark.slow
def test_claude_says_what_happened_to_each_command(tmp_path):
    commands = ("cp-missing-program -m pytest", "false", "echo hi > /etc/cp-outcome-probe")
    scenario = {"turns": [*({"tools": [{"tool": "Bash", "input": {"command": command}}]} for command in commands),
                          {"text": "done"}]}
    work = tmp_path / "work"
    work.mkdir()
    request = AgentRequest(
        role="implementer", operation="implement", prompt="do it", workspace=str(work),
        profile=claude_profile({"default": scenario}), deadline_seconds=60, log_path=str(tmp_path / "out.log"),
        raw_path=str(tmp_path / "out.raw"), env=dict(os.environ), stage_key="s", attempt_number=1,
        control_dir=str(tmp_path), prompt_path=str(tmp_path / "prompt.md"), home_dir=str(tmp_path / "attempt-home"))
    (tmp_path / "prompt.md").write_text("Do it.\n")
    result = ClaudeCodeAdapter().run(request)
    assert result.exit_code == 0, (tmp_path / "out.log").read_text()[-2000:]
    assert [(r["tool"], r["exit_code"], r["outcome"]) for r in result.extra["refusals"]] == [
        ("Bash", 127, "command_not_found"), ("Bash", 1, "failed"), ("Bash", 1, "refused")], result.extra["refusals"]
    entries = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    said = [(e["kind"], e["text"]) for e in entries if e["kind"] in ("tool_result", "refusal")]
    assert said == [("tool_result", "command not found: cp-missing-program (exit status 127)"),
                    ("tool_result", "failed with exit status 1"),
                    ("refusal", "Bash was refused (exit status 1): /bin/bash: line 1: /etc/cp-outcome-probe: "
                                "Read-only file system")], said


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_implementer_writing_outside_its_scope_is_a_scope_violation(claude_pipeline, repo, sent):
    """The CLI's own rule (acceptEdits: anywhere in the working directory) is wider than the stage's
    scope (app/**): the manifest check after the attempt is what stops it."""
    outside = {"turns": [
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/NOTES.md", "content": "outside the scope\n"}}]},
        {"text": "Wrote the notes."}]}
    run = operations.create_run(claude_pipeline(outside), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "waiting_review" and run.stop_reason == "scope_violation"
    assert run.stop_evidence["outside"] == ["NOTES.md"]
    attempt = Attempt.objects.get(run=run, operation="implement")
    assert "outside the scope" in (Path(settings.VAR_DIR) / attempt.patch_path).read_text()
    assert (Path(run.worktree) / "NOTES.md").exists()  # the worktree is kept as it was left


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_implementers_shell_cannot_write_outside_the_worktree(claude_pipeline, repo, sent):
    """The operating-system boundary: even as root, the agent's Bash cannot touch the control records."""
    target = Path(settings.VAR_DIR) / "runs" / "written-by-agent.txt"
    turns = {"turns": [
        {"tools": [{"tool": "Bash", "input": {"command": f"echo x > {target}; echo rc=$?",
                                               "description": "try the control records"}}]},
        {"tools": [{"tool": "Bash", "input": {"command": f"echo y >> {repo}/app/core.py; "
                                                          f"git -C {repo} commit -qam 'agent on main'; echo rc=$?",
                                               "description": "try the original checkout"}}]},
        {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}]},
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app/core.py",
                                                "content": ANSWER_STEP["write"]["app/core.py"]}}]},
        {"text": "Done."}]}
    head = git(repo, "rev-parse", "main")
    run = operations.create_run(claude_pipeline(turns), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    attempt = Attempt.objects.get(run=run, operation="implement")
    log = (Path(settings.VAR_DIR) / attempt.log_path).read_text()
    assert not target.exists()
    assert git(repo, "rev-parse", "main") == head and git(repo, "status", "--porcelain") == ""
    assert "Read-only file system" in log
    assert run.status == "succeeded", run.stop_message  # the worktree itself stayed writable


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_agent_sees_only_its_own_processes_and_cannot_relink_git(claude_pipeline, repo, sent):
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        turns = {"turns": [
            {"tools": [{"tool": "Bash", "input": {"command": f"kill -9 {bystander.pid}; echo kill-rc=$?",
                                                   "description": "kill a process of the host"}}]},
            {"tools": [{"tool": "Bash", "input": {"command": "echo 'gitdir: /tmp/elsewhere' > .git; echo rc=$?",
                                                   "description": "relink the worktree"}}]},
            {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}]},
            {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app/core.py",
                                                    "content": ANSWER_STEP["write"]["app/core.py"]}}]},
            {"text": "Done."}]}
        run = operations.create_run(claude_pipeline(turns), str(repo), "main")
        operations.request_start(run, requested_by="t", source="test")
        run = drive(run.pk, sent)
        assert bystander.poll() is None  # still alive: the agent has its own PID namespace
        assert (Path(run.worktree) / ".git").read_text().startswith("gitdir: ")
        assert "/tmp/elsewhere" not in (Path(run.worktree) / ".git").read_text()
        assert run.status == "succeeded", run.stop_message
        # the CLI's own transcripts (unredacted) are not kept; the redacted logs are the evidence
        assert not (Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}" / "home" / "attempt-001").exists()
    finally:
        bystander.kill()
        bystander.wait()


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_real_cli_repairs_a_failed_gate_then_the_review_passes(make_pipeline, repo, sent):
    """Verification with the real claude: its first implementation fails the gate; a fresh
    repair session gets the failure evidence and fixes it; the checks run again; the reviewer passes."""
    wrong = {"turns": [
        {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}]},
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app/core.py",
                                                "content": '"""Core."""\n\n\ndef answer():\n    return 41\n'}}]},
        {"text": "Done (wrongly)."}]}
    fix = {"turns": [
        {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}]},
        {"tools": [{"tool": "Edit", "input": {"file_path": "{cwd}/app/core.py", "old_string": "return 41",
                                               "new_string": "return 42"}}]},
        {"text": "Repaired: answer() returns 42."}]}
    endpoint = {"stages": {"answer": {"implement": wrong, "repair": fix, "review": REVIEW_TURNS}}}
    pipeline = make_pipeline(
        name="claude-repair", roles={"implementer": "claude", "reviewer": "claude", "documenter": "claude"},
        profiles={"claude": claude_profile(endpoint)}, deadlines={"implement": 60, "repair": 60, "gate": 120})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent, limit=20)
    assert run.status == "succeeded", run.stop_message
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    assert [a.operation for a in attempts] == ["implement", "repair", "review", "document"]
    assert all(a.adapter == "claude-code" and a.cli_version.startswith("2.1.197") for a in attempts)
    assert len({a.session_id for a in attempts}) == 4  # four fresh sessions
    prompt = (Path(settings.VAR_DIR) / attempts[1].prompt_path).read_text()
    assert "Gate 'unit' failed" in prompt and "assert 41 == 42" in prompt
    assert attempts[1].final_message == "Repaired: answer() returns 42."
    assert "return 42" in git(repo, "show", f"{run.branch}:app/core.py")
    assert run.stages.get().repairs_used == 1


def documented_by_claude(make_pipeline, repo, sent, document: dict):
    """A one-stage run by the real claude against the scripted endpoint, whose documenter's model
    answers ``document``; the run, driven to its stop."""
    pipeline = make_pipeline(
        name="claude-docs", roles={"implementer": "claude", "reviewer": "claude", "documenter": "claude"},
        profiles={"claude": claude_profile({"stages": {"answer": {
            "implement": WRITE_ANSWER, "review": REVIEW_TURNS, "document": document}}})},
        deadlines={"implement": 60, "gate": 120})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    return drive(run.pk, sent)


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_documentation_the_cli_refused_to_write_is_a_failed_documentation_attempt(make_pipeline, repo, sent):
    """Issue 13: claude's Write refused to overwrite docs/INDEX.md (not read first); the documentation
    attempt still counted as succeeded and the index stayed stale."""
    document = {"turns": [
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/docs/INDEX.md",
                                                "content": "# Index\n- docs/PLAN.md\n- docs/answer.md\n"}}]},
        {"text": "Updated the index."}]}
    run = documented_by_claude(make_pipeline, repo, sent, document)
    attempt = Attempt.objects.get(run=run, operation="document")
    assert (run.status, run.stop_reason) == ("waiting_review", "docs_failed"), run.stop_message
    assert attempt.exit_code == 0 and attempt.failure_kind == "writes_refused", attempt.failure_message
    assert [r["tool"] for r in attempt.refusals] == ["Write"]
    assert "refused 1 of its writes" in run.stop_message and "Write" in run.stop_message
    assert run.stop_evidence["refused"][0]["tool"] == "Write"
    assert "docs/answer.md" not in (Path(run.worktree) / "docs" / "INDEX.md").read_text()
    assert not run.stages.get().checkpoint_commit


def test_a_refused_write_that_a_later_write_of_the_same_file_made_good_is_recovered(tmp_path):
    from engine.agents.claude.adapter import parse_stream
    from engine.steps.document import refused_writes

    def use(call, tool, path):
        return {"type": "assistant", "message": {"content": [
            {"type": "tool_use", "id": call, "name": tool, "input": {"file_path": path}}]}}

    def result(call, error):
        return {"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": call, "is_error": error, "content": "File has not been read yet."
             if error else "ok"}]}}

    raw = tmp_path / "out.raw"
    events = [use("1", "Write", "/w/docs/INDEX.md"), result("1", True), use("2", "Read", "/w/docs/INDEX.md"),
              result("2", False), use("3", "Write", "/w/docs/INDEX.md"), result("3", False),
              use("4", "Edit", "/w/docs/other.md"), result("4", True)]
    raw.write_text("".join(json.dumps(e) + "\n" for e in events))
    refusals = parse_stream(str(raw))["refusals"]
    assert [(r["tool"], r["path"], r.get("recovered", False)) for r in refusals] == [
        ("Write", "/w/docs/INDEX.md", True), ("Edit", "/w/docs/other.md", False)]
    assert [r["path"] for r in refused_writes(refusals)] == ["/w/docs/other.md"]


@needs_claude
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_documenter_that_reads_and_writes_again_after_a_refusal_documents(make_pipeline, repo, sent):
    index = "# Index\n- docs/PLAN.md\n- docs/answer.md\n"
    document = {"turns": [
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/docs/INDEX.md", "content": index}}]},
        {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/docs/INDEX.md"}}]},
        {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/docs/INDEX.md", "content": index}}]},
        {"text": "Updated the index."}]}
    run = documented_by_claude(make_pipeline, repo, sent, document)
    attempt = Attempt.objects.filter(run=run, operation="document").order_by("number").first()
    assert [(r["tool"], r.get("recovered")) for r in attempt.refusals] == [("Write", True)], attempt.refusals
    assert run.status == "succeeded", run.stop_message
    assert "docs/answer.md" in git(repo, "show", f"{run.stages.get().checkpoint_commit}:docs/INDEX.md")


def test_each_failed_tool_call_says_what_happened_to_it(tmp_path):
    """Claude Code 2.1.197's Bash errors (as test_claude_says_what_happened_to_each_command saw them):
    exit 127 is a missing program, a read-only file system the sandbox's refusal, a permission the
    CLI did not grant a refusal, anything else a failure."""
    def use(call, tool, given):
        return {"type": "assistant", "message": {"content": [{"type": "tool_use", "id": call, "name": tool,
                                                              "input": given}]}}

    def result(call, content):
        return {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": call,
                                                         "is_error": True, "content": content}]}}

    raw = tmp_path / "out.raw"
    events = [use("1", "Bash", {"command": "python -m pytest"}),
              result("1", "Exit code 127\n/bin/bash: line 1: python: command not found"),
              use("2", "Bash", {"command": "false"}), result("2", "Exit code 1"),
              use("3", "Bash", {"command": "echo hi > /etc/x"}),
              result("3", [{"type": "text", "text": "Exit code 1\n/bin/bash: line 1: /etc/x: Read-only file system"}]),
              use("4", "Write", {"file_path": "/w/a.py", "content": "x"}),
              result("4", "Claude requested permissions to write to /w/a.py, but you haven't granted it yet.")]
    raw.write_text("".join(json.dumps(e) + "\n" for e in events))
    refusals = parse_stream(str(raw))["refusals"]
    assert [(r["tool"], r["outcome"], r.get("exit_code")) for r in refusals] == [
        ("Bash", "command_not_found", 127), ("Bash", "failed", 1), ("Bash", "refused", 1), ("Write", "refused", None)]
    assert refusals[0]["message"] == "Exit code 127\n/bin/bash: line 1: python: command not found"
