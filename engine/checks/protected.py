"""Protected checks: the agreed tests and configuration an agent may not weaken.

At run creation ``snapshot`` copies the protected files of the run's commit out of git into
the run's control records (``runs/<id>/protected/files/<path>``) with their mode, blob id and
sha256 (``index.json`` lists them). The protected set (``choose``):

* every file a pipeline's ``protected_paths`` patterns match (gitignore patterns,
  engine/checks/globs.py; a later ``!pattern`` narrows);
* **the test tree**: every file under the folder part of each protected pattern
  (``tests/test_*.py`` -> everything under ``tests/``: helpers, ``__init__.py``, fixtures,
  data); for a pattern whose folder part is a wildcard or that has none (``**/test_*.py``,
  ``test_*.py``), the folders holding the files it matches (not the repository root). The
  folders are fixed at run creation (``folders.json``);
* every file a frozen gate command names (``gate_named_files``), and the folder it lies in;
* with any gate, **what a test runner loads by itself** wherever it is (``LOADER_NAMES``,
  ``*.pth``): ``conftest.py``, runner configuration, ``sitecustomize.py``...

After every agent attempt (and before the gates run) ``compare`` checks the worktree's content
manifest against the records: a protected file modified, deleted, renamed (its content
reappears under another name) or whose mode changed is tampering. So is an **added** file that
changes how existing tests run: a runner's file (``is_loader``: a new ``conftest.py`` or
``pytest.ini`` at any depth, docs/field-cases.md C22), a file a protected pattern matches that is not a
new test module (``TEST_FILE_PATTERNS``: agents may add tests), an ``__init__.py`` in a folder
of protected files, a new top-level module that shadows another where the tests import from
(``shadowed_names``, ``import_roots``), and a new test module naming ``pytest_plugins``. When a
stage checkpoints, ``carry_forward`` makes the files it added (a new test module anywhere, a new
file under a protected folder) protected for the rest of the run: an accepted test cannot be
weakened by a later stage.

A pipeline narrows the set with a negation in ``protected_paths``: ``!tests/generated/**``
leaves those files out of the tree, ``!pyproject.toml`` lets agents edit that runner file.
"""
from __future__ import annotations

import ast
import configparser
import difflib
import functools
import importlib.machinery
import hashlib
import json
import os
import posixpath
import pkgutil
import shlex
import site
import sys
import tomllib
from pathlib import Path

from .. import workspace
from . import gate_files, globs

#: Names of files that add tests; adding one under a protected glob is allowed.
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "*_test.go", "*.test.js", "*.test.ts", "*.test.jsx",
                      "*.test.tsx", "*.spec.js", "*.spec.ts", "*Test.java", "*_spec.rb")
#: Files read by a runner named in a gate command, protected when they exist at the run's commit
#: (this names the reason only: every file of LOADER_NAMES is protected with any gate).
RUNNER_FILES = {"make": ("Makefile", "makefile", "GNUmakefile"),
                "pytest": ("pytest.ini", "tox.ini", "conftest.py"), "npm": ("package.json",)}
#: Files a test runner or Python itself loads without being named, wherever they are: pytest's
#: conftest.py and configuration files (pytest.ini, .pytest.ini, pyproject.toml, tox.ini,
#: setup.cfg: https://docs.pytest.org/en/stable/reference/customize.html), make's makefiles,
#: and the site module's sitecustomize/usercustomize and ``*.pth`` files
#: (https://docs.python.org/3/library/site.html). With any gate, each one of the run's commit is
#: protected and adding one anywhere is tampering.
LOADER_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
                "pyproject.toml", "sitecustomize.py", "usercustomize.py", ".gitattributes", ".mocharc.js", ".mocharc.json",
                ".mocharc.yml", ".mocharc.yaml", ".mocharc.cjs")
#: ``.gitattributes`` is among them: its filters and ``eol`` settings change the bytes a checkout
#: writes without changing what git records, so a protected file would look unchanged.
LOADER_SUFFIXES = (".pth",)
#: Runner configuration names with any ending (``jest.config.js``, ``vitest.config.ts``...).
LOADER_PREFIXES = ("jest.config.", "vitest.config.", "vitest.workspace.")
#: Read by ``make`` in the folder it runs in, with a gate that runs make: the root's (a gate's
#: ``make -C DIR`` makes DIR's a named file, engine/checks/gate_files.py).
ROOT_LOADER_NAMES = ("Makefile", "makefile", "GNUmakefile")
#: With a gate that runs a JavaScript package manager, its manifest (the ``scripts`` it runs).
JS_MANIFESTS = ("package.json",)
#: Configuration files whose other parts an agent may change (a dependency, a linter's options):
#: only the sections a runner reads are compared (``runner_sections``).
SECTIONED = ("pyproject.toml", "setup.cfg", "tox.ini")
#: Folders of installed-package metadata: their ``entry_points.txt`` can make pytest load a
#: plugin (group ``pytest11``) from wherever the folder lies on ``sys.path``.
METADATA_SUFFIXES = (".dist-info", ".egg-info")
#: Test frameworks a shadowing module could replace, besides the standard library and the
#: repository's own top-level modules.
FRAMEWORK_MODULES = frozenset({"pytest", "_pytest", "pluggy", "hypothesis", "mock", "nose", "unittest"})
#: Subfolders of a new test module's folder whose new files are its data (carried with it).
DATA_FOLDER_NAMES = frozenset({"data", "fixtures", "snapshots", "__snapshots__", "testdata", "test_data",
                               "cassettes", "golden", "expected", "resources"})
#: Bytes of one file's diff kept in a tamper report.
MAX_DIFF_BYTES = 256 * 1024


def shown(path: str) -> str:
    """``path`` as records store it: a byte that is not UTF-8 (a surrogate escape of
    ``os.fsdecode``) written as ``\\xNN``; any other path unchanged."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_loader(path: str, tools: set[str] | frozenset = frozenset()) -> bool:
    """True when a test runner or Python loads ``path`` by itself: a name of LOADER_NAMES,
    LOADER_SUFFIXES or LOADER_PREFIXES anywhere, anything in a package metadata folder
    (METADATA_SUFFIXES, in any case); with a ``make`` gate (``tools``: ``gate_tools``) ROOT_LOADER_NAMES at
    the root, with an ``npm`` gate a ``package.json``."""
    name = posixpath.basename(path)
    if name in LOADER_NAMES or name.endswith(LOADER_SUFFIXES) or name.startswith(LOADER_PREFIXES):
        return True
    if ("make" in tools and path in ROOT_LOADER_NAMES) or ("npm" in tools and name in JS_MANIFESTS):
        return True
    # importlib.metadata lower-cases the folder names it searches: Zz.DIST-INFO is a package's metadata
    return any(part.lower().endswith(METADATA_SUFFIXES) for part in path.split("/")[:-1])


def gate_tools(commands: list[str]) -> set[str]:
    """The runners the gate ``commands`` start: ``make``, ``pytest``, ``npm`` (npm, yarn, pnpm, npx)."""
    tools: set[str] = set()
    for command in commands:
        tools |= _tools(command)
    return tools


def runner_sections(path: str, data: bytes) -> object:
    """What a test runner reads of a SECTIONED file, comparable with ``==``; None when the file
    does not parse (a broken file is judged as a whole).

    ``pyproject.toml``: everything but ``[project]``'s own fields (its ``entry-points``, which
    can name a pytest plugin, stay) and the linters' ``[tool.*]`` tables (ruff, black, isort,
    mypy, pylint, pyright, flake8). ``setup.cfg`` and ``tox.ini``: every section but
    ``metadata``, ``options`` (its ``options.entry_points`` stays) and the linters'.
    """
    name = posixpath.basename(path)
    try:
        text = data.decode("utf-8")
        if name == "pyproject.toml":
            doc = tomllib.loads(text)
            project = doc.pop("project", {})
            doc["project.entry-points"] = project.get("entry-points") if isinstance(project, dict) else project
            tool = doc.get("tool")
            if isinstance(tool, dict):
                doc["tool"] = {k: v for k, v in tool.items() if k not in _LINTERS}
            return doc
        parser = configparser.RawConfigParser(interpolation=None, strict=False)
        parser.optionxform = str
        parser.read_string(text)
        return {section: dict(parser.items(section)) for section in parser.sections()
                if section not in ("metadata", "options") and section.split(":")[0] not in _LINTERS
                and not section.startswith(("mypy", "mypy-"))}
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error, ValueError):
        return None


_LINTERS = frozenset({"ruff", "black", "isort", "mypy", "pylint", "pyright", "flake8", "pycodestyle", "pydocstyle",
                      "codespell", "bandit", "bumpversion", "bdist_wheel", "egg_info", "sdist"})


def is_test_file(path: str) -> bool:
    """True when ``path``'s name marks a new test module (TEST_FILE_PATTERNS)."""
    name = posixpath.basename(path)
    return globs.matches(name, TEST_FILE_PATTERNS)


def _words(command: str) -> list[str]:
    """A gate command's words as the shell splits them (on whitespace when the quotes do not balance)."""
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def _tools(command: str) -> set[str]:
    """The runners of RUNNER_FILES a gate command starts (``make``, ``pytest``)."""
    words = _words(command)
    tools = set()
    for i, word in enumerate(words):
        name = posixpath.basename(word)
        if name in ("make", "gmake"):
            tools.add("make")
        elif name in ("pytest", "py.test") or (word == "pytest" and i > 0 and words[i - 1] == "-m"):
            tools.add("pytest")
        elif name in ("npm", "yarn", "pnpm", "npx"):
            tools.add("npm")
    return tools


def gate_named_files(commands: list[str], files: set[str], read=None) -> dict[str, str]:
    """Files of ``files`` (repository paths) that the gate ``commands`` run or read, with why.

    Returns ``{path: "named by the gate command `...`"}`` and the like: the words that are
    files, the makefiles a ``make`` reads and the programs its recipes and the shell scripts
    found run (engine/checks/gate_files.py; followed only where ``read(path) -> bytes | None`` gives
    their content), and the root pytest configuration of a ``pytest`` gate. Words that are not
    paths of the commit are ignored; an unparseable command is split on whitespace.
    """
    named = gate_files.gate_files(commands, set(files), read or (lambda path: None))
    for command in commands:
        for tool in sorted(_tools(command)):
            for path in RUNNER_FILES[tool]:
                if path in files:
                    named.setdefault(path, f"read by `{tool}` in the gate command `{command}`")
    return named


def tree_folders(patterns: list[str], paths: list[str]) -> list[str]:
    """The protected folders (``"tests/"``) of ``patterns`` over a commit's ``paths``: each
    positive pattern's literal folder part (globs.literal_folder), or, when it has none, the
    folders holding the files it matches; never the repository root. Sorted."""
    folders: set[str] = set()
    for pattern in patterns:
        if pattern.startswith("!"):
            continue
        literal = globs.literal_folder(pattern)
        if literal:
            folders.add(literal)
            continue
        for path in paths:
            parent = posixpath.dirname(path)
            if parent and globs.matches(path, [pattern]):
                folders.add(parent + "/")
    return sorted(folders)


def _in_folders(path: str, folders) -> str | None:
    """The first of ``folders`` that holds ``path`` (at any depth), or None."""
    for folder in folders:
        if path.startswith(folder):
            return folder
    return None


def choose(paths: list[str], patterns: list[str], gate_commands: list[str],
           folders: list[str] | None = None, read=None) -> dict[str, str]:
    """The protected files among a commit's ``paths``, each with why: ``{path: reason}``.

    ``folders``: the protected folders (``tree_folders`` of the run's commit; computed from
    ``paths`` when None). A negation in ``patterns`` leaves a file out of the folder and runner
    rules as it does out of the patterns' own matches; files a gate names stay protected.
    """
    folders = tree_folders(patterns, paths) if folders is None else folders
    tools = gate_tools(gate_commands)
    chosen: dict[str, str] = {}
    for path, why in gate_named_files(gate_commands, set(paths), read).items():
        chosen[path] = why
    gate_folders = sorted({posixpath.dirname(p) + "/" for p in chosen if posixpath.dirname(p)})
    for path in paths:
        if path in chosen:
            continue
        decision = globs.decides(path, patterns) if patterns else None
        if decision is True:
            chosen[path] = "matches protected_paths"
        elif decision is False:
            continue  # narrowed by a negation
        elif (folder := _in_folders(path, folders)) is not None:
            chosen[path] = f"in the protected folder {folder}"
        elif gate_commands and is_loader(path, tools):
            chosen[path] = "a test runner loads it by itself"
        elif (folder := _in_folders(path, gate_folders)) is not None:
            chosen[path] = f"in the folder {folder} of a file a gate command names"
    return chosen


def _blob(repo: str, oid: str) -> bytes:
    """The content of blob ``oid`` of ``repo`` (through the engine's one hardened git invocation)."""
    return workspace.git(["cat-file", "blob", oid], repo).stdout


def _copy_records(repo: str, entries: dict[str, dict], chosen: dict[str, str], dest_dir: str) -> list[dict]:
    """Copy each chosen entry's content into ``dest_dir/files/<path>``; their records, sorted."""
    records = []
    files_dir = Path(dest_dir, "files")
    for path in sorted(chosen):
        entry = entries[path]
        if entry["mode"] == "160000":  # a submodule: its commit id is what is protected
            data = entry["blob"].encode()
        else:
            data = _blob(repo, entry["blob"])
        target = files_dir / shown(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        records.append({"path": shown(path), "mode": entry["mode"], "blob": entry["blob"],
                        "sha256": hashlib.sha256(data).hexdigest(), "why": chosen[path]})
    return records


def _write_index(dest_dir: str, records: list[dict]) -> None:
    Path(dest_dir).mkdir(parents=True, exist_ok=True)
    Path(dest_dir, "index.json").write_text(json.dumps(records, indent=1), encoding="utf-8")


def gate_commands(definition: dict) -> list[str]:
    """The commands of a pipeline definition's baseline checks and stage gates, in order (what
    ``snapshot`` reads for the files they run)."""
    commands = [g["command"] for g in definition.get("baseline_checks") or []]
    return commands + [g["command"] for stage in definition["stages"] for g in stage.get("gates") or []]


def write_definition(control_dir: str, snapshot_: dict, digest: str) -> None:
    """Write a run's frozen definition and its digest to its control records folder ``control_dir``:
    ``definition.json`` and ``definition.sha256`` (engine/steps/common.py ``definition_tampered``
    holds the row to the latter)."""
    Path(control_dir, "definition.json").write_text(json.dumps(snapshot_, indent=1, sort_keys=True), encoding="utf-8")
    Path(control_dir, "definition.sha256").write_text(digest + "\n", encoding="utf-8")


def snapshot(repo: str, commit: str, globs_: list[str], gate_commands: list[str], dest_dir: str) -> list[dict]:
    """Copy the protected files of ``commit`` (``choose``) into ``dest_dir``; returns their records.

    Each record: ``{"path", "mode", "blob", "sha256", "why"}``; the content is written to
    ``dest_dir/files/<path>``, the list to ``dest_dir/index.json`` and the protected folders to
    ``dest_dir/folders.json``. Symlinks are recorded by their target text. Raises
    workspace.WorkspaceError when git fails.
    """
    entries = {e["path"]: e for e in workspace._tree_entries(repo, commit)}
    folders = tree_folders(globs_, list(entries))

    def read(path: str) -> bytes | None:
        entry = entries.get(path)
        if entry is None or entry["mode"] not in ("100644", "100755"):
            return None
        return _blob(repo, entry["blob"])

    records = _copy_records(repo, entries, choose(list(entries), globs_, gate_commands, folders, read), dest_dir)
    _write_index(dest_dir, records)
    Path(dest_dir, "folders.json").write_text(json.dumps(folders), encoding="utf-8")
    return records


def folders_of(dest_dir: str) -> list[str]:
    """The protected folders ``snapshot`` wrote to ``dest_dir`` ([] for an older run)."""
    try:
        return json.loads(Path(dest_dir, "folders.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []


def carry_forward(repo: str, commit: str, base_commit: str, globs_: list[str], records: list[dict],
                  dest_dir: str, stage_key: str) -> list[dict]:
    """The files an accepted checkpoint ``commit`` added since the run's ``base_commit`` that join
    the protected set, copied like ``snapshot``'s (``why`` names the stage); ``records``: the
    run's records so far (not repeated). Chosen: a new test module anywhere
    (``is_test_file``, unless a negation in ``globs_`` leaves it out), and what ``choose`` takes
    with the folders fixed at run creation (a new helper or data file under a protected folder).
    Does not rewrite ``index.json`` (the caller saves the joined list with ``save_index``).
    """
    known = {r["path"] for r in records}
    at_base = {e["path"] for e in workspace._tree_entries(repo, base_commit)}
    entries = {e["path"]: e for e in workspace._tree_entries(repo, commit)
               if shown(e["path"]) not in known and e["path"] not in at_base}
    chosen = {p: r for p, r in choose(list(entries), globs_, [], folders_of(dest_dir)).items()
              if r != "a test runner loads it by itself"}
    for path in entries:
        if path not in chosen and is_test_file(path) and globs.decides(path, globs_) is not False:
            chosen[path] = "a new test module"
    # what a new test module reads beside it: the data files of its folder (not its Python
    # modules: the code under test may live there, except those it imports by a top-level
    # name, its helpers), and what its data subfolders hold
    new_tests = [p for p, r in chosen.items() if r == "a new test module" and p.endswith(".py")]
    for test in new_tests:
        folder = posixpath.dirname(test)
        source = _blob(repo, entries[test]["blob"])
        for name in sorted(_imports(source) | _imports(source, relative=True)):
            for candidate in (posixpath.join(folder, name + ".py"), posixpath.join(folder, name, "__init__.py")):
                if candidate in entries and candidate not in chosen and globs.decides(candidate, globs_) is not False:
                    chosen[candidate] = f"a helper the new test module {test} imports"
    test_folders = sorted({posixpath.dirname(p) for p, r in chosen.items() if r == "a new test module"} - {""})
    for path in entries:
        if path in chosen or globs.decides(path, globs_) is False:
            continue
        for folder in test_folders:
            if not path.startswith(folder + "/"):
                continue
            parts = path[len(folder) + 1:].split("/")
            if (len(parts) == 1 and not parts[0].endswith(MODULE_SUFFIXES)) or (
                    len(parts) > 1 and parts[0] in DATA_FOLDER_NAMES):
                chosen[path] = f"test data beside a new test module in {folder}/"
                break
    why = f"added by stage '{stage_key}', accepted at checkpoint {commit[:12]}"
    return _copy_records(repo, entries, {p: f"{why} ({reason})" for p, reason in chosen.items()}, dest_dir)


def save_index(dest_dir: str, records: list[dict]) -> None:
    """Write the run's full list of protected records to ``dest_dir/index.json``."""
    _write_index(dest_dir, records)


def _imports(source: bytes, relative: bool = False) -> set[str]:
    """Top-level names of the absolute imports in Python ``source``; with ``relative``, the names it
    imports from its own folder instead (``from . import x``, ``from .x import y``). Empty when it
    does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and not relative:
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == (1 if relative else 0):
            if node.module:
                names.add(node.module.split(".")[0])
            elif relative:
                names.update(alias.name for alias in node.names if alias.name != "*")
    return names


def top_level_modules(paths) -> set[str]:
    """Names importable at the top level from the folders of ``paths``: ``x.py`` and
    ``x/__init__.py`` whose folder is not itself a package."""
    paths = set(paths)
    names = set()
    for path in paths:
        if not path.endswith(".py"):
            continue
        folder, name = posixpath.split(path)
        if name == "__init__.py":
            if not folder:
                continue
            folder, name = posixpath.split(folder)
        else:
            name = name[:-3]
        if posixpath.join(folder, "__init__.py") not in paths and name.isidentifier():
            names.add(name)
    return names


@functools.lru_cache(maxsize=1)
def installed_modules() -> frozenset[str]:
    """Top-level module names of the packages installed beside the engine (its site-packages
    folders): the test runner's own (pytest, pluggy, iniconfig...) among them."""
    folders = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    return frozenset(m.name for m in pkgutil.iter_modules(folders))


def shadowed_names(records: list[dict], snapshot_dir: str, base_paths) -> set[str]:
    """Module names a new top-level module may not take: the standard library's, the test
    frameworks' (FRAMEWORK_MODULES), the installed packages' (``installed_modules``: what the
    runner imports while it starts), and the top-level modules of ``base_paths`` that the
    protected Python files import (read from their copies in ``snapshot_dir``)."""
    imported: set[str] = set()
    for record in records:
        if record["path"].endswith(".py") and record["mode"] in ("100644", "100755"):
            try:
                with open(Path(snapshot_dir, "files", record["path"]), "rb") as fh:
                    imported |= _imports(fh.read())
            except OSError:
                continue
    return (set(sys.stdlib_module_names) | FRAMEWORK_MODULES | installed_modules()
            | (imported & top_level_modules(base_paths)))


def import_roots(paths) -> set[str]:
    """Folders (``""`` for the root, else ``"a/b"``) a pytest gate puts on ``sys.path``: the root
    (``python -m`` and pytest's rootdir) and, for each test module, the first folder up from it
    that is no package (pytest's default "prepend" import mode)."""
    paths = set(paths)
    roots = {""}
    for path in paths:
        if not is_test_file(path):
            continue
        folder = posixpath.dirname(path)
        while folder and posixpath.join(folder, "__init__.py") in paths:
            folder = posixpath.dirname(folder)
        roots.add(folder)
    return roots


def loads_plugins(source: bytes) -> bool:
    """True when Python ``source`` assigns ``pytest_plugins`` at its top level: pytest loads the
    plugins a test module names (https://docs.pytest.org/en/stable/how-to/plugins.html,
    "Requiring plugins"), and a plugin's hooks reach every test. Unparseable source counts as
    False (pytest fails to collect it)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        if any(isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name) == "pytest_plugins" for alias in node.names):
            return True
    return False


def compare(protected: list[dict], globs_: list[str], entries: list[dict],
            base_entries: set[str] | None = None, *, gates: bool = False,
            shadowed: set[str] | frozenset = frozenset(), worktree: str | None = None,
            tools: set[str] | frozenset = frozenset(), snapshot_dir: str | None = None) -> list[dict]:
    """Tampering of the protected files, judged on a content manifest's ``entries``.

    ``protected``: the records of ``snapshot`` (and ``carry_forward``); ``entries``:
    ``[{path, mode, blob}]`` of the current files (``workspace.manifest``); ``base_entries``:
    paths of the stage's base (a file there is not "added"); ``gates``: the run has gates (so
    an added runner file counts); ``shadowed``: ``shadowed_names``. Returns ``[{"path",
    "change", ...}]`` with change one of ``modified``, ``deleted``, ``renamed`` (with ``to``),
    ``mode_changed`` (``old_mode``, ``new_mode``), ``added`` (with ``why``); empty when
    nothing protected changed. New test modules (``is_test_file``) are not listed, except one
    that loads pytest plugins (read from ``worktree`` when given). ``tools``: ``gate_tools``.
    A SECTIONED file protected only as a runner's counts as modified when the sections a runner
    reads changed (``runner_sections``, the copy read from ``snapshot_dir``).
    """
    current = {shown(e["path"]): e for e in entries}
    known = {p["path"] for p in protected} | {shown(p) for p in base_entries or ()}
    all_new = {path for path in current if path not in known}
    module_paths = set(current)
    roots = import_roots(module_paths) if shadowed else set()
    # a script a gate runs imports from its own folder first
    roots |= {posixpath.dirname(p["path"]) for p in protected
              if p["path"].endswith(".py") and p.get("why", "").startswith(("named by the gate", "run by"))}
    # an __init__.py added to a folder of protected files turns it into a package: pytest then
    # imports those tests under other names, from another sys.path folder
    protected_folders = {posixpath.dirname(p["path"]) for p in protected if posixpath.dirname(p["path"])}
    protected_modules = {p["path"] for p in protected if p["path"].endswith(".py")}
    added: dict[str, str] = {}
    for path in sorted(all_new):
        decision = globs.decides(path, globs_) if globs_ else None
        if decision is False:
            continue
        if gates and is_loader(path, tools) and not (
                worktree and posixpath.basename(path) in SECTIONED and not _has_runner_sections(worktree, path)):
            added[path] = "a test runner loads it by itself"
        elif posixpath.basename(path) == "__init__.py" and posixpath.dirname(path) in protected_folders:
            added[path] = "makes a folder of protected tests a package (pytest imports them otherwise)"
        elif (module := _shadows_beside(path, current[path]["mode"], protected_modules)) is not None:
            added[path] = f"is imported instead of the protected module {module} beside it"
        elif shadowed and (name := _module_name(path, module_paths, roots)) in shadowed:
            added[path] = f"shadows the module {name} (a new top-level module where the tests import from)"
        elif worktree and gates and path.endswith(".py") and is_test_file(path) and _loads_plugins_at(
                worktree, path, import_roots(module_paths)):
            added[path] = "a new test module that loads pytest plugins (pytest_plugins)"
    changes = []
    for record in protected:
        now = current.get(record["path"])
        if now is None:
            moved = sorted(p for p in all_new if current[p]["blob"] == record["blob"])
            if moved:
                changes.append({"path": record["path"], "change": "renamed", "to": moved[0],
                                "old_mode": record["mode"], "new_mode": current[moved[0]]["mode"]})
                added.pop(moved[0], None)
            else:
                changes.append({"path": record["path"], "change": "deleted", "old_mode": record["mode"]})
        elif now["blob"] != record["blob"]:
            if _only_other_sections(record, worktree, snapshot_dir):
                continue
            changes.append({"path": record["path"], "change": "modified", "old_mode": record["mode"],
                            "new_mode": now["mode"]})
        elif now["mode"] != record["mode"]:
            changes.append({"path": record["path"], "change": "mode_changed", "old_mode": record["mode"],
                            "new_mode": now["mode"]})
    changes += [{"path": path, "change": "added", "new_mode": current[path]["mode"], "why": why}
                for path, why in sorted(added.items())]
    return changes


#: What Python imports before ``x.py`` in the same folder: a compiled extension module.
EXTENSION_ENDINGS = (".so", ".pyd")


def _shadows_beside(path: str, mode: str, protected_modules: set[str]) -> str | None:
    """The protected module ``x.py`` that the added ``path`` makes Python import something else for, in
    any layout (top-level or inside a package): a package ``x/__init__.py`` (or a compiled
    ``x/__init__.*.so``), a compiled module ``x.*.so`` (an extension comes before a source file), or a
    symlink ``x`` (to a folder that is a package). None when it shadows no protected module."""
    folder, name = posixpath.split(path)
    if name == "__init__.py" or (name.startswith("__init__.") and name.endswith(EXTENSION_ENDINGS)):
        target = f"{folder}.py" if folder else None
    elif name.endswith(EXTENSION_ENDINGS):
        target = posixpath.join(folder, name.split(".", 1)[0] + ".py")
    elif mode == "120000" and "." not in name:
        target = f"{path}.py"
    else:
        target = None
    return target if target in protected_modules else None


def _only_other_sections(record: dict, worktree: str | None, snapshot_dir: str | None) -> bool:
    """True when ``record`` (a SECTIONED file protected only as a runner's) changed outside the
    sections a runner reads (``runner_sections``), so the change is not tampering."""
    if not (worktree and snapshot_dir) or posixpath.basename(record["path"]) not in SECTIONED:
        return False
    if record.get("why") != "a test runner loads it by itself" or record["mode"] not in ("100644", "100755"):
        return False
    new = _worktree_bytes(Path(worktree, record["path"]))
    try:
        old = Path(snapshot_dir, "files", record["path"]).read_bytes()
    except OSError:
        return False
    if new is None or os.path.islink(os.path.join(worktree, record["path"])):
        return False
    before, after = runner_sections(record["path"], old), runner_sections(record["path"], new)
    return before is not None and before == after


def _has_runner_sections(worktree: str, path: str) -> bool:
    """Whether the new SECTIONED file ``worktree/path`` holds anything a runner reads (a file that
    does not parse, or is a symlink, counts as holding it)."""
    if os.path.islink(os.path.join(worktree, path)):
        return True
    sections = runner_sections(path, _worktree_bytes(Path(worktree, path)) or b"")
    if sections is None:
        return True
    return any(value for value in sections.values())


def _regular_inside(worktree: str, path: str) -> str | None:
    """The real path of ``worktree/path`` when it is (or links to) a regular file inside the worktree."""
    top = os.path.realpath(worktree)
    real = os.path.realpath(os.path.join(top, path))
    return real if real.startswith(top + os.sep) and os.path.isfile(real) else None


def _read_source(worktree: str, path: str) -> bytes:
    real = _regular_inside(worktree, path)
    if real is None:
        return b""
    try:
        with open(real, "rb") as fh:
            return fh.read(4 * 1024 * 1024)
    except OSError:
        return b""


def _loads_plugins_at(worktree: str, path: str, roots: set[str]) -> bool:
    """``loads_plugins`` of ``worktree/path`` (through a symlink inside the worktree too), or of a
    repository module it star-imports (``from x.y import *`` copies ``pytest_plugins``), found
    under the folders of ``roots``."""
    source = _read_source(worktree, path)
    if loads_plugins(source):
        return True
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    folder = posixpath.dirname(path)
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)):
            continue
        parts = (node.module or "").split(".") if node.module else []
        if node.level:
            base = folder
            for _ in range(node.level - 1):
                base = posixpath.dirname(base)
            bases = [base]
        else:
            bases = sorted(roots)
        for base in bases:
            stem = posixpath.join(base, *parts) if parts else base
            for candidate in (stem + ".py", posixpath.join(stem, "__init__.py")):
                if loads_plugins(_read_source(worktree, candidate)):
                    return True
    return False


#: File name endings Python imports a module from (``x.py``, ``x.cpython-311-x86_64-linux-gnu.so``...).
MODULE_SUFFIXES = tuple(sorted(set(importlib.machinery.SOURCE_SUFFIXES + importlib.machinery.EXTENSION_SUFFIXES),
                               key=len, reverse=True))


def _module_name(path: str, paths: set[str], roots: set[str]) -> str | None:
    """The top-level module name ``path`` adds (``x.py``, an extension module ``x.*.so``, or a
    package ``x/__init__.py``) in a folder of ``roots`` (``import_roots``), or None."""
    folder, name = posixpath.split(path)
    if name == "__init__.py":
        if not folder:
            return None
        folder, name = posixpath.split(folder)
    else:
        suffix = next((s for s in MODULE_SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            return None
        name = name[:-len(suffix)]
    if folder not in roots or not name.isidentifier():
        return None
    return name


def describe(changes: list[dict]) -> str:
    """One line per change, e.g. ``tests/test_a.py modified; Makefile mode 100644 -> 100755``; a
    protected test module's change names the tests it held (``tests``, ``held_tests``)."""
    words = []
    for c in changes:
        if c["change"] == "renamed":
            word = f"{c['path']} renamed to {c['to']}"
        elif c["change"] == "mode_changed":
            word = f"{c['path']} mode {c['old_mode']} -> {c['new_mode']}"
        else:
            word = f"{c['path']} {c['change']}"
        if c.get("tests"):
            shown = ", ".join(c["tests"][:5]) + (f" and {len(c['tests']) - 5} more" if len(c["tests"]) > 5 else "")
            word += f" (its tests: {shown})"
        words.append(word)
    return "; ".join(words)


def held_tests(snapshot_dir: str, path: str, limit: int = 50) -> list[str]:
    """The pytest ids of the tests a protected Python test module held (its protected copy, read with
    ``ast``: ``path::test_x`` and ``path::TestY::test_z``); empty for any other file."""
    if not (path.endswith(".py") and is_test_file(path)):
        return []
    try:
        tree = ast.parse(Path(snapshot_dir, "files", path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            found += [f"{path}::{node.name}::{item.name}" for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test")]
    return found[:limit]


def _worktree_bytes(path: Path) -> bytes | None:
    """A worktree file's content as git stores it (a symlink's target text), or None when absent."""
    try:
        if path.is_symlink():
            return os.fsencode(os.readlink(path))
        with open(path, "rb") as fh:
            return fh.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _text(data: bytes | None) -> str | None:
    """``data`` as UTF-8 text without NUL bytes, else None (binary: described, not diffed)."""
    if data is None:
        return ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def report(changes: list[dict], snapshot_dir: str, worktree: str, records: list[dict], redact=None,
           real_paths: dict | None = None) -> list[dict]:
    """Each change of ``compare`` with its evidence: ``sha256_before`` (of the protected copy),
    ``sha256_after`` (of the worktree's file; None when deleted), and ``diff`` (a unified diff
    from the copy to the worktree, at most MAX_DIFF_BYTES, redacted by ``redact`` (``str ->
    str``); a sentence for binary content)."""
    by_path = {r["path"]: r for r in records}
    out = []
    for c in changes:
        record = by_path.get(c["path"])
        old_path = Path(snapshot_dir, "files", c["path"])
        new_rel = c.get("to") or c["path"]
        real = (real_paths or {}).get(new_rel, new_rel)
        new = None if c["change"] == "deleted" else _worktree_bytes(Path(worktree, real))
        old = old_path.read_bytes() if record is not None and old_path.exists() else None
        old_text, new_text = _text(old), _text(new)
        if old_text is None or new_text is None:
            diff = "(binary content: compare the files by hand; their sha256 are above)\n"
        else:
            diff = "".join(difflib.unified_diff(old_text.splitlines(True), new_text.splitlines(True),
                                                f"a/{c['path']} (protected copy)", f"b/{new_rel} (worktree)"))
            diff = diff[:MAX_DIFF_BYTES] or "(content unchanged)\n"
        if redact is not None:
            diff = redact(diff)
        out.append({**c, "sha256_before": record["sha256"] if record else None,
                    "sha256_after": hashlib.sha256(new).hexdigest() if new is not None else None, "diff": diff})
    return out


def write_report(changes: list[dict], snapshot_dir: str, worktree: str, out_path: str, redact=None,
                 records: list[dict] | None = None, real_paths: dict | None = None) -> list[dict]:
    """Write the tamper report of ``changes``: ``out_path`` (a ``.diff``: per file a ``###`` line,
    its hashes and the diff) and beside it ``<out_path minus .diff>.json`` (``report``'s list).

    Returns the changes with their hashes (``report`` without the diffs), as stored in the
    run's evidence. ``records``: the protected records (for the hashes before); ``real_paths``: the
    worktree path of each path as ``shown`` (for names that are not UTF-8).
    """
    files = report(changes, snapshot_dir, worktree, records or [], redact, real_paths)
    parts = []
    for item in files:
        hashes = f"sha256 before {item['sha256_before'] or '-'}, after {item['sha256_after'] or '-'}\n"
        parts.append(f"### {describe([item])}\n{hashes}{item['diff']}")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(parts))
    with open(os.path.splitext(out_path)[0] + ".json", "w", encoding="utf-8") as fh:
        json.dump(files, fh, indent=1)
    return [{k: v for k, v in item.items() if k != "diff"} for item in files]
