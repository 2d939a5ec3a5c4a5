"""Text for an operator's terminal: what an agent chose never drives it.

File names, messages and stop sentences hold what an agent wrote, and an agent can name a file
``"\\x1b[2J"`` (clear the screen), ``"\\x1b]52;c;...\\x07"`` (write the clipboard, OSC 52) or
``"a.py\\nrun 3 is succeeded"`` (forge a line). Every management command prints through
``SafeOutput`` (engine/management/commands/_base.py), which shows each such character as an escape
(``\\x1b``, ``\\n``, ``\\u202e``) instead of sending it: the C0 and C1 controls, DEL, the Unicode
line and paragraph separators and the bidirectional overrides. A write is one line; the line
break a command ends it with is its own. ``--json`` output is JSON, whose strings escape controls.
"""
from __future__ import annotations

import logging
import re

#: C0 controls (tab and line feed included), DEL, C1 controls, the line and paragraph separators,
#: and the bidirectional marks, embeddings, overrides and isolates (they reorder what follows).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def printable(text: str) -> str:
    """``text`` with every character that could drive a terminal shown as an escape."""
    return UNSAFE.sub(_escape, str(text))


class SafeOutput:
    """A Django ``OutputWrapper`` whose ``write`` prints one line, its controls escaped
    (``raw`` writes text the command made itself whole, such as its JSON)."""

    def __init__(self, wrapped):
        self._wrapped = wrapped

    def write(self, msg="", style_func=None, ending=None):
        ending = self._wrapped.ending if ending is None else ending
        if ending and msg.endswith(ending):
            msg = msg[: -len(ending)]
        self._wrapped.write(printable(msg), style_func=style_func, ending=ending)

    def raw(self, msg: str) -> None:
        self._wrapped.write(msg)

    def __getattr__(self, name):
        return getattr(self._wrapped, name)


class SafeStream:
    """A command's ``stdout`` or ``stderr`` attribute whose every value is kept as a ``SafeOutput``
    (Django's BaseCommand sets both in ``__init__`` and again in ``execute``)."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner=None):
        return self if instance is None else instance.__dict__["_safe_streams"][self.name]

    def __set__(self, instance, wrapper):
        streams = instance.__dict__.get("_safe_streams")
        if streams is None:
            streams = instance._safe_streams = {}
        streams[self.name] = wrapper if isinstance(wrapper, SafeOutput) else SafeOutput(wrapper)


class SafeFormatter(logging.Formatter):
    """The log format of the processes' consoles (controlpanel/settings.py LOGGING): a record's
    message, which may name what an agent chose (a file, a folder), is printed escaped; a
    traceback after it keeps its own lines."""

    def formatMessage(self, record):
        record.message = printable(record.message)
        return super().formatMessage(record)
