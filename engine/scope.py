"""Path globs of scopes and protected paths: ``**`` crosses folders, ``*`` and ``?`` do not.

``app/**`` matches every file under app/; ``*.md`` matches a Markdown file at the top level
only (write ``**/*.md`` for any level); a glob without wildcards names one file or, with a
trailing ``/``, one folder. Paths are repository-relative with ``/`` separators.
"""
from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=512)
def _compile(glob: str) -> re.Pattern:
    if glob.endswith("/"):
        glob += "**"
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def matches(path: str, globs: list[str]) -> bool:
    """True when ``path`` matches any of ``globs``."""
    return any(_compile(glob).match(path) for glob in globs)


def outside(paths: list[str], globs: list[str]) -> list[str]:
    """The paths that match none of ``globs``, sorted."""
    return sorted(p for p in paths if not matches(p, globs))
