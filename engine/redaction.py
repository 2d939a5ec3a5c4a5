"""Streaming credential redaction for captured process output.

Everything an agent or a gate prints goes through a :class:`Redactor` *before* it is
written anywhere (docs/field-cases.md C14: redaction happens before anything is persisted, not
only when output is displayed).  The redactor works on bytes, chunk by chunk, with a
bounded hold-back so that a credential split across two reads is still caught.

What is redacted (each occurrence is replaced by ``[REDACTED]``):

* literal secret values handed to the :class:`Redactor` (for example the values of the
  process's own secret environment variables, see :func:`secret_env_values`), also in
  their JSON-escaped form;
* Anthropic / OpenAI keys ``sk-...``, ``sk-ant-...``, ``sk-proj-...`` (body of at least
  20 characters from ``[A-Za-z0-9_-]``);
* Stripe keys ``sk_live_``, ``rk_live_``, ``sk_test_``, ``rk_test_``;
* GitHub tokens ``ghp_``, ``gho_``, ``ghs_``, ``ghu_``, ``ghr_``, ``github_pat_``;
* Google API keys ``AIza...``; Slack tokens ``xox[abeoprs]-...``;
* AWS access key ids ``AKIA``/``ASIA`` + 16 characters, and the value of AWS secret
  access keys given as ``aws_secret_access_key = ...``, ``AWS_SECRET_ACCESS_KEY=...`` or
  ``"SecretAccessKey": "..."`` (any case, quoted or not, JSON-escaped or not);
* the token after ``Bearer`` (``Authorization: Bearer <token>``): 8+ characters with a
  digit, or 20+ characters;
* private key blocks ``-----BEGIN ... PRIVATE KEY-----`` through
  ``-----END ... PRIVATE KEY-----`` (through the end of the base64 body when the END
  line never comes);
* the password in URLs ``scheme://user:PASSWORD@host``.

A recognised credential is consumed to its end, whatever characters follow the part that
made it recognisable (``_REST``: up to whitespace, a quote, a backslash, a bracket, ``<``, ``>``,
``&``, ``@`` or a trailing punctuation mark), so no piece of its body survives after
``[REDACTED]`` (issue 13 saw ``[REDACTED]_UZG0lgg``).

A credential that terminal escape sequences split (``grep --color`` colouring part of a key, a
hyperlink around a piece of it), raw or JSON-escaped (``\\u001b[1m``), is found too: where escapes
stand inside a word, the rules run again on a copy without those (``_strip_escapes``) and what they
find is mapped back, so the escapes inside the credential go with it and the others stay as printed.
An escape beside a space is not looked through: ``Bearer ESC[1mTOKEN`` is redacted only where the
token has a known prefix (the display log, which drops escapes first, redacts it in any case).

JSON-escaped output (stream-json lines, docs/field-cases.md C14) is handled: token bodies never include a
backslash or a quote, so a key inside ``"...sk_live_XXXX\\n..."`` ends at the ``\\`` of
``\\n`` and the closing quote is kept; escaped ``\\/`` inside base64 values and escaped
newlines inside private key blocks are redacted with the value.

Speed: each rule is one compiled bytes regex that starts with a literal, so the regex
engine scans for it at C speed; there is no per-byte Python loop.  Pattern checks run on
the original bytes or on one ``bytes.lower()`` copy of them (same offsets).

Not covered (by design, to keep false positives and cost low): free-form secrets with no
recognisable prefix (``PASSWORD=hunter2`` in a ``.env`` file) unless they are given as
literal values, because name-based rules misfire constantly on source code;
``Authorization: Basic`` credentials; URLs written with JSON-escaped slashes
(``https:\\/\\/``); key bodies longer than the per-rule bound (1,024 bytes; 16 KiB
for private key blocks), whose remainder is not redacted.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "REDACTED",
    "MIN_SECRET_LENGTH",
    "Redactor",
    "redact_text",
    "secret_env_values",
]

#: Replacement written in place of every redacted value.
REDACTED = b"[REDACTED]"

#: Literal secrets shorter than this (in characters) are ignored: they would cause
#: redaction of ordinary words and numbers.
MIN_SECRET_LENGTH = 8

# Minimum number of bytes held back at the end of every feed() so that a partial
# credential at the end of a chunk is not emitted before it can be recognised.  Must be
# at least the longest prefix any rule needs to *decide* whether it matches (the URL
# rule is the longest: 3 + 128 + 1 + 2*256 + 1 bytes).
_MIN_HOLD = 1024

# How many already-emitted bytes are kept as left context for lookbehind checks.
_CONTEXT = 16


@dataclass(frozen=True)
class _Rule:
    name: str
    regex: re.Pattern[bytes]
    group: int = 0  # which group is replaced: 0 = the whole match
    lower: bool = False  # run on the lowercased copy of the buffer (same offsets)
    back: int = 0  # bytes before m.start() that belong to the match (anchor offset)
    # Every match contains one of these bytes; when none is in the buffer the scan is
    # skipped (a memchr, far cheaper than the regex scan).  Empty: always scan.
    needs: tuple[bytes, ...] = ()
    # A match ending less than this many bytes before the end of the data may still
    # grow (an optional trailing part not yet complete), so it is held back.
    margin: int = 0


_TOKEN = rb"[A-Za-z0-9_-]"
# The rest of a recognised credential, whatever its characters (issue 13: a key whose body ran past
# its provider's usual alphabet left "_UZG0lgg" behind): everything up to whitespace, a quote, a
# backslash (a JSON escape ends it, except a \uXXXX escape, which is consumed whole), a bracket, a
# "<", ">", "&" or "@" (markup, URL query and host); a trailing punctuation mark (".", ",", ":"...)
# ends it too, one followed by more body characters belongs to it; a control character (an escape
# sequence) or a byte that is no UTF-8 ends it. A body character is printable ASCII but those stops,
# or one whole UTF-8 character (never half of one: the bound counts characters, so what follows
# [REDACTED] stays valid UTF-8).
_BODY = rb"(?:[#$%*+\-/0-9=A-Z^_a-z|~]|[\xc2-\xf4][\x80-\xbf]{1,3})"
_REST = rb"(?:" + _BODY + rb"|\\u[0-9A-Fa-f]{4}|[.,;:!?](?=" + _BODY + rb")){0,1024}"
_B64ISH = rb"(?:[a-z0-9._~+-]|\\?/)"  # on the lowercased copy; \/ is JSON-escaped /

_RULES: tuple[_Rule, ...] = (
    # OpenAI / Anthropic (sk-, sk-proj-, sk-ant-...) and Stripe (sk_/rk_ live/test).
    # Anchored on the literal "k" for speed; the lookbehinds check the s/r before it
    # and that the key starts a word.
    _Rule(
        "sk_key",
        re.compile(
            rb"k(?<=[sr]k)(?<![A-Za-z0-9_-].k)"
            rb"(?:-(?<=sk-)" + _TOKEN + rb"{20,1024}"
            rb"|_(?:live|test)_[A-Za-z0-9]{10,1024})" + _REST
        ),
        back=1,
        needs=(b"-", b"_"),
    ),
    _Rule(
        "github_token",
        re.compile(rb"gh(?<![A-Za-z0-9_]gh)[pousr]_[A-Za-z0-9]{20,1024}" + _REST),
        needs=(b"_",),
    ),
    _Rule(
        "github_pat",
        re.compile(rb"github_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{20,1024}" + _REST),
        needs=(b"_",),
    ),
    # Google API keys and AWS access key ids share the literal "A".
    _Rule(
        "google_or_aws_key_id",
        re.compile(
            rb"A(?:Iza" + _TOKEN + rb"{30,1024}"
            rb"|(?<![A-Z0-9]A)[KS]IA[0-9A-Z]{16}(?![A-Z0-9]))" + _REST
        ),
    ),
    _Rule(
        "slack_token",
        re.compile(rb"xox[abeoprs]-[A-Za-z0-9-]{10,1024}" + _REST),
        needs=(b"-",),
    ),
    _Rule(
        "private_key",
        re.compile(
            rb"-----BEGIN (?:[A-Z0-9]+ ){0,4}PRIVATE KEY(?: BLOCK)?-----"
            rb"(?:(?!-----END)(?:[A-Za-z0-9+/=\s:,.()-]|\\[nrt/])){0,16384}"
            rb"(?:-----END (?:[A-Z0-9]+ ){0,4}PRIVATE KEY(?: BLOCK)?-----)?"
        ),
        needs=(b"-",),
        margin=64,  # the END line may be arriving
    ),
    _Rule(
        "url_password",
        re.compile(rb"://[^\s/@:\"'\\<>]{0,128}:((?:[^\s/@\"\\<>]|\\\\){1,256})(?=@)"),
        group=1,
        needs=(b":",),
    ),
    # On the lowercased copy: case-insensitive at no extra scan.
    _Rule(
        "bearer_token",
        re.compile(
            rb"bearer[ \t]{1,8}((?:(?=" + _B64ISH + rb"{0,4095}[0-9])" + _B64ISH + rb"{8,4096}=*"
            rb"|" + _B64ISH + rb"{20,4096}=*)" + _REST + rb")"
        ),
        group=1,
        lower=True,
        needs=(b" ", b"\t"),
    ),
    _Rule(
        "aws_secret_access_key",
        re.compile(
            rb"secret_?access_?key(?:\\?[\"'])?[ \t]{0,8}[=:][ \t]{0,8}(?:\\?[\"'])?"
            rb"((?:[a-z0-9+=]|\\?/){16,1024}(?![a-z0-9+=/])" + _REST + rb")"
        ),
        group=1,
        lower=True,
        needs=(b"=", b":"),
    ),
)


def _literal_variants(secret: str) -> set[bytes]:
    """The byte forms in which ``secret`` can appear: raw UTF-8 and JSON-escaped."""
    variants = {secret.encode("utf-8", "surrogatepass")}
    for ascii_only in (False, True):
        escaped = json.dumps(secret, ensure_ascii=ascii_only)[1:-1]
        variants.add(escaped.encode("utf-8", "surrogatepass"))
    variants |= {v.replace(b"/", b"\\/") for v in list(variants) if b"/" in v}
    return variants


class Redactor:
    """Streaming credential redactor for bytes.

    Feed raw output chunks in order; each call returns the bytes that are safe to
    persist now, with credentials replaced by ``[REDACTED]``.  Up to a bounded tail is
    held back until the next call (or :meth:`flush`) so that a credential split across
    two chunks is still found.  The hold-back is normally the current unfinished line,
    capped at ``max(1 KiB, longest literal secret)`` bytes, and can grow to the length of
    the longest possible match (about 16 KiB, for a private key block) while a match is
    still open at the end of the data.  Memory use is therefore bounded whatever the
    output size.

    :param secrets: literal secret values (``str``) to redact wherever they appear,
        raw or JSON-escaped.  Values shorter than :data:`MIN_SECRET_LENGTH` (8)
        characters are ignored.
    :ivar count: number of values redacted so far (overlapping matches count once; a match that is
        only an earlier pass's ``[REDACTED]`` marker, e.g. ``https://u:[REDACTED]@host`` redacted again,
        is left alone and not counted).

    Not thread-safe: use one instance per output stream, from one thread.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        secrets = list(secrets)
        self._secrets = secrets
        variants: set[bytes] = set()
        for secret in secrets:
            if isinstance(secret, str) and len(secret) >= MIN_SECRET_LENGTH:
                variants |= _literal_variants(secret)
        ordered = sorted(variants, key=lambda v: (-len(v), v))
        self._literals: list[re.Pattern[bytes]] = [re.compile(re.escape(v)) for v in ordered]
        longest = len(ordered[0]) if ordered else 0
        self._hold = max(_MIN_HOLD, longest + 1)
        # Every rule is single-line except private key blocks, which are found as soon
        # as their header is complete; so a newline ends the region any future match
        # could reach back into, unless a literal secret itself spans lines.
        self._newline_safe = not any(b"\n" in v for v in ordered)
        self._tail = b""  # left context + held-back bytes, carried to the next feed()
        self._start = 0  # offset in _tail where the held-back (not yet emitted) part begins
        self.count = 0

    def fresh(self) -> "Redactor":
        """A new Redactor for another stream, with the same secrets and a count of 0."""
        return Redactor(self._secrets)

    def feed(self, data: bytes) -> bytes:
        """Take the next chunk of output; return redacted bytes safe to persist now.

        :param data: raw bytes, any length (may be empty).
        :returns: redacted bytes; may be shorter or longer than ``data`` (the held-back
            tail comes out with a later call or :meth:`flush`).
        """
        if not data:
            return b""
        return self._process(self._tail + data, final=False)

    def flush(self) -> bytes:
        """Return the held-back rest, redacted; call once at end of stream.

        The redactor can be reused afterwards (it starts a new stream, keeping
        :attr:`count`).
        """
        out = self._process(self._tail, final=True)
        self._tail = b""
        self._start = 0
        return out

    # -- internals -------------------------------------------------------------

    def _process(self, buf: bytes, *, final: bool) -> bytes:
        # buf = left context (already emitted) + held-back tail + new data
        start = self._start
        end = len(buf)
        if start >= end:
            return b""

        # spans: (match start, match end, redact start, redact end, open-until)
        spans = self._spans(buf, start)
        stripped, cuts = _strip_escapes(buf, start)  # escapes inside a word may split a credential:
        if cuts:  # look again without them
            spans += [_unstrip(span, cuts, len(stripped)) for span in self._spans(stripped, start)]

        if final:
            safe = end
        else:
            safe = max(start, end - self._hold)
            if self._newline_safe:
                nl = buf.rfind(b"\n", safe)
                if nl != -1:
                    safe = nl + 1
            # A match that reaches the end may still grow; a match that crosses the
            # cut is kept whole: hold both back from their start.
            changed = True
            while changed:
                changed = False
                for s, e, _rs, _re, open_until in spans:
                    if s < safe and (e > safe or open_until >= end):
                        safe = s
                        changed = True

        redact = sorted((rs, re_) for s, e, rs, re_, _o in spans if e <= safe and re_ > rs)
        if not redact:
            out = buf[start:safe]
        else:
            parts: list[bytes] = []
            pos = start
            cur_s, cur_e = redact[0]
            for rs, re_ in redact[1:]:
                if rs < cur_e:  # overlaps the current span: merge
                    cur_e = max(cur_e, re_)
                    continue
                parts += (buf[pos:cur_s], REDACTED)
                self.count += 1
                pos = cur_e
                cur_s, cur_e = rs, re_
            parts += (buf[pos:cur_s], REDACTED, buf[cur_e:safe])
            self.count += 1
            out = b"".join(parts)

        keep_from = max(0, safe - _CONTEXT)
        self._tail = buf[keep_from:] if not final else b""
        self._start = safe - keep_from if not final else 0
        return out


    def _spans(self, buf: bytes, start: int) -> list[tuple[int, int, int, int, int]]:
        """Every rule's and literal's matches in ``buf`` from ``start``: ``(match start, match end,
        redact start, redact end, open-until)``."""
        spans: list[tuple[int, int, int, int, int]] = []
        low: bytes | None = None
        for rule in _RULES:
            if rule.needs and not any(b in buf for b in rule.needs):
                continue
            if rule.lower:
                if low is None:
                    low = buf.lower()
                haystack = low
            else:
                haystack = buf
            for m in rule.regex.finditer(haystack, start):
                s = m.start() - rule.back
                if s < start:  # anchor offset reaches into already-emitted context
                    continue
                rs, re_ = m.span(rule.group)
                if rule.group == 0:
                    rs = s
                if buf[rs:re_] == REDACTED:  # an earlier pass's marker (a URL password already gone): nothing new
                    continue
                spans.append((s, m.end(), rs, re_, m.end() + rule.margin))
        for lit in self._literals:
            for m in lit.finditer(buf, start):
                spans.append((m.start(), m.end(), m.start(), m.end(), m.end()))
        return spans


#: Terminal escape sequences (CSI, such as colours ``ESC[31m``, and OSC ``ESC]...BEL``), raw or written
#: as JSON or shell escapes (``\\u001b[31m``, ``\\x1b[31m``, ``\\033[31m``, ``\\e[31m``), which a
#: program may print inside a credential (colouring part of it): what introduces one, and the rest.
_INTRODUCERS = (b"\x1b", b"\\u001b", b"\\u001B", b"\\x1b", b"\\x1B", b"\\033", b"\\e")
_SEQUENCE = rb"(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\\]{0,256}(?:\x07|\x1b\\|\\u0007|\\x07|\\a))"
_ANY_ESCAPE = rb"(?:\x1b|\\u001[bB]|\\x1[bB]|\\033|\\e)" + _SEQUENCE
#: For each introducer: a run of escape sequences inside a word (a byte other than white space before
#: it, and after it a byte that is neither white space nor the start of another escape). Each pattern
#: starts with its introducer, a literal, so the regex engine skips to it at C speed.
_INSIDE_WORD = tuple(
    (intro, re.compile(re.escape(intro) + rb"(?<=[^\s]" + re.escape(intro) + rb")" + _SEQUENCE
                       + rb"(?:" + _ANY_ESCAPE + rb")*(?=[^\s\x1b\\])"))
    for intro in _INTRODUCERS)


def _strip_escapes(buf: bytes, start: int) -> tuple[bytes, list[tuple[int, int]]]:
    """``buf`` without the runs of escape sequences after ``start`` that stand inside a word (they
    may split a credential; colours around words, at a line's ends or beside a space join nothing),
    and the cuts: ``[(offset in the stripped bytes, bytes removed there and before)]``, ascending
    (``_unstrip`` maps back). No cut (the usual case: one ``bytes.find`` an introducer): ``(buf, [])``."""
    runs: list[tuple[int, int]] = []
    for intro, pattern in _INSIDE_WORD:
        if buf.find(intro, start) != -1:
            runs += [m.span() for m in pattern.finditer(buf, start)]
    if not runs:
        return buf, []
    runs.sort()
    parts, cuts, pos, removed = [buf[:start]], [], start, 0
    for a, b in runs:
        a = max(a, pos)  # a run found from two introducers overlaps: cut each byte once
        if b <= a:
            continue
        parts.append(buf[pos:a])
        cuts.append((a - removed, removed + (b - a)))
        removed += b - a
        pos = b
    parts.append(buf[pos:])
    return b"".join(parts), cuts


def _unstrip(span: tuple[int, int, int, int, int], cuts: list[tuple[int, int]], length: int) -> tuple:
    """A span found in the stripped bytes (``_strip_escapes``) as offsets of the original: a start
    goes after the escapes cut at its offset, an end before them, so a match that an escape split
    covers that escape too and one that merely touches an escape does not swallow it."""
    at = [c[0] for c in cuts]

    def first(p: int) -> int:  # a start: past every cut at or before p
        n = bisect.bisect_right(at, p)
        return p + (cuts[n - 1][1] if n else 0)

    def last(p: int) -> int:  # an end: past the cuts strictly before p
        n = bisect.bisect_left(at, p)
        return p + (cuts[n - 1][1] if n else 0)

    s, e, rs, re_, open_until = span
    beyond = max(0, open_until - length)
    return first(s), last(e), first(rs), last(re_), last(min(open_until, length)) + beyond


def redact_text(text: str, secrets: Iterable[str] = ()) -> tuple[str, int]:
    """Redact a whole string at once.

    :param text: any string (e.g. a prompt before it is stored, a log message).
    :param secrets: literal secret values, as for :class:`Redactor`.
    :returns: ``(redacted_text, number_of_redactions)``.
    """
    redactor = Redactor(secrets)
    raw = text.encode("utf-8", "surrogatepass")
    out = redactor.feed(raw) + redactor.flush()
    return out.decode("utf-8", "surrogatepass"), redactor.count


_SECRET_NAME_WORDS = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
    "SESSION",
)
_NON_SECRET_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def secret_env_values(env: Mapping[str, str]) -> list[str]:
    """Values of environment variables that look like secrets.

    A variable counts when its NAME contains (case-insensitive) KEY, TOKEN, SECRET,
    PASSWORD, PASSWD, CREDENTIAL, AUTH, COOKIE or SESSION, and its value is at least
    :data:`MIN_SECRET_LENGTH` (8) characters and not an obvious non-secret: an absolute
    path (starts with ``/``), a boolean word (true/false/yes/no/on/off/none/null) or a
    number.

    :param env: a mapping of variable names to values, e.g. the environment a child
        process is started with.
    :returns: distinct values, in the mapping's order; pass them to :class:`Redactor`.
    """
    found: list[str] = []
    seen: set[str] = set()
    for name, value in env.items():
        if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH:
            continue
        upper = name.upper()
        if not any(word in upper for word in _SECRET_NAME_WORDS):
            continue
        stripped = value.strip()
        if (
            stripped.startswith("/")
            or stripped.lower() in _NON_SECRET_WORDS
            or _NUMBER.fullmatch(stripped)
        ):
            continue
        if value not in seen:
            seen.add(value)
            found.append(value)
    return found
