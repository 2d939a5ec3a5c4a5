"""The commands the engine prints for a person to type next ("needs Start: ... start_run 7"), each one that
works as printed in a new shell in the project's folder: the interpreter that has Django (the project's
virtual environment, ``make install``'s ``.venv``) and ``manage.py``, where a bare ``python`` would be the
machine's, without Django (a new shell has no virtual environment active). No Django imports.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

#: The project's folder (where manage.py is) and the interpreter ``make install`` puts in it.
PROJECT = Path(__file__).resolve().parents[2]
PROJECT_PYTHON = Path(".venv") / "bin" / "python"


def interpreter() -> str:
    """The Python a person types in the project's folder: ``.venv/bin/python`` when the project has one (whatever
    runs this process: a WSGI server's binary is no interpreter), else this process's own, by its whole path."""
    if (PROJECT / PROJECT_PYTHON).is_file():
        return str(PROJECT_PYTHON)
    return shlex.quote(sys.executable)


def manage(words: str) -> str:
    """``.venv/bin/python manage.py WORDS``: a management command as a person types it in the project's folder."""
    return f"{interpreter()} manage.py {words}"
