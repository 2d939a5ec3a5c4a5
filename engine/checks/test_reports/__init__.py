"""A gate's tests, as the test runner itself recorded them: the engine's reporter, loaded from
outside the worktree, and what its record says against the gate's exit status.

An exit status of 0 is a claim of the process under test: ``os._exit(0)`` at collection, in a
test or in the code a test imports, an ``atexit`` handler that rewrites the status, or
``pytest.exit(returncode=0)`` all end a gate with 0 while tests failed or never ran. So every gate
runs with the engine's pytest reporter (engine/checks/test_reports/pytest_plugin.py) loaded into any
pytest it starts (``PYTEST_PLUGINS``), from a folder of its own that the sandbox shows read-only,
under a module name made up for that gate (no file of the repository can stand in for it). It
writes each session's start, the ids it collected, each test's outcome and the session's end to a
file in the gate's HOME (``record``), read by the engine after the gate (``read``) and kept beside
the gate's log.

``judge`` fails a gate that exited 0 when its record says otherwise:

* ``runner_incomplete``: a session began and never finished (its process ended first), was
  interrupted (``pytest.exit``, Ctrl-C), or a test it collected never reported an outcome; or the
  gate's command runs pytest (``runs_pytest``) and no session was recorded at all (the reporter
  was kept out, or the process ended before pytest began);
* ``tests_failed``: a session finished with a non-zero status (the exit status was changed after
  it), or a test failed or errored.

A gate whose command does not name pytest and that recorded no session (``make lint``, a shell
script, another runner) stays an exit-status gate, and its check says so (``summary``).

**unittest.** The same folder holds engine/checks/test_reports/unittest_hook.py as ``sitecustomize.py``:
every Python the gate starts imports it at start-up, and in a ``python -m unittest`` process it
records unittest's own view in the same lines, test ids written as pytest writes them
(``tests/test_x.py::TestY::test_z``), so agreed tests and running apart work alike.

**Adding a runner** (jest or vitest, go test, cargo test): give the engine a reporter that the
runner loads from a path outside the worktree by the gate's environment alone (a jest
``--reporters`` module, ``go test -json`` read by a wrapper...), writing the lines listed in
engine/checks/test_reports/pytest_plugin.py (``start`` with ``runner``, ``collected``, ``report``,
``finish``) to ``CP_TEST_RECORD``; copy it into the reporter's folder in ``prepare``, name the
runner's command words in ``runner_of``, and honour ``CP_TEST_COLLECT_ONLY``, ``CP_TEST_ONLY`` and
``CP_TEST_EXCEPT`` (list, only those files, all but those files). ``parse``, ``judge`` and the
agreed tests (engine/steps/agreed.py) need nothing more.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..gate_files import ASSIGNMENT, shell_words

PLUGIN_SOURCE = Path(__file__).with_name("pytest_plugin.py")
#: Copied as ``sitecustomize.py`` beside the pytest plugin: the reporter of ``python -m unittest``.
UNITTEST_SOURCE = Path(__file__).with_name("unittest_hook.py")
#: A record larger than this is not read (a gate's code could write one to slow the worker); the
#: gate then fails ``runner_incomplete``: the engine could not read what its runner said.
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: How many test ids of each kind a check's summary names (the whole record is kept as a file).
NAMED = 20
#: Words that start pytest in a gate command (``python -m pytest`` is found by ``-m``).
PYTEST_WORDS = ("pytest", "py.test")


@dataclass
class Reporter:
    """One gate's reporter: ``folder`` (holds the plugin module ``module``, shown read-only) and
    ``record`` (the file it writes, in the gate's HOME)."""

    folder: Path
    module: str
    record: Path
    apart: tuple[str, Path] | None = None

    def env(self, env: dict) -> dict:
        """``env`` with the reporter loaded into any pytest the gate starts."""
        path = [str(self.folder)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        plugins = [self.module] + ([env["PYTEST_PLUGINS"]] if env.get("PYTEST_PLUGINS") else [])
        env = {**env, "PYTHONPATH": os.pathsep.join(path), "PYTEST_PLUGINS": ",".join(plugins),
               "CP_TEST_RECORD": str(self.record)}
        if self.apart is not None:
            env["CP_TEST_ONLY" if self.apart[0] == "only" else "CP_TEST_EXCEPT"] = str(self.apart[1])
        return env

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def prepare(parent: Path, home: Path, apart: tuple[str, list[str]] | None = None) -> Reporter:
    """A reporter for one gate: its module under a fresh name in a new folder under ``parent``,
    its record in ``home``. ``apart``: ``("only", files)`` or ``("except", files)``: the gate's
    pytest collects only those test files, or every file but them (engine/steps/agreed.py)."""
    module = f"cp_tests_{secrets.token_hex(8)}"
    folder = Path(tempfile.mkdtemp(prefix="gate-reporter-", dir=parent))
    shutil.copyfile(PLUGIN_SOURCE, folder / f"{module}.py")
    os.chmod(folder / f"{module}.py", 0o444)
    shutil.copyfile(UNITTEST_SOURCE, folder / "sitecustomize.py")
    os.chmod(folder / "sitecustomize.py", 0o444)
    listed = None
    if apart is not None:
        listed = folder / "files.txt"
        listed.write_text("".join(f"{path}\n" for path in apart[1] if "\n" not in path), encoding="utf-8")
        os.chmod(listed, 0o444)
    return Reporter(folder=folder, module=module, record=home / f".cp-tests-{secrets.token_hex(8)}.jsonl",
                    apart=(apart[0], listed) if apart is not None else None)


#: Words after which the next word is a command (a shell's separators, and what runs a command).
_COMMAND_BEFORE = frozenset({";", "&&", "||", "|", "&", "(", "{", "!", "then", "do", "else", "exec", "env", "time",
                             "nice", "nohup", "xvfb-run", "run", "-m", "-x"})


def runs_pytest(command: str) -> bool:
    """Whether a gate command starts pytest by name: ``pytest`` or ``py.test`` (any folder) where
    a command begins, after ``-m`` (``python -m pytest``) or ``run`` (``uv run pytest``), not
    as another program's argument (``pip show pytest``)."""
    words = shell_words(command)
    for index, word in enumerate(words):
        if os.path.basename(word) not in PYTEST_WORDS:
            continue
        before = words[:index]
        while before and ASSIGNMENT.match(before[-1]):  # VAR=value pytest
            before.pop()
        if not before or before[-1] in _COMMAND_BEFORE or (len(before) >= 2 and before[-2] == "timeout"):
            return True
    return False


def runs_unittest(command: str) -> bool:
    """Whether a gate command starts ``python -m unittest`` (``-munittest`` too) where a command begins."""
    words = shell_words(command)
    for index, word in enumerate(words):
        module = words[index + 1] if word == "-m" and index + 1 < len(words) else word[2:] if word.startswith("-m") else ""
        if module != "unittest":
            continue
        before = index - 1  # back over the interpreter's options (-X dev, -W error, -u...) to the interpreter
        while before > 0 and (words[before].startswith("-") or words[before - 1] in ("-X", "-W")):
            before -= 1
        if before >= 0 and os.path.basename(words[before]).startswith("python"):
            return True
    return False


def runner_of(command: str) -> str | None:
    """The test runner a gate command starts by name, whose record the engine then expects: ``pytest``,
    ``unittest`` or None (an exit-status gate unless a runner records a session anyway)."""
    return "pytest" if runs_pytest(command) else "unittest" if runs_unittest(command) else None


@dataclass
class Record:
    """A record as read: its sessions by pid, each test's outcome, the ids collected to run, those
    collected by ``--collect-only`` (and which of them a skip or xfail mark stands on), the files
    that could not be collected, and how many lines the reporter did not write."""

    sessions: dict
    outcomes: dict
    collected: list
    listed: list
    marked: set
    collect_errors: list
    unreadable: int
    apart: str | None = None
    runner: str = "pytest"


def parse(path: Path) -> Record | None:
    """The record at ``path``; None when there is none or it is larger than MAX_RECORD_BYTES."""
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            return None
    except OSError:
        return None
    record = Record(sessions={}, outcomes={}, collected=[], listed=[], marked=set(), collect_errors=[], unreadable=0)
    with open(path, "rb") as lines:
        for raw in lines:
            try:
                entry = json.loads(raw)
                kind = entry["e"]
            except (ValueError, KeyError, TypeError):
                record.unreadable += 1
                continue
            _take(record, kind, entry)
    return record


def _take(record: Record, kind, entry: dict) -> None:
    if kind in ("start", "finish", "interrupted", "collected"):
        session = record.sessions.setdefault(_int(entry.get("pid")), {"started": False, "finished": False,
                                                                      "status": None, "interrupted": False})
        if kind == "start":
            session["started"] = True
            if entry.get("runner") == "unittest":
                record.runner = "unittest"
            if entry.get("apart") in ("only", "except") and record.apart is None:
                record.apart = entry["apart"]
        elif kind == "finish":
            session["finished"], session["status"] = True, _int(entry.get("status"))
        elif kind == "interrupted":
            session["interrupted"] = True
        else:
            ids = [one for one in entry.get("ids") or [] if isinstance(one, str)]
            if entry.get("only"):  # --collect-only: nothing is to run
                record.listed.extend(ids)
                record.marked.update(one for one in entry.get("marked") or [] if isinstance(one, str))
            else:
                record.collected.extend(ids)
    elif kind == "report":
        _outcome(record.outcomes, str(entry.get("id")), entry.get("when"), entry.get("outcome"), entry.get("xfail"))
    elif kind == "collect_error":
        record.collect_errors.append(str(entry.get("id")))
    else:
        record.unreadable += 1


def read(path: Path) -> dict | None:
    """What the record at ``path`` says, summed up (``_summary``); None when no session was recorded."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size > MAX_RECORD_BYTES:
        return {"runner": "pytest", "unreadable": f"the record is {size} bytes, more than the engine reads"}
    record = parse(path)
    if record is None or (not record.sessions and not record.outcomes and not record.unreadable):
        return None
    summary = _summary(record.sessions, record.outcomes, record.collected, record.collect_errors, record.unreadable)
    summary["runner"] = record.runner
    summary["listed"] = len(set(record.listed))
    summary["apart"] = record.apart
    return summary


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _outcome(outcomes: dict, test: str, when, outcome, xfail) -> None:
    """Fold one report into a test's outcome: a failed setup or teardown is an error, a skip at
    setup a skip, the call's outcome the test's (an expected failure ``xfailed``, an unexpected
    pass ``xpassed``); an error or failure is never overwritten by a later phase's pass."""
    before = outcomes.get(test)
    if outcome == "rerun":  # pytest-rerunfailures: the next run of the same test decides
        return
    if outcome == "failed":
        now = "failed" if when == "call" else "error"
    elif outcome == "skipped":
        now = "xfailed" if xfail else "skipped"
    elif outcome == "passed":
        now = ("xpassed" if xfail else "passed") if when == "call" else None
    else:
        now = "error"
    if now is None:  # a setup or teardown that passed says nothing of the test
        return
    if before in ("failed", "error"):
        return
    outcomes[test] = now


def _summary(sessions: dict, outcomes: dict, collected: list[str], collect_errors: list[str], unreadable: int) -> dict:
    counts = {name: 0 for name in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")}
    for outcome in outcomes.values():
        counts[outcome] += 1
    unreported = sorted(set(collected) - set(outcomes))
    return {
        "runner": "pytest",
        "sessions": len(sessions),
        "finished": sum(1 for s in sessions.values() if s["finished"]),
        "unfinished": sum(1 for s in sessions.values() if s["started"] and not s["finished"]),
        "interrupted": sum(1 for s in sessions.values() if s["interrupted"]),
        "statuses": sorted({s["status"] for s in sessions.values() if s["status"] is not None}),
        "collected": len(set(collected)),
        "counts": counts,
        "failed_ids": sorted(t for t, o in outcomes.items() if o in ("failed", "error"))[:NAMED],
        "unreported": len(unreported),
        "unreported_ids": unreported[:NAMED],
        "collect_errors": collect_errors[:NAMED],
        "unreadable_lines": unreadable,
    }


def judge(command: str, exit_code: int | None, summary: dict | None) -> tuple[str, str]:
    """``(failure kind, why)`` for a gate that exited ``exit_code`` with ``summary`` recorded, or
    ``("", "")`` when the record agrees with a pass (or the gate did not exit 0: its status decides)."""
    if exit_code != 0:
        return "", ""
    if summary is None:
        runner = runner_of(command)
        if runner:
            return "runner_incomplete", (f"it exited 0, but {runner} recorded no session: the process ended before "
                                         f"{runner} began, or the engine's reporter was kept out")
        return "", ""
    runner = summary.get("runner") or "pytest"
    if summary.get("unreadable"):
        return "runner_incomplete", f"it exited 0, but {summary['unreadable']}"
    if summary["unreadable_lines"]:
        return "runner_incomplete", (f"it exited 0, but its runner's record holds {summary['unreadable_lines']} "
                                     "line(s) the engine's reporter did not write")
    if summary["unfinished"]:
        return "runner_incomplete", (f"it exited 0, but {runner}'s session never finished: its process ended during "
                                     "the session (os._exit, a crash)" + _named(summary, "unreported_ids",
                                                                                 " before these tests reported"))
    if summary["interrupted"]:
        return "runner_incomplete", (f"it exited 0, but {runner}'s session was interrupted (pytest.exit or an "
                                     "interrupt) before it ran its tests to the end")
    if summary["unreported"]:
        return "runner_incomplete", (f"it exited 0, but {summary['unreported']} collected test(s) never reported "
                                     "an outcome" + _named(summary, "unreported_ids", ""))
    failed = summary["counts"]["failed"] + summary["counts"]["error"]
    if failed:
        return "tests_failed", (f"it exited 0, but {runner} recorded {failed} failed test(s)"
                                + _named(summary, "failed_ids", ""))
    bad = [status for status in summary["statuses"] if status != 0]
    if bad or summary["collect_errors"]:
        return "tests_failed", (f"it exited 0, but {runner}'s session ended with status {bad[0] if bad else 2}"
                                + (f" ({len(summary['collect_errors'])} file(s) could not be collected)"
                                   if summary["collect_errors"] else "") + ": the exit status was changed after it")
    return "", ""


def _named(summary: dict, key: str, lead: str) -> str:
    ids = summary.get(key) or []
    return f"{lead}: {', '.join(ids[:5])}" + (" ..." if len(ids) > 5 else "") if ids else ""


def sentence(summary: dict | None) -> str:
    """What a check page says of a gate's tests: the runner's counts, or that only the exit status decided."""
    if summary is None:
        return ("No test runner record: an exit-status gate (the engine's reporters record pytest and "
                "python -m unittest sessions; this gate ran neither), so only its exit status decided.")
    if summary.get("unreadable"):
        return f"The test runner's record could not be read: {summary['unreadable']}."
    counts = summary["counts"]
    if summary.get("listed") and not summary["collected"]:
        return (f"{summary.get('runner') or 'pytest'} listed {summary['listed']} test(s) and ran none (--collect-only); "
                f"{summary['sessions']} session(s), " + ("finished." if summary["finished"] == summary["sessions"]
                                                          else f"{summary['finished']} finished."))
    shown = ", ".join(f"{counts[name]} {name}" for name in ("passed", "failed", "error", "skipped", "xfailed",
                                                             "xpassed") if counts[name] or name == "passed")
    apart = {"only": "Run apart from new tests, on the agreed tests' files only: ",
             "except": "The new tests, run apart from the agreed ones (every file but theirs): "}.get(
        summary.get("apart") or "", "")
    sessions = summary["sessions"]
    ended = ("finished" if summary["finished"] == sessions and not summary["interrupted"]
             else f"{summary['finished']} of {sessions} finished")
    return (f"{apart}{summary.get('runner') or 'pytest'} recorded {summary['collected']} collected test(s): {shown}; "
            f"{sessions} session(s), {ended}" + (f", status {', '.join(map(str, summary['statuses']))}"
                                                 if summary["statuses"] else "")
            + (f"; {summary['unreported']} never reported" if summary["unreported"] else "") + ".")
