"""One machine for every record: no module but engine/machine.py assigns a status or a state.

The test reads the project's code (engine/ and controlpanel/, migrations aside) with ``ast`` and
fails on any write of a run's, stage's, attempt's, decision's or journal entry's status, state
or phase, or of a run's lease, outside engine/machine.py: an assignment to such an attribute,
``setattr`` with such a name, or such a keyword in ``.update()`` / ``.create()`` /
``.get_or_create()`` / ``.update_or_create()`` (reads, ``filter(status=...)``, are fine).
bench/ and tests/ build fixture rows directly and are not scanned.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine import machine
from engine.models import AttemptStatus, Decision, JournalEntry, RunStatus, StageStatus

ROOT = Path(__file__).resolve().parent.parent
#: The columns only the machine writes.
GUARDED = frozenset({"status", "state", "phase", "lease_owner", "lease_token"})
WRITERS = frozenset({"update", "create", "get_or_create", "update_or_create", "bulk_create"})


def _modules():
    for folder in ("engine", "controlpanel"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            yield path


def writes_outside_machine(source: str, filename: str) -> list[str]:
    """``file:line: what`` for every guarded write in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and leaf.attr in GUARDED and isinstance(leaf.ctx, ast.Store):
                    found.append(f"{filename}:{node.lineno}: assigns .{leaf.attr}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) >= 2:
            name = node.args[1]
            if not isinstance(name, ast.Constant) or name.value in GUARDED:
                found.append(f"{filename}:{node.lineno}: setattr of {ast.unparse(name)}")
        if isinstance(func, ast.Attribute) and func.attr in WRITERS:
            for keyword in node.keywords:
                if keyword.arg in GUARDED:
                    found.append(f"{filename}:{node.lineno}: .{func.attr}({keyword.arg}=...)")
                if keyword.arg == "defaults" and isinstance(keyword.value, ast.Dict):
                    for key in keyword.value.keys:
                        if isinstance(key, ast.Constant) and key.value in GUARDED:
                            found.append(f"{filename}:{node.lineno}: .{func.attr}(defaults={{{key.value!r}: ...}})")
    return found


def test_no_module_but_the_machine_writes_a_status_or_state():
    found = []
    for path in _modules():
        if path == ROOT / "engine" / "machine.py":
            continue
        found += writes_outside_machine(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == [], "status/state/lease written outside engine/machine.py:\n" + "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "attempt.status = 'failed'",
    "entry.state = JournalEntry.State.DONE",
    "run.lease_token, x = '', 1",
    "Attempt.objects.filter(pk=1).update(status='failed')",
    "Decision.objects.create(run=run, state='approved')",
    "Profile.objects.update_or_create(pk=1, defaults={'status': 'x'})",
    "setattr(stage, 'phase', 'verify')",
    "setattr(stage, name, value)",
])
def test_the_scan_finds_each_kind_of_write(snippet):
    assert writes_outside_machine(snippet, "x.py"), snippet


@pytest.mark.parametrize("snippet", [
    "Run.objects.filter(status='running').count()",
    "Response(data, status=404)",
    "x = attempt.status",
    "dict(item, status='in_progress')",
])
def test_the_scan_leaves_reads_and_other_status_words_alone(snippet):
    assert writes_outside_machine(snippet, "x.py") == []


@pytest.mark.parametrize("table, choices", [
    (machine.RUN_TRANSITIONS, RunStatus),
    (machine.STAGE_TRANSITIONS, StageStatus),
    (machine.ATTEMPT_TRANSITIONS, AttemptStatus),
    (machine.DECISION_TRANSITIONS, Decision.State),
    (machine.JOURNAL_TRANSITIONS, JournalEntry.State),
])
def test_every_record_has_a_complete_transition_table(table, choices):
    assert set(table) == set(choices.values)
    for targets in table.values():
        assert set(targets) <= set(choices.values)


def test_the_lease_table_names_every_lease_state():
    states = {machine.Lease.FREE, machine.Lease.HELD, machine.Lease.HANDED_OFF}
    assert set(machine.LEASE_TRANSITIONS) == states
    for targets in machine.LEASE_TRANSITIONS.values():
        assert set(targets) <= states


def _doc_table(heading: str) -> dict[str, str]:
    text = (ROOT / "docs" / "run-status.md").read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            name, meaning = line[3:].split("` | ", 1)
            rows[name] = meaning.rstrip(" |")
    return rows


def test_the_docs_list_exactly_the_stop_reasons_and_event_kinds_of_the_code():
    assert _doc_table("Stop reasons") == machine.STOP_REASONS
    assert _doc_table("Event kinds") == machine.EVENT_KINDS


def _codes_in_engine() -> dict[str, set[str]]:
    """The first string argument of every ``WorkspaceError(...)`` / ``ContextError(...)`` and every
    string event kind / stop reason passed to ``event`` / ``stop`` / ``fail`` in engine/."""
    found: dict[str, set[str]] = {"reasons": set(), "events": set()}

    def strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.IfExp):
            return strings(node.body) + strings(node.orelse)
        return []

    for path in (ROOT / "engine").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("WorkspaceError", "ContextError"):
                found["reasons"].update(strings(node.args[0]))
            elif name in ("stop", "fail") and len(node.args) >= 2:
                found["reasons"].update(strings(node.args[1]))
            elif name == "event" and len(node.args) >= 2 and not isinstance(func, ast.Attribute) or (
                    isinstance(func, ast.Attribute) and func.attr == "event"
                    and isinstance(func.value, ast.Name) and func.value.id == "machine" and len(node.args) >= 2):
                found["events"].update(strings(node.args[1]))
    return found


def test_every_code_the_engine_can_stop_with_is_a_listed_stop_reason():
    from engine.agents.base import FAILURE_KINDS

    found = _codes_in_engine()
    assert found["reasons"], "the scan found no stop reason: it is broken"
    assert found["reasons"] - set(machine.STOP_REASONS) == set()
    assert set(FAILURE_KINDS) - set(machine.STOP_REASONS) == set()
    assert found["events"] - set(machine.EVENT_KINDS) == set()


def test_an_unlisted_stop_reason_or_event_kind_is_refused(db):
    from engine.models import Run

    run = Run(pk=None)
    with pytest.raises(machine.IllegalTransition, match="stop reason"):
        machine.stop(run, "made_up_reason", "no")
    with pytest.raises(machine.IllegalTransition, match="event kind"):
        machine.event(run, "made_up_kind", "no")


def test_the_first_claim_records_when_the_start_request_was_claimed(run_row, sent):
    from engine import operations
    from engine.models import StartRequest

    run = run_row()
    operations.request_start(run, requested_by="t", source="test")
    assert StartRequest.objects.get(run=run).claimed_at is None
    token = machine.claim(run.pk, None, "test:1")
    assert token
    claimed = StartRequest.objects.get(run=run).claimed_at
    assert claimed is not None
    run.refresh_from_db()
    assert (run.status, run.lease_owner, machine.lease_state(run)) == ("running", "test:1", machine.Lease.HELD)
    assert machine.claim(run.pk, None, "test:2") is None  # a second claim of a queued run wins nothing
    assert StartRequest.objects.get(run=run).claimed_at == claimed


def test_a_lease_move_the_table_does_not_allow_is_refused(run_row):
    run = run_row(status="running", stage_statuses=("running",))
    run.lease_token, run.lease_owner = "", ""  # fixture data: a running run whose lease is free
    with pytest.raises(machine.IllegalTransition, match="lease"):
        machine.hand_off(run)
