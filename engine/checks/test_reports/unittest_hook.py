"""The engine's unittest reporter: copied as ``sitecustomize.py`` into a gate's reporter folder (first
on the gate's ``PYTHONPATH``, shown read-only by the sandbox), so every Python the gate starts
imports it at start-up, before the worktree is on ``sys.path``. It does nothing unless this
process is ``python -m unittest ...`` (``sys.orig_argv``, Python 3.10 and later): then it wraps
unittest's ``TextTestRunner.run`` to record what unittest itself saw, in the lines the pytest
reporter writes (engine/checks/test_reports/pytest_plugin.py), to the file ``CP_TEST_RECORD`` names.

Test ids are written as pytest writes them (``tests/test_x.py::TestY::test_z``: the test's module
file, relative to the current folder, then its class and method), so a gate's agreed tests and
the run-apart lists (``CP_TEST_ONLY``, ``CP_TEST_EXCEPT``) work the same for both runners.
``CP_TEST_COLLECT_ONLY``: list the tests (``"only": true``, with those a skip decorator stands on
as ``marked``) and run none.

Any ``sitecustomize`` that this one hides (a virtual environment's own) is loaded after it.
Runs inside the gate's Python: the standard library only.
"""
import os
import sys


def _unittest_main():
    argv = list(getattr(sys, "orig_argv", []) or [])
    index = 1
    while index < len(argv):
        word = argv[index]
        if word == "-munittest" or (word == "-m" and argv[index + 1:index + 2] == ["unittest"]):
            return True
        if word in ("-c", "-m") or word.startswith(("-c", "-m")) or not word.startswith("-"):
            return False  # the program is something else
        index += 2 if word in ("-X", "-W") else 1  # an option's own argument
    return False


def _next_sitecustomize():
    """Load the ``sitecustomize`` this file hides, if there is one further on ``sys.path``."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py does with a failing sitecustomize
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


def _listed(name):
    """The set of lines of the file the variable ``name`` names (the variable removed), or None."""
    listed = os.environ.pop(name, "")
    if not listed:
        return None
    with open(listed, encoding="utf-8") as lines:
        return {line.rstrip("\n") for line in lines if line.strip()}


def _limit_discovery(only, exclude, top):
    """Discovery imports no test file of the other part, and in the agreed part no package that holds
    none of the agreed files: a new module cannot patch, at import, what the agreed tests call (a
    test module named on the command line is the gate author's choice)."""
    import unittest.loader

    find = unittest.loader.TestLoader._find_test_path
    folders = {os.path.dirname(name) for name in only or ()}

    def find_test_path(self, full_path, *args, **kwargs):
        relative = os.path.relpath(os.path.abspath(full_path), top).replace(os.sep, "/")
        if os.path.isfile(full_path):
            if (only is not None and relative not in only) or (exclude is not None and relative in exclude):
                return None, False
        elif only is not None and not any(folder == relative or folder.startswith(relative + "/")
                                          for folder in folders):
            return None, False  # a package holding no agreed file: its __init__.py is not imported either
        return find(self, full_path, *args, **kwargs)

    unittest.loader.TestLoader._find_test_path = find_test_path


def _flat(suite):
    import unittest

    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _flat(test)
        else:
            yield test


def _broken(test):
    """A module unittest could not import, or a class fixture that failed."""
    return type(test).__name__ in ("_FailedTest", "_ErrorHolder") or type(test).__module__ == "unittest.loader"


def _marked(test):
    method = getattr(test, getattr(test, "_testMethodName", ""), None)
    return bool(getattr(type(test), "__unittest_skip__", False) or getattr(method, "__unittest_skip__", False)
                or getattr(method, "__unittest_expecting_failure__", False))


class _Record:
    """The session's record file (``CP_TEST_RECORD``) and what it writes there."""

    def __init__(self, path, top, only, exclude):
        self.top, self.only, self.exclude = top, only, exclude
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)

    def write(self, entry):
        import json

        data = (json.dumps(entry, separators=(",", ":")) + "\n").encode("utf-8", "backslashreplace")
        while data:
            data = data[os.write(self.fd, data):]

    def file_of(self, test):
        module = sys.modules.get(type(test).__module__)
        name = getattr(module, "__file__", None)
        if not name:
            return None
        relative = os.path.relpath(os.path.abspath(name), self.top)
        return None if relative.startswith("..") else relative.replace(os.sep, "/")

    def test_id(self, test):
        relative = self.file_of(test)
        method = getattr(test, "_testMethodName", None)
        if relative is None or method is None:
            return test.id()
        return f"{relative}::{type(test).__qualname__.replace('.', '::')}::{method}"

    def report(self, test, outcome, xfail=False):
        test = getattr(test, "test_case", test)  # a subTest's skip or failure is its test's
        if _broken(test):
            self.write({"e": "collect_error", "id": test.id()})
        else:
            self.write({"e": "report", "id": self.test_id(test), "when": "call", "outcome": outcome, "xfail": xfail})

    def recorded(self, method, outcome, xfail):
        def recorded(test, *args, **kwargs):
            self.report(test, outcome, xfail)
            return method(test, *args, **kwargs)
        return recorded

    def result_class(self, base):
        """Wraps the runner's result class: each outcome is recorded, then handed on."""
        record = self

        def make(*args, **kwargs):
            result = base(*args, **kwargs)
            result.addSuccess = record.recorded(result.addSuccess, "passed", False)
            result.addFailure = record.recorded(result.addFailure, "failed", False)
            result.addError = record.recorded(result.addError, "error", False)
            result.addSkip = record.recorded(result.addSkip, "skipped", False)
            result.addExpectedFailure = record.recorded(result.addExpectedFailure, "skipped", True)
            result.addUnexpectedSuccess = record.recorded(result.addUnexpectedSuccess, "passed", True)
            sub = result.addSubTest

            def add_sub_test(test, subtest, err):
                if err is not None:
                    record.report(test, "failed" if issubclass(err[0], test.failureException) else "error")
                return sub(test, subtest, err)

            result.addSubTest = add_sub_test
            return result
        return make

    def kept(self, test):
        """Whether ``test`` belongs to this part of a run-apart session (a broken one always does)."""
        return _broken(test) or ((self.only is None or self.file_of(test) in self.only)
                                 and (self.exclude is None or self.file_of(test) not in self.exclude))

    def run(self, runner, test, original_run, collect_only):
        import unittest

        tests = [t for t in _flat(test) if self.kept(t)]
        for bad in (t for t in tests if _broken(t)):
            self.write({"e": "collect_error", "id": bad.id()})
        runnable = [t for t in tests if not _broken(t)]
        entry = {"e": "collected", "pid": os.getpid(), "ids": [self.test_id(t) for t in runnable],
                 "only": collect_only}
        if collect_only:
            entry["marked"] = [self.test_id(t) for t in runnable if _marked(t)]
            self.write(entry)
            self.write({"e": "finish", "pid": os.getpid(), "status": 0})
            sys.exit(0)
        self.write(entry)
        if self.exclude is not None and not tests:  # the new tests' invocation found none: not a failure
            self.write({"e": "finish", "pid": os.getpid(), "status": 0})
            sys.exit(0)
        runner.resultclass = self.result_class(runner.resultclass)
        result = original_run(runner, unittest.TestSuite(tests))
        self.write({"e": "finish", "pid": os.getpid(), "status": 0 if result.wasSuccessful() else 1})
        return result


def _install():
    import unittest.runner

    path = os.environ.pop("CP_TEST_RECORD", "")
    collect_only = os.environ.pop("CP_TEST_COLLECT_ONLY", "") == "1"
    only, exclude = _listed("CP_TEST_ONLY"), _listed("CP_TEST_EXCEPT")
    if not path:
        return
    top = os.getcwd()
    if only is not None or exclude is not None:
        _limit_discovery(only, exclude, top)
    record = _Record(path, top, only, exclude)
    # the session starts now, before discovery imports the test modules (a module that ends the process
    # there leaves a session that never finished)
    record.write({"e": "start", "pid": os.getpid(), "runner": "unittest",
                  "apart": "only" if only is not None else "except" if exclude is not None else None})
    original_run = unittest.runner.TextTestRunner.run

    def run(self, test):
        return record.run(self, test, original_run, collect_only)

    unittest.runner.TextTestRunner.run = run


if _unittest_main():
    _install()
_next_sitecustomize()
