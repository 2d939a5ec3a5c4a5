"""The engine's pytest reporter: loaded into a gate's pytest from outside the worktree, it records
what pytest itself saw, one JSON line at a time, to the file ``CP_TEST_RECORD`` names.

Not imported by the engine: engine/checks/test_reports/__init__.py copies this file, under a module name
made up for each gate (so that no file of the repository can stand in for it), into a folder the
sandbox shows read-only, and names it in ``PYTEST_PLUGINS``. Runs inside the gate's Python, which
may be any Python 3.8 or later with any pytest from 7 on: the standard library and pytest only.

Lines (``e`` is the event):

* ``{"e": "start", "pid", "apart"}``: the session began (before collection); ``apart`` is ``only``
  or ``except`` when it collects only the listed test files, or all but them;
* ``{"e": "collected", "pid", "ids", "only"}``: the test ids pytest will run, after deselection
  (``only``: ``--collect-only``, none will run, and ``marked`` lists those a skip, a true skipif or
  an xfail mark stands on; with pytest-xdist, ``"worker"`` names the worker that collected them);
* ``{"e": "report", "id", "when", "outcome", "xfail"}``: a test's setup, call or teardown ended;
* ``{"e": "collect_error", "id"}``: a file or folder could not be collected;
* ``{"e": "interrupted", "pid", "status"}``: ``pytest.exit()`` or Ctrl-C ended the session early;
* ``{"e": "finish", "pid", "status"}``: the session ended, with the exit status pytest returns.

A session whose process ends without its ``finish`` line (``os._exit`` in a test, in the code it
imports, at collection) is incomplete; so is a session whose collected tests did not each report.
What is recorded here is still written by the process under test: the engine takes it as the
runner's own record, checked against the exit status, never as proof beyond that.
"""
import json
import os
import platform
import sys

import pytest

_PATH = os.environ.pop("CP_TEST_RECORD", "")
# a test that runs pytest itself (pytester, a subprocess) does not write into the gate's record
_OTHERS = [name for name in os.environ.get("PYTEST_PLUGINS", "").split(",")
           if name.strip() and name.strip() != __name__]
if _OTHERS:
    os.environ["PYTEST_PLUGINS"] = ",".join(_OTHERS)
else:
    os.environ.pop("PYTEST_PLUGINS", None)


def _files(name):
    """The test files named one per line in the file the variable ``name`` names (the engine wrote it into
    this module's read-only folder), or None."""
    path = os.environ.pop(name, "")
    if not path:
        return None
    with open(path, encoding="utf-8") as listed:
        return {line.rstrip("\n") for line in listed if line.strip()}


# the agreed tests run apart from new ones: one invocation collects only the agreed tests' files
# (CP_TEST_ONLY), another every file but those (CP_TEST_EXCEPT)
_ONLY = _files("CP_TEST_ONLY")
_EXCEPT = _files("CP_TEST_EXCEPT")
_FD = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600) if _PATH else None


def _write(entry):
    if _FD is None:
        return
    data = (json.dumps(entry, separators=(",", ":")) + "\n").encode("utf-8", "backslashreplace")
    while data:  # O_APPEND: each line lands whole after the last one
        data = data[os.write(_FD, data):]


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path, config):
    if (_ONLY is None and _EXCEPT is None) or collection_path.name in ("__init__.py", "conftest.py"):
        return None
    if not collection_path.is_file():
        return None
    try:
        relative = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    if (_ONLY is not None and relative not in _ONLY) or (_EXCEPT is not None and relative in _EXCEPT):
        return True
    return None


def pytest_sessionstart(session):
    _write({"e": "start", "pid": os.getpid(),
            "apart": "only" if _ONLY is not None else "except" if _EXCEPT is not None else None})


def _marked(item):
    """Whether a skip, a true skipif or an xfail mark stands on the test where it was collected (what
    ``--collect-only`` cannot run to find out)."""
    for mark in item.iter_markers():
        if mark.name in ("skip", "xfail"):
            return True
        if mark.name == "skipif":
            conditions = mark.args or ((mark.kwargs["condition"],) if "condition" in mark.kwargs else ())
            try:
                if any(bool(eval(c, {"os": os, "sys": sys, "platform": platform, "config": item.config},
                                 getattr(item, "module", None) and vars(item.module) or {}))
                       if isinstance(c, str) else bool(c) for c in conditions):
                    return True
            except Exception:  # a condition it cannot weigh: not counted as marked
                pass
    return False


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    only = bool(session.config.getoption("collectonly", False))
    entry = {"e": "collected", "pid": os.getpid(), "ids": [item.nodeid for item in session.items], "only": only}
    if only:
        entry["marked"] = [item.nodeid for item in session.items if _marked(item)]
    _write(entry)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    _write({"e": "collected", "pid": os.getpid(), "ids": list(ids), "worker": str(getattr(node, "gateway", node))})


def pytest_collectreport(report):
    if report.failed:
        _write({"e": "collect_error", "id": report.nodeid})


def pytest_runtest_logreport(report):
    _write({"e": "report", "id": report.nodeid, "when": report.when, "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail")})


def pytest_keyboard_interrupt(excinfo):
    _write({"e": "interrupted", "pid": os.getpid(), "status": getattr(excinfo.value, "returncode", None)})


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if _EXCEPT is not None and int(session.exitstatus) == 5 and not session.testscollected:
        # the new tests' invocation found none to collect (every test was an agreed one, run apart): not a failure
        session.exitstatus = 0
    _write({"e": "finish", "pid": os.getpid(), "status": int(session.exitstatus)})
