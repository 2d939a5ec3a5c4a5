"""Acceptance: what a second stage receives from a real agent CLI, and what a person sees of a stopped run.

1. With the real ``claude`` CLI (against the scripted model endpoint): two stages, the second
   starting from the first's checkpoint and receiving its accepted output (the implementer's
   final message, the files) and the documentation its documenter wrote. Driven step by step in
   this process, and once through a real worker process.
2. With the scripted test adapter: a repair that then succeeds, exhausted repairs, a gate whose
   command does not exist and an invalid review, each read through every surface a person uses:
   ``run_status`` (text and ``--json``), the run's events, the admin page of the run, and the
   evidence file the stop points at. Every one of these runs is labelled simulated.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.urls import reverse

from engine import operations
from engine.agents.claude.adapter import find_executable
from engine.models import Attempt, Check, RunEvent

from .conftest import ANSWER_STEP, git, new_log_text, wait_for
from .support.claude import claude_profile
from .support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

needs_claude = pytest.mark.skipif(find_executable("claude") is None,
                                  reason="run `make agents` to install the pinned claude CLI")


def var(rel: str) -> Path:
    return Path(settings.VAR_DIR) / rel


def operations_of(run) -> list[str]:
    return [a.operation for a in Attempt.objects.filter(run=run).order_by("number")]


# ----------------------------------------------------------------------------- 1. real CLI, two stages

#: What stage one's implementer says at the end: the accepted output stage two must receive.
ANSWER_MESSAGE = "Done: app.core.answer() returns 42 (stage one, real claude CLI)."
#: A sentence only stage one's documenter writes: stage two must receive it.
NOTES_MARK = "answer() returns 42; written by the claude documenter of stage one (mark 7f3a)."
NOTES_TEXT = f"# Notes\n\n{NOTES_MARK}\nVerified by the gate `unit`.\n"
#: The index the documenter writes: it must name every note it changed (engine/context.py unindexed_notes).
INDEX_TEXT = "# Index\n- docs/PLAN.md\n- docs/NOTES.md: what answer() returns\n"
ANSWER_CODE = ANSWER_STEP["write"]["app/core.py"]
EXTRA_CODE = "from app import core\n\n\ndef double():\n    return 2 * core.answer()\n"

PASS_TURNS = {"turns": [
    {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}]},
    {"text": 'Reviewed.\n```json\n{"verdict": "pass", "summary": "meets the requirement", "findings": []}\n```'}]}

TWO_STAGE_ENDPOINT = {"stages": {
    "answer": {
        "implement": {"turns": [
            {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}]},
            {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app/core.py", "content": ANSWER_CODE}}]},
            {"text": ANSWER_MESSAGE}]},
        "review": PASS_TURNS,
        "document": {"turns": [
            {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/docs/INDEX.md"}}]},
            {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/docs/NOTES.md", "content": NOTES_TEXT}},
                       {"tool": "Write", "input": {"file_path": "{cwd}/docs/INDEX.md", "content": INDEX_TEXT}}]},
            {"text": "Documented answer() in docs/NOTES.md and listed it in docs/INDEX.md."}]},
    },
    "double": {
        "implement": {"turns": [
            {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/docs/NOTES.md"}}]},
            {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app/extra.py", "content": EXTRA_CODE}}]},
            {"text": "Done: app.extra.double() returns 84."}]},
        "review": PASS_TURNS,
        "document": {"turns": [{"text": "The documentation is current; nothing to change."}]},
    },
}}

TWO_STAGES = [
    {"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
     "gates": [{"name": "unit", "command": "python -c 'from app import core; assert core.answer() == 42'"}]},
    {"key": "double", "requirement": "Add app.extra.double() returning twice answer().", "scope": ["app/**"],
     "depends_on": ["answer"],
     "gates": [{"name": "double", "command": "python -c 'from app import extra; assert extra.double() == 84'"}]},
]


def two_stage_claude_run(make_pipeline, repo):
    """A created (not started) run of the two-stage pipeline, every role played by the real claude."""
    pipeline = make_pipeline(
        name="claude-two-stages", stages=TWO_STAGES, documentation_paths=["docs/**"],
        roles={"implementer": "claude", "reviewer": "claude", "documenter": "claude"},
        profiles={"claude": claude_profile(TWO_STAGE_ENDPOINT)},
        deadlines={"implement": 90, "review": 90, "document": 90, "gate": 120})
    run = operations.create_run(pipeline, str(repo), "main")
    assert run.simulated and run.simulated_reason == "scripted model endpoint"
    return run


def assert_second_stage_received_the_first(run, repo):
    """The run succeeded and stage two started from, and was told, what stage one accepted."""
    attempts = list(Attempt.objects.filter(run=run).select_related("stage").order_by("stage__order", "number"))
    logs = {(a.stage.key, a.number): var(a.log_path).read_text(errors="replace")[-3000:]
            for a in attempts if a.log_path}
    assert run.status == "succeeded", (run.stop_reason, run.stop_message, logs)
    assert [(a.stage.key, a.operation) for a in attempts] == [
        ("answer", "implement"), ("answer", "review"), ("answer", "document"), ("answer", "review"),
        ("double", "implement"), ("double", "review"), ("double", "document")]
    assert all(a.adapter == "claude-code" and a.cli_version.startswith("2.1.197") for a in attempts)
    assert len({a.session_id for a in attempts}) == len(attempts)  # a fresh session each time

    first, second = run.stages.get(key="answer"), run.stages.get(key="double")
    assert first.checkpoint_commit and second.checkpoint_commit
    assert second.base_commit == first.checkpoint_commit  # stage two's worktree starts from stage one's checkpoint
    # stage one's checkpoint holds the implementer's code and the documenter's note
    assert git(repo, "show", f"{first.checkpoint_commit}:app/core.py") == ANSWER_CODE
    assert git(repo, "show", f"{first.checkpoint_commit}:docs/NOTES.md") == NOTES_TEXT
    implement = next(a for a in attempts if a.stage.key == "answer" and a.operation == "implement")
    assert implement.final_message == ANSWER_MESSAGE

    second_implement = next(a for a in attempts if a.stage.key == "double" and a.operation == "implement")
    assert second_implement.start_commit == first.checkpoint_commit
    prompt = var(second_implement.prompt_path).read_text()
    section = prompt.split("## Accepted output of the stages this one depends on", 1)
    assert len(section) == 2, prompt
    received = section[1]
    assert f"### Stage 'answer' (checkpoint {first.checkpoint_commit})" in received
    assert "app/core.py" in received and "docs/NOTES.md" in received  # the accepted files
    assert f"Agent's final message:\n{ANSWER_MESSAGE}" in received  # the implementer's, not a reviewer's
    assert "meets the requirement" not in received
    assert "Documentation docs/NOTES.md (as checkpointed):" in received and NOTES_MARK in received
    # the second implementer's Read of the note (its first turn) saw the same text in its worktree
    assert git(repo, "show", f"{second.checkpoint_commit}:docs/NOTES.md") == NOTES_TEXT
    assert "return 2 * core.answer()" in git(repo, "show", f"{run.branch}:app/extra.py")


@needs_claude
def test_real_claude_second_stage_receives_accepted_output_and_docs_step_driven(make_pipeline, repo, sent):
    run = two_stage_claude_run(make_pipeline, repo)
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent, limit=60)
    assert_second_stage_received_the_first(run, repo)


@needs_claude
@pytest.mark.slow
def test_real_claude_second_stage_receives_accepted_output_and_docs_through_a_worker(make_pipeline, repo,
                                                                                     workers):
    run = two_stage_claude_run(make_pipeline, repo)
    operations.request_start(run, requested_by="t", source="test")
    try:
        run = wait_for(run.pk, timeout=600)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- worker log ---\n{new_log_text(workers)[-6000:]}") from None
    assert_second_stage_received_the_first(run, repo)  # no `sent` here: only a worker could take the steps


# ----------------------------------------------------------------------------- 2. what a person sees

WRONG = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 41\n'}}
WRONG_40 = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 40\n'}}
WRONG_39 = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 39\n'}}
PASS = {"verdict": {"verdict": "pass", "findings": []}, "final_message": "pass"}
QUICK_GATE = "python -c 'from app import core; assert core.answer() == 42, core.answer()'"
MISSING_COMMAND = "no-such-gate-command-4711 --all"

#: scenario id -> the gate command, the stage's scripted operations, and what a person must be able to read:
#: status, stop reason, the attempts' operations, sentences (in the stop message and the events), the kind
#: of row the stop's evidence names, and a line that its log file holds.
SCENARIOS = {
    "repair-then-success": dict(
        gate=QUICK_GATE, ops={"implement": [WRONG], "repair": [ANSWER_STEP], "review": [PASS]},
        status="succeeded", reason=None, operations=["implement", "repair", "review", "document"],
        sentences=["Gate 'unit' failed", "Repair 1 of 2 starts a fresh session", "the run succeeded"],
        evidence="check", log_text="AssertionError: 41"),
    "repair-exhausted": dict(
        gate=QUICK_GATE, ops={"implement": [WRONG], "repair": [WRONG_40, WRONG_39]},
        status="waiting_review", reason="repair_exhausted", operations=["implement", "repair", "repair"],
        sentences=["Gate 'unit' failed", "repair allowance (2) is used up"],
        evidence="check", log_text="AssertionError: 39"),
    "missing-gate-command": dict(
        gate=MISSING_COMMAND, ops={"implement": [ANSWER_STEP]}, repair_allowance=0,
        status="waiting_review", reason="gate_failed", operations=["implement"],
        sentences=[f"`{MISSING_COMMAND}` failed: command not found (exit 127)"],
        evidence="check", log_text="no-such-gate-command-4711: command not found"),
    "invalid-review": dict(
        gate=QUICK_GATE, ops={"implement": [ANSWER_STEP], "review": [{"final_message": "I approve of this change."}]},
        status="waiting_review", reason="invalid_review", operations=["implement", "review"],
        sentences=["did not answer a valid verdict", "no JSON object"],
        evidence="attempt", log_text="I approve of this change."),
}


@pytest.fixture
def staff(client, django_user_model):
    """The django test client, logged in as a superuser."""
    user = django_user_model.objects.create_superuser("person", "person@example.invalid", "pw-for-tests-only")
    client.force_login(user)
    return client


def run_status_text(run_id: int, *args: str) -> str:
    out = io.StringIO()
    call_command("run_status", str(run_id), *args, stdout=out)
    return out.getvalue()


def visible_text(html: str) -> str:
    """The text a browser shows of an admin page (tags dropped, entities decoded, spaces squeezed)."""
    import html as html_lib

    text = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S | re.I)
    text = re.sub(r"<[^>]+>", " ", text)
    return re.sub(r"\s+", " ", html_lib.unescape(text))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_person_can_read_how_a_simulated_run_ended_and_why(make_pipeline, repo, sent, staff, name):
    case = SCENARIOS[name]
    stage = {"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**"],
             "gates": [{"name": "unit", "command": case["gate"]}]}
    if "repair_allowance" in case:
        stage["repair_allowance"] = case["repair_allowance"]
    pipeline = make_pipeline(name=f"person-{name}", stages=[stage], scenario={"stages": {"answer": case["ops"]}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent, limit=40)

    assert (run.status, run.stop_reason or None) == (case["status"], case["reason"]), run.stop_message
    assert run.simulated and run.simulated_reason == "scripted test adapter"
    assert operations_of(run) == case["operations"]
    if case["reason"] is not None:
        for sentence in case["sentences"]:
            assert sentence in run.stop_message, (sentence, run.stop_message)

    # the evidence the stop points at (for the success: the failed gate it repaired) exists and shows why
    data = operations.run_status(run)
    if case["reason"] is None:
        failed = Check.objects.filter(run=run, passed=False).order_by("id")
        assert failed.count() == 1
        evidence_row, evidence_log = failed.first(), failed.first().log_path
    else:
        evidence = data["stop_evidence"]
        assert evidence and case["evidence"] in evidence, evidence
        if case["evidence"] == "check":
            evidence_row = Check.objects.get(pk=evidence["check"], run=run)
            assert not evidence_row.passed and evidence["gate"] == "unit"
            evidence_log = evidence_row.log_path
        else:
            evidence_row = Attempt.objects.get(pk=evidence["attempt"], run=run)
            assert evidence_row.operation == "review" and evidence_row.verdict_problem
            evidence_log = evidence_row.log_path
    assert evidence_log and var(evidence_log).is_file(), evidence_log
    assert case["log_text"] in var(evidence_log).read_text(errors="replace")
    if case["reason"] is None:  # the repair session was given that evidence
        repair = Attempt.objects.get(run=run, operation="repair")
        assert "Gate 'unit' failed" in var(repair.prompt_path).read_text() and var(repair.log_path).is_file()

    # run_status: the status, the reason code and its sentence, labelled simulated
    text = run_status_text(run.pk)
    head = text.splitlines()[0]
    assert head == f"run {run.pk} of person-{name} [SIMULATED]: {case['status']}", text
    if case["reason"] is not None:
        assert f"stopped: {case['reason']}: {run.stop_message}" in text
        assert f".venv/bin/python manage.py recover {run.pk} --decision" in text  # what the person can do next
    else:
        assert "stopped:" not in text
    shown = [re.match(r"\s+attempt \d+ (\w+) \[scripted\]", line) for line in text.splitlines()]
    assert [m.group(1) for m in shown if m] == case["operations"], text
    if case["evidence"] == "check":
        assert re.search(r"check unit: FAIL \(exit \d+", text), text
    # --json: the same, for a program
    record = json.loads(run_status_text(run.pk, "--json"))
    assert record["simulated"] is True and record["simulated_reason"] == "scripted test adapter"
    assert record["status"] == case["status"] and record["stop_reason"] == case["reason"]
    assert all(a["simulated"] for stage_data in record["stages"] for a in stage_data["attempts"])
    if case["reason"] is not None:
        assert record["stop_message"] == run.stop_message
        assert record["stop_evidence"] == run.stop_evidence
        assert record["stop_evidence"][case["evidence"]] == evidence_row.pk
        logs = [c["log"] for s in record["stages"] for c in s["checks"]] + [
            a["log"] for s in record["stages"] for a in s["attempts"]]
        assert str(var(evidence_log)) in logs  # the JSON points at the evidence file by its path

    # the run's events tell the story in sentences, ending with why it stopped (or that it succeeded)
    events = list(RunEvent.objects.filter(run=run).order_by("id"))
    story = "\n".join(e.message for e in events)
    for sentence in case["sentences"]:
        assert sentence in story, (sentence, story)
    last = events[-1]
    if case["reason"] is None:
        assert last.kind == "succeeded"
    else:
        assert last.kind == "stopped" and last.message == f"Stopped ({case['reason']}): {run.stop_message}"
        assert last.data == run.stop_evidence and last.decision_id is not None
    assert all(e.message.strip().endswith((".", ")", "`")) for e in events), [e.message for e in events]

    # the admin page of the run: reason, sentence, and that it is simulated
    response = staff.get(reverse("admin:engine_run_change", args=[run.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    page = visible_text(html)
    title = re.search(r"<title>(.*?)</title>", html, re.S).group(1)
    heading = re.search(r"<h2>(.*?)</h2>", html, re.S).group(1)  # the page's heading: the run itself
    for shown_as in (title, heading):
        assert f"run {run.pk} of person-{name}" in shown_as and f"{case['status']} [simulated]" in shown_as, shown_as
    assert "Simulated reason: scripted test adapter" in page
    if case["reason"] is not None:
        assert f"Stop reason: {case['reason']} " in page and f"Stop message: {run.stop_message}" in page, page
        assert f"Stopped ({case['reason']}): {run.stop_message}" in page  # the events, inline
    listing = visible_text(staff.get(reverse("admin:engine_run_changelist")).content.decode())
    assert re.search(rf"{run.pk} person-{name} \S.* SIMULATED", listing), listing
