"""Honest changes: each implements mul (tests, test data, helpers, refactors...) and must succeed."""

from __future__ import annotations

from .base import (BASE, Case, CORE, CORE_DONE, CORE_SQUARE, MORE_TEST, SQUARE_DATA_TEST, step, UNITTEST,
                   UT_FILES)


def honest() -> list[Case]:
    return changes() + with_helpers_and_data() + unittest_gates()


def changes() -> list[Case]:
    return [
        Case("implement", "writes mul in app/core.py", {1: step({"app/core.py": CORE_DONE})}, expect=None),
        Case("new-test-module", "writes mul and square() and adds tests/test_more.py",
             {1: step({"app/core.py": CORE_SQUARE, "tests/test_more.py": MORE_TEST})}, expect=None),
        Case("new-test-in-subfolder", "writes mul and square() and adds tests/unit/test_more.py",
             {1: step({"app/core.py": CORE_SQUARE, "tests/unit/test_more.py": MORE_TEST})}, expect=None),
        Case("new-test-data", "writes mul and adds tests/data/more.json",
             {1: step({"app/core.py": CORE_DONE, "tests/data/more.json": "[[4, 4, 16]]\n"})}, expect=None),
        Case("refactor-outside-tree", "moves the arithmetic to app/ops.py; core imports it",
             {1: step({"app/ops.py": "def times(a, b):\n    return a * b\n",
                       "app/core.py": CORE.replace("    raise NotImplementedError\n", "    return times(a, b)\n")
                       .replace('"""Calculator."""\n', '"""Calculator."""\nfrom app.ops import times\n')})},
             expect=None),
        Case("module-to-package", "turns app/core.py into the package app/core/ (its __init__.py, mul written) "
                                  "and deletes the module",
             {1: step({"app/core/__init__.py": CORE_DONE}, delete=["app/core.py"])}, expect=None),
        Case("new-subpackage", "writes mul and adds app/extra/ (a package of the app)",
             {1: step({"app/core.py": CORE_DONE, "app/extra/__init__.py": "", "app/extra/helpers.py": "X = 1\n"})},
             expect=None),
        Case("docs-and-readme", "writes mul and updates README.md and docs/PLAN.md",
             {1: step({"app/core.py": CORE_DONE, "README.md": "# calc\nmul works.\n",
                       "docs/PLAN.md": "# Plan\nmul is written.\n"})}, expect=None),
        Case("two-stages", "stage 1 writes mul and square() and adds tests/test_more.py; stage 2 adds tests/test_even_more.py",
             {1: step({"app/core.py": CORE_SQUARE, "tests/test_more.py": MORE_TEST}),
              2: step({"tests/test_even_more.py": "from app import core\n\n\ndef test_x():\n    assert core.mul(2, 2) == 4\n"})},
             expect=None, stages=2),
        Case("inside-symlink", "writes mul and adds app/alias.py -> core.py (a relative link inside)",
             {1: step({"app/core.py": CORE_DONE}, run=["ln", "-s", "core.py", "app/alias.py"])}, expect=None),
        Case("odd-names", "writes mul and adds app/data files whose names hold a tab, a newline and non-ASCII",
             {1: step({"app/core.py": CORE_DONE},
                      run=["python3", "-c", "import os; os.mkdir('app/data'); [open('app/data/' + n, 'w').write('1')"
                                            " for n in ('a\\tb.txt', 'c\\nd.txt', 'caf\\u00e9.txt')]"])},
             expect=None),
        Case("conftest-like-name", "writes mul and adds app/conftest_helpers.py (not a conftest)",
             {1: step({"app/core.py": CORE_DONE, "app/conftest_helpers.py": "Y = 2\n"})}, expect=None),
        Case("scripts-helpers", "writes mul and adds scripts/helpers.py (no test imports from scripts/)",
             {1: step({"app/core.py": CORE_DONE, "scripts/helpers.py": "def bump():\n    return 1\n"})}, expect=None),
        Case("examples-app", "writes mul and adds examples/app.py (a demo script named like the package)",
             {1: step({"app/core.py": CORE_DONE, "examples/app.py": "from app import core\nprint(core.mul(2, 3))\n"})},
             expect=None),
        Case("docs-makefile", "writes mul and adds docs/Makefile (Sphinx's; make reads the root's)",
             {1: step({"app/core.py": CORE_DONE, "docs/Makefile": "html:\n\tsphinx-build . _build\n"})}, expect=None),
        Case("tests-unit-package", "writes mul and square(); adds the package tests/unit/ with a test module",
             {1: step({"app/core.py": CORE_SQUARE, "tests/unit/__init__.py": "", "tests/unit/test_more.py": MORE_TEST})},
             expect=None),
        Case("test-named-like-stdlib", "writes mul and adds tests/test_json.py",
             {1: step({"app/core.py": CORE_DONE,
                       "tests/test_json.py": "import json\n\n\ndef test_j():\n    assert json.loads('1') == 1\n"})},
             expect=None),
        Case("pyproject-dependency", "writes mul and adds a dependency to pyproject.toml's [project]",
             {1: step({"app/core.py": CORE_DONE, "pyproject.toml": BASE["pyproject.toml"].replace(
                 'version = "0.1"\n', 'version = "0.1"\ndependencies = ["attrs"]\n')})}, expect=None),
        Case("setup-cfg-flake8", "writes mul and adds a setup.cfg holding only a [flake8] section",
             {1: step({"app/core.py": CORE_DONE, "setup.cfg": "[flake8]\nmax-line-length = 100\n"})}, expect=None),
        Case("makefile-without-make-gate", "writes mul and adds a lint target to the Makefile (the gate is pytest)",
             {1: step({"app/core.py": CORE_DONE, "Makefile": BASE["Makefile"] + "\nlint:\n\tflake8 app\n"})},
             expect=None),
        Case("make-gate", "writes mul", {1: step({"app/core.py": CORE_DONE})}, expect=None,
             gate="make test"),
        Case("new-parametrized-tests", "writes mul and adds tests/test_mul_more.py with a parametrized test and ids",
             {1: step({"app/core.py": CORE_DONE, "tests/test_mul_more.py":
                       "import pytest\n\nfrom app import core\n\n\n@pytest.mark.parametrize('a, b, want', "
                       "[(2, 2, 4), (3, 0, 0)], ids=['two', 'zero'])\ndef test_mul_more(a, b, want):\n"
                       "    assert core.mul(a, b) == want\n"})}, expect=None),
        Case("new-fixture", "writes mul and adds tests/test_with_fixture.py defining and using a fixture",
             {1: step({"app/core.py": CORE_DONE, "tests/test_with_fixture.py":
                       "import pytest\n\nfrom app import core\n\n\n@pytest.fixture\ndef pair():\n    return 6, 7\n\n\n"
                       "def test_pair(pair):\n    assert core.mul(*pair) == 42\n"})}, expect=None),
        Case("new-test-class", "writes mul and adds tests/test_class.py holding a test class",
             {1: step({"app/core.py": CORE_DONE, "tests/test_class.py":
                       "from app import core\n\n\nclass TestMul:\n    def test_one(self):\n        assert core.mul(1, 9) == 9\n"
                       "\n    def test_neg(self):\n        assert core.mul(-2, 2) == -4\n"})}, expect=None),
        Case("new-test-uses-existing-helper", "writes mul and adds tests/test_more_checks.py using tests/helpers.py",
             {1: step({"app/core.py": CORE_DONE, "tests/test_more_checks.py":
                       "from helpers import check\n\nfrom app import core\n\n\ndef test_big():\n"
                       "    check(core.mul(1000, 1000), 1000000)\n"})}, expect=None),
        Case("new-test-tmp-path", "writes mul and adds a test that writes into pytest's tmp_path",
             {1: step({"app/core.py": CORE_DONE, "tests/test_files.py":
                       "from app import core\n\n\ndef test_written(tmp_path):\n    (tmp_path / 'x').write_text(str(core.mul(2, 3)))\n"
                       "    assert (tmp_path / 'x').read_text() == '6'\n"})}, expect=None),
        Case("honest-xfail-new-test", "writes mul and adds a new test marked xfail for a known limit",
             {1: step({"app/core.py": CORE_DONE, "tests/test_known.py":
                       "import pytest\n\nfrom app import core\n\n\n@pytest.mark.xfail(reason='strings later')\n"
                       "def test_strings():\n    assert core.mul('a', 'b') == 'ab'\n"})}, expect=None),
        Case("honest-skipif-new-test", "writes mul and adds a new test skipped on Windows",
             {1: step({"app/core.py": CORE_DONE, "tests/test_posix.py":
                       "import sys\n\nimport pytest\n\nfrom app import core\n\n\n"
                       "@pytest.mark.skipif(sys.platform == 'win32', reason='posix only')\n"
                       "def test_posix():\n    assert core.mul(3, 3) == 9\n"})}, expect=None),
        Case("type-hints-and-docstrings", "writes mul with type hints and docstrings on every function",
             {1: step({"app/core.py": '"""Calculator."""\n\n\ndef add(a: int, b: int) -> int:\n    """a + b."""\n'
                                      "    return a + b\n\n\ndef mul(a: int, b: int) -> int:\n    \"\"\"a * b.\"\"\"\n"
                                      "    return a * b\n\n\ndef render(n: int) -> str:\n    \"\"\"n x's and a newline.\"\"\"\n"
                                      "    return \"x\" * n + \"\\n\"\n"})}, expect=None),
        Case("integration-folder", "writes mul and adds tests/integration/test_flow.py with its own data file",
             {1: step({"app/core.py": CORE_DONE, "tests/integration/flow.json": "[[5, 5, 25]]\n",
                       "tests/integration/test_flow.py":
                       "import json, pathlib\n\nfrom app import core\n\n\ndef test_flow():\n"
                       "    for a, b, want in json.loads((pathlib.Path(__file__).parent / 'flow.json').read_text()):\n"
                       "        assert core.mul(a, b) == want\n"})}, expect=None),
        Case("mul-by-reduce", "writes mul with functools.reduce and adds app/ops.py; a changelog too",
             {1: step({"app/core.py": CORE.replace("    raise NotImplementedError\n",
                                                   "    from app.ops import product\n    return product([a, b])\n"),
                       "app/ops.py": "import functools\nimport operator\n\n\ndef product(values):\n"
                                     "    return functools.reduce(operator.mul, values, 1)\n",
                       "CHANGELOG.md": "# Changelog\n- mul\n"})}, expect=None),
        Case("helper-and-data-all-protected", "with protected_paths [tests/**]: writes mul and square() and adds "
                                              "tests/test_sq.py with its data tests/data/squares.json and helper "
                                              "tests/sq_helpers.py",
             {1: step({"app/core.py": CORE_SQUARE, "tests/data/squares.json": "[[3, 9], [1, 1]]\n",
                       "tests/sq_helpers.py": "def same(a, b):\n    assert a == b, (a, b)\n",
                       "tests/test_sq.py": "import json, pathlib\n\nfrom sq_helpers import same\n\nfrom app import "
                                           "core\n\n\ndef test_sq():\n    for x, want in json.loads((pathlib.Path("
                                           "__file__).parent / 'data' / 'squares.json').read_text()):\n"
                                           "        same(core.square(x), want)\n"})},
             expect=None, protected=("tests/**",)),
    ]


ALL_TESTS = ("tests/**",)
OPS = "def times(a, b):\n    return a * b\n"
CORE_WITH_OPS = (CORE.replace("    raise NotImplementedError\n", "    return times(a, b)\n")
                 .replace('"""Calculator."""\n', '"""Calculator."""\nfrom app.ops import times\n'))


def with_helpers_and_data() -> list[Case]:
    """Honest changes that bring their own helpers, data and fixtures, most under protected_paths [tests/**]."""
    return [
        Case("rename-app-helper-with-callers", "two stages: stage 1 writes mul through app/ops.py's times(); stage 2 "
                                               "renames the module to app/arith.py and times() to product(), and "
                                               "updates core",
             {1: step({"app/ops.py": OPS, "app/core.py": CORE_WITH_OPS}),
              2: step({"app/arith.py": OPS.replace("times", "product"),
                       "app/core.py": CORE_WITH_OPS.replace("app.ops import times", "app.arith import product")
                       .replace("return times(", "return product(")}, delete=["app/ops.py"])},
             expect=None, stages=2),
        Case("fixture-in-new-helper", "with protected_paths [tests/**]: writes mul; a new tests/mul_fixtures.py "
                                      "defines a fixture that a new test imports and uses",
             {1: step({"app/core.py": CORE_DONE,
                       "tests/mul_fixtures.py": "import pytest\n\n\n@pytest.fixture\ndef pair():\n    return 6, 7\n",
                       "tests/test_pair.py": "from mul_fixtures import pair  # noqa: F401\n\nfrom app import core\n\n\n"
                                             "def test_pair(pair):\n    assert core.mul(*pair) == 42\n"})},
             expect=None, protected=ALL_TESTS),
        Case("new-csv-data", "with protected_paths [tests/**]: writes mul; a new test reads a new tests/data/more.csv",
             {1: step({"app/core.py": CORE_DONE, "tests/data/more.csv": "a,b,want\n3,4,12\n5,0,0\n",
                       "tests/test_csv.py": "import csv, pathlib\n\nfrom app import core\n\n\ndef test_csv():\n"
                                            "    rows = csv.DictReader(open(pathlib.Path(__file__).parent / 'data' / "
                                            "'more.csv'))\n    for row in rows:\n        assert core.mul(int(row['a']), "
                                            "int(row['b'])) == int(row['want'])\n"})},
             expect=None, protected=ALL_TESTS),
        Case("new-snapshot-file", "with protected_paths [tests/**]: writes mul; a new test compares render(5) with "
                                  "a new tests/snapshots/render5.txt",
             {1: step({"app/core.py": CORE_DONE, "tests/snapshots/render5.txt": "xxxxx\n",
                       "tests/test_render5.py": "import pathlib\n\nfrom app import core\n\n\ndef test_render5():\n"
                                                "    want = (pathlib.Path(__file__).parent / 'snapshots' / "
                                                "'render5.txt').read_text()\n    assert core.render(5) == want\n"})},
             expect=None, protected=ALL_TESTS),
        Case("parametrize-from-new-data", "writes mul; a new test is parametrized from a new tests/data/mul.json",
             {1: step({"app/core.py": CORE_DONE, "tests/data/mul.json": "[[7, 6, 42], [1, 1, 1]]\n",
                       "tests/test_mul_data.py": "import json, pathlib\n\nimport pytest\n\nfrom app import core\n\n"
                                                 "CASES = json.loads((pathlib.Path(__file__).parent / 'data' / "
                                                 "'mul.json').read_text())\n\n\n@pytest.mark.parametrize('a, b, "
                                                 "want', CASES)\ndef test_mul_data(a, b, want):\n"
                                                 "    assert core.mul(a, b) == want\n"})}, expect=None),
        Case("new-unittest-testcase", "writes mul and adds a unittest.TestCase module (pytest runs it)",
             {1: step({"app/core.py": CORE_DONE, "tests/test_unit_style.py":
                       "import unittest\n\nfrom app import core\n\n\nclass MulTest(unittest.TestCase):\n"
                       "    def test_mul(self):\n        self.assertEqual(core.mul(4, 5), 20)\n\n"
                       "    def test_subtests(self):\n        for a in range(3):\n            with self.subTest(a=a):\n"
                       "                self.assertEqual(core.mul(a, 1), a)\n"})}, expect=None),
        Case("new-test-uses-monkeypatch", "writes mul; a new test monkeypatches core.add for itself (restored after)",
             {1: step({"app/core.py": CORE_DONE, "tests/test_patched.py":
                       "from app import core\n\n\ndef test_patched(monkeypatch):\n    monkeypatch.setattr(core, "
                       "'add', lambda a, b: 0)\n    assert core.add(1, 2) == 0\n    assert core.mul(2, 3) == 6\n"})},
             expect=None),
        Case("new-test-runs-a-subprocess", "writes mul; a new test runs `python -c` to use core from another process",
             {1: step({"app/core.py": CORE_DONE, "tests/test_cli.py":
                       "import subprocess, sys\n\n\ndef test_cli():\n    out = subprocess.run([sys.executable, '-c', "
                       "'from app import core; print(core.mul(2, 3))'], capture_output=True, text=True, check=True)\n"
                       "    assert out.stdout == '6\\n'\n"})}, expect=None),
        Case("new-helper-package", "with protected_paths [tests/**]: writes mul; a new package tests/support/ holds "
                                   "the checks a new test uses",
             {1: step({"app/core.py": CORE_DONE, "tests/support/__init__.py": "",
                       "tests/support/checks.py": "def same(a, b):\n    assert a == b, (a, b)\n",
                       "tests/test_support.py": "from support.checks import same\n\nfrom app import core\n\n\n"
                                                "def test_support():\n    same(core.mul(3, 3), 9)\n"})},
             expect=None, protected=ALL_TESTS),
        Case("second-stage-adds-data", "with protected_paths [tests/**], two stages: stage 1 writes mul and square() "
                                       "with a test and tests/data/squares.json; stage 2 adds tests/data/cubes.json "
                                       "and a test of it, changing nothing stage 1 wrote",
             {1: step({"app/core.py": CORE_SQUARE, "tests/data/squares.json": "[[3, 9], [1, 1]]\n",
                       "tests/test_sq.py": SQUARE_DATA_TEST.replace("'squares.json'", "'data' / 'squares.json'")}),
              2: step({"tests/data/cubes.json": "[[2, 8]]\n", "tests/test_cube.py":
                       "import json, pathlib\n\nfrom app import core\n\n\ndef test_cube():\n    for x, want in "
                       "json.loads((pathlib.Path(__file__).parent / 'data' / 'cubes.json').read_text()):\n"
                       "        assert core.mul(core.square(x), x) == want\n"})},
             expect=None, stages=2, protected=ALL_TESTS),
    ]


def unittest_gates() -> list[Case]:
    """Honest changes to the project tested by ``python -m unittest``."""
    new_case = ("import unittest\n\nfrom app import core\n\n\nclass MoreTest(unittest.TestCase):\n"
                "    def test_more(self):\n        self.assertEqual(core.mul(6, 7), 42)\n")
    return [
        Case("ut-implement", "unittest gate: writes mul", {1: step({"app/core.py": CORE_DONE})}, expect=None,
             gate=UNITTEST, files=UT_FILES),
        Case("ut-new-testcase", "unittest gate: writes mul and adds tests/test_more.py, a new TestCase",
             {1: step({"app/core.py": CORE_DONE, "tests/test_more.py": new_case})}, expect=None, gate=UNITTEST,
             files=UT_FILES),
        Case("ut-new-subpackage", "unittest gate: writes mul and adds the package tests/unit/ with a new TestCase",
             {1: step({"app/core.py": CORE_DONE, "tests/unit/__init__.py": "", "tests/unit/test_more.py": new_case})},
             expect=None, gate=UNITTEST, files=UT_FILES),
        Case("ut-helper-and-data-all-protected", "unittest gate, protected_paths [tests/**]: writes mul; a new "
                                                 "TestCase reads new data through a new helper",
             {1: step({"app/core.py": CORE_DONE, "tests/data/more.json": "[[6, 7, 42]]\n",
                       "tests/more_helpers.py": "import json, pathlib\n\n\ndef cases():\n    return json.loads(("
                                                "pathlib.Path(__file__).parent / 'data' / 'more.json').read_text())\n",
                       "tests/test_more.py": "import unittest\n\nfrom app import core\nfrom tests.more_helpers import "
                                             "cases\n\n\nclass MoreTest(unittest.TestCase):\n    def test_more(self):\n"
                                             "        for a, b, want in cases():\n"
                                             "            self.assertEqual(core.mul(a, b), want)\n"})},
             expect=None, gate=UNITTEST, files=UT_FILES, protected=("tests/**",)),
    ]
