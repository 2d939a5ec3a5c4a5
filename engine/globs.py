"""The one path-pattern dialect of the project: gitignore patterns, as git matches them.

Every path list of a pipeline (``scope``, ``protected_paths``, ``documentation_paths``,
``exclude``) and the engine's own lists (``workspace.DEFAULT_EXCLUDES``) use it, and the
validator (engine/pipeline_format.py) checks a pattern by compiling it here. The semantics are
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
well-kept implementation of git's rules, pinned in pyproject.toml), then compiled here with
``re.DOTALL`` and ``\\Z`` as the end anchor: pathspec 1.1.1 compiles without DOTALL (so ``**``
misses a folder whose name holds a newline; fixed upstream in cpburnz/python-pathspec pull
request 139, not yet released) and ends with ``$`` (which also matches before a final newline,
so ``x.md`` matched a file named ``x.md<LF>``). With both, every byte a name can hold
(newline, tab, non-ASCII letters, brackets) matches as git matches it, which
tests/test_globs.py checks against ``git ls-files --exclude-from`` itself.
"""
from __future__ import annotations

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


def _end_anchors(regex: str) -> str:
    """``regex`` with every end-of-string ``$`` (outside a character class, unescaped) as ``\\Z``."""
    out, i, in_class = [], 0, False
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or regex[i - 1] == "["
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return "".join(out)


@lru_cache(maxsize=2048)
def _compile(pattern: str) -> tuple[re.Pattern | None, bool | None]:
    """``(regex, include)`` of one pattern; ``(None, None)`` for a blank line or comment.

    Raises GlobError for a pattern git would discard (an invalid range, for example)."""
    try:
        text, include = GitIgnoreSpecPattern.pattern_to_regex(pattern)
    except (GitIgnorePatternError, ValueError) as exc:
        raise GlobError(f"{pattern!r} is not a valid gitignore pattern: {exc}") from None
    if text is None or include is None:
        return None, None
    return re.compile(_end_anchors(text), re.DOTALL), include


def decides(path: str, patterns: Iterable[str]) -> bool | None:
    """How ``patterns`` decide ``path`` (repository-relative, ``/`` separators): True when the
    last pattern that matches it is a positive one, False when it is a ``!`` negation, None
    when none matches."""
    decision = None
    for pattern in patterns:
        regex, include = _compile(pattern)
        if regex is not None and regex.match(path):
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
    i = 0
    while i < len(body):
        if body[i] == "\\":
            if i + 1 >= len(body) or body[i + 1] not in _ESCAPABLE:
                raise GlobError(f"{pattern!r}: a backslash escapes one of * ? [ ] ! # space or \\; "
                                f"folders are separated by '/', not '\\'")
            i += 2
            continue
        i += 1
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
