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
