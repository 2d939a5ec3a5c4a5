"""The linter runs in `make test-fast` and CI: ruff with the rules and the complexity limit of pyproject.toml
([tool.ruff]: pyflakes, pycodestyle's statement errors, no function above McCabe complexity 25)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).with_name("ruff")


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    assert RUFF.is_file(), f"{RUFF} is missing: ruff is in the [test] extras of pyproject.toml (make install)"
    return subprocess.run([str(RUFF), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_code_passes_ruff():
    proc = ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "warning" not in proc.stderr.lower(), proc.stderr[-2000:]  # an invalid noqa, a setting ruff ignored


def test_ruff_refuses_a_function_above_complexity_25_and_an_unused_import(tmp_path):
    """The same settings catch what they are there for (the check can fail)."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8")
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(26))
    (tmp_path / "tangled.py").write_text(f"import os\n\n\ndef tangled(x):\n{branches}\n    return -1\n",
                                         encoding="utf-8")
    proc = ruff("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "C901 `tangled` is too complex (27 > 25)" in proc.stdout, proc.stdout
    assert "F401" in proc.stdout and "`os` imported but unused" in proc.stdout, proc.stdout


def imports_of_test_modules(root: Path) -> list[str]:
    """``file:line: module`` for each import of a test module (``test_*``) by a file under ``root``: what
    more than one test module uses lives in tests/support/ (README.md, "Tests"), so a test module is never
    imported for its helpers (nor its tests collected twice under another name)."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.module:
                names = [alias.name for alias in node.names]  # from . import test_x
            found += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in names
                      if name.rsplit(".", 1)[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another_for_its_helpers(tmp_path):
    assert imports_of_test_modules(ROOT / "tests") == []
    # the check can fail: each way of importing a test module is found
    (tmp_path / "test_a.py").write_text("from .test_steps import drive\nfrom . import test_b\n"
                                        "import tests.test_c\nfrom .support.runs import drive\n", encoding="utf-8")
    assert imports_of_test_modules(tmp_path) == ["test_a.py:1: test_steps", "test_a.py:2: test_b",
                                                 "test_a.py:3: tests.test_c"]
