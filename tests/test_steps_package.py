"""The layering of engine/steps/: shared modules below the step kinds, the kinds below the dispatch.

Every module of the package is read with ``ast``: its imports of sibling modules (``from . import
x``, ``from .x import y``) must form no cycle, no import may sit inside a function (a cycle is
not to be broken that way), and a step kind's module imports no other step kind's. The names
other modules and the tests use are still reachable as ``engine.steps.<name>``.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "engine" / "steps"
KINDS = {"implement", "review", "document", "verify", "checkpoint", "final"}


def _siblings(path: Path) -> tuple[set[str], list[str]]:
    """The sibling modules ``path`` imports at module level, and ``line: import`` of every import
    found inside a function or a class."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, nested = set(), []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module] if node.module else [alias.name for alias in node.names])
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    nested.append(f"{path.name}:{inner.lineno}: {ast.unparse(inner)}")
    return found, nested


def _graph() -> dict[str, set[str]]:
    return {path.stem: _siblings(path)[0] for path in PACKAGE.glob("*.py")}


def test_the_package_has_a_module_per_step_kind_and_the_shared_ones():
    assert KINDS | {"__init__", "attempts", "gates", "prompts", "plans", "common", "paths"} <= set(_graph())


def test_no_import_cycle_inside_the_package():
    graph, done, order = _graph(), set(), []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, "import cycle: " + " -> ".join(trail + (name,))
        if name in done:
            return
        for dep in sorted(graph.get(name, ())):
            visit(dep, trail + (name,))
        done.add(name)
        order.append(name)

    for name in sorted(graph):
        visit(name, ())
    assert set(order) == set(graph)


def test_no_function_imports_and_no_kind_imports_another():
    for path in sorted(PACKAGE.glob("*.py")):
        imports, nested = _siblings(path)
        assert nested == [], nested
        if path.stem in KINDS:
            assert imports & KINDS == set(), f"{path.name} imports another step kind: {imports & KINDS}"


def test_the_names_others_import_from_engine_steps_are_still_there():
    from engine import steps

    for name in ("begin", "execute", "finish", "crashed", "record_late", "definition_tampered", "save_manifest",
                 "manifest_excludes", "process_marker_prefix", "sha256_file", "var_path", "gate_results",
                 "storable", "scratch_dirs", "run_env", "LeaseLost", "_final_checkout", "_remove_final_checkout"):
        assert callable(getattr(steps, name)), name
