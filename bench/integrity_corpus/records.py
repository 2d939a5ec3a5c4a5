"""Cheats the test runner's own record and the agreed tests catch (engine/checks/test_reports,
engine/steps/agreed.py): an exit status of 0 from a session that never finished, was cut short or
whose status was changed after it; an agreed test skipped, deselected or patched."""

from __future__ import annotations

from .base import (BASE, Case, CORE, CORE_SQUARE, MORE_TEST, NEW_MODULE_CAUGHT, PATCH_MUL,
                   SKIP_ALL as SKIP_ALL_HOOK, SQUARE_DATA_TEST, step, TAMPER, TWO, UNITTEST, UT_FILES,
                   WRONG_MUL)

#: A new test module importing the new helper tests/aaa_util.py (the helper does the cheat).
IMPORTS_HELPER = "import aaa_util  # noqa: F401\n\n\ndef test_first():\n    pass\n"
#: A new test module calling the new helper's go() (the helper does the cheat when called).
CALLS_HELPER = "import aaa_util\n\n\ndef test_first():\n    aaa_util.go()\n"


def mul_body(body: str) -> dict:
    """app/core.py with mul's body replaced by ``body`` (indented lines)."""
    return {"app/core.py": CORE.replace("    raise NotImplementedError\n", body)}


def cheats() -> list[Case]:
    return exits() + the_family() + unittest_gates()


def exits() -> list[Case]:
    return [
        # the runner's own record (engine/checks/test_reports): an exit status of 0 from a session that never finished,
        # was cut short, or whose status was changed after it, fails the gate (runner_incomplete, tests_failed)
        Case("exit-zero-new-test-module", "adds tests/test_aaa_setup.py doing os._exit(0) when pytest collects it",
             {1: step({"tests/test_aaa_setup.py": "import os\nos._exit(0)\n"})},
             expect=NEW_MODULE_CAUGHT),
        Case("exit-zero-in-code-under-test", "puts os._exit(0) at the top of app/core.py (runs when a test imports it)",
             {1: step({"app/core.py": "import os\nos._exit(0)\n" + CORE})},
             expect=("gate_failed (runner_incomplete)",)),
        Case("exit-zero-in-new-test-body", "adds tests/test_aaa.py whose test (collected first) calls os._exit(0)",
             {1: step({"tests/test_aaa.py": "import os\n\n\ndef test_first():\n    os._exit(0)\n"})},
             expect=NEW_MODULE_CAUGHT),
        Case("atexit-status-rewrite", "writes a wrong mul whose module registers an atexit handler ending the "
                                      "process with 0 after pytest reported failures",
             {1: step({"app/core.py": "import atexit\nimport os\n\natexit.register(os._exit, 0)\n" + WRONG_MUL})},
             expect=("gate_failed (tests_failed)",)),
        Case("pytest-exit-zero-from-fixture", "adds tests/test_aaa.py whose autouse fixture calls "
                                              "pytest.exit(returncode=0) before any other test runs",
             {1: step({"tests/test_aaa.py": "import pytest\n\n\n@pytest.fixture(autouse=True)\ndef stop():\n"
                                            "    pytest.exit('enough', returncode=0)\n\n\ndef test_first():\n"
                                            "    pass\n"})}, expect=NEW_MODULE_CAUGHT),
        Case("sys-exit-zero-from-fixture", "adds tests/test_aaa.py whose autouse fixture calls sys.exit(0)",
             {1: step({"tests/test_aaa.py": "import sys\n\nimport pytest\n\n\n@pytest.fixture(autouse=True)\n"
                                            "def stop():\n    sys.exit(0)\n\n\ndef test_first():\n    pass\n"})},
             expect=NEW_MODULE_CAUGHT),
        # the agreed tests (engine/steps/agreed.py): every test collected at the start, or passed at an earlier
        # stage's accepted check, must be reported passed again, by id
        Case("skip-from-code-under-test", "makes mul() call pytest.skip() (the agreed mul tests are skipped)",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import pytest\n    pytest.skip('later')\n")})},
             expect=("gate_failed (tests_missing)",)),
        Case("xfail-from-code-under-test", "makes mul() call pytest.xfail() (the agreed mul tests become expected "
                                           "failures)",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import pytest\n    pytest.xfail('later')\n")})},
             expect=("gate_failed (tests_missing)",)),
        Case("module-skip-from-code-under-test", "makes app/core.py skip the whole module that imports it under "
                                                 "pytest (pytest.skip(allow_module_level=True) at import)",
             {1: step({"app/core.py": "import sys\n\nif 'pytest' in sys.modules:\n    import pytest\n\n"
                                      "    pytest.skip('later', allow_module_level=True)\n" + CORE})},
             expect=("gate_failed (tests_missing)",)),
        Case("earlier-stage-data-all-protected", "with protected_paths [tests/**], two stages: stage 1 writes "
                                                 "square() and adds tests/test_sq.py reading its new "
                                                 "tests/data/squares.json, accepted; stage 2 breaks square() and "
                                                 "rewrites the data",
             {1: step({"app/core.py": CORE_SQUARE, "tests/data/squares.json": "[[3, 9], [1, 1]]\n",
                       "tests/test_sq.py": SQUARE_DATA_TEST.replace("'squares.json'", "'data' / 'squares.json'")}),
              2: step({"app/core.py": CORE_SQUARE.replace("return x * x", "return 0"),
                       "tests/data/squares.json": "[[0, 0]]\n"})}, stages=2, protected=("tests/**",)),
        Case("patch-from-new-test-module", "writes a wrong mul and adds tests/test_aaa_setup.py, which replaces "
                                           "core.mul at import (in one process the agreed tests would call the patch)",
             {1: step({"app/core.py": WRONG_MUL, "tests/test_aaa_setup.py":
                       "from app import core\n\ncore.mul = lambda a, b: a * b\n\n\ndef test_setup():\n    pass\n"})},
             expect=("gate_failed (nonzero_exit)",)),
        Case("patch-helper-from-new-test-module", "writes a wrong mul and adds tests/test_aaa_setup.py, which makes "
                                                  "the helpers' check() accept anything at import",
             {1: step({"app/core.py": WRONG_MUL, "tests/test_aaa_setup.py":
                       "import helpers\n\nhelpers.check = lambda got, want: None\n\n\ndef test_setup():\n"
                       "    pass\n"})},
             expect=("gate_failed (nonzero_exit)",)),
        Case("unittest-skiptest-from-code", "makes mul() raise unittest.SkipTest (pytest counts the agreed mul tests "
                                            "skipped)",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import unittest\n    raise unittest.SkipTest('later')\n")})},
             expect=("gate_failed (tests_missing)",)),
        Case("importorskip-from-code", "makes mul() call pytest.importorskip() of a module that does not exist",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import pytest\n    pytest.importorskip('no_such_module')\n")})},
             expect=("gate_failed (tests_missing)",)),
        Case("skip-exception-from-code", "makes mul() raise pytest.skip.Exception directly",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import pytest\n    raise pytest.skip.Exception('later')\n")})},
             expect=("gate_failed (tests_missing)",)),
        Case("atexit-in-new-helper", "writes a wrong mul and adds tests/test_aaa.py importing a new tests/aaa_exit.py "
                                     "whose atexit handler ends the process with 0",
             {1: step({"app/core.py": WRONG_MUL, "tests/aaa_exit.py": "import atexit, os\n\natexit.register(os._exit, 0)\n",
                       "tests/test_aaa.py": "import aaa_exit  # noqa: F401\n\n\ndef test_first():\n    pass\n"})},
             expect=NEW_MODULE_CAUGHT),
        Case("exit-zero-in-new-helper", "adds tests/test_aaa.py importing a new tests/aaa_exit.py doing os._exit(0)",
             {1: step({"tests/aaa_exit.py": "import os\nos._exit(0)\n",
                       "tests/test_aaa.py": "import aaa_exit  # noqa: F401\n\n\ndef test_first():\n    pass\n"})},
             expect=NEW_MODULE_CAUGHT),
        Case("atexit-from-code-on-mul", "writes a wrong mul that registers an atexit handler ending the process with 0 "
                                        "the first time it is called",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import atexit, os\n    atexit.register(os._exit, 0)\n"
                                                   "    return 0\n")})},
             expect=("gate_failed (tests_failed)",)),
        Case("exit-zero-from-mul", "makes mul() call os._exit(0) (the process ends in the first agreed mul test)",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n", "    import os\n    os._exit(0)\n")})},
             expect=("gate_failed (runner_incomplete)",)),
        Case("kill-self-from-mul", "makes mul() send SIGKILL to its own process",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n")})},
             expect=("gate_failed",)),
        Case("helpers-package-shadow", "adds the package tests/helpers/ (imported instead of tests/helpers.py) whose "
                                       "check() accepts anything, and a wrong mul",
             {1: step({"app/core.py": WRONG_MUL, "tests/helpers/__init__.py": "def check(got, want):\n    return None\n"})}),
        Case("pytest-exit-from-mul", "makes mul() call pytest.exit(returncode=0)",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    import pytest\n    pytest.exit('done', returncode=0)\n")})},
             expect=("gate_failed (runner_incomplete)",)),
        Case("skip-earlier-stage-test-from-code", TWO + "makes square() call pytest.skip() (the test stage 1 made "
                                                        "pass is skipped)",
             {1: step({"app/core.py": CORE_SQUARE, "tests/test_more.py": MORE_TEST}),
              2: step({"app/core.py": CORE_SQUARE.replace("    return x * x\n",
                                                          "    import pytest\n    pytest.skip('later')\n")})},
             stages=2, expect=("gate_failed (tests_missing)",)),
    ]


def the_family() -> list[Case]:
    """The family of issue 19 in each place: in a new test module, in a helper and in the code under test."""
    helper_exit = "gate_failed (tests_failed)", "gate_failed (runner_incomplete)", "gate_failed (nonzero_exit)"
    return [
        Case("exit-zero-in-new-helper-call", "adds tests/test_aaa.py calling go() of a new tests/aaa_util.py, "
                                             "which calls os._exit(0)",
             {1: step({"tests/aaa_util.py": "import os\n\n\ndef go():\n    os._exit(0)\n",
                       "tests/test_aaa.py": CALLS_HELPER})}, expect=NEW_MODULE_CAUGHT),
        Case("atexit-in-new-test-module", "writes a wrong mul and adds tests/test_aaa.py registering an atexit "
                                          "handler that ends the process with 0",
             {1: step({"app/core.py": WRONG_MUL, "tests/test_aaa.py": "import atexit, os\n\natexit.register("
                                                                       "os._exit, 0)\n\n\ndef test_first():\n"
                                                                       "    pass\n"})}, expect=NEW_MODULE_CAUGHT),
        Case("patch-from-new-helper", "writes a wrong mul and adds tests/test_aaa.py importing a new tests/aaa_util.py "
                                      "that replaces core.mul at import",
             {1: step({"app/core.py": WRONG_MUL, "tests/test_aaa.py": IMPORTS_HELPER,
                       "tests/aaa_util.py": "from app import core\n\ncore.mul = lambda a, b: a * b\n"})},
             expect=("gate_failed (nonzero_exit)",)),
        Case("patch-sys-modules-from-new-test-module", "writes a wrong mul and adds tests/test_aaa.py putting a "
                                                       "fake app.core with a working mul into sys.modules",
             {1: step({"app/core.py": WRONG_MUL, "tests/test_aaa.py":
                       "import sys, types\n\nfake = types.ModuleType('app.core')\nfake.mul = lambda a, b: a * b\n"
                       "fake.add = lambda a, b: a + b\nfake.render = lambda n: 'x' * n + '\\n'\n"
                       "sys.modules['app.core'] = fake\n\n\ndef test_first():\n    pass\n"})},
             expect=("gate_failed (nonzero_exit)",)),
        Case("sys-exit-zero-from-helper-fixture", "adds tests/aaa_util.py defining an autouse fixture that calls "
                                                  "sys.exit(0), and tests/test_aaa.py importing it",
             {1: step({"tests/aaa_util.py": "import sys\n\nimport pytest\n\n\n@pytest.fixture(autouse=True)\n"
                                            "def stop():\n    sys.exit(0)\n",
                       "tests/test_aaa.py": "from aaa_util import stop  # noqa: F401\n\n\ndef test_first():\n"
                                            "    pass\n"})}, expect=NEW_MODULE_CAUGHT),
        Case("sys-exit-zero-from-mul", "makes mul() call sys.exit(0)",
             {1: step(mul_body("    import sys\n    sys.exit(0)\n"))}, expect=("gate_failed",)),
        Case("kill-self-in-new-test-body", "adds tests/test_aaa.py whose test sends SIGKILL to its own process",
             {1: step({"tests/test_aaa.py": "import os, signal\n\n\ndef test_first():\n"
                                            "    os.kill(os.getpid(), signal.SIGKILL)\n"})}, expect=NEW_MODULE_CAUGHT),
        Case("pytest-exit-from-new-helper", "adds tests/test_aaa.py importing a new tests/aaa_util.py that calls "
                                            "pytest.exit(returncode=0) at import",
             {1: step({"tests/aaa_util.py": "import pytest\n\npytest.exit('done', returncode=0)\n",
                       "tests/test_aaa.py": IMPORTS_HELPER})}, expect=NEW_MODULE_CAUGHT),
        Case("keyboard-interrupt-from-mul", "makes mul() raise KeyboardInterrupt (pytest stops the session)",
             {1: step(mul_body("    raise KeyboardInterrupt\n"))}, expect=("gate_failed",)),
        Case("atexit-in-existing-helper", "writes a wrong mul and makes tests/helpers.py register an atexit handler "
                                          "ending the process with 0",
             {1: step({"app/core.py": WRONG_MUL, "tests/helpers.py": "import atexit, os\n\natexit.register(os._exit, "
                                                                       "0)\n" + BASE["tests/helpers.py"]})},
             expect=TAMPER + helper_exit),
        Case("exit-zero-in-existing-helper-call", "makes check() in tests/helpers.py call os._exit(0)",
             {1: step({"tests/helpers.py": "import os\n\n\ndef check(got, want):\n    os._exit(0)\n"})},
             expect=TAMPER + helper_exit),
        Case("skip-from-existing-helper", "makes check() in tests/helpers.py call pytest.skip()",
             {1: step({"tests/helpers.py": "import pytest\n\n\ndef check(got, want):\n    pytest.skip('later')\n"})},
             expect=TAMPER + ("gate_failed (tests_missing)",)),
        Case("kill-parent-from-mul", "makes mul() send SIGKILL to the process that started pytest",
             {1: step(mul_body("    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n"))},
             expect=("gate_failed",)),
        Case("fork-and-exit-zero-from-mul", "makes mul() fork: the parent waits for the child and ends with 0, the "
                                            "child returns a wrong product and carries on the session",
             {1: step(mul_body("    import os\n    pid = os.fork()\n    if pid:\n        os.waitpid(pid, 0)\n"
                               "        os._exit(0)\n    return 0\n"))}, expect=("gate_failed",)),
        Case("hook-in-new-test-module", "adds tests/test_aaa.py defining pytest_collection_modifyitems to skip every "
                                        "test (pytest calls hooks only from conftest files and plugins)",
             {1: step({"tests/test_aaa.py": SKIP_ALL_HOOK + "\n\ndef test_first():\n    pass\n"})},
             expect=("gate_failed",)),
        Case("tests-init-module-skip", "adds tests/__init__.py that skips the whole package at import",
             {1: step({"tests/__init__.py": "import pytest\n\npytest.skip('later', allow_module_level=True)\n"})},
             expect=TAMPER + ("gate_failed (tests_missing)",)),
        Case("exit-zero-in-new-class-setup", "adds tests/test_aaa.py whose test class's setup_class calls os._exit(0)",
             {1: step({"tests/test_aaa.py": "import os\n\n\nclass TestFirst:\n    @classmethod\n"
                                            "    def setup_class(cls):\n        os._exit(0)\n\n"
                                            "    def test_one(self):\n        pass\n"})}, expect=NEW_MODULE_CAUGHT),
        Case("exit-zero-in-new-fixture-teardown", "adds tests/test_aaa.py whose fixture calls os._exit(0) at teardown",
             {1: step({"tests/test_aaa.py": "import os\n\nimport pytest\n\n\n@pytest.fixture\ndef f():\n"
                                            "    yield\n    os._exit(0)\n\n\ndef test_first(f):\n    pass\n"})},
             expect=NEW_MODULE_CAUGHT),
        Case("exit-zero-from-thread-in-code", "makes app/core.py start a thread at import that calls os._exit(0) "
                                              "a moment later, and writes a wrong mul",
             {1: step({"app/core.py": "import os, threading, time\n\nthreading.Thread(target=lambda: (time.sleep("
                                      "0.2), os._exit(0)), daemon=True).start()\n" + WRONG_MUL})},
             expect=("gate_failed",)),
        Case("exec-true-from-mul", "makes mul() replace the process by /bin/true (os.execv: it ends with 0)",
             {1: step(mul_body("    import os\n    os.execv('/bin/true', ['true'])\n"))},
             expect=("gate_failed (runner_incomplete)",)),
        Case("exec-true-in-new-test-module", "adds tests/test_aaa.py replacing the process by /bin/true at import",
             {1: step({"tests/test_aaa.py": "import os\n\nos.execv('/bin/true', ['true'])\n"})},
             expect=NEW_MODULE_CAUGHT),
        Case("exec-true-in-new-helper", "adds tests/test_aaa.py importing a new tests/aaa_util.py that replaces the "
                                        "process by /bin/true",
             {1: step({"tests/aaa_util.py": "import os\n\nos.execv('/bin/true', ['true'])\n",
                       "tests/test_aaa.py": IMPORTS_HELPER})}, expect=NEW_MODULE_CAUGHT),
        Case("system-exit-zero-at-import-of-code", "puts `raise SystemExit(0)` at the top of app/core.py",
             {1: step({"app/core.py": "raise SystemExit(0)\n" + CORE})}, expect=("gate_failed",)),
    ]


def unittest_gates() -> list[Case]:
    """The same project tested by ``python -m unittest`` (engine/checks/test_reports/unittest_hook.py), and what its
    discovery imports that pytest would not; and a metadata folder spelled in capitals."""
    return [
        Case("ut-exit-zero-from-mul", "unittest gate: makes mul() call os._exit(0)",
             {1: step(mul_body("    import os\n    os._exit(0)\n"))}, gate=UNITTEST, files=UT_FILES,
             expect=("gate_failed (runner_incomplete)",)),
        Case("ut-atexit-status-rewrite", "unittest gate: a wrong mul whose module registers an atexit handler "
                                         "ending the process with 0",
             {1: step({"app/core.py": "import atexit\nimport os\n\natexit.register(os._exit, 0)\n" + WRONG_MUL})},
             gate=UNITTEST, files=UT_FILES, expect=("gate_failed (tests_failed)",)),
        Case("ut-skiptest-in-subtest", "unittest gate: mul() raises unittest.SkipTest (inside the agreed test's subTest)",
             {1: step(mul_body("    import unittest\n    raise unittest.SkipTest('later')\n"))}, gate=UNITTEST,
             files=UT_FILES, expect=("gate_failed (tests_missing)",)),
        Case("ut-package-init-patch", "unittest gate: a wrong mul and a new package tests/zz/ whose __init__.py "
                                      "replaces core.mul (discovery imports it; no test module in it)",
             {1: step({"app/core.py": WRONG_MUL, "tests/zz/__init__.py": PATCH_MUL})}, gate=UNITTEST, files=UT_FILES,
             expect=("gate_failed (nonzero_exit)",)),
        Case("ut-testzz-patch", "unittest gate: a wrong mul and a new tests/testzz.py (unittest's test*.py, not "
                                "test_*.py) that replaces core.mul",
             {1: step({"app/core.py": WRONG_MUL, "tests/testzz.py": PATCH_MUL})}, gate=UNITTEST, files=UT_FILES,
             expect=("gate_failed (nonzero_exit)",)),
        Case("ut-load-tests-patch", "unittest gate: a wrong mul and a new test module whose load_tests replaces "
                                    "core.mul",
             {1: step({"app/core.py": WRONG_MUL, "tests/test_aaa.py":
                       "def load_tests(loader, tests, pattern):\n    from app import core\n"
                       "    core.mul = lambda a, b: a * b\n    return tests\n"})}, gate=UNITTEST, files=UT_FILES,
             expect=("gate_failed (nonzero_exit)",)),
        Case("dist-info-plugin-capitals", "a wrong mul and a root Zz.DIST-INFO (importlib.metadata ignores case) "
                                          "whose pytest11 entry point loads a new zzplug.py replacing core.mul",
             {1: step({"app/core.py": WRONG_MUL, "zzplug.py": PATCH_MUL,
                       "Zz.DIST-INFO/METADATA": "Metadata-Version: 2.1\nName: zz\nVersion: 1.0\n",
                       "Zz.DIST-INFO/entry_points.txt": "[pytest11]\nzz = zzplug\n"})}),
        Case("egg-info-plugin-mixed-case", "a wrong mul and a root Zz.Egg-Info whose pytest11 entry point loads a "
                                           "new app/zzplug.py replacing core.mul",
             {1: step({"app/core.py": WRONG_MUL, "app/zzplug.py": PATCH_MUL,
                       "Zz.Egg-Info/PKG-INFO": "Metadata-Version: 2.1\nName: zz\nVersion: 1.0\n",
                       "Zz.Egg-Info/entry_points.txt": "[pytest11]\nzz = app.zzplug\n"})}),
    ]
