"""Protected checks: the agreed tests and configuration an agent may not weaken.

At run creation ``snapshot`` copies every file of the run's commit that a pipeline's
``protected_paths`` glob matches, and every file a frozen gate command names, out of git
into the run's control records (``runs/<id>/protected/files/<path>``) with its mode, blob id
and sha256. After every agent attempt (and before the gates run) ``compare`` checks the
worktree's content manifest against that snapshot:

* a protected file modified, deleted, renamed (its content reappears under another name) or
  whose mode changed is tampering;
* a file **added** under a protected glob is tampering too (field case C22: a new
  ``tests/conftest.py`` can skip every test), except a new test module, recognised by its
  name (``TEST_FILE_PATTERNS``): agents may add tests.

A gate may not be weakened: its command is frozen in the run's definition, and the files it
names are protected (``gate_named_files``): a path in the command that is a file of the
commit, the makefile of a ``make`` gate, and the root pytest configuration of a ``pytest``
gate (``pytest.ini``, ``tox.ini``, ``conftest.py``).
"""
from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import posixpath
import shlex
from pathlib import Path

from . import scope, workspace

#: Names of files that add tests; adding one under a protected glob is allowed.
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "*_test.go", "*.test.js", "*.test.ts", "*.test.jsx",
                      "*.test.tsx", "*.spec.js", "*.spec.ts", "*Test.java", "*_spec.rb")
#: Files read by a runner named in a gate command, protected when they exist at the run's commit.
RUNNER_FILES = {"make": ("Makefile", "makefile", "GNUmakefile"),
                "pytest": ("pytest.ini", "tox.ini", "conftest.py")}
#: Names of files that configure a runner wherever they are: with such a gate, every one of them is
#: protected and adding one anywhere is tampering (a tests/pytest.ini with --collect-only, a
#: conftest.py that skips everything, pytest options in pyproject.toml or setup.cfg).
GUARDED_NAMES = {"make": ("Makefile", "makefile", "GNUmakefile"),
                 "pytest": ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")}
#: Bytes of one file's diff kept in a tamper report.
MAX_DIFF_BYTES = 256 * 1024


def is_test_file(path: str) -> bool:
    """True when ``path``'s name marks a new test module (TEST_FILE_PATTERNS)."""
    name = posixpath.basename(path)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in TEST_FILE_PATTERNS)


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
    return tools


def guarded_names(commands: list[str]) -> set[str]:
    """File names protected at any depth because a gate command runs the tool they configure."""
    names: set[str] = set()
    for command in commands:
        for tool in _tools(command):
            names.update(GUARDED_NAMES[tool])
    return names


def gate_named_files(commands: list[str], files: set[str]) -> dict[str, str]:
    """Files of ``files`` (repository paths) that the gate ``commands`` depend on, with why.

    Returns ``{path: "named by gate command `...`"}``. Words that are not paths of the commit
    are ignored; an unparseable command (unbalanced quotes) is split on whitespace.
    """
    named: dict[str, str] = {}
    for command in commands:
        for word in _words(command):
            candidate = posixpath.normpath(word)
            if candidate in files:
                named.setdefault(candidate, f"named by the gate command `{command}`")
        for tool in sorted(_tools(command)):
            for path in RUNNER_FILES[tool]:
                if path in files:
                    named.setdefault(path, f"read by `{tool}` in the gate command `{command}`")
    return named


def snapshot(repo: str, commit: str, globs: list[str], gate_commands: list[str], dest_dir: str) -> list[dict]:
    """Copy the protected files of ``commit`` into ``dest_dir``; returns their records.

    Each record: ``{"path", "mode", "blob", "sha256", "why"}``; the content is written to
    ``dest_dir/files/<path>`` and the list to ``dest_dir/index.json``. Symlinks are recorded
    by their target text. Raises workspace.WorkspaceError when git fails.
    """
    entries = {e["path"]: e for e in workspace._tree_entries(repo, commit)}
    chosen: dict[str, str] = {}
    for path in entries:
        if globs and scope.matches(path, globs):
            chosen[path] = "matches protected_paths"
    for path, why in gate_named_files(gate_commands, set(entries)).items():
        chosen.setdefault(path, why)
    guarded = guarded_names(gate_commands)
    for path in entries:
        if posixpath.basename(path) in guarded:
            chosen.setdefault(path, "configures a tool a gate runs")
    records = []
    files_dir = Path(dest_dir, "files")
    for path in sorted(chosen):
        entry = entries[path]
        if entry["mode"] == "160000":  # a submodule: its commit id is what is protected
            data = entry["blob"].encode()
        else:
            data = workspace.git(["cat-file", "blob", entry["blob"]], repo).stdout
        target = files_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        records.append({"path": path, "mode": entry["mode"], "blob": entry["blob"],
                        "sha256": hashlib.sha256(data).hexdigest(), "why": chosen[path]})
    Path(dest_dir).mkdir(parents=True, exist_ok=True)
    Path(dest_dir, "index.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    return records


def compare(protected: list[dict], globs: list[str], entries: list[dict],
            base_entries: set[str] | None = None, guarded: set[str] | frozenset = frozenset()) -> list[dict]:
    """Tampering of the protected files, judged on a content manifest's ``entries``.

    ``protected``: the records of ``snapshot``; ``entries``: ``[{path, mode, blob}]`` of the
    current files (``workspace.manifest``); ``base_entries``: paths of the run's commit (a
    file there is not "added"). Returns ``[{"path", "change", ...}]`` with change one of
    ``modified``, ``deleted``, ``renamed`` (with ``to``), ``mode_changed`` (``old_mode``,
    ``new_mode``), ``added``; empty when nothing protected changed. New test modules
    (``is_test_file``) are not listed.
    """
    current = {e["path"]: e for e in entries}
    known = {p["path"] for p in protected} | set(base_entries or ())
    added = [path for path in current if path not in known and (
        (globs and scope.matches(path, globs) and not is_test_file(path)) or posixpath.basename(path) in guarded)]
    all_new = {path for path in current if path not in known}
    changes = []
    for record in protected:
        now = current.get(record["path"])
        if now is None:
            moved = sorted(p for p in all_new if current[p]["blob"] == record["blob"])
            if moved:
                changes.append({"path": record["path"], "change": "renamed", "to": moved[0]})
                if moved[0] in added:
                    added.remove(moved[0])
            else:
                changes.append({"path": record["path"], "change": "deleted"})
        elif now["blob"] != record["blob"]:
            changes.append({"path": record["path"], "change": "modified", "old_mode": record["mode"],
                            "new_mode": now["mode"]})
        elif now["mode"] != record["mode"]:
            changes.append({"path": record["path"], "change": "mode_changed", "old_mode": record["mode"],
                            "new_mode": now["mode"]})
    changes += [{"path": path, "change": "added"} for path in sorted(added)]
    return changes


def describe(changes: list[dict]) -> str:
    """One line per change, e.g. ``tests/test_a.py modified; Makefile mode 100644 -> 100755``."""
    words = []
    for c in changes:
        if c["change"] == "renamed":
            words.append(f"{c['path']} renamed to {c['to']}")
        elif c["change"] == "mode_changed":
            words.append(f"{c['path']} mode {c['old_mode']} -> {c['new_mode']}")
        else:
            words.append(f"{c['path']} {c['change']}")
    return "; ".join(words)


def write_report(changes: list[dict], snapshot_dir: str, worktree: str, out_path: str, redact=None) -> str:
    """Write a unified diff of each tampered file (snapshot copy -> worktree) to ``out_path``.

    ``redact``: optional ``str -> str`` applied to the text before it is stored. Returns the
    path. Binary or unreadable content is described, not diffed.
    """
    parts = []
    for c in changes:
        old_path = Path(snapshot_dir, "files", c["path"])
        new_rel = c.get("to") or c["path"]
        new_path = Path(worktree, new_rel)
        header = f"### {describe([c])}\n"
        try:
            old = old_path.read_bytes().decode("utf-8") if old_path.exists() else ""
            new = (new_path.read_bytes().decode("utf-8")
                   if c["change"] != "deleted" and new_path.is_file() and not new_path.is_symlink() else "")
        except (UnicodeDecodeError, OSError):
            parts.append(header + "(binary or unreadable content: compare the files by hand)\n")
            continue
        diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                            f"a/{c['path']} (protected copy)", f"b/{new_rel} (worktree)"))
        parts.append(header + (diff[:MAX_DIFF_BYTES] or "(content unchanged)\n"))
    text = "\n".join(parts)
    if redact is not None:
        text = redact(text)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return out_path
