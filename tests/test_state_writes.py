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
import re
from pathlib import Path

import pytest

from engine import machine
from engine.models import AttemptStatus, Decision, JournalEntry, RunStatus, StageStatus

ROOT = Path(__file__).resolve().parent.parent
#: The columns only the machine writes.
GUARDED = frozenset({"status", "state", "phase", "lease_owner", "lease_token", "stop_reason"})
WRITERS = frozenset({"update", "create", "get_or_create", "update_or_create", "bulk_create"})
#: The engine's models whose rows hold a guarded column (a constructor call with one is a write).
MODELS = frozenset({"Run", "StageRun", "Attempt", "Decision", "JournalEntry"})
_SQL_WRITE = re.compile(r"\b(UPDATE|INSERT)\b.*\b(" + "|".join(sorted(GUARDED)) + r")\b", re.I | re.S)


def _modules():
    for folder in ("engine", "controlpanel"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            yield path


def _constant(node):
    return node.value if isinstance(node, ast.Constant) else None


def _writer_name(func) -> str | None:
    """``update`` for ``qs.update`` and for ``getattr(qs, "update")``."""
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr" \
            and len(func.args) >= 2:
        return _constant(func.args[1])
    return None


def _keyword_writes(node: ast.Call, what: str, where: str) -> list[str]:
    found = []
    for keyword in node.keywords:
        if keyword.arg in GUARDED:
            found.append(f"{where}: {what}({keyword.arg}=...)")
        elif keyword.arg is None:  # **mapping: a literal is read, anything else may hold a guarded key
            if isinstance(keyword.value, ast.Dict):
                found += [f"{where}: {what}(**{{{_constant(k)!r}: ...}})" for k in keyword.value.keys
                          if _constant(k) in GUARDED or k is None]
            else:
                found.append(f"{where}: {what}(**{ast.unparse(keyword.value)})")
        elif keyword.arg == "defaults":
            if isinstance(keyword.value, ast.Dict):
                found += [f"{where}: {what}(defaults={{{_constant(k)!r}: ...}})" for k in keyword.value.keys
                          if _constant(k) in GUARDED or k is None]
            else:
                found.append(f"{where}: {what}(defaults={ast.unparse(keyword.value)})")
    return found


def writes_outside_machine(source: str, filename: str) -> list[str]:
    """``file:line: what`` for every guarded write in ``source``: an attribute assignment, an
    item assignment through ``__dict__`` / ``vars()``, ``setattr`` / ``__setattr__``, a keyword
    (or an unknown ``**mapping``) of a queryset writer or a model constructor, ``bulk_update``
    of a guarded field, or SQL text that updates one. (A full ``save()`` of a row read with a
    status cannot be told from the code; the machine's functions are the callers that change
    one, and the runner and operations save only rows they locked.)"""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and leaf.attr in GUARDED and isinstance(leaf.ctx, ast.Store):
                    found.append(f"{where}: assigns .{leaf.attr}")
                if isinstance(leaf, ast.Subscript) and isinstance(leaf.ctx, ast.Store):
                    holder = leaf.value
                    through = (isinstance(holder, ast.Attribute) and holder.attr == "__dict__") or (
                        isinstance(holder, ast.Call) and isinstance(holder.func, ast.Name) and holder.func.id == "vars")
                    if through and (_constant(leaf.slice) in GUARDED or _constant(leaf.slice) is None):
                        found.append(f"{where}: assigns {ast.unparse(leaf)}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL_WRITE.search(node.value):
            found.append(f"{where}: SQL writes a guarded column")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        setter = (isinstance(func, ast.Name) and func.id == "setattr") or (
            isinstance(func, ast.Attribute) and func.attr == "__setattr__")
        if setter and len(node.args) >= 2:
            name = node.args[1]
            if _constant(name) is None or _constant(name) in GUARDED:
                found.append(f"{where}: setattr of {ast.unparse(name)}")
        writer = _writer_name(func)
        if writer in WRITERS:
            found += _keyword_writes(node, f".{writer}", where)
        if writer == "bulk_update":
            fields = node.args[1] if len(node.args) >= 2 else next(
                (k.value for k in node.keywords if k.arg == "fields"), None)
            if not isinstance(fields, (ast.List, ast.Tuple)) or any(
                    _constant(item) in GUARDED or _constant(item) is None for item in fields.elts):
                found.append(f"{where}: .bulk_update of {ast.unparse(fields) if fields else '?'}")
        if isinstance(func, ast.Name) and func.id in MODELS:
            found += _keyword_writes(node, func.id, where)
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
    "qs.update(**{'status': 'failed'})",
    "qs.update(**values)",
    "Run.objects.bulk_update(runs, ['status'])",
    "Run.objects.bulk_update(runs, fields=names)",
    "cursor.execute('UPDATE engine_run SET status = %s WHERE id = %s', [s, i])",
    "run.__dict__['status'] = 'failed'",
    "vars(run)['lease_token'] = ''",
    "object.__setattr__(run, 'status', 'failed')",
    "Profile.objects.update_or_create(pk=1, defaults=values)",
    "getattr(qs, 'update')(status='failed')",
    "Run(pk=1, status='failed').save()",
    "run.stop_reason = 'anything'",
])
def test_the_scan_finds_each_kind_of_write(snippet):
    assert writes_outside_machine(snippet, "x.py"), snippet


@pytest.mark.parametrize("snippet", [
    "Run.objects.filter(status='running').count()",
    "Response(data, status=404)",
    "x = attempt.status",
    "dict(item, status='in_progress')",
    "qs.update(**{'heartbeat_at': now})",
    "Run.objects.bulk_update(runs, ['active_seconds'])",
    "cursor.execute('SELECT status FROM engine_run')",
    "Check(run=run, name='unit', failure_kind='x')",
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


def test_a_move_refuses_fields_that_only_the_machine_sets(run_row):
    from engine.models import Attempt

    run = run_row(status="running", stage_statuses=("running",))
    attempt = Attempt.objects.create(run=run, stage=run.stages.get(), operation="implement", number=1,
                                     role="implementer", profile_name="scripted", adapter="scripted",
                                     deadline_seconds=60, status="running")
    with pytest.raises(machine.IllegalTransition, match="lease_token"):
        machine.end_attempt(attempt, "failed", lease_token="")
    attempt.refresh_from_db()
    assert attempt.status == "running"
