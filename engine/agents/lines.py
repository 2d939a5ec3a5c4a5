"""Reading an agent CLI's captured output line by line, with a bounded buffer.

Every adapter's parser reads the raw log through :class:`BoundedLines` (issue 13: a 50 MB
single-line output grew the worker's pool process by ~98 MB when a parser read a line whole).
A line longer than the limit is drained in bounded chunks and not parsed; it is counted in
:attr:`BoundedLines.truncated`, which the adapters report as ``extra["truncated_lines"]``, and
its bytes stay whole in the raw log (engine/process.py writes the output as it comes).
"""

from __future__ import annotations

from typing import BinaryIO, Iterator

__all__ = ["MAX_LINE_BYTES", "BoundedLines"]

#: Longest line a parser holds in memory (bytes): 1 MiB, the transcript's bound too
#: (engine/transcript.py MAX_LINE_BYTES). No stream-json or JSONL event an adapter needs
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
