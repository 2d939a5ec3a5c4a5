"""The Run Engine (engine/) imports nothing from the Control Panel (controlpanel/).

The UI depends on the engine, never the other way round: every module under engine/ is read
with ``ast`` and any import of ``controlpanel`` (``import controlpanel...``, ``from controlpanel...
import``, at module level or inside a function, or by name through ``importlib.import_module`` /
``__import__``) fails the test, naming the file and line. Strings that only mention the project
(``celery -A controlpanel``) are not imports.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine"
UI_PACKAGE = "controlpanel"


def _is_ui(name: str | None) -> bool:
    return bool(name) and (name == UI_PACKAGE or name.startswith(UI_PACKAGE + "."))


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted package a module file belongs to, as parts (``engine/agents/x.py`` -> engine, agents)."""
    return list(path.relative_to(root).with_suffix("").parts[:-1])  # an __init__.py's too: its folder


def ui_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``["<file>:<line>: <import>"]`` for every import of the UI package in the module at ``path``.

    ``root`` is the folder the dotted names start from (the repository); relative imports are
    resolved against the module's package. Raises SyntaxError when the file is not Python.
    """
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    where = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path, root)
                base = package[: len(package) - (node.level - 1)] if node.level <= len(package) else []
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        if any(_is_ui(name) for name in names):
            found.append(f"{where}:{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_the_detector_finds_every_form_of_import(tmp_path):
    """A check that cannot fail proves nothing: each form is caught, mentions in strings are not."""
    module = tmp_path / "engine" / "agents" / "sample.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "import os\n"
        "import controlpanel.views\n"
        "from controlpanel import forms\n"
        "from controlpanel.api import RunDetail as D\n"
        "def later():\n"
        "    from controlpanel.views import RunPages\n"
        "    import importlib\n"
        "    importlib.import_module('controlpanel.admin')\n"
        "    return __import__('controlpanel')\n"
        "HELP = 'celery -A controlpanel worker; from controlpanel import x'\n"
        "from . import controlpanelish\n"
        "import controlpanel_other\n",
        encoding="utf-8")
    found = ui_imports(module, tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "3", "4", "6", "8", "9"], found


@pytest.mark.parametrize("path", sorted(ENGINE.rglob("*.py")), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_engine_imports_nothing_from_controlpanel(path):
    assert ui_imports(path) == [], "the engine must not import the Control Panel (move the code into controlpanel/)"


def test_every_engine_module_is_read():
    modules = list(ENGINE.rglob("*.py"))
    assert ENGINE / "models.py" in modules and ENGINE / "agents" / "claude" / "adapter.py" in modules
