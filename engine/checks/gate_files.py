"""The files a frozen gate command runs, found from its words, through makefiles and scripts.

A gate is agreed by its command, but what it runs lies in files: ``make test`` runs the recipe
of ``test`` in the Makefile (and the makefiles it includes), ``bash ci/test.sh`` runs that
script, which may run ``python tools/runtests.py``. Rewriting any of them weakens the gate
without touching its command, so each is protected (engine/checks/protected.py). Found here:

* every word of the gate command that is a file of the commit (relative to the root, or to a
  folder the command changes to with ``cd DIR`` or ``make -C DIR``);
* the makefile ``make`` reads in each folder it runs in, the makefiles those ``include``, and
  in the recipes of the targets the gate asks for (the first target when it names none) and
  of their prerequisite targets, the programs run: a file right after an interpreter
  (``python``, ``sh``, ``bash``, ``node``...) or first in a command;
* the same programs in the lines of every shell script found so far, to a depth of 4.

Only programs are followed through makefiles and scripts, not every path they mention (a lint
target naming ``app/core.py`` does not freeze the code under test). Pure functions over a
commit's paths and a ``read(path) -> bytes | None``; no git here.
"""
from __future__ import annotations

import posixpath
import re
import shlex
from typing import Callable

#: Words after which a file is a program run by that interpreter.
INTERPRETERS = frozenset({"python", "python3", "python2", "sh", "bash", "dash", "zsh", "node", "ruby", "perl",
                          "php", "Rscript", "source", "."})
MAKE_NAMES = ("GNUmakefile", "makefile", "Makefile")
#: Shell words that start a new command.
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "then", "do", "else", "exec", "env", "time", "nohup", "xargs",
                         "(", "{", "!"})
MAX_DEPTH = 4
MAX_BYTES = 1_000_000
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_TARGET = re.compile(r"^([^\s:=#][^:=#]*?)\s*::?(?!=)\s*(.*)$")


def shell_words(line: str) -> list[str]:
    """The words of a shell line (quotes removed, ``;&|()`` apart, a comment dropped)."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        return list(lexer)
    except ValueError:
        return line.split()


def _norm(base: str, word: str) -> str:
    return posixpath.normpath(posixpath.join(base, word)) if base else posixpath.normpath(word)


def programs(line: str, files: set[str], base: str = "") -> list[str]:
    """Files of ``files`` a shell ``line`` (run in folder ``base``) runs as programs."""
    words = shell_words(line)
    found = []
    start = True
    for i, word in enumerate(words):
        if word in _SEPARATORS:
            start = True
            continue
        if start and ASSIGNMENT.match(word):
            continue  # VAR=value before a command
        candidate = _norm(base, word.lstrip("@-+") if start else word)
        previous = posixpath.basename(words[i - 1]) if i else ""
        if candidate in files and (start or previous in INTERPRETERS or re.fullmatch(r"python[0-9.]*", previous)):
            found.append(candidate)
        start = False
    return found


def _make_invocations(words: list[str]) -> list[tuple[str, list[str], str | None]]:
    """``(folder, targets, makefile)`` of each ``make`` the words run (``-C DIR``, ``-f FILE``),
    with the folder a preceding ``cd DIR`` changed to."""
    out, folder, i = [], "", 0
    while i < len(words):
        word = words[i]
        if word == "cd" and i + 1 < len(words):
            folder = _norm(folder, words[i + 1])
            i += 2
            continue
        if posixpath.basename(word) in ("make", "gmake"):
            where, targets, makefile, j = folder, [], None, i + 1
            while j < len(words) and words[j] not in _SEPARATORS:
                arg = words[j]
                if arg == "-C" and j + 1 < len(words):
                    where, j = _norm(where, words[j + 1]), j + 2
                    continue
                if arg.startswith("--directory="):
                    where = _norm(where, arg.split("=", 1)[1])
                elif arg.startswith("-C") and len(arg) > 2:
                    where = _norm(where, arg[2:])
                elif arg in ("-f", "--file", "--makefile") and j + 1 < len(words):
                    makefile, j = words[j + 1], j + 2
                    continue
                elif not arg.startswith("-") and not ASSIGNMENT.match(arg):
                    targets.append(arg)
                j += 1
            out.append((where, targets, makefile))
            i = j
            continue
        i += 1
    return out


def _parse_makefile(text: str) -> tuple[list[str], dict[str, tuple[list[str], list[str]]], str | None]:
    """``(includes, {target: (prerequisites, recipe lines)}, first target)`` of a makefile's text."""
    includes, rules, first, current = [], {}, None, None
    for raw in text.replace("\\\n", " ").splitlines():
        if raw.startswith("\t"):
            if current is not None:
                for target in current:
                    rules[target][1].append(raw[1:])
            continue
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        head = line.split(None, 1)
        if head[0] in ("include", "-include", "sinclude") and len(head) > 1:
            includes += head[1].split()
            current = None
            continue
        match = _TARGET.match(line)
        if match and not line.startswith(("export ", "override ")):
            targets = match.group(1).split()
            recipe_inline = ""
            prereqs = match.group(2)
            if ";" in prereqs:
                prereqs, recipe_inline = prereqs.split(";", 1)
            current = targets
            for target in targets:
                rules.setdefault(target, ([], []))
                rules[target][0].extend(prereqs.split())
                if recipe_inline.strip():
                    rules[target][1].append(recipe_inline)
                if first is None and "%" not in target and not target.startswith("."):
                    first = target
            continue
        current = None
    return includes, rules, first


def gate_files(commands: list[str], files: set[str], read: Callable[[str], bytes | None]) -> dict[str, str]:
    """``{path: why}`` of the files of ``files`` the gate ``commands`` run (module docstring).

    ``read(path)`` gives a file's content (None when it cannot be read: such a file is
    protected but not followed)."""
    found = _Found(files, read)
    makes: list[tuple[str, list[str], str | None, str]] = []
    for command in commands:
        words = shell_words(command)
        folders = [""] + [_norm("", words[i + 1]) for i, w in enumerate(words[:-1]) if w == "cd"]
        for word in words:
            for base in folders:
                candidate = _norm(base, word)
                if candidate in files:
                    found.add(candidate, f"named by the gate command `{command}`", 0)
        makes += [(where, targets, makefile, command) for where, targets, makefile in _make_invocations(words)]
    for where, targets, makefile, command in makes:
        found.make_once(where, targets, makefile, f"read by `make` in the gate command `{command}`", 0)
    found.follow_scripts()
    return found.named


class _Found:
    """The files a gate runs, found so far (``named``: ``{path: why}``), and those still to follow."""

    def __init__(self, files: set[str], read: Callable[[str], bytes | None]):
        self.files, self.read = files, read
        self.named: dict[str, str] = {}
        self.queue: list[tuple[str, int]] = []
        self.makes_done: set[str] = set()

    def add(self, path: str, why: str, depth: int) -> None:
        if path not in self.named:
            self.named[path] = why
            self.queue.append((path, depth))

    def make_once(self, where: str, targets: list[str], makefile: str | None, why: str, depth: int) -> None:
        key = f"{where}|{makefile}|{','.join(targets)}"
        if key not in self.makes_done:
            self.makes_done.add(key)
            self.follow_make(where, targets, makefile, why, depth)

    def _makefile_texts(self, path: str, where: str, depth: int) -> list[str]:
        """The text of the makefile ``path`` and of the files it includes (each added)."""
        texts, pending = [], [path]
        while pending:
            current = pending.pop()
            data = self.read(current)
            if data is None or len(data) > MAX_BYTES:
                continue
            text = data.decode("utf-8", "replace")
            texts.append(text)
            includes, _rules, _first = _parse_makefile(text)
            for inc in includes:
                inc_path = _norm(where, inc)
                if inc_path in self.files and inc_path not in self.named:
                    self.add(inc_path, f"included by {current}, which the gate's make reads", depth + 1)
                    pending.append(inc_path)
        return texts

    def follow_make(self, where: str, targets: list[str], makefile: str | None, why: str, depth: int) -> None:
        names = [makefile] if makefile else list(MAKE_NAMES)
        path = next((_norm(where, n) for n in names if _norm(where, n) in self.files), None)
        if path is None:
            return
        self.add(path, why, depth)
        rules, first = {}, None
        for text in self._makefile_texts(path, where, depth):
            _inc, found, top = _parse_makefile(text)
            for target, (pre, recipe) in found.items():
                entry = rules.setdefault(target, ([], []))
                entry[0].extend(pre)
                entry[1].extend(recipe)
            first = first or top
        wanted = list(targets) or ([first] if first else [])
        visited: set[str] = set()
        while wanted:
            target = wanted.pop()
            if target in visited or target not in rules:
                continue
            visited.add(target)
            pre, recipe = rules[target]
            wanted += pre
            for line in recipe:
                for program in programs(line, self.files, where):
                    self.add(program, f"run by the recipe of `{target}` in {path}", depth + 1)
                for sub_where, sub_targets, sub_makefile in _make_invocations(shell_words(line)):
                    self.make_once(_norm(where, sub_where), sub_targets, sub_makefile,
                                   f"read by a make the recipe of `{target}` in {path} runs", depth + 1)

    def follow_scripts(self) -> None:
        """Programs run by the shell scripts found (to MAX_DEPTH)."""
        while self.queue:
            path, depth = self.queue.pop(0)
            if depth >= MAX_DEPTH or posixpath.basename(path) in MAKE_NAMES or path.endswith(".mk"):
                continue
            data = self.read(path)
            if data is None or len(data) > MAX_BYTES or b"\0" in data[:4096]:
                continue
            text = data.decode("utf-8", "replace")
            first_line = text.split("\n", 1)[0]
            if not (path.endswith((".sh", ".bash")) or (first_line.startswith("#!") and
                                                         re.search(r"\b(ba|da|z)?sh\b", first_line))):
                continue  # programs are followed through shell scripts only
            for line in text.splitlines():
                for program in programs(line, self.files):
                    self.add(program, f"run by {path}, which the gate runs", depth + 1)
