"""The agreed tests of a stage's gates: the test ids each gate's test runner must report passing
again, by id (engine/checks/test_reports records them).

A gate's ledger (``StageRun.agreed_tests``, by gate name) is made once per stage, at its first
verification:

* for the first stage that runs a gate whose command names pytest or ``python -m unittest``
  (``test_reports.runner_of``):
  the ids pytest collects at the stage's starting commit, less those a skip, a true skipif or an
  xfail mark stands on. The gate runs there once with ``--collect-only`` added (no test runs), on a
  fresh checkout of that commit, recorded as no check: its log and its runner's record are kept in
  the run's ``agreed/`` records (the ledger's ``log`` and ``record``), the evidence of what was agreed;
* for a later stage: the ledger of the latest earlier stage that has the gate, with the ids that
  passed in that stage's accepted check of it (the gate that passed on its accepted manifest):
  a test a stage added and made pass is agreed from the next stage on.

When the stage adds a test module, the agreed tests run apart from the new ones (``gate_checks``):
a new module cannot patch, inside the runner's process, what the agreed tests call.

A check of the gate that would pass (exit 0, a record that agrees) then fails ``tests_missing``
when an agreed id is not reported passed (not collected, deselected, skipped, an expected
failure), or ``tests_failed`` when one failed; the check's ``tests.agreed`` says how many were
agreed and which are missing. The final verification holds each gate to its last ledger.
A gate whose command names no pytest (``make test``, a script) has no ledger: its runner's record,
when there is one, is still judged (engine/checks/test_reports), its ids are not.

When an agent changed protected files (a runner configuration, a conftest, a protected test), the
run stops without running a gate; ``dropped`` then names the agreed tests pytest would no longer
run on those files (``--collect-only`` on a fresh checkout of them, in the gates' sandbox): the
stop says which tests a ``-k``, a ``--deselect`` or a ``collect_ignore`` took away. That list is
what the agent's own configuration let pytest say, shown as such, never a reason to pass.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from django.db import transaction

from .. import machine, workspace
from ..checks import protected, test_reports
from ..models import Check, Run, StageRun
from .checkouts import final_checkout, remove_final_checkout
from .common import fenced
from .gates import collect_tests, run_gate
from .paths import control_path, scratch_dirs, var_path

#: How many missing ids a check's record and its sentence name.
NAMED = 20


def ledgers(run: Run, stage: StageRun, gates: list[tuple[dict, str]], env: dict, should_stop,
            lease: str | None) -> dict[str, dict]:
    """``{gate name: {"ids", "from", "log", "record"}}`` for the stage's gates, made once and kept on the stage."""
    known = dict(stage.agreed_tests or {})
    made = False
    for gate, _kind in gates:
        if gate["name"] in known:
            continue
        earlier = _from_earlier_stage(run, stage, gate["name"])
        known[gate["name"]] = earlier if earlier is not None else _at_start(run, stage, gate, env, should_stop, lease)
        made = True
        if should_stop():
            break
    if made:
        StageRun.objects.filter(pk=stage.pk).update(agreed_tests=known)
        stage.agreed_tests = known
        with transaction.atomic():
            if lease is None or fenced(run.pk, lease) is not None:
                count = {name: len(entry["ids"]) for name, entry in known.items() if entry["ids"]}
                if count:
                    machine.event(run, "tests_agreed", "Agreed tests of stage '" + stage.key + "': " + ", ".join(
                        f"{n} for gate '{name}'" for name, n in count.items()) + "; each must pass again, by id.",
                        stage=stage, data={"counts": count})
    return known


def after(stage: StageRun, name: str) -> dict | None:
    """The ledger of gate ``name`` once ``stage`` passed: its own, with the ids that passed in its
    accepted check of the gate; None when the stage has none for it."""
    entry = (stage.agreed_tests or {}).get(name)
    if entry is None:
        return None
    ids = set(entry["ids"])
    if stage.accepted_manifest:
        accepted = (stage.checks.filter(name=name, passed=True, stale=False, manifest_digest=stage.accepted_manifest)
                    .order_by("-id").first())
        if accepted is not None:
            ids |= passed_ids(accepted)
    carried = {"skipped_at_start": entry["skipped_at_start"]} if "skipped_at_start" in entry else {}
    return {"ids": sorted(ids), "from": f"stage '{stage.key}'", "log": entry.get("log"), "record": entry.get("record"),
            **carried}


def final_ledger(run: Run, name: str) -> dict | None:
    """The last ledger of gate ``name`` in the run (the latest stage that has one, after it passed)."""
    for stage in run.stages.order_by("-order"):
        found = after(stage, name)
        if found is not None:
            return found
    return None


def passed_ids(check: Check) -> set[str]:
    return {test for test, outcome in outcomes(check).items() if outcome == "passed"}


def outcomes(check: Check) -> dict[str, str]:
    """``{test id: outcome}`` as the check's runner recorded them (empty without a record)."""
    record = _record_of(check)
    return dict(record.outcomes) if record else {}


def _record_of(check: Check) -> test_reports.Record | None:
    path = (check.tests or {}).get("record_path")
    return test_reports.parse(var_path(path)) if isinstance(path, str) and path else None


def _from_earlier_stage(run: Run, stage: StageRun, name: str) -> dict | None:
    for earlier in run.stages.filter(order__lt=stage.order).order_by("-order"):
        found = after(earlier, name)
        if found is not None:
            return found
    return None


def _at_start(run: Run, stage: StageRun, gate: dict, env: dict, should_stop, lease: str | None) -> dict:
    """The gate's tests at the stage's starting commit, collected only, on a fresh checkout of it; its log
    and its runner's record are kept under the run's ``agreed/`` records."""
    if not test_reports.runner_of(gate["command"]):
        return {"ids": [], "from": "none: the gate's command names no pytest or python -m unittest", "log": None,
                "record": None}
    log_rel = control_path(run, "agreed", f"{stage.order + 1:02d}-{stage.key}-{gate['name']}.log")
    with _checkout(run, stage.base_commit, f"start-{stage.order + 1:02d}-{stage.base_commit[:12]}", env) as (
            folder, start_env):
        found = collect_tests(run, gate, folder, start_env, should_stop, lease, log_rel)
    ids = sorted(set(found["listed"]) - set(found["marked"]))
    return {"ids": ids, "from": f"the starting commit {stage.base_commit[:12]}", "log": found["log_path"],
            "record": found["record_path"], "exit_code": found["exit_code"]}


def skipped_at_start(run: Run, stage: StageRun, gate: dict, env: dict, should_stop, lease: str | None) -> list[str]:
    """The agreed ids of ``gate`` that skip themselves at the run's starting commit (the commit a person
    chose, never one an agent wrote: a later stage's start is an earlier stage's checkpoint, whose code
    could skip a test from then on): the gate run for real once on a fresh checkout of it (its log and
    record kept under the run's ``agreed/`` records), kept on the stage's ledger (``skipped_at_start``,
    ``skipped_log``; a later stage's ledger carries it) so it runs once per run and gate."""
    entry = dict((stage.agreed_tests or {}).get(gate["name"]) or {})
    if "skipped_at_start" in entry:
        return list(entry["skipped_at_start"])
    log_rel = control_path(run, "agreed", f"{stage.order + 1:02d}-{stage.key}-{gate['name']}-at-start.log")
    with _checkout(run, run.commit, f"baseline-{run.commit[:12]}", env) as (folder, start_env):
        found = collect_tests(run, gate, folder, start_env, should_stop, lease, log_rel, collect_only=False)
    skipped = sorted(test for test, outcome in found["outcomes"].items()
                     if outcome == "skipped" and test in set(entry.get("ids") or []))
    entry.update(skipped_at_start=skipped, skipped_log=found["log_path"], skipped_record=found["record_path"])
    known = {**(stage.agreed_tests or {}), gate["name"]: entry}
    StageRun.objects.filter(pk=stage.pk).update(agreed_tests=known)
    stage.agreed_tests = known
    return skipped


def dropped(run: Run, stage: StageRun, tree: str, folder: str, env: dict, should_stop,
            lease: str | None) -> dict[str, dict]:
    """``{gate name: {"count", "ids", "log"}}``: the agreed tests of the stage's pytest gates that pytest
    would not run (not collected, or now under a skip or xfail mark) on the files ``tree`` (a
    manifest of what an agent left, refused as tampering), collected on a fresh checkout of them;
    the collection's log under the run's ``folder``. Empty when no gate has agreed tests."""
    gates = [(g, kind) for g, kind in stage_gates(run, stage) if test_reports.runner_of(g["command"])]
    if not gates:
        return {}
    known = ledgers(run, stage, gates, env, should_stop, lease)
    wanted = [(gate, known[gate["name"]]["ids"]) for gate, _ in gates if (known.get(gate["name"]) or {}).get("ids")]
    if not wanted or should_stop():
        return {}
    found: dict[str, dict] = {}
    try:
        commit = workspace.tree_commit(run.worktree, tree, stage.base_commit)
        with _checkout(run, commit, f"changed-{tree[:12]}", env) as (checkout, changed_env):
            for gate, ids in wanted:
                listed = collect_tests(run, gate, checkout, changed_env, should_stop, lease,
                                       control_path(run, folder, f"collected-{gate['name']}.log"))
                still = set(listed["listed"]) - set(listed["marked"])
                gone = [test for test in ids if test not in still]
                if gone:
                    found[gate["name"]] = {"count": len(gone), "ids": gone[:NAMED], "log": listed["log_path"]}
                if should_stop():
                    break
    except workspace.WorkspaceError:
        pass
    return found


def stage_gates(run: Run, stage: StageRun) -> list[tuple[dict, str]]:
    """``[(gate, check kind)]``: the pipeline's baseline checks, then the stage's gates, as they run."""
    gates = [(g, Check.Kind.BASELINE) for g in run.definition["pipeline"].get("baseline_checks") or []]
    return gates + [(g, Check.Kind.GATE) for g in stage.spec.get("gates") or []]


@contextlib.contextmanager
def _checkout(run: Run, commit: str, name: str, env: dict):
    """``(folder, env)``: a fresh checkout of ``commit`` beside the worktree (``name`` under the run's
    scratch folder, with its own TMPDIR and data folder in ``env``), removed afterwards. Raises
    workspace.WorkspaceError when it cannot be made."""
    scratch = Path(scratch_dirs(run.pk)["tmp"]).parent
    folder, own = scratch / name, scratch / f"{name}-scratch"
    try:
        final_checkout(run, commit, folder, own)
        yield str(folder), {**env, "CP_WORKTREE": str(folder), "TMPDIR": str(own / "tmp"),
                            "CP_TMP_DIR": str(own / "tmp"), "CP_DATA_DIR": str(own / "data")}
    finally:
        with contextlib.suppress(workspace.WorkspaceError):
            remove_final_checkout(run, folder, own)


def dropped_sentence(found: dict[str, dict]) -> str:
    """The stop message's words for ``dropped``'s result, or "" when it named none."""
    if not found:
        return ""
    parts = [f"gate '{name}': " + ", ".join(entry["ids"][:5]) + (f" and {entry['count'] - 5} more"
                                                                 if entry["count"] > 5 else "")
             for name, entry in found.items()]
    return (" With these files, the test runner (listing its tests, running none, on a checkout of them) would "
            "no longer run these agreed tests: " + "; ".join(parts) + ".")


def gate_checks(run: Run, stage: StageRun, gate: dict, kind: str, digest: str, changes: list[dict], env: dict,
                should_stop, round_no: int, lease: str | None, entry: dict | None):
    """The checks of one gate on the worktree, one at a time (the caller stops at the first that fails).

    With agreed tests and a new test module in the stage's changes (``changes``: the manifest's; for
    a ``python -m unittest`` gate, any file outside the agreed files), the agreed tests run
    apart: first only the files of the agreed tests (a new module cannot patch, in the runner's
    process, what they call), held to the ledger; then every file but those, where the new tests
    run (an invocation that collects none exits 0). Otherwise the gate runs once, held to the ledger."""
    files = sorted({test.split("::", 1)[0] for test in entry["ids"]}) if entry and entry["ids"] else []
    # unittest's discovery imports every test*.py and every package it walks (an __init__.py, a compiled
    # __init__.*.so, a linked folder), whatever the engine calls a test module: for it, any file the stage
    # changed outside the agreed files
    unittest = test_reports.runner_of(gate["command"]) == "unittest"
    new = [change["path"] for change in changes if change.get("status") != "deleted" and change["path"] not in files
           and (unittest or (change["path"].endswith(".py") and protected.is_test_file(change["path"])))] if files else []
    def at_start() -> list[str]:
        return skipped_at_start(run, stage, gate, env, should_stop, lease)

    if not new:
        yield hold(run_gate(run, stage, gate, kind, digest, env, should_stop, round_no, lease=lease), entry, at_start)
        return
    first = hold(run_gate(run, stage, gate, kind, digest, env, should_stop, round_no, lease=lease,
                          apart=("only", files)), entry, at_start)
    yield first
    if first.passed and not should_stop():
        yield run_gate(run, stage, gate, kind, digest, env, should_stop, round_no, lease=lease, apart=("except", files))


def hold(check: Check, entry: dict | None, at_start=None) -> Check:
    """``check`` held to its gate's ledger ``entry``: a check that passed fails ``tests_missing`` (or
    ``tests_failed``) when an agreed id was not reported passed; ``tests.agreed`` records the count.

    An agreed test the check reports skipped is excused when it skipped at the run's starting commit
    too (a test that skips itself at run time: an optional dependency missing, another platform), which
    collecting alone cannot tell: ``at_start()`` then runs the gate once on a fresh checkout of that
    commit (``skipped_at_start``) and the ids it reports skipped there are kept on the ledger
    (``skipped_at_start``, with that run's log and record). A test that ran there, or that an earlier
    stage added, and skips now is still missing."""
    if entry is None or not entry["ids"]:
        return check
    record = _record_of(check)
    outcomes = record.outcomes if record else {}
    missing = [test for test in entry["ids"] if outcomes.get(test) != "passed"]
    excused: list[str] = []
    if check.passed and any(outcomes.get(test) == "skipped" for test in missing):
        before = set(entry["skipped_at_start"]) if "skipped_at_start" in entry else (
            set(at_start()) if at_start is not None else set())
        excused = [test for test in missing if outcomes.get(test) == "skipped" and test in before]
        missing = [test for test in missing if test not in excused]
    failed = [test for test in missing if outcomes.get(test) in ("failed", "error")]
    agreed = {"count": len(entry["ids"]), "from": entry["from"], "missing": len(missing),
              "missing_ids": missing[:NAMED],
              "how": {test: outcomes.get(test) or "not run" for test in missing[:NAMED]}}
    if excused:
        agreed["skipped_at_start"] = len(excused)
    tests = {**(check.tests or {}), "agreed": agreed}
    if not missing or not check.passed:
        Check.objects.filter(pk=check.pk).update(tests=tests)
        check.tests = tests
        return check
    kind = "tests_failed" if len(failed) == len(missing) else "tests_missing"
    shown = ", ".join(f"{test} ({agreed['how'][test]})" for test in missing[:5]) + (" ..." if len(missing) > 5 else "")
    why = (f"it exited 0, but {len(missing)} of the {len(entry['ids'])} agreed tests (from {entry['from']}) did not "
           f"pass again: {shown}")
    tests["why"] = why
    Check.objects.filter(pk=check.pk).update(passed=False, failure_kind=kind, tests=tests)
    check.passed, check.failure_kind, check.tests = False, kind, tests
    with contextlib.suppress(OSError), open(var_path(check.log_path), "a", encoding="utf-8") as log:
        log.write(f"\n[control panel] The gate failed ({kind}): {why}; every agreed test must be reported passed "
                  "again, by id.\n")
    return check
