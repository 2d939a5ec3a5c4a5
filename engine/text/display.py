"""Display text of a process's output: UTF-8, no ANSI escapes, carriage-return progress collapsed.

engine/processes/process.py streams every supervised process's output through a :class:`DisplayDecoder`
into its display log (docs/field-cases.md C12). No Django imports.
"""

from __future__ import annotations

import codecs
import re

__all__ = ["DisplayDecoder"]

_LINE_CAP = 64 * 1024  # characters of an unfinished display line kept before it is emitted
_ESC_MAX = 4096  # bytes an unfinished escape sequence may be held back

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


