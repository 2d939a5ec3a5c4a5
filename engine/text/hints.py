"""The commands the engine prints for a person to type next ("needs Start: ... start_run 7"), each one that
works as printed in a new shell in the project's folder: the interpreter that has Django (the project's
virtual environment, ``make install``'s ``.venv``) and ``manage.py``, where a bare ``python`` would be the
machine's, without Django (a new shell has no virtual environment active).
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from django.conf import settings


def interpreter() -> str:
    """This process's Python as a person types it in the project's folder: ``.venv/bin/python`` when it is
    the project's own, else its whole path (an operator's interpreter elsewhere)."""
    executable = Path(sys.executable)
    try:
        return shlex.quote(str(executable.relative_to(Path(settings.BASE_DIR))))
    except ValueError:
        return shlex.quote(str(executable))


def manage(words: str) -> str:
    """``.venv/bin/python manage.py WORDS``: a management command as a person types it in the project's folder."""
    return f"{interpreter()} manage.py {words}"
