"""Reading an agent CLI's captured output line by line, with a bounded buffer.

Every adapter's parser reads the raw log through :class:`BoundedLines` (issue 13: a 50 MB
single-line output grew the worker's pool process by ~98 MB when a parser read a line whole).
A line longer than the limit is drained in bounded chunks and not parsed; it is counted in
:attr:`BoundedLines.truncated`, which the adapters report as ``extra["truncated_lines"]``, and
its bytes stay whole in the raw log (engine/processes/process.py writes the output as it comes).
"""

from __future__ import annotations

import json
from collections import deque
from typing import BinaryIO, Iterator

__all__ = ["MAX_LINE_BYTES", "PLAIN_TEXT_CHARS", "BoundedLines", "JsonEvents", "PlainText", "stderr_lines"]

#: Longest line a parser holds in memory (bytes): 1 MiB, the transcript's bound too
#: (engine/text/transcript.py MAX_LINE_BYTES). No stream-json or JSONL event an adapter needs
#: (init, result, usage, a tool call) comes near it; what does is command output.
MAX_LINE_BYTES = 1024 * 1024


class BoundedLines:
    """The lines of a binary file object, each at most ``limit`` bytes (with its newline).

    :param fh: a file opened in binary mode.
    :param limit: the longest line kept, in bytes (default :data:`MAX_LINE_BYTES`).
    :ivar truncated: how many lines were longer than ``limit`` and skipped so far.

    Memory: at most ``limit`` bytes of one line at a time, whatever the file holds.
    """

    def __init__(self, fh: BinaryIO, limit: int | None = None) -> None:
        self.fh, self.limit, self.truncated = fh, limit or MAX_LINE_BYTES, 0

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.fh.readline(self.limit)
            if not line:
                return
            if len(line) >= self.limit and not line.endswith(b"\n"):
                self.truncated += 1
                while True:  # drain the rest of the overlong line in bounded chunks
                    rest = self.fh.readline(self.limit)
                    if not rest or rest.endswith(b"\n"):
                        break
                continue
            yield line


#: Most text (characters) kept of what a CLI printed outside its JSON stream (``PlainText``).
PLAIN_TEXT_CHARS = 64 * 1024


class PlainText:
    """The lines a CLI printed on stdout that are not JSON events (issue 13: plain text where
    JSON was expected was lost as an answer), kept as text for the attempt's final message.

    :param limit: characters kept at most; when more arrive, the last ``limit`` are kept (an
        answer ends its output) and :attr:`cut` is set.
    :ivar text: the kept text, lines joined by newlines.
    """

    def __init__(self, limit: int = PLAIN_TEXT_CHARS) -> None:
        self.limit, self.cut, self._parts, self._size = limit, False, deque(), 0

    def add(self, line: bytes) -> None:
        """Keep one line (bytes, its newline stripped or not); bounded by ``limit``."""
        text = line.decode("utf-8", errors="replace").rstrip("\r\n")
        self._parts.append(text)
        self._size += len(text) + 1
        while self._size > self.limit and len(self._parts) > 1:
            self._size -= len(self._parts.popleft()) + 1
            self.cut = True
        if self._size > self.limit:  # one line longer than the limit: its end
            self._parts = deque([self._parts[0][-self.limit:]])
            self._size, self.cut = len(self._parts[0]) + 1, True

    @property
    def text(self) -> str:
        return "\n".join(self._parts).strip()


def stderr_lines(path: str | None, limit: int | None = None) -> Iterator[str]:
    """The lines of an attempt's stderr capture (engine/processes/process.py ``stderr_path``), decoded,
    each at most ``limit`` bytes (overlong ones skipped, as :class:`BoundedLines`); nothing
    when ``path`` is empty or missing."""
    if not path:
        return
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        for line in BoundedLines(fh, limit):
            text = line.decode("utf-8", errors="replace").strip()
            if text:
                yield text


class JsonEvents:
    """The JSON-object lines of a CLI's stdout capture, read through :class:`BoundedLines`: what
    every adapter's parser loops over (engine/agents/<cli>/adapter.py).

    :param path: the capture (a missing file has no line).
    :param on_line: called with every non-empty line (stripped bytes) before it is parsed.
    :param on_text: called with every line that is not a JSON object (stderr when it shares the
        capture, a CLI's plain text, a cut line).
    :param skip: line prefixes counted as the stream's own but not parsed (e.g. one CLI's partial-message deltas).
    :ivar structured: whether a JSON object (or a skipped line) was read.
    :ivar plain: the lines that are not JSON and do not start with ``{`` (:class:`PlainText`;
        a cut or broken JSON line is no answer, docs/field-cases.md C11).
    :ivar truncated: lines longer than MAX_LINE_BYTES, skipped (after the iteration).
    """

    def __init__(self, path: str, on_line=None, on_text=None, skip: tuple[bytes, ...] = ()) -> None:
        self.path, self.on_line, self.on_text, self.skip = path, on_line, on_text, skip
        self.structured, self.plain, self.truncated = False, PlainText(), 0

    def __iter__(self) -> Iterator[dict]:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return
        lines = BoundedLines(fh)
        with fh:
            for line in lines:
                line = line.strip()
                if not line:
                    continue
                if self.on_line is not None:
                    self.on_line(line)
                if self.skip and line.startswith(self.skip):
                    self.structured = True
                    continue
                event = None
                if line.startswith(b"{"):
                    try:
                        event = json.loads(line)
                    except ValueError:
                        event = None
                if not isinstance(event, dict):
                    if self.on_text is not None:
                        self.on_text(line)
                    if not line.startswith(b"{"):
                        self.plain.add(line)
                    continue
                self.structured = True
                yield event
        self.truncated = lines.truncated
