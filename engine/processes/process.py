"""Supervised subprocesses: own session, deadline, streamed capture, redaction, tree kill.

The Run Engine starts agent CLIs and gate commands through :func:`run_supervised`.  It
owns everything the field cases C06, C08, C10, C11, C12 and C14 (docs/field-cases.md) ask of a child process (each a
test named after its id, in tests/test_process.py and tests/test_steps.py):

* the child gets its own session (``start_new_session=True``), ``stdin`` from
  ``/dev/null`` and ``GIT_TERMINAL_PROMPT=0`` / ``GIT_ASKPASS=`` (docs/field-cases.md C10), so a prompt
  sees EOF instead of waiting forever;
* every process of the tree carries ``CP_PROCESS_MARKER=<marker>`` in its environment,
  so descendants that escaped into their own session (an agent CLI's Bash tool shells,
  ``sleep 600 &``) can still be found and killed (docs/field-cases.md C06), also by a later reconciler
  (:func:`kill_tree`; finding and stopping trees is engine/processes/process_tree.py);
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

import errno
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from engine.processes.capture import NOTE as _NOTE
from engine.processes.capture import Capture as _Capture
from engine.processes.capture import open_append as _open_append
from engine.processes.capture import write_all as _write_all
from engine.text.display import DisplayDecoder
from engine.processes.process_tree import _KILL_WAIT, MARKER_ENV, _terminate, find_marked, kill_marked_prefix, kill_tree  # noqa: F401 - re-exported
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

_DRAIN_SECONDS = 1.0  # after the tree is gone: time allowed for the reader to reach EOF
_STOP_SECONDS = 1.0  # then: time allowed for the reader to notice the stop flag


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
    ``limit`` names the limit we stopped the tree for (``output_too_large``, or what the
    caller's ``watch`` returned, e.g. ``process_limit``: engine/processes/limits.py), else None.
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
    limit: str | None = None

    @property
    def ok(self) -> bool:
        """True only for a real exit status 0 of a process we did not have to stop.

        A process that exits 0 after our SIGINT at the deadline (or on cancel) is not ok.
        """
        return self.exit_code == 0 and not self.timed_out and not self.cancelled and not self.limit


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
    watch: Callable[[], str | None] | None = None,
    stop_at_output_cap: bool = False,
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
    :param max_output_bytes: raw bytes kept at most: past it the first part and the last
        part are kept (engine/processes/capture.py), the bytes between are read and discarded (the
        child never blocks) and ``truncated`` is set.
    :param watch: polled every ``poll_seconds``; a returned name (a limit reached, e.g.
        ``process_limit``) stops the tree like a deadline and becomes ``limit``.
    :param stop_at_output_cap: past ``max_output_bytes`` the tree is stopped too
        (``limit`` = ``output_too_large``).
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

    def limit_reached() -> str | None:
        if stop_at_output_cap and any(capture.truncated for capture in captures):
            return "output_too_large"
        return watch() if watch is not None else None

    try:
        for capture in captures:
            capture.start()
        if on_start is not None:
            on_start(proc.pid, result.create_time)
        supervision.wait(should_stop, poll_seconds, limit_reached)
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
    if stop_at_output_cap and result.truncated and result.limit is None:  # it passed the cap, then exited first
        result.limit = "output_too_large"
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
        return self.result.timed_out or self.result.cancelled or bool(self.result.limit)

    def wait(self, should_stop: Callable[[], bool] | None, poll_seconds: float,
             limit_reached: Callable[[], str | None] | None = None) -> None:
        """Wait until the child exits, the deadline passes, ``should_stop()`` is true or
        ``limit_reached()`` names a limit (then ``limit`` is set).

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
            reached = limit_reached() if limit_reached is not None else None
            if reached:
                if self.proc.poll() is None:
                    self.result.limit = reached
                    self.stop_note = f"limit reached: {reached}"
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
