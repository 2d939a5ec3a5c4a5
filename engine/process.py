"""Supervised subprocesses: own session, deadline, streamed capture, redaction, tree kill.

The Run Engine starts agent CLIs and gate commands through :func:`run_supervised`.  It
owns everything the field cases C06, C08, C10, C11, C12 and C14 (docs/field-cases.md) ask of a child process (each a
test named after its id, in tests/test_process.py and tests/test_steps.py):

* the child gets its own session (``start_new_session=True``), ``stdin`` from
  ``/dev/null`` and ``GIT_TERMINAL_PROMPT=0`` / ``GIT_ASKPASS=`` (docs/field-cases.md C10), so a prompt
  sees EOF instead of waiting forever;
* every process of the tree carries ``CP_PROCESS_MARKER=<marker>`` in its environment,
  so descendants that escaped into their own session (claude's Bash tool shells,
  ``sleep 600 &``) can still be found and killed (docs/field-cases.md C06), also by a later reconciler
  (:func:`kill_tree`);
* stdout and stderr go to one pipe that a reader thread streams through a
  :class:`~engine.redaction.Redactor` into a raw file (bytes as emitted, apart from
  redactions; docs/field-cases.md C11, C12, C14) and a display log (UTF-8, ANSI removed, carriage-return
  progress collapsed; docs/field-cases.md C12), with a byte cap and bounded memory; given a
  ``stderr_path``, stderr has a pipe and a reader of its own: the raw file then holds stdout
  alone (what an adapter parses) and stderr is kept apart, both still shown in the display log;
* the deadline is watched by the caller's thread; on expiry the tree is stopped
  politely and then by force (SIGINT, SIGTERM, SIGKILL; docs/field-cases.md C08), and the reader is joined
  with a bounded wait even if a process outside our reach still holds the pipe (docs/field-cases.md C06).

This module takes and returns plain values; it does not import Django.
"""

from __future__ import annotations

import codecs
import errno
import os
import queue
import re
import select
import signal as _signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from engine.redaction import Redactor, secret_env_values

__all__ = [
    "MARKER_ENV",
    "ProcessResult",
    "DisplayDecoder",
    "run_supervised",
    "kill_tree",
    "kill_marked_prefix",
    "find_marked",
    "tail_text",
]

#: Environment variable that tags every process of a supervised tree.
MARKER_ENV = "CP_PROCESS_MARKER"

_READ_SIZE = 64 * 1024  # bytes per os.read
_READER_POLL_MS = 100  # the reader checks its stop flag this often (milliseconds)
_DRAIN_SECONDS = 1.0  # after the tree is gone: time allowed for the reader to reach EOF
_STOP_SECONDS = 1.0  # then: time allowed for the reader to notice the stop flag
_SIGINT_SHARE = 0.5  # part of the grace period reserved for SIGINT before SIGTERM...
_SIGINT_MAX = 1.0  # ...but never more than this many seconds
_KILL_WAIT = 0.5  # seconds to wait for SIGKILLed processes to disappear
_CREATE_TIME_TOLERANCE = 2.0  # seconds; the boot time psutil reads can drift by a second or so
_LINE_CAP = 64 * 1024  # characters of an unfinished display line kept before it is emitted
_ESC_MAX = 4096  # bytes an unfinished escape sequence may be held back
_NOTE = "[run-engine] "


# ---------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------


@dataclass
class ProcessResult:
    """What happened to one supervised process.

    Times are epoch seconds (``started_at``, ``ended_at``, ``create_time``) or seconds
    (``elapsed_seconds``, monotonic clock, from start until the main process was reaped).

    ``exit_code`` is the child's own exit status, or ``None`` when it died from a signal
    (then ``signal`` holds the signal number, e.g. 9 for SIGKILL) or never started.
    ``timed_out`` / ``cancelled`` say that *we* stopped it (deadline / ``should_stop``).
    ``missing_executable`` is set when ``argv[0]`` could not be executed (not found, not
    executable); ``error`` then holds the OS error text.  ``output_bytes`` counts raw bytes
    captured (at most the cap); ``truncated`` says more was produced and discarded.
    ``redactions`` counts values replaced by ``[REDACTED]`` in this run's output.
    ``strays_killed`` counts processes other than the main one that had to be signalled
    (descendants at a timeout or cancel, or leftovers still carrying the marker after the
    main process exited).  ``marker`` is the ``CP_PROCESS_MARKER`` value the tree carried.
    """

    argv: list[str]
    cwd: str
    pid: int | None = None
    create_time: float | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    elapsed_seconds: float = 0.0
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    missing_executable: bool = False
    output_bytes: int = 0
    truncated: bool = False
    redactions: int = 0
    strays_killed: int = 0
    error: str | None = None
    marker: str | None = None

    @property
    def ok(self) -> bool:
        """True only for a real exit status 0 of a process we did not have to stop.

        A process that exits 0 after our SIGINT at the deadline (or on cancel) is not ok.
        """
        return self.exit_code == 0 and not self.timed_out and not self.cancelled


# ---------------------------------------------------------------------------------------
# Display text: UTF-8, no ANSI, carriage returns collapsed
# ---------------------------------------------------------------------------------------

# The escape sequences are handled on the bytes, before UTF-8 decoding (no UTF-8 sequence holds an
# ESC byte), where a regex pass runs about 2.5x as fast as on the decoded text (bench/capture.py).
# Complete escape sequences: CSI; OSC ended by BEL or ST; DCS/SOS/PM/APC ended by ST;
# any other ESC + intermediates + final byte.
_ANSI = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]"
    rb"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    rb"|\x1b[PX^_][^\x1b]*\x1b\\"
    rb"|\x1b[ -/]*[0-~]"
)
# A prefix of an escape sequence that more input could still complete.
_ESC_PARTIAL = re.compile(
    rb"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[PX^_][^\x1b]*\x1b?|[ -/]*)"
)
# Sequences that change the line rather than the colour: erase in line (EL 0/1/2) and
# cursor to column 1 (CHA).  They become the C0 separators FS, GS and RS (which a terminal
# ignores, so any the program printed itself are dropped first), then are applied by the line model.
_EL_END, _EL_START, _EL_ALL = "\x1c", "\x1d", "\x1e"
_OWN_CONTROLS = b"\x1c\x1d\x1e"
_LINE_SEQ = re.compile(rb"\x1b\[(?:([012]?)K|[01]?G)")
_LINE_SEQ_AS = {b"": b"\x1c", b"0": b"\x1c", b"1": b"\x1d", b"2": b"\x1e", None: b"\r"}
_TOKENS = re.compile("([\r\b\x1c-\x1e])")
_LINE_CONTROLS = ("\r", "\b", _EL_END, _EL_START, _EL_ALL)


def _render_lines(text: str) -> str:
    """``text`` (whole lines) with each line that holds a line control rendered (:func:`_render`) and the
    others as they are. The controls are found with ``str.find`` (a C scan each), not with a regex tried at
    every line start, which ran at about a fifth of the speed (bench/capture.py)."""
    found: list[int] = []
    for control in _LINE_CONTROLS:
        at = text.find(control)
        while at != -1:
            found.append(at)
            at = text.find(control, at + 1)
    if not found:
        return text
    found.sort()
    out: list[str] = []
    pos = 0
    for at in found:
        if at < pos:  # on a line already rendered
            continue
        start = text.rfind("\n", pos, at) + 1 or pos
        end = text.find("\n", at)
        if end == -1:
            end = len(text)
        out += (text[pos:start], _render("", 0, text[start:end])[0])
        pos = end
    out.append(text[pos:])
    return "".join(out)


_CR_LF = re.compile(r"\r+\n")


def _render(buf: str, col: int, text: str) -> tuple[str, int]:
    """Apply ``text`` (no newline) to a line ``buf`` with the cursor at ``col``."""
    for tok in _TOKENS.split(text):
        if not tok:
            continue
        if tok == "\r":
            col = 0
        elif tok == "\b":
            col = max(0, col - 1)
        elif tok == _EL_END:
            buf = buf[:col]
        elif tok == _EL_ALL:
            buf = ""
        elif tok == _EL_START:
            keep = min(col + 1, len(buf))
            buf = " " * keep + buf[keep:]
        else:
            if col > len(buf):
                buf += " " * (col - len(buf))
            buf = buf[:col] + tok + buf[col + len(tok) :]
            col += len(tok)
    return buf, col


class DisplayDecoder:
    """Turns a raw output byte stream into readable log text, incrementally.

    * UTF-8 is decoded with an incremental decoder (``errors='replace'``): a multi-byte
      character split across chunks decodes correctly, an invalid byte becomes U+FFFD.
    * ANSI/VT escape sequences (CSI, OSC, DCS/APC/PM/SOS, other ESC sequences) are
      removed, also when split across chunks; no ESC character is ever emitted.
    * Carriage returns behave as on a terminal: ``\\r`` moves to the start of the line and
      later text overwrites it, so ``50%\\r100%\\n`` shows ``100%``; ``\\r\\n`` is a plain
      line end; erase-in-line (``ESC[K``, ``ESC[2K``), cursor-to-column-1 (``ESC[G``) and
      backspace are applied the same way.

    An unfinished line is held until its newline arrives (it may still be overwritten),
    up to 64 Ki characters, after which it is emitted as is.  Memory is bounded.

    Not thread-safe: use one instance per stream, from one thread.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._esc = b""  # unfinished escape sequence held from the previous chunk
        self._buf = ""  # the current (unfinished) line
        self._col = 0  # cursor column in the current line

    def feed(self, data: bytes) -> str:
        """Decode the next chunk; return the display text that is final now."""
        return self._text(self._decoder.decode(self._bytes(data, final=False)))

    def flush(self) -> str:
        """End of stream: return everything still held (a trailing unfinished line too).

        A trailing incomplete UTF-8 sequence becomes U+FFFD; a trailing incomplete escape
        sequence is dropped.  The decoder can be reused for a new stream afterwards.
        """
        out = self._text(self._decoder.decode(self._bytes(b"", final=True), final=True))
        out += self._buf
        self._buf, self._col = "", 0
        self._decoder.reset()
        return out

    def _bytes(self, data: bytes, *, final: bool) -> bytes:
        """``data`` with its escape sequences removed or turned into line controls (bytes, not decoded)."""
        if self._esc:
            data = self._esc + data
            self._esc = b""
        if b"\x1c" in data or b"\x1d" in data or b"\x1e" in data:
            data = data.translate(None, _OWN_CONTROLS)
        if b"\x1b" in data:
            data = self._strip_escapes(data, final=final)
        return data

    def _text(self, text: str) -> str:
        if not text:
            return ""
        if "\r" in text:
            # str.replace is a C scan; the regex (for \r\r\n) ran at a tenth of its speed on every chunk
            text = text.replace("\r\n", "\n")
            if "\r\n" in text:
                text = _CR_LF.sub("\n", text)

        nl = text.find("\n")
        if nl == -1:
            self._apply(text)
            return self._emit_overlong()
        self._apply(text[:nl])
        out = [self._buf, "\n"]
        self._buf, self._col = "", 0
        rest = text[nl + 1 :]
        last = rest.rfind("\n")
        if last != -1:
            middle = rest[: last + 1]
            rest = rest[last + 1 :]
            middle = _render_lines(middle)
            out.append(middle)
        self._apply(rest)
        out.append(self._emit_overlong())
        return "".join(out)

    def _strip_escapes(self, data: bytes, *, final: bool) -> bytes:
        lo = max(0, len(data) - _ESC_MAX)
        last = data.rfind(b"\x1b", lo)
        if last != -1:
            # Hold back an escape sequence that the next chunk may complete.  An OSC or
            # DCS whose ST terminator is split shows as two ESCs: check the one before.
            prev = data.rfind(b"\x1b", lo, last)
            if prev != -1 and _ESC_PARTIAL.fullmatch(data, prev):
                last = prev
            elif not _ESC_PARTIAL.fullmatch(data, last):
                last = -1
            if last != -1:
                if not final:
                    self._esc = data[last:]
                data = data[:last]
        data = _LINE_SEQ.sub(lambda m: _LINE_SEQ_AS[m.group(1)], data)
        return _ANSI.sub(b"", data).replace(b"\x1b", b"")

    def _apply(self, text: str) -> None:
        if not text:
            return
        if self._col == len(self._buf) and not _has_line_controls(text):
            self._buf += text
            self._col = len(self._buf)
        else:
            self._buf, self._col = _render(self._buf, self._col, text)

    def _emit_overlong(self) -> str:
        if len(self._buf) <= _LINE_CAP:
            return ""
        out = self._buf
        self._buf, self._col = "", 0
        return out


def _has_line_controls(text: str) -> bool:
    return (
        "\r" in text
        or "\b" in text
        or _EL_END in text
        or _EL_START in text
        or _EL_ALL in text
    )


# ---------------------------------------------------------------------------------------
# Output capture (reader thread)
# ---------------------------------------------------------------------------------------


def _open_append(path: str | os.PathLike[str]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _writev_all(fd: int, buffers: list[bytes]) -> None:
    written = os.writev(fd, buffers)
    total = sum(len(b) for b in buffers)
    if written < total:  # short write (rare on regular files): finish it by hand
        _write_all(fd, b"".join(buffers)[written:])


class _Capture:
    """Streams the child's output pipe into the raw file and the display log.

    Two threads: the *reader* reads the pipe (``os.read`` of 64 KiB after ``poll``),
    applies the byte cap, the redactor and the :class:`DisplayDecoder`; the *writer*
    appends the results to the files.  File writes release the GIL, so they overlap
    with the next chunk's redaction.  The queue between them is bounded (16 chunks,
    about 2 MiB), so memory stays bounded whatever the output size.

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
        self.captured = 0  # raw bytes accepted (<= max_bytes)
        self.discarded = 0  # raw bytes read after the cap
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
        text = f"{prefix}{_NOTE}{message}\n"
        if self._log_fd is not None:
            _write_all(self._log_fd, text.encode("utf-8"))
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
                    self._emit_text(
                        f"{'' if self._last_char == chr(10) else chr(10)}{_NOTE}"
                        f"output truncated at {self.captured} bytes; "
                        f"{self.discarded} more bytes were read and discarded\n"
                    )
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
            if self.truncated or self.error:
                # keep draining so the child never blocks on a full pipe
                self.discarded += len(data)
                continue
            room = self._max_bytes - self.captured
            if len(data) > room:
                self.discarded += len(data) - room
                data = data[:room]
                self.truncated = True
            self.captured += len(data)
            if data:
                self._emit(self._redactor.feed(data), final=False)

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

    def _emit_text(self, text: str) -> None:
        self._last_char = text[-1]
        self._put((b"", text.encode("utf-8")))

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


# ---------------------------------------------------------------------------------------
# Finding and stopping process trees
# ---------------------------------------------------------------------------------------


def _protected() -> tuple[set[int], set[int]]:
    """Our own pid and our ancestors' pids, and their process groups: never signalled."""
    pids = {0, 1, os.getpid()}
    try:
        pids.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pids.add(os.getppid())
    pgids = {0, 1}
    for pid in pids - {0}:
        try:
            pgids.add(os.getpgid(pid))
        except OSError:
            continue
    return pids, pgids


def _in_session(proc: psutil.Process, sid: int, not_before: float) -> bool:
    try:
        return os.getsid(proc.pid) == sid and proc.create_time() >= not_before
    except (OSError, psutil.Error):
        return False


def _marked(
    marker: str | None,
    protected: set[int],
    sid: int | None = None,
    not_before: float = 0.0,
) -> list[psutil.Process]:
    """Live processes carrying ``marker``, plus (with ``sid``) members of session ``sid``
    created at or after ``not_before`` (epoch seconds): they catch descendants that
    cleared their environment but stayed in the child's session."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid in protected:
            continue
        try:
            ours = bool(marker) and proc.environ().get(MARKER_ENV) == marker
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            ours = False
        except OSError:
            # /proc/<pid>/environ can fail in odd ways for kernel threads; not ours
            ours = False
        if not ours and (sid is None or not _in_session(proc, sid, not_before)):
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        found.append(proc)
    return found


def _scrub_raw(raw_path: str, redactor: Redactor) -> None:
    """Rewrite a raw log without terminal escape sequences, redacted again: a credential split by
    colour codes was found in the display text, so the raw bytes hold it too. The raw log is then
    no longer byte-identical to the output (a note at its end says so): no credential is kept."""
    tmp = os.fspath(raw_path) + ".scrub"
    with open(raw_path, "rb") as src, open(tmp, "wb") as dst:
        carry = b""
        for chunk in iter(lambda: src.read(1 << 20), b""):
            data = carry + chunk
            cut = data.rfind(b"\n") + 1 or len(data)  # escapes never span lines here
            carry, data = data[cut:], data[:cut]
            dst.write(redactor.feed(_ANSI_BYTES.sub(b"", data)))
        dst.write(redactor.feed(_ANSI_BYTES.sub(b"", carry)) + redactor.flush())
        dst.write(b"\n" + _NOTE.encode() + b"terminal escape sequences were removed from this raw log, because a "
                  b"credential split by them had to be redacted\n")
    os.replace(tmp, raw_path)


_ANSI_BYTES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]*[0-~]")


def find_marked(marker: str) -> list[psutil.Process]:
    """Live processes whose environment has ``CP_PROCESS_MARKER == marker``.

    Skips zombies, processes whose environment cannot be read (other users, kernel
    threads), this process and its ancestors.

    :param marker: the marker value given to :func:`run_supervised`.
    :returns: ``psutil.Process`` objects (may already be gone by the time they are used).
    :raises ValueError: if ``marker`` is empty.
    """
    if not marker:
        raise ValueError("marker must be a non-empty string")
    return _marked(marker, _protected()[0])


def markers_with_prefix(prefix: str) -> set[str]:
    """The distinct ``CP_PROCESS_MARKER`` values of live processes that start with ``prefix``.

    Skips zombies, unreadable environments, this process and its ancestors.

    :raises ValueError: if ``prefix`` is empty (it would match every marked process).
    """
    if not prefix:
        raise ValueError("prefix must be a non-empty string")
    protected = _protected()[0]
    found = set()
    for proc in psutil.process_iter():
        if proc.pid in protected:
            continue
        try:
            value = proc.environ().get(MARKER_ENV) or ""
            if value.startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(value)
        except (psutil.Error, OSError):
            continue
    return found


def kill_marked_prefix(prefix: str, grace_seconds: float = 5.0) -> int:
    """Stop every process tree whose ``CP_PROCESS_MARKER`` starts with ``prefix`` (e.g. all the
    processes of one run: its agents and its gates), as :func:`kill_tree` does with a marker.

    :param prefix: a non-empty marker prefix (the Run Engine's is ``cp-run-<id>-<uid8>-``).
    :param grace_seconds: seconds between the polite signals and SIGKILL.
    :returns: how many distinct processes were signalled (0 if none carried such a marker).
    :raises ValueError: if ``prefix`` is empty.
    """
    return sum(kill_tree(None, None, marker, grace_seconds) for marker in sorted(markers_with_prefix(prefix)))


def _alive(proc: psutil.Process) -> bool:
    # Never reaps (no waitpid): psutil.wait_procs() would reap our own child and
    # subprocess would then report its exit status as 0.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _collect(
    root: psutil.Process | None,
    marker: str | None,
    protected: set[int],
    session: tuple[int, float] | None = None,
) -> dict[int, psutil.Process]:
    procs: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            if _alive(root):
                procs[root.pid] = root
            for child in root.children(recursive=True):
                if _alive(child):
                    procs[child.pid] = child
        except psutil.NoSuchProcess:
            pass
    if marker or session:
        sid, not_before = session if session else (None, 0.0)
        for proc in _marked(marker, protected, sid, not_before):
            procs.setdefault(proc.pid, proc)
    for pid in protected:
        procs.pop(pid, None)
    return procs


#: The sandbox's own processes (bubblewrap's monitor and its PID namespace's init). A polite
#: signal spares them: bubblewrap ends on SIGINT or SIGTERM, and with it, at once, everything in
#: its PID namespace, which would cut the grace an agent inside gets to clean up. SIGKILL reaches them.
SANDBOX_PROCESS_NAMES = ("bwrap",)


def _is_sandbox(proc: psutil.Process) -> bool:
    try:
        return proc.name() in SANDBOX_PROCESS_NAMES
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _send(
    procs: Iterable[psutil.Process],
    sig: int,
    protected_pgids: set[int],
    signalled: set[int],
) -> None:
    """Signal each distinct process group of ``procs``, then each process. A polite signal (not
    SIGKILL) skips the sandbox's own processes (SANDBOX_PROCESS_NAMES) and the groups they are in;
    the processes inside the sandbox get it one by one."""
    procs = list(procs)
    groups, spared_groups = set(), set()
    if sig != _signal.SIGKILL:
        spared = [proc for proc in procs if _is_sandbox(proc)]
        procs = [proc for proc in procs if proc not in spared]
        for proc in spared:
            try:
                spared_groups.add(os.getpgid(proc.pid))
            except OSError:
                continue
    for proc in procs:
        try:
            groups.add(os.getpgid(proc.pid))
        except OSError:
            continue
    for pgid in groups - protected_pgids - spared_groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            continue
    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil checks the pid was not reused
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        signalled.add(proc.pid)


def _wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll until every process is gone or a zombie; return the ones still alive."""
    end = time.monotonic() + max(0.0, timeout)
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        alive = [p for p in alive if _alive(p)]
    return alive


def _terminate(
    root: psutil.Process | None,
    marker: str | None,
    grace_seconds: float,
    *,
    polite: bool = True,
    session: tuple[int, float] | None = None,
) -> set[int]:
    """Stop ``root``'s tree plus every process carrying ``marker`` (plus, with
    ``session=(sid, not_before)``, the members of that session started since then).

    SIGINT (the claude CLI cleans up its tool shells only on SIGINT), then SIGTERM, each
    sent to every distinct process group and to every process; after ``grace_seconds``
    in total, SIGKILL to whatever is left, re-collected first to catch new children.
    With ``polite=False`` SIGKILL is sent at once.  Returns the pids signalled.
    """
    protected, protected_pgids = _protected()
    signalled: set[int] = set()
    procs = _collect(root, marker, protected, session)
    if not procs:
        return signalled
    if polite:
        grace = max(0.0, grace_seconds)
        end = time.monotonic() + grace
        _send(procs.values(), _signal.SIGINT, protected_pgids, signalled)
        alive = _wait_gone(procs.values(), min(_SIGINT_MAX, grace * _SIGINT_SHARE))
        procs = {p.pid: p for p in alive}
        procs.update(_collect(root, marker, protected, session))
        if procs:
            _send(procs.values(), _signal.SIGTERM, protected_pgids, signalled)
            alive = _wait_gone(procs.values(), end - time.monotonic())
            procs = {p.pid: p for p in alive}
            procs.update(_collect(root, marker, protected, session))
    if procs:
        _send(procs.values(), _signal.SIGKILL, protected_pgids, signalled)
        _wait_gone(procs.values(), _KILL_WAIT)
    return signalled


def kill_tree(
    pid: int | None,
    create_time: float | None = None,
    marker: str | None = None,
    grace_seconds: float = 5.0,
) -> int:
    """Kill a recorded process tree, e.g. when reconciling after a worker crash.

    The process ``pid`` and its descendants are stopped only if the pid still belongs to
    the recorded process: its start time must equal ``create_time`` (epoch seconds, as
    given to ``on_start`` by :func:`run_supervised`), within 2 s because the boot time
    another process computes can drift by a second.  A mismatch means the pid was reused
    and the process is skipped.  Without ``create_time`` the pid is accepted only if it
    carries ``marker``.  Every process carrying ``marker`` is stopped as well.  Stopping
    is SIGINT, SIGTERM, then SIGKILL after ``grace_seconds`` (seconds).  This process and
    its ancestors are never signalled.

    :returns: how many distinct processes were signalled (0 if nothing was left).
    """
    protected, _ = _protected()
    root = None
    session = None
    if pid is not None and pid not in protected:
        try:
            proc = psutil.Process(pid)
            if create_time is not None:
                if abs(proc.create_time() - create_time) <= _CREATE_TIME_TOLERANCE:
                    root = proc
            elif marker and proc.environ().get(MARKER_ENV) == marker:
                root = proc
            # A verified root that leads its own session (run_supervised starts it so):
            # its session's members are part of the tree.
            if root is not None and os.getsid(pid) == pid != os.getsid(0):
                session = (pid, root.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            root = None
            session = None
    if root is None and not marker:
        return 0
    return len(_terminate(root, marker, grace_seconds, session=session))


# ---------------------------------------------------------------------------------------
# run_supervised
# ---------------------------------------------------------------------------------------


def _start_error(exc: OSError | ValueError, argv: Sequence[str], cwd: str) -> tuple[bool, str]:
    """(missing_executable, message) for an exception raised by Popen."""
    program = argv[0] if argv else ""
    if isinstance(exc, OSError):
        filename = exc.filename
        if filename is not None and os.fsdecode(filename) == cwd:
            return False, f"cannot use working directory {cwd!r}: {exc}"
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.EPERM):
            return True, f"cannot execute {program!r}: {exc}"
    return False, f"cannot start {program!r}: {exc}"


def run_supervised(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None,
    deadline_seconds: float,
    log_path: str | os.PathLike[str],
    raw_path: str | os.PathLike[str] | None = None,
    grace_seconds: float = 5.0,
    max_output_bytes: int = 512 * 1024**2,
    redactor: Redactor | None = None,
    marker: str | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_start: Callable[[int, float], None] | None = None,
    poll_seconds: float = 0.2,
    stdin_path: str | os.PathLike[str] | None = None,
    stderr_path: str | os.PathLike[str] | None = None,
) -> ProcessResult:
    """Run ``argv`` as a supervised process tree and capture its output.

    :param argv: program and arguments (no shell).
    :param cwd: working directory.
    :param env: the child's complete environment (``None``: a copy of ours).  Added on
        top: ``GIT_TERMINAL_PROMPT=0``, ``GIT_ASKPASS=`` (empty) and
        ``CP_PROCESS_MARKER=<marker>``.
    :param deadline_seconds: wall-clock budget in seconds (monotonic clock).  When it
        expires the tree is stopped and ``timed_out`` is set.
    :param log_path: display log, appended to: UTF-8 text with ANSI sequences removed and
        carriage-return progress collapsed (see :class:`DisplayDecoder`), plus
        ``[run-engine] ...`` notes on their own lines for a start failure, truncation,
        timeout or cancellation.  Written as output arrives, so it can be tailed.
    :param raw_path: optional raw capture, appended to: the bytes the process wrote
        (stdout and stderr interleaved), identical apart from redactions.
    :param grace_seconds: seconds between the first polite signal (SIGINT, then SIGTERM
        within at most 1 s) and SIGKILL.
    :param max_output_bytes: raw bytes kept at most; further output is read and
        discarded (the child never blocks) and ``truncated`` is set.
    :param redactor: redactor applied before anything is written; default: a new
        :class:`Redactor` for the secret-looking values of the child's environment
        (:func:`~engine.redaction.secret_env_values`).
    :param marker: ``CP_PROCESS_MARKER`` value; persist it to find the tree later with
        :func:`kill_tree`.  Default: a fresh random marker (still used for clean-up).
    :param should_stop: polled every ``poll_seconds``; returning True stops the tree and
        sets ``cancelled``.
    :param on_start: called as ``on_start(pid, create_time)`` right after the start
        (``create_time``: epoch seconds from psutil, for pid-reuse checks later).
    :param poll_seconds: how often (seconds) ``should_stop`` is polled.
    :param stdin_path: a file given to the child as its standard input (e.g. the prompt of
        a CLI that reads it from stdin); it ends in EOF, so nothing can wait on it. Default:
        ``/dev/null``.
    :param stderr_path: optional capture of stderr alone, appended to (redacted bytes, as
        ``raw_path``). With it, stderr gets its own pipe and reader, ``raw_path`` holds stdout
        alone, and the display log shows both (each stream's lines whole where a line fits
        one read of 64 KiB). ``max_output_bytes`` then applies to each stream; ``output_bytes``
        and ``redactions`` count both.
    :returns: a :class:`ProcessResult`.  A program that cannot be started gives
        ``missing_executable=True`` (not found / not executable) or ``error`` set,
        with the error text also written to the log; this never raises.
    :raises ValueError: if ``argv`` is empty.
    :raises OSError: if ``log_path``, ``raw_path`` or ``stderr_path`` cannot be opened.
    :raises BaseException: whatever ``on_start`` or ``should_stop`` raise (and
        KeyboardInterrupt etc.), after the process tree has been stopped.

    The call returns within ``deadline_seconds + grace_seconds + ~2 s`` even if some
    process outside our reach keeps the output pipe open.
    """
    plan = _plan(argv, cwd, env, marker, redactor)
    result = ProcessResult(argv=plan.argv, cwd=plan.cwd, marker=plan.marker)
    log_fd, raw_fd, err_fd = _open_outputs(log_path, raw_path, stderr_path)
    err_log_fd = None
    try:  # stderr's reader writes the same display log through its own descriptor
        err_log_fd = os.dup(log_fd) if err_fd is not None else None
    except OSError:
        for fd in (log_fd, raw_fd, err_fd):
            if fd is not None:
                os.close(fd)
        raise

    result.started_at = time.time()
    t0 = time.monotonic()
    try:
        proc, read_fd, err_read_fd = _launch(plan, stdin_path, separate_stderr=err_fd is not None)
    except _StartFailed as failed:
        if err_log_fd is not None:
            os.close(err_log_fd)
        return _start_failed(result, failed.error, t0, log_fd, raw_fd, err_fd)
    except OSError:  # stdin_path or a pipe could not be opened: the caller's error, no file of ours left open
        for fd in (log_fd, raw_fd, err_fd, err_log_fd):
            if fd is not None:
                os.close(fd)
        raise

    captures = [_Capture(read_fd, log_fd, raw_fd, plan.redactor, max_output_bytes)]
    raws = [raw_path]
    if err_read_fd is not None:  # stderr apart: its own reader, redactor and file; the same display log
        captures.append(_Capture(err_read_fd, err_log_fd, err_fd, plan.redactor.fresh(), max_output_bytes))
        raws.append(stderr_path)
    supervision = _Supervision.started(proc, result, plan.marker, grace_seconds, t0, deadline_seconds)
    try:
        for capture in captures:
            capture.start()
        if on_start is not None:
            on_start(proc.pid, result.create_time)
        supervision.wait(should_stop, poll_seconds)
        supervision.stop_and_reap()
    except BaseException:
        # on_start / should_stop raised, or we are being interrupted: never leave the
        # tree running or the pipe open behind us.
        supervision.abort()
        try:
            _discard_capture(captures[0], read_fd)
        finally:
            if err_read_fd is not None:
                _discard_capture(captures[1], err_read_fd)
        raise
    supervision.record_exit()
    _finish_capture(result, captures, supervision.stop_note, plan, raws)
    return result


# The parts of run_supervised, in the order it uses them.


@dataclass
class _Plan:
    """What the child is started with, settled before any file is opened.

    ``argv`` and ``cwd`` as strings; ``env`` the child's complete environment (the
    caller's, or a copy of ours, plus ``GIT_TERMINAL_PROMPT``, ``GIT_ASKPASS`` and
    ``CP_PROCESS_MARKER``); ``marker`` the value of the latter; ``redactor`` the one that
    output passes through; ``redactions_before`` its count before this run, so the result
    counts only this run's redactions.
    """

    argv: list[str]
    cwd: str
    env: dict[str, str]
    marker: str
    redactor: Redactor
    redactions_before: int


def _plan(
    argv: Sequence[str | os.PathLike[str]],
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None,
    marker: str | None,
    redactor: Redactor | None,
) -> _Plan:
    """Settle argv, environment, marker and redactor as :func:`run_supervised` documents.

    :raises ValueError: if ``argv`` is empty.
    """
    argv_list = [os.fspath(a) for a in argv]
    if not argv_list:
        raise ValueError("argv must name a program")
    cwd_str = os.fspath(cwd)
    marker = marker or f"cp-{uuid.uuid4().hex}"
    child_env = dict(os.environ if env is None else env)
    child_env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", MARKER_ENV: marker})
    if redactor is None:
        redactor = Redactor(secret_env_values(child_env))
    return _Plan(argv_list, cwd_str, child_env, marker, redactor, redactor.count)


def _open_outputs(
    log_path: str | os.PathLike[str], raw_path: str | os.PathLike[str] | None,
    stderr_path: str | os.PathLike[str] | None = None,
) -> tuple[int, int | None, int | None]:
    """Open the display log, the optional raw capture and the optional stderr capture for appending.

    :returns: ``(log_fd, raw_fd, err_fd)``; ``raw_fd`` / ``err_fd`` are None without their path.
    :raises OSError: if one cannot be opened (those already open are closed again).
    """
    opened: list[int] = []
    try:
        for path in (log_path, raw_path, stderr_path):
            opened.append(_open_append(path) if path is not None else -1)
    except OSError:
        for fd in opened:
            if fd >= 0:
                os.close(fd)
        raise
    log_fd, raw_fd, err_fd = (fd if fd >= 0 else None for fd in opened)
    return log_fd, raw_fd, err_fd


class _StartFailed(Exception):
    """``Popen`` refused to start the child; ``error`` is what it raised."""

    def __init__(self, error: OSError | ValueError) -> None:
        super().__init__(str(error))
        self.error = error


def _launch(
    plan: _Plan, stdin_path: str | os.PathLike[str] | None, separate_stderr: bool = False
) -> tuple[subprocess.Popen[bytes], int, int | None]:
    """Start the child in its own session, stdout and stderr on one new pipe (or each on
    its own with ``separate_stderr``).

    Standard input is ``stdin_path`` opened for reading, or ``/dev/null``.  Our copies of
    the pipes' write ends and of the stdin file are closed once ``Popen`` has returned or
    failed.

    :returns: ``(proc, read_fd, err_read_fd)``: the child, the stdout pipe's read end and
        the stderr pipe's read end (None when stderr shares the first pipe); ours to close.
    :raises _StartFailed: if ``Popen`` raised OSError or ValueError (the pipes are closed).
    :raises OSError: if ``stdin_path`` cannot be opened.
    """
    stdin_file = open(stdin_path, "rb") if stdin_path is not None else None  # before the pipe: nothing to leak
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        if stdin_file is not None:
            stdin_file.close()
        raise
    try:
        err_read_fd, err_write_fd = os.pipe() if separate_stderr else (None, write_fd)
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        if stdin_file is not None:
            stdin_file.close()
        raise
    try:
        proc = subprocess.Popen(
            plan.argv,
            cwd=plan.cwd,
            env=plan.env,
            stdin=stdin_file if stdin_file is not None else subprocess.DEVNULL,
            stdout=write_fd,
            stderr=err_write_fd,
            start_new_session=True,
            close_fds=True,
        )
    except (OSError, ValueError) as exc:
        os.close(read_fd)
        if err_read_fd is not None:
            os.close(err_read_fd)
        raise _StartFailed(exc) from exc
    finally:
        os.close(write_fd)
        if err_read_fd is not None:
            os.close(err_write_fd)
        if stdin_file is not None:
            stdin_file.close()
    return proc, read_fd, err_read_fd


def _start_failed(
    result: ProcessResult, exc: OSError | ValueError, t0: float, log_fd: int, raw_fd: int | None,
    err_fd: int | None = None,
) -> ProcessResult:
    """Fill ``result`` for a child that never started; note why in the log; close the files.

    ``t0`` is the monotonic clock (seconds) read when the start began.

    :returns: ``result``, with ``missing_executable`` or only ``error`` set.
    :raises OSError: if the note cannot be written (the files are closed all the same).
    """
    missing, message = _start_error(exc, result.argv, result.cwd)
    result.missing_executable = missing
    result.error = message
    result.ended_at = time.time()
    result.elapsed_seconds = time.monotonic() - t0
    try:
        _write_all(log_fd, f"{_NOTE}{message}\n".encode("utf-8", "replace"))
    finally:
        for fd in (log_fd, raw_fd, err_fd):
            if fd is not None:
                os.close(fd)
    return result


@dataclass
class _Supervision:
    """A started child under watch: how to stop its tree, and why we did.

    ``proc`` is the child, ``result`` the :class:`ProcessResult` being filled in.  ``root``
    is its psutil handle and ``session`` its ``(sid, create_time)`` (epoch seconds), both
    None when psutil could no longer see it right after the start.  ``marker`` and
    ``grace_seconds`` (seconds) are passed to :func:`_terminate`.  ``t0`` and
    ``deadline_at`` are monotonic-clock seconds (start, and start + deadline);
    ``deadline_seconds`` is kept for the log note.  ``stop_note`` is set when we stopped
    the tree (deadline or ``should_stop``); ``signalled`` collects the pids signalled.
    """

    proc: subprocess.Popen[bytes]
    result: ProcessResult
    root: psutil.Process | None
    session: tuple[int, float] | None
    marker: str
    grace_seconds: float
    t0: float
    deadline_seconds: float
    deadline_at: float
    stop_note: str | None = None
    signalled: set[int] = field(default_factory=set)

    @classmethod
    def started(
        cls,
        proc: subprocess.Popen[bytes],
        result: ProcessResult,
        marker: str,
        grace_seconds: float,
        t0: float,
        deadline_seconds: float,
    ) -> _Supervision:
        """Record the child's pid and start time in ``result`` and watch it from ``t0``."""
        result.pid = proc.pid
        try:
            root: psutil.Process | None = psutil.Process(proc.pid)
            result.create_time = root.create_time()
        except psutil.Error:
            root = None
        # start_new_session: the child leads a new session whose id is its pid.
        session = (proc.pid, result.create_time) if result.create_time is not None else None
        return cls(
            proc, result, root, session, marker, grace_seconds, t0, deadline_seconds, t0 + deadline_seconds
        )

    @property
    def stopped(self) -> bool:
        """True when we stopped the tree (deadline reached or stop requested)."""
        return self.result.timed_out or self.result.cancelled

    def wait(self, should_stop: Callable[[], bool] | None, poll_seconds: float) -> None:
        """Wait until the child exits, the deadline passes, or ``should_stop()`` is true.

        Waits in steps of ``poll_seconds`` (at least 0.01 s, at most what is left of the
        deadline) and asks ``should_stop`` after each step that ended without an exit.
        Sets ``timed_out`` or ``cancelled`` (and ``stop_note``) only if the child is still
        running at that moment; it signals nothing.

        :raises BaseException: whatever ``should_stop`` raises.
        """
        while True:
            remaining = self.deadline_at - time.monotonic()
            if remaining <= 0:
                if self.proc.poll() is None:
                    self.result.timed_out = True
                    self.stop_note = f"deadline of {self.deadline_seconds:g} s reached"
                return
            if self._exited_within(max(0.01, min(poll_seconds, remaining))):
                return
            if should_stop is not None and should_stop():
                if self.proc.poll() is None:
                    self.result.cancelled = True
                    self.stop_note = "stop requested"
                return

    def _exited_within(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the child; True if it exited (reaped)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop_and_reap(self) -> None:
        """Stop the tree if we decided to, reap the child, then stop what is left.

        After a deadline or cancel: SIGINT, SIGTERM, SIGKILL (:func:`_terminate`) to the
        whole tree.  Then the child is reaped, which fixes ``ended_at`` and
        ``elapsed_seconds``.  Then the leftovers still carrying the marker or still in the
        child's session (e.g. ``sleep 600 &`` holding the pipe, docs/field-cases.md C06) are stopped, politely
        after a normal exit, by SIGKILL at once after a stop (they already had their grace).
        """
        if self.stopped:
            self.signalled |= _terminate(self.root, self.marker, self.grace_seconds, session=self.session)
        _reap(self.proc)
        self.result.ended_at = time.time()
        self.result.elapsed_seconds = time.monotonic() - self.t0
        polite = not self.stopped
        self.signalled |= _terminate(
            None, self.marker, self.grace_seconds, polite=polite, session=self.session
        )

    def abort(self) -> None:
        """Stop the whole tree and reap the child, on the way out of an exception."""
        _terminate(self.root, self.marker, self.grace_seconds, session=self.session)
        _reap(self.proc)

    def record_exit(self) -> None:
        """Fill ``strays_killed`` and the exit status (``exit_code``, ``signal`` or ``error``)."""
        self.signalled.discard(self.proc.pid)
        self.result.strays_killed = len(self.signalled)
        rc = self.proc.returncode
        if rc is None:
            self.result.error = "process did not exit after SIGKILL"
        elif rc < 0:
            self.result.signal = -rc
        else:
            self.result.exit_code = rc


def _discard_capture(capture: _Capture, read_fd: int) -> None:
    """Close the capture on the way out of an exception: drain for a bounded time, then
    close the files (or leave them to the threads if they do not finish); if the threads
    never started, close the pipe's read end and the files here."""
    if capture.started and _close_capture(capture):
        capture.release()
    elif not capture.started:
        os.close(read_fd)
        capture.release()


def _finish_capture(
    result: ProcessResult,
    captures: list[_Capture],
    stop_note: str | None,
    plan: _Plan,
    raw_paths: list[str | os.PathLike[str] | None],
) -> None:
    """Close the captures after the tree is gone and fill in the output fields of ``result``.

    ``captures``: stdout's (or both streams') first, then stderr's when it is kept apart;
    ``raw_paths`` the file each writes. Lets each reader drain (:func:`_close_capture`); if
    the first finished, appends the stop note to the log; closes the files of those that
    finished and, when the display text needed redactions the raw bytes did not get,
    rewrites that raw capture (:func:`_scrub_raw`).  Sets ``output_bytes``, ``truncated``,
    ``redactions`` (summed over the captures), and ``error`` if none is set yet and writing
    failed or a capture did not finish.

    :raises OSError: if a raw capture cannot be rewritten.
    """
    finished = [_close_capture(capture) for capture in captures]
    if finished[0] and stop_note is not None:
        _note_stop(captures[0], stop_note)
    for capture, done in zip(captures, finished):
        if done:
            capture.release()
    result.output_bytes = sum(capture.captured for capture in captures)
    result.truncated = any(capture.truncated for capture in captures)
    result.redactions = plan.redactor.count - plan.redactions_before + sum(
        capture.display_redactor.count for capture in captures) + sum(
        capture.redactor.count for capture in captures[1:])
    for capture, done, raw_path in zip(captures, finished, raw_paths):
        if done and capture.display_redactor.count and raw_path:
            _scrub_raw(raw_path, plan.redactor.fresh())
    for capture in captures:
        if capture.error and result.error is None:
            result.error = capture.error
    if not all(finished) and result.error is None:
        result.error = "output capture did not finish; some output may be missing"


def _note_stop(capture: _Capture, stop_note: str) -> None:
    """Append "<stop_note>; the process tree was stopped" to the log of a finished capture;
    a write error becomes ``capture.error`` (unless one is already there)."""
    try:
        # the threads are done: safe to append from here
        capture.note(f"{stop_note}; the process tree was stopped")
    except OSError as exc:
        capture.error = capture.error or f"writing output failed: {exc}"


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=_KILL_WAIT + 1.0)
    except subprocess.TimeoutExpired:
        # Uninterruptible sleep even after SIGKILL: nothing more we can do here.
        return


def _close_capture(capture: _Capture) -> bool:
    """Let the reader drain to EOF for a bounded time, then make it stop.

    :returns: True if the threads finished (the caller must then ``release()``);
        False if they were abandoned (they close the files themselves when they end).
    """
    if capture.join(_DRAIN_SECONDS):
        return True
    capture.stop()
    if capture.join(_STOP_SECONDS):
        return True
    return not capture.abandon()


# ---------------------------------------------------------------------------------------
# tail_text
# ---------------------------------------------------------------------------------------


def tail_text(path: str | os.PathLike[str], max_bytes: int = 64 * 1024) -> str:
    """The end of a log file as text.

    :param path: file to read.
    :param max_bytes: read at most this many bytes from the end.
    :returns: the last ``max_bytes`` bytes decoded as UTF-8 (``errors='replace'``),
        starting after the first newline when the read began mid-file and a newline is
        there; ``''`` when the file does not exist or ``max_bytes <= 0``.
    :raises OSError: for errors other than a missing file (e.g. permission denied).
    """
    if max_bytes <= 0:
        return ""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read(max_bytes)
    except FileNotFoundError:
        return ""
    if start > 0:
        nl = data.find(b"\n")
        if 0 <= nl < len(data) - 1:
            data = data[nl + 1 :]
        else:
            # no line boundary: at least do not start inside a UTF-8 character
            skip = 0
            while skip < min(3, len(data)) and 0x80 <= data[skip] <= 0xBF:
                skip += 1
            data = data[skip:]
    return data.decode("utf-8", "replace")
