"""The protected set's rules, without a run: what a gate runs, runner sections, shadowing roots."""
from engine.checks import gate_files, protected

FILES = {"Makefile", "mk/test.mk", "ci/run-tests.sh", "ci/Makefile", "tools/runtests.py", "app/core.py",
         "ci/test.sh", "scripts/check.py", "tests/test_a.py"}
CONTENT = {"Makefile": b"include mk/test.mk\nlint:\n\tflake8 app/core.py\n",
           "mk/test.mk": b"test: deps\n\tsh ci/run-tests.sh\ndeps:\n\t@./tools/runtests.py --deps\n",
           "ci/run-tests.sh": b"set -e\npython tools/runtests.py\n",
           "ci/Makefile": b"test:\n\tcd .. && python -m pytest -q\n",
           "ci/test.sh": b"#!/bin/sh\nexec python3 tools/runtests.py \"$@\"\n"}


def found(command):
    return set(gate_files.gate_files([command], FILES, CONTENT.get))


def test_what_a_make_gate_runs_is_found_through_includes_recipes_and_scripts():
    assert found("make test") == {"Makefile", "mk/test.mk", "ci/run-tests.sh", "tools/runtests.py"}
    # a lint target naming the code under test does not freeze it
    assert "app/core.py" not in found("make test") and "app/core.py" not in found("make lint")


def test_a_make_in_another_folder_and_a_script_chain():
    assert found("make -C ci test") == {"ci/Makefile"} == found("cd ci && make test")
    assert found("make --directory=ci") == {"ci/Makefile"}
    assert found("bash ci/test.sh") == {"ci/test.sh", "tools/runtests.py"}
    assert found("python -m pytest -q tests/test_a.py") == {"tests/test_a.py"}


def test_only_the_sections_a_runner_reads_count():
    base = b'[project]\nname = "x"\ndependencies = []\n\n[tool.pytest.ini_options]\naddopts = "-q"\n'
    dep = base.replace(b"dependencies = []", b'dependencies = ["attrs"]')
    weakened = base.replace(b'"-q"', b'"-q -k not_slow"')
    plugin = base + b'\n[project.entry-points.pytest11]\nevil = "app.evil"\n'
    ruff = base + b'\n[tool.ruff]\nline-length = 100\n'
    rs = protected.runner_sections
    assert rs("pyproject.toml", base) == rs("pyproject.toml", dep) == rs("pyproject.toml", ruff)
    assert rs("pyproject.toml", base) != rs("pyproject.toml", weakened)
    assert rs("pyproject.toml", base) != rs("pyproject.toml", plugin)
    assert rs("pyproject.toml", b"[oops") is None
    cfg = b"[metadata]\nname = x\n[flake8]\nmax-line-length = 100\n"
    assert rs("setup.cfg", cfg) == {} and rs("setup.cfg", cfg + b"[tool:pytest]\naddopts = -k x\n") != {}
    assert rs("tox.ini", b"[pytest]\naddopts = -x\n") == {"pytest": {"addopts": "-x"}}


def test_runner_files_depend_on_the_gates():
    assert protected.is_loader("pytest.toml") and protected.is_loader("a/b/.pytest.toml")
    assert protected.is_loader("x-1.0.dist-info/entry_points.txt") and protected.is_loader(".gitattributes")
    assert protected.is_loader("web/jest.config.ts") and not protected.is_loader("package.json")
    assert protected.is_loader("package.json", {"npm"}) and protected.is_loader("Makefile", {"make"})
    assert not protected.is_loader("Makefile", {"pytest"}) and not protected.is_loader("docs/Makefile", {"make"})
    assert protected.gate_tools(["npm test --silent", "make -C ci test"]) == {"npm", "make"}


def test_shadowing_is_judged_where_the_tests_import_from():
    paths = {"tests/test_a.py", "pkg/__init__.py", "pkg/tests/__init__.py", "pkg/tests/test_b.py", "e2e/test_c.py"}
    assert protected.import_roots(paths) == {"", "tests", "e2e"}
    roots = protected.import_roots(paths)
    assert protected._module_name("tests/json.py", paths, roots) == "json"
    assert protected._module_name("scripts/json.py", paths, roots) is None
    assert protected._module_name("pkg/tests/json.py", paths, roots) is None
    assert protected._module_name("tests/helpers.cpython-311-x86_64-linux-gnu.so", paths, roots) == "helpers"
