"""The capture of a supervised process's output: a reader and a writer thread per stream.

engine/processes/process.py ``run_supervised`` starts one :class:`Capture` per output pipe; it streams the
bytes through the redactor into the raw file and, through a ``DisplayDecoder``
(engine/text/display.py), into the display log, with a byte cap and bounded memory. No Django imports.
"""

from __future__ import annotations

import collections
import os
import queue
import select
import threading
from pathlib import Path

from engine.text.display import DisplayDecoder
from engine.redaction import Redactor

_READ_SIZE = 64 * 1024  # bytes per os.read
_READER_POLL_MS = 100  # the reader checks its stop flag this often (milliseconds)
NOTE = "[run-engine] "
#: Of an output past its cap, the last bytes kept (at most a quarter of the cap): the first part
#: is kept as it streams, the last in memory until the stream ends.
TAIL_BYTES = 1024 * 1024


def open_append(path: str | os.PathLike[str]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _writev_all(fd: int, buffers: list[bytes]) -> None:
    written = os.writev(fd, buffers)
    total = sum(len(b) for b in buffers)
    if written < total:  # short write (rare on regular files): finish it by hand
        write_all(fd, b"".join(buffers)[written:])


class Capture:
    """Streams the child's output pipe into the raw file and the display log.

    Two threads: the *reader* reads the pipe (``os.read`` of 64 KiB after ``poll``),
    applies the byte cap, the redactor and the :class:`DisplayDecoder`; the *writer*
    appends the results to the files.  File writes release the GIL, so they overlap
    with the next chunk's redaction.  The queue between them is bounded (16 chunks,
    about 2 MiB), so memory stays bounded whatever the output size.

    Past the byte cap, the first ``max_bytes - tail`` bytes are what was streamed, and the last
    ``tail`` bytes read (``TAIL_BYTES``, at most a quarter of the cap) are kept in memory and
    written after a note saying how many bytes between were discarded, when the stream ends:
    the evidence keeps both the beginning and the end of an overlong output.

    The reader owns the read end of the pipe and closes it when it stops.  The output
    files are closed by the caller (:meth:`release`) once :meth:`join` reports the
    threads finished, or by the threads themselves if the caller gave up waiting
    (:meth:`abandon`).
    """

    def __init__(
        self,
        read_fd: int,
        log_fd: int,
        raw_fd: int | None,
        redactor: Redactor,
        max_bytes: int,
    ) -> None:
        self._fd = read_fd
        self._log_fd: int | None = log_fd
        self._raw_fd = raw_fd
        self._redactor = self.redactor = redactor
        # the display text is redacted again once terminal escapes are gone: a key printed with a
        # colour code inside it (`grep --color`) is only whole there
        self.display_redactor = redactor.fresh()
        self._display = DisplayDecoder()
        self._max_bytes = max(0, max_bytes)
        self._stop_flag = threading.Event()
        self._queue: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue(maxsize=16)
        self._lock = threading.Lock()
        self._done = False
        self._abandoned = False
        self._reader = threading.Thread(
            target=self._read_main, name=f"run-engine-reader-{read_fd}", daemon=True
        )
        self._writer = threading.Thread(
            target=self._write_main, name=f"run-engine-writer-{read_fd}", daemon=True
        )
        self._tail_max = min(TAIL_BYTES, self._max_bytes // 4)
        self._head_max = self._max_bytes - self._tail_max
        self._tail: collections.deque[bytes] = collections.deque()  # the newest bytes past the head
        self._tail_len = 0
        self.captured = 0  # raw bytes kept (<= max_bytes)
        self.discarded = 0  # raw bytes read and not kept (between the head and the tail)
        self.truncated = False
        self.eof = False
        self.error: str | None = None
        self._last_char = "\n"

    # -- control (caller's thread) -------------------------------------------------

    @property
    def started(self) -> bool:
        return self._reader.ident is not None

    def start(self) -> None:
        self._writer.start()
        self._reader.start()

    def stop(self) -> None:
        """Ask the reader to stop reading (takes effect within 0.1 s)."""
        self._stop_flag.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when both threads have finished."""
        self._reader.join(timeout)
        if not self._reader.is_alive():
            self._writer.join(max(0.0, timeout))
        return not (self._reader.is_alive() or self._writer.is_alive())

    def abandon(self) -> bool:
        """Caller gives up on threads that did not finish; they close the files.

        :returns: False if they had finished after all (then call :meth:`release`).
        """
        with self._lock:
            if self._done:
                return False
            self._abandoned = True
            return True

    def release(self) -> None:
        """Close the output files; only after the threads have finished."""
        self._close_files()

    def note(self, message: str) -> None:
        """Append an engine note on its own line of the display log.

        Only once the threads have finished (it writes directly).
        """
        prefix = "" if self._last_char == "\n" else "\n"
        text = f"{prefix}{NOTE}{message}\n"
        if self._log_fd is not None:
            write_all(self._log_fd, text.encode("utf-8"))
            self._last_char = "\n"

    def _close_files(self) -> None:
        for fd in (self._log_fd, self._raw_fd):
            if fd is not None:
                os.close(fd)
        self._log_fd = self._raw_fd = None

    # -- reader thread -------------------------------------------------------------

    def _read_main(self) -> None:
        try:
            self._read_loop()
        except OSError as exc:
            self.error = self.error or f"reading output failed: {exc}"
        finally:
            os.close(self._fd)
            try:
                self._emit(self._redactor.flush(), final=True)
                if self.truncated:
                    note = (f"{'' if self._last_char == chr(10) else chr(10)}{NOTE}output passed its cap of "
                            f"{self._max_bytes} bytes: the first {self._head_max} and the last {self._tail_len} "
                            f"bytes are kept; {self.discarded} bytes between were read and discarded\n")
                    self._emit_text(note, raw=True)
                if self._tail:  # through a fresh redactor and decoder: the stream is cut before it
                    self._redactor, self._display = self._redactor.fresh(), DisplayDecoder()
                    self._emit(self._redactor.feed(b"".join(self._tail)), final=False)
                    self._emit(self._redactor.flush(), final=True)
            finally:
                self._put(None)

    def _read_loop(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while not self._stop_flag.is_set():
            if not poller.poll(_READER_POLL_MS):
                continue
            data = os.read(self._fd, _READ_SIZE)
            if not data:
                self.eof = True
                return
            if self.error:
                # keep draining so the child never blocks on a full pipe
                self.discarded += len(data)
                continue
            room = self._head_max - self.captured
            if room > 0:
                head, data = data[:room], data[room:]
                self.captured += len(head)
                self._emit(self._redactor.feed(head), final=False)
            if data:  # past the head: the newest bytes are kept as the tail, the rest discarded
                self._keep_tail(data)

    def _keep_tail(self, data: bytes) -> None:
        """Keep ``data`` as the newest bytes of the tail (at most ``_tail_max``, oldest dropped);
        once bytes are dropped the output passed its cap: ``truncated``."""
        self._tail.append(data)
        self._tail_len += len(data)
        extra = self._tail_len - self._tail_max
        while extra > 0:
            self.truncated = True
            first = self._tail[0]
            if len(first) <= extra:
                self._tail.popleft()
                cut = len(first)
            else:
                self._tail[0] = first[extra:]
                cut = extra
            self._tail_len -= cut
            self.discarded += cut
            extra -= cut
        self.captured = self._head_max + self._tail_len

    def _emit(self, clean: bytes, *, final: bool) -> None:
        text = self._display.feed(clean) if clean else ""
        if final:
            text += self._display.flush()
        if text:
            self._last_char = text[-1]
        shown = self.display_redactor.feed(text.encode("utf-8")) if text else b""
        if final:
            shown += self.display_redactor.flush()
        if clean or shown:
            self._put((clean if self._raw_fd is not None else b"", shown))

    def _emit_text(self, text: str, raw: bool = False) -> None:
        """An engine note in the display log (and, with ``raw``, in the raw file too)."""
        self._last_char = text[-1]
        data = text.encode("utf-8")
        self._put((data if raw and self._raw_fd is not None else b"", data))

    def _put(self, item: tuple[bytes, bytes] | None) -> None:
        while True:
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                if not self._writer.is_alive():
                    return

    # -- writer thread -------------------------------------------------------------

    def _write_main(self) -> None:
        try:
            finished = False
            while not finished:
                batch = [self._queue.get()]
                while batch[-1] is not None and len(batch) < 64:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                if batch[-1] is None:
                    finished = True
                    batch.pop()
                if batch and self.error is None:
                    self._write_batch(batch)  # type: ignore[arg-type]
        finally:
            with self._lock:
                self._done = True
                if self._abandoned:
                    self._close_files()

    def _write_batch(self, batch: list[tuple[bytes, bytes]]) -> None:
        try:
            raw = [r for r, _t in batch if r]
            if raw and self._raw_fd is not None:
                _writev_all(self._raw_fd, raw)
            text = [t for _r, t in batch if t]
            if text and self._log_fd is not None:
                _writev_all(self._log_fd, text)
        except OSError as exc:
            # e.g. disk full: stop writing; the reader keeps draining the pipe
            self.error = f"writing output failed: {exc}"


