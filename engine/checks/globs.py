"""The one path-pattern dialect of the project: gitignore patterns, as git matches them.

Every path list of a pipeline (``scope``, ``protected_paths``, ``documentation_paths``,
``exclude``) and the engine's own lists (``workspace.DEFAULT_EXCLUDES``) use it, and the
validator (engine/pipeline/format.py) checks a pattern by compiling it here. The semantics are
git's (https://git-scm.com/docs/gitignore, "PATTERN FORMAT"), stated for users in
docs/pipeline-format.md:

* a pattern with a ``/`` at its start or in its middle is anchored at the repository root
  (``docs/*.md``, ``/README.md``); one without (``*.md``, ``conftest.py``) matches a name at
  any depth; a trailing ``/`` matches a folder and everything under it;
* ``*`` and ``?`` never cross a ``/``; ``**`` crosses folders (``a/**``, ``**/b``, ``a/**/b``);
  ``[...]`` is a character class; ``\\`` makes the next character literal (``a\\[1\\].txt``);
* ``!pattern`` re-includes what an earlier pattern matched: the last pattern that matches a
  path decides.

Patterns are translated to regular expressions by pathspec (``GitIgnoreSpecPattern``, the
well-kept implementation of git's rules, pinned in pyproject.toml), then made git's here:

* pattern and path are matched as **bytes** (UTF-8, one latin-1 character per byte), as git's
  wildmatch does: a ``?`` or a class member is one byte;
* compiled with ``re.DOTALL`` and ``\\Z`` as the end anchor: pathspec 1.1.1 compiles without
  DOTALL (``**`` missed a folder whose name holds a newline; fixed upstream in
  cpburnz/python-pathspec pull request 139, not yet released) and ends with ``$`` (which also
  matches before a final newline: ``x.md`` matched a file named ``x.md<LF>``);
* a negated class never matches ``/``; a regex pathspec leaves unanchored (``*/``) is searched;
* white space Python's ``str.rstrip`` would take off a pattern's end but git keeps (a tab, and
  bytes 0x85 and 0xA0, which end many UTF-8 letters) is carried through pathspec as a stand-in.

``check`` refuses what pathspec and git would read differently (classes with backslashes or
``[:alpha:]``, ``**`` inside a name, white space at either end...). tests/test_globs.py checks
every pattern kind against ``git ls-files --exclude-from`` itself.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Iterable

from pathspec.patterns.gitignore import GitIgnorePatternError
from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

__all__ = ["GlobError", "matches", "outside", "decides", "check", "literal_folder"]

#: Characters that make a pattern segment a wildcard rather than a literal name.
WILDCARDS = frozenset("*?[\\")
#: What a backslash may escape: the characters gitignore gives a meaning, and itself.
_ESCAPABLE = frozenset("*?[]!# \\")


class GlobError(ValueError):
    """A pattern that is not a valid gitignore pattern for a repository path (``str(exc)``
    says why in a sentence)."""


def _fix_regex(regex: str) -> str:
    """pathspec's ``regex`` made git's: every end-of-string ``$`` (outside a character class,
    unescaped) as ``\\Z``, and ``/`` out of every negated class (``[!x]``, ``[^x]``: git's classes
    never match a ``/``)."""
    out, i, in_class, class_start = [], 0, False, False
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]" and not class_start:
                in_class = False
            elif ch == "[":
                ch = "\\["  # a literal "[" in a class (unescaped, Python warns of a nested set)
            elif ch in "-&~|" and out and out[-1] == ch:
                ch = "\\" + ch  # "--", "&&", "~~", "||": literal, not a set operation to come
            class_start = False
            out.append(ch)
            i += 1
            continue
        if ch == "[":
            in_class, class_start = True, True
            if regex.startswith("[^]", i):  # "]" first in a negated class is a member
                out.append("[^/\\]")
                i += 3
                class_start = False
                continue
            if regex.startswith("[^", i):
                out.append("[^/")
                i += 2
                continue
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return "".join(out)


#: Characters Python's ``str.rstrip`` (used by pathspec) would take off a pattern's end although git
#: keeps them, each with the stand-in the pattern carries through pathspec (control characters the
#: validator refuses in patterns, so none is ever meant literally).
_KEPT_AT_END = {"\t": "\x01", "\x0b": "\x02", "\x0c": "\x03", "\x85": "\x04", "\xa0": "\x05"}


def _as_bytes_text(text: str) -> str:
    """``text`` (a pattern or a path) as git sees it, bytes, one character per byte (latin-1):
    a ``?`` then matches one byte, as in git. Names that are not UTF-8 (surrogate escapes from
    ``os.fsdecode``) keep their bytes."""
    return os.fsencode(text).decode("latin-1")


@lru_cache(maxsize=2048)
def _compile(pattern: str) -> tuple[re.Pattern | None, bool | None]:
    """``(regex, include)`` of one pattern, for paths given by ``_as_bytes_text``; ``(None, None)``
    for a blank line, a comment, or a pattern git discards (an unclosed ``[``).

    Raises GlobError for a pattern no regular expression can express (a reversed range)."""
    text = _as_bytes_text(pattern)
    for kept, stand_in in _KEPT_AT_END.items():
        text = text.replace(kept, stand_in)
    try:
        regex, include = GitIgnoreSpecPattern.pattern_to_regex(text)
    except (GitIgnorePatternError, ValueError) as exc:
        raise GlobError(f"{pattern!r} is not a valid gitignore pattern: {exc}") from None
    if regex is None or include is None:
        return None, None
    regex = _fix_regex(regex)
    for kept, stand_in in _KEPT_AT_END.items():
        regex = regex.replace(stand_in, re.escape(kept))
    try:
        return re.compile(regex, re.DOTALL), include
    except re.error as exc:
        raise GlobError(f"{pattern!r} is not a valid gitignore pattern: {exc.msg} (a range goes upwards: "
                        f"[a-z], [0-9])") from None


def _hit(regex: re.Pattern, path: str) -> bool:
    # pathspec anchors with "^" where a pattern is rooted; one without (a bare "*/") may match
    # anywhere in the path
    return bool(regex.match(path) if regex.pattern.startswith("^") else regex.search(path))


def decides(path: str, patterns: Iterable[str]) -> bool | None:
    """How ``patterns`` decide ``path`` (repository-relative, ``/`` separators): True when the
    last pattern that matches it is a positive one, False when it is a ``!`` negation, None
    when none matches."""
    decision = None
    text = _as_bytes_text(path)
    for pattern in patterns:
        regex, include = _compile(pattern)
        if regex is not None and _hit(regex, text):
            decision = include
    return decision


def matches(path: str, patterns: Iterable[str]) -> bool:
    """True when ``patterns`` include ``path`` (the last matching pattern is not a negation)."""
    return decides(path, patterns) is True


def outside(paths: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The paths ``patterns`` do not include, sorted."""
    patterns = list(patterns)
    return sorted(p for p in paths if not matches(p, patterns))


def check(pattern: str, *, negation: bool = True) -> str:
    """Validate one pattern of a pipeline's path list and return it.

    Refused (GlobError with the reason): anything but a one-line string; a pattern that names
    nothing inside the repository (``/``, ``!``); a ``..`` or empty folder segment; a backslash
    that does not escape one of ``* ? [ ] ! # space \\`` (folders are separated by ``/``); a
    ``!`` negation when ``negation`` is False; what git itself would discard.
    """
    if not isinstance(pattern, str) or not pattern:
        raise GlobError("must be a non-empty pattern")
    if any(ch in pattern for ch in "\x00\n\r"):
        raise GlobError(f"{pattern!r} must be a single line (a name holding a newline is matched by '?' or '*')")
    body = pattern[1:] if pattern.startswith("!") else pattern
    if body.startswith("//"):
        raise GlobError(f"{pattern!r} must be relative to the repository root: a pattern may start with one '/', "
                        f"which anchors it there")
    if pattern.startswith("!") and not negation:
        raise GlobError(f"{pattern!r}: negation ('!') is not supported here")
    if pattern.startswith("#"):
        raise GlobError(f"{pattern!r} would be a comment; write '\\#' for a name starting with '#'")
    if any(ord(ch) < 0x20 and ch != "\t" or ord(ch) == 0x7F for ch in pattern):
        raise GlobError(f"{pattern!r} must not hold control characters (a name holding one is matched by '?')")
    if pattern != pattern.strip() and not pattern.endswith("\\ "):
        raise GlobError(f"{pattern!r} must not start or end with white space: git would drop a trailing space "
                        f"(write '\\ ' for a space that ends a name, '?' for any other)")
    i, in_class, class_open = 0, False, 0
    while i < len(body):
        ch = body[i]
        if in_class:
            if ch == "\\":
                raise GlobError(f"{pattern!r}: no backslash inside [...] (put ']' first to include it, '-' "
                                f"first or last)")
            if body.startswith("[:", i):
                raise GlobError(f"{pattern!r}: character classes such as [:alpha:] are not supported; "
                                f"write the range ([a-zA-Z])")
            if ch == "]" and i > class_open + 1 and not (i == class_open + 2 and body[class_open + 1] in "!^"):
                in_class = False
            i += 1
            continue
        if ch == "\\":
            if i + 1 >= len(body) or body[i + 1] not in _ESCAPABLE:
                raise GlobError(f"{pattern!r}: a backslash escapes one of * ? [ ] ! # space or \\; "
                                f"folders are separated by '/', not '\\'")
            i += 2
            continue
        if ch == "[" and "]" in body[i + 2:]:  # an unclosed "[" is literal for git too: checked below
            in_class, class_open = True, i
        i += 1
    if body.rstrip("/").endswith("/**") and body.endswith("/") and body.strip("/") != "**":
        raise GlobError(f"{pattern!r}: write {body[:-4]}/ for everything under that folder, or {body[:-4]}/*/** "
                        f"for what its subfolders hold ('**/' at the end reads differently in git and here)")
    for segment in body.split("/"):
        if "***" in segment or ("**" in segment and segment != "**"):
            raise GlobError(f"{pattern!r}: '**' must be a whole folder segment (a/**/b, **/x, x/**); "
                            f"'*' matches within a name")
    segments = body.strip("/").split("/")
    if not body.strip("/"):
        raise GlobError(f"{pattern!r} must name something inside the repository")
    if ".." in segments or "." in segments:
        raise GlobError(f"{pattern!r} must not contain '.' or '..' segments (it must stay inside the repository)")
    if "" in segments:
        raise GlobError(f"{pattern!r} must not contain an empty folder segment ('//')")
    regex, _include = _compile(pattern)
    if regex is None:
        raise GlobError(f"{pattern!r} matches nothing")
    return pattern


def literal_folder(pattern: str) -> str:
    """The folder an anchored positive pattern names before its first wildcard, with a
    trailing ``/`` (``tests/test_*.py`` -> ``tests/``, ``tests/unit/`` -> ``tests/unit/``,
    ``data/**`` -> ``data/``); ``""`` for a negation, an unanchored pattern (``conftest.py``,
    ``*.md``) or one whose first folder is a wildcard (``**/test_*.py``)."""
    if pattern.startswith("!"):
        return ""
    body = pattern.lstrip("/")
    anchored = pattern.startswith("/") or "/" in pattern.rstrip("/")
    if not anchored:
        return ""
    segments = body.split("/")
    if not pattern.endswith("/"):
        segments = segments[:-1]  # the last segment names files
    literal = []
    for segment in segments:
        if not segment or WILDCARDS & set(segment):
            break
        literal.append(segment)
    return "/".join(literal) + "/" if literal else ""
