"""An agent's conversation as a person reads it: its CLI's stream normalized into transcript entries.

Each adapter names the format of its CLI's output (``Adapter.transcript_format``): a CLI's package
name (engine/agents/registry.py), whose ``stream.py`` turns each event of its stream into entries
with the helpers of ``Normalizer`` (``entries(normalizer, event)``; its ``SKIPPED`` line prefixes are not
read); ``messages`` (Anthropic Messages-shaped ``assistant`` messages with ``text``, ``thinking`` and
``tool_use`` blocks and ``user`` messages with ``tool_result`` blocks: what the model gateway writes,
engine/model_gateway/conversation.py); or ``scripted`` (the scripted test agent's lines,
engine/agents/scripted_agent.py). Lines that are not of the format (the engine's ``[run-engine]``
notes, text a CLI printed on stdout; stderr is kept apart in ``output.stderr``, engine/processes/process.py
``stderr_path``, and is not in the raw log) become ``output`` entries.

A ``Follower`` thread reads the attempt's raw log (``output.raw``) while the process writes it and
appends one JSON object a line to ``transcript.jsonl`` beside it. An entry::

    {"n": 7, "t": 1764662400.25, "kind": "tool_call", "tool": "Bash",
     "text": "Runs `python -m pytest -q`", "detail": "Run the tests", "call": "toolu_01"}

``kind`` is one of ``KINDS``; ``t`` the time it was read (seconds since the epoch); ``text`` the
sentence shown; optional ``detail`` (the first lines of a result, a description), ``ok``
(a result's outcome), ``exit`` (a command's exit status), ``call`` (the tool call a result
answers), ``usage`` (tokens so far: ``{"input_tokens", "output_tokens", "cached_tokens"}``).

Bounds: a line of the raw log longer than ``MAX_LINE_BYTES`` is not parsed (an entry says it was
cut; the raw bytes stay in the raw log); texts are cut at ``TEXT_CHARS``, results to their first
``DETAIL_LINES`` lines of at most ``DETAIL_LINE_CHARS`` each. Every entry is redacted again with
the attempt's secrets before it is written (the raw log is redacted at capture already; a line is
redacted whole here, so a credential split across two reads of the capture is still caught).
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

from . import tool_outcomes
from ..agents import registry
from ..processes.process import tail_text
from ..redaction import Redactor

#: The entry kinds, in the words the run page uses for them.
KINDS = ("start", "text", "thinking", "tool_call", "tool_result", "refusal", "usage", "error", "output",
         "result", "cut")
#: The formats an adapter may name; anything else gives ``output`` entries only.
FORMATS = ("messages", "scripted", *registry.CLIS.values())
#: The file name of the transcript, beside the attempt's raw log.
FILE_NAME = "transcript.jsonl"
#: A raw line longer than this (bytes) is not parsed.
MAX_LINE_BYTES = 1024 * 1024
TEXT_CHARS = 2000
DETAIL_LINES = 6
DETAIL_LINE_CHARS = 240
#: Seconds between two looks of a follower at the raw log.
POLL_SECONDS = 0.25

#: The shell tools of the CLIs (each CLI's policy names its own: engine/agents/<cli>/policy.py SHELL_TOOLS),
#: whose command lines are kept to word a missing program, each call worded "Runs `command`".
_SHELL_TOOLS = registry.bundled_all("SHELL_TOOLS")
_TOOL_ERROR_TAG = re.compile(r"</?tool_use_error>")


def transcript_path(raw_path: str | os.PathLike[str]) -> Path:
    """The transcript's path beside ``raw_path`` (the attempt's raw log)."""
    return Path(raw_path).parent / FILE_NAME


def cut(text: str, limit: int = TEXT_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def first_lines(text: str, lines: int = DETAIL_LINES) -> str:
    """The first ``lines`` non-empty lines of ``text``, each cut at DETAIL_LINE_CHARS, and how many more."""
    rows = [row for row in str(text).splitlines() if row.strip()]
    shown = [cut(row, DETAIL_LINE_CHARS) for row in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"… {len(rows) - lines} more line{'s' if len(rows) - lines != 1 else ''}")
    return "\n".join(shown)


def code(text: str, limit: int = 300) -> str:
    one = " ".join(str(text).split())
    return "`" + cut(one, limit) + "`"


#: A shell command that only writes one file from a here-document whose delimiter is quoted (``cat > path <<'EOF'
#: … EOF``: its body is written as it is, nothing in it expanded), or ``tee path``, maybe after making its folder
#: (``mkdir -p dir &&``) and wrapped in ``bash -lc "…"`` as one CLI runs every command: shown as "Writes path (N
#: lines)". A plain path only (no expansion, no ``~``, no ``/dev/``), the end marker on a line of its own.
_HEREDOC_WRITE = re.compile(
    r"""^(?:(?:/usr)?(?:/bin/)?(?:ba)?sh\s+-l?c\s+(?P<q>['"]))?\s*"""
    r"""(?:mkdir\s+-p\s+(?:[\w./-]+|\$\(dirname\s+[\w./-]+\))\s*&&\s*)?(?:cat\s*>|tee)\s*(?P<path>[\w./-]+)\s*"""
    r"""<<-?\s*(?P<tq>['"])(?P<tag>\w+)(?P=tq)[ \t]*\n(?P<body>(?:.*?\n)?)(?P=tag)[ \t]*(?P=q)?\s*$""", re.DOTALL)


def shell_sentence(n: "Normalizer", command) -> str:
    """A shell tool call as a sentence: ``Writes app/core.py (12 lines)`` when the command does nothing but write
    one file from a here-document (_HEREDOC_WRITE), else ``Runs `command```. Anything that could run something
    else reads "Runs": a second end marker, a body that could leave the wrapper's quotes or be expanded by them."""
    if isinstance(command, list):
        command = " ".join(str(part) for part in command)
    written = _HEREDOC_WRITE.match(str(command).strip())
    if written is None or _not_only_a_write(written):
        return f"Runs {code(command)}"
    lines = written.group("body").count("\n")
    return f"Writes {n.path(written.group('path'))} ({lines} line{'s' if lines != 1 else ''})"


def _not_only_a_write(written: re.Match) -> bool:
    body, quote, path = written.group("body"), written.group("q") or "", written.group("path")
    if any(line.lstrip("\t").rstrip() == written.group("tag") for line in body.split("\n")):
        return True  # the here-document ends earlier: what follows its end runs
    if quote and written.group("tq") == quote:
        return True  # the delimiter's quotes close the wrapper's: the shell sees it unquoted and expands the body
    if quote == '"' and any(ch in body for ch in '"$`\\'):
        return True  # inside the wrapper's double quotes the body is expanded, or closes them
    if quote == "'" and "'" in body:
        return True  # the body closes the wrapper's single quotes
    return path.startswith("/dev/") or path.startswith("-")


def joined(entries: list[dict]) -> list[dict]:
    """Entries as a person reads them: the streamed pieces of one message (``text`` entries marked
    ``delta``, one per chunk the CLI printed) joined into one entry, numbered and timed as its first."""
    out: list[dict] = []
    for entry in entries:
        last = out[-1] if out else None
        if (entry.get("delta") and last is not None and last.get("kind") == "text" and last.get("delta")
                and entry.get("kind") == "text"):
            out[-1] = {**last, "text": str(last.get("text") or "") + str(entry.get("text") or "")}
        else:
            out.append(entry)
    return out


class Normalizer:
    """Turns one line of a CLI's output into transcript entries (dicts without ``n`` and ``t``).

    ``fmt``: one of FORMATS (anything else: every line an ``output`` entry). ``workspace``: the
    attempt's working directory; paths under it are shown relative to it.
    """

    def __init__(self, fmt: str, workspace: str = "") -> None:
        self.fmt = fmt if fmt in FORMATS else ""
        self.workspace = os.path.realpath(workspace) if workspace else ""
        self.tools: dict[str, str] = {}  # tool call id -> tool name
        self.commands: dict[str, str] = {}  # tool call id -> its shell command line
        self.usage = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
        self.message_ids: set[str] = set()
        self.kept: dict = {}  # what a CLI's stream module keeps between events
        self.reader = registry.stream(self.fmt)  # the CLI's stream module, or None

    # ------------------------------------------------------------------ entry point

    def line(self, raw: bytes) -> list[dict]:
        """The entries of one complete line (without its newline); [] for a blank one."""
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            return []
        if self.reader is not None and text.startswith(getattr(self.reader, "SKIPPED", ())):
            return []  # a CLI's streaming deltas that repeat what a later event says whole
        if text.startswith("{") and self.fmt:
            try:
                event = json.loads(text)
            except ValueError:
                event = None
            if isinstance(event, dict):
                if self.reader is not None:
                    return self.reader.entries(self, event)
                return self.messages(event) if self.fmt == "messages" else self._scripted(event)
        if self.fmt == "scripted":
            return self._scripted_line(text)
        return [{"kind": "output", "text": cut(text, DETAIL_LINE_CHARS * 2)}]

    # ------------------------------------------------------------------ helpers

    def path(self, value) -> str:
        path = str(value or "")
        if self.workspace and path.rstrip(os.sep) == self.workspace:
            return "the working directory"
        if self.workspace and path.startswith(self.workspace + os.sep):
            return path[len(self.workspace) + 1:]
        return path

    def called(self, call: str, name: str, args) -> None:
        """Remember a tool call's name and, for a shell tool, its command line."""
        self.tools[call] = name
        command = args.get("command") or args.get("cmd") if isinstance(args, dict) else None
        if name in _SHELL_TOOLS and len(self.commands) < 10_000:
            self.commands[call] = " ".join(map(str, command)) if isinstance(command, list) else str(command or "")

    def unsuccessful(self, entry: dict, outcome: str, output: str, refused: str = "") -> dict:
        """Word a result that did not succeed by its outcome (engine/text/tool_outcomes.py): a missing program
        is a result of its own, a refusal a ``refusal`` entry, anything else "failed"."""
        entry["ok"] = False
        rows = [row for row in _TOOL_ERROR_TAG.sub("", output).splitlines()  # the "Exit code N" line aside
                if row.strip() and not tool_outcomes.EXIT_CODE_TEXT.fullmatch(row.strip())]
        said = rows[0].strip() if rows else ""
        if outcome == "command_not_found":
            entry.update(kind="tool_result", text=tool_outcomes.not_found_text(
                output, self.commands.get(entry.get("call", ""), ""), entry.get("exit")))
        elif outcome == "refused":
            status = f" (exit status {entry['exit']})" if entry.get("exit") is not None else ""
            entry.update(kind="refusal", text=refused or f"{entry.get('tool') or 'The tool call'} was refused"
                                                         f"{status}: {cut(said, 240)}")
        else:
            entry["text"] = (f"failed with exit status {entry['exit']}" if entry.get("exit") is not None
                             else f"failed: {cut(said, 240)}")
        return entry

    def tool_sentence(self, name: str, args: dict) -> str:
        """A tool call as a sentence of what the agent asks for (its result follows as its own entry):
        ``Runs `pytest -q```, ``Reads app/core.py``, ``Searches for “x” in app``."""
        args = args if isinstance(args, dict) else {}
        path = self.path(args.get("file_path") or args.get("notebook_path") or args.get("path") or "")
        if name in _SHELL_TOOLS:
            return shell_sentence(self, args.get("command") or args.get("cmd") or "")
        if name == "Read":
            return f"Reads {path or 'a file'}"
        if name == "Write":
            lines = str(args.get("content") or "").count("\n")
            return f"Writes {path or 'a file'}" + (f" ({lines} line{'s' if lines != 1 else ''})" if lines else "")
        if name in ("Edit", "MultiEdit"):
            return f"Edits {path or 'a file'}"
        if name == "NotebookEdit":
            return f"Edits the notebook {path}"
        if name == "Grep":
            where = f" in {path}" if path else ""
            return f"Searches for “{cut(str(args.get('pattern') or ''), 120)}”{where}"
        if name == "Glob":
            where = f" in {path}" if path else ""
            return f"Looks for files matching “{cut(str(args.get('pattern') or ''), 120)}”{where}"
        if name == "LS":
            return f"Lists {path or 'a folder'}"
        if name == "TodoWrite":
            todos = args.get("todos") if isinstance(args.get("todos"), list) else []
            return f"Updates its to-do list ({len(todos)} item{'s' if len(todos) != 1 else ''})"
        if name == "Task":
            return f"Starts a sub-agent: {cut(str(args.get('description') or args.get('prompt') or ''), 160)}"
        if name == "WebFetch":
            return f"Fetches {cut(str(args.get('url') or ''), 200)}"
        if name == "WebSearch":
            return f"Searches the web for “{cut(str(args.get('query') or ''), 160)}”"
        return f"Calls {name or 'a tool'}"

    def add_usage(self, reported) -> dict | None:
        if not isinstance(reported, dict):
            return None
        for ours, theirs in (("input_tokens", "input_tokens"), ("output_tokens", "output_tokens"),
                             ("cached_tokens", "cache_read_input_tokens"), ("cached_tokens", "cached_input_tokens")):
            value = reported.get(theirs)
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[ours] += value
        return dict(self.usage)

    def usage_entry(self) -> dict:
        u = self.usage
        return {"kind": "usage", "usage": dict(u),
                "text": f"tokens so far: {u['input_tokens']:,} in · {u['output_tokens']:,} out · "
                        f"{u['cached_tokens']:,} cached"}

    # ------------------------------------------------------------------ Anthropic Messages-shaped events

    def messages(self, event: dict) -> list[dict]:
        """The entries of an ``assistant`` or ``user`` message in the Messages shape (module docstring):
        one agent CLI's stream and the model gateway's conversation (engine/model_gateway/conversation.py)
        are of it. A failed Bash result says "Exit code N" (engine/text/tool_outcomes.py ``of_message_result``)."""
        kind = event.get("type")
        if kind == "assistant":
            message = event.get("message") or {}
            out = []
            for block in message.get("content") or []:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text" and str(block.get("text") or "").strip():
                    out.append({"kind": "text", "text": cut(str(block["text"]))})
                elif block.get("type") == "thinking" and str(block.get("thinking") or "").strip():
                    out.append({"kind": "thinking", "text": cut(str(block["thinking"]), 600)})
                elif block.get("type") == "tool_use":
                    name = str(block.get("name") or "")
                    call = str(block.get("id") or "")
                    args = block.get("input") if isinstance(block.get("input"), dict) else {}
                    self.called(call, name, args)
                    entry = {"kind": "tool_call", "tool": name, "call": call,
                             "text": self.tool_sentence(name, args)}
                    if name == "Bash" and args.get("description"):
                        entry["detail"] = cut(str(args["description"]), 200)
                    out.append(entry)
            message_id = str(message.get("id") or "")
            if message_id and message_id not in self.message_ids and isinstance(message.get("usage"), dict):
                self.message_ids.add(message_id)
                self.add_usage(message["usage"])
                out.append(self.usage_entry())
            return out
        if kind == "user":
            out = []
            for block in (event.get("message") or {}).get("content") or []:
                if not isinstance(block, dict) or block.get("type") != "tool_result":
                    continue
                content = block.get("content")
                if isinstance(content, list):
                    content = "\n".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
                content = str(content or "")
                call = str(block.get("tool_use_id") or "")
                tool = self.tools.get(call, "")
                error = bool(block.get("is_error"))
                entry = {"kind": "tool_result", "tool": tool, "call": call, "ok": not error,
                         "detail": first_lines(content)}
                outcome, code = tool_outcomes.of_message_result(tool, content, error, self.commands.get(call, ""))
                if code is not None:  # a failed command is an error ("Exit code N")
                    entry["exit"] = code
                if outcome or error:
                    self.unsuccessful(entry, outcome or "failed", content)
                else:
                    rows = [row for row in content.splitlines() if row.strip()]
                    many = f"{len(rows)} line{'s' if len(rows) != 1 else ''}"
                    if tool in ("Write", "Edit", "MultiEdit", "NotebookEdit") or not rows:
                        entry["text"] = "done"
                    elif tool == "Read":
                        entry["text"] = f"{many} read"
                    elif tool == "Bash":  # a failed command is an error: this one exited 0
                        entry["text"] = f"exit status 0 · {many} of output"
                    else:
                        entry["text"] = f"{many} of output"
                out.append(entry)
            return out
        return []

    # ------------------------------------------------------------------ the scripted test agent

    def _scripted(self, event: dict) -> list[dict]:
        if event.get("type") != "result":
            return [{"kind": "output", "text": cut(json.dumps(event), DETAIL_LINE_CHARS * 2)}]
        usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
        self.add_usage(usage)
        parts = [f"{usage[key]:,} tokens {label}" for key, label in (("input_tokens", "in"), ("output_tokens", "out"))
                 if isinstance(usage.get(key), int)]
        if event.get("is_error"):
            return [{"kind": "error", "ok": False, "text": "The scripted agent ended with an error",
                     "detail": first_lines(str(event.get("result") or ""))}]
        return [{"kind": "result", "ok": True, "text": "Finished" + (": " + ", ".join(parts) if parts else ""),
                 "detail": first_lines(str(event.get("result") or ""), 10)}]

    def _scripted_line(self, text: str) -> list[dict]:
        if text.startswith("[scripted agent] "):
            return [{"kind": "start", "text": "The scripted test agent started: " + text[len("[scripted agent] "):]}]
        for prefix, tool, verb in (("wrote ", "Write", "Wrote"), ("deleted ", "Delete", "Deleted")):
            if text.startswith(prefix):
                return [{"kind": "tool_call", "tool": tool, "ok": True, "text": f"{verb} {text[len(prefix):]}"}]
        if text.startswith("running "):
            return [{"kind": "tool_call", "tool": "Bash", "text": f"Runs {code(text[len('running '):])}"}]
        return [{"kind": "output", "text": cut(text, DETAIL_LINE_CHARS * 2)}]


class Transcript:
    """Builds a transcript from raw bytes fed in order: complete lines are normalized, redacted and
    written to ``out_path`` (appended, one JSON object a line). ``feed`` and ``close`` from one thread.

    ``redactor``: applied to each complete line before it is parsed (a fresh one per line); None:
    a Redactor without literal secrets (the credential patterns still apply).
    """

    def __init__(self, out_path: str | os.PathLike[str], fmt: str, workspace: str = "",
                 redactor: Redactor | None = None) -> None:
        self.out_path = Path(out_path)
        self.normalizer = Normalizer(fmt, workspace)
        self.redactor = redactor or Redactor()
        self.count = 0
        self._rest = b""
        self._skipping = 0  # bytes of an over-long line dropped so far (0: not in one)
        self._fh = open(self.out_path, "a", encoding="utf-8")

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the raw log."""
        entries: list[dict] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            self._complete(self._rest + data[start:end], entries)
            self._rest = b""
            start = end + 1
        tail = data[start:]
        if self._skipping:
            self._skipping += len(tail)
        elif len(self._rest) + len(tail) > MAX_LINE_BYTES:
            self._skipping = len(self._rest) + len(tail)
            self._rest = b""
        else:
            self._rest += tail
        self._write(entries)

    def _complete(self, line: bytes, entries: list[dict]) -> None:
        if self._skipping:
            size, self._skipping = self._skipping + len(line), 0
            entries.append({"kind": "cut", "text": f"a line of {size:,} bytes was not read (over "
                                                   f"{MAX_LINE_BYTES:,} bytes); it is whole in the raw output"})
            return
        if len(line) > MAX_LINE_BYTES:
            entries.append({"kind": "cut", "text": f"a line of {len(line):,} bytes was not read (over "
                                                   f"{MAX_LINE_BYTES:,} bytes); it is whole in the raw output"})
            return
        clean = self.redactor.fresh()
        line = clean.feed(line) + clean.flush()
        entries.extend(self.normalizer.line(line))

    def _write(self, entries: list[dict]) -> None:
        if not entries:
            return
        now = time.time()
        for entry in entries:
            self.count += 1
            entry = {"n": self.count, "t": round(now, 3), **entry}
            self._fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Take the last line (one without a newline at the end) and close the file."""
        entries: list[dict] = []
        if self._rest or self._skipping:
            self._complete(self._rest, entries)
            self._rest = b""
        self._write(entries)
        self._fh.close()


class Follower(threading.Thread):
    """Follows a raw log while its process writes it and keeps its transcript (``Transcript``).

    ``start()`` it before the process starts; ``finish()`` after the process ended and the log is
    complete: it reads what is left and closes the transcript. Never raises into its caller: a
    failure is written to the transcript as an ``error`` entry and the follower stops.
    """

    def __init__(self, raw_path: str | os.PathLike[str], fmt: str, workspace: str = "",
                 redactor: Redactor | None = None, out_path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(name="transcript-follower", daemon=True)
        self.raw_path = str(raw_path)
        self.transcript = Transcript(out_path or transcript_path(raw_path), fmt, workspace, redactor)
        self._done = threading.Event()
        self._offset = 0

    def _read_more(self) -> None:
        try:
            with open(self.raw_path, "rb") as fh:
                fh.seek(self._offset)
                while True:
                    chunk = fh.read(1024 * 1024)
                    if not chunk:
                        return
                    self._offset += len(chunk)
                    self.transcript.feed(chunk)
        except FileNotFoundError:
            return

    def run(self) -> None:
        try:
            while not self._done.wait(POLL_SECONDS):
                self._read_more()
            self._read_more()
        except Exception as exc:  # a transcript must never break the attempt
            self.transcript._write([{"kind": "error", "text": f"the transcript stopped: {type(exc).__name__}: {exc}"}])
        finally:
            self.transcript.close()

    def finish(self, timeout: float = 30.0) -> None:
        """Read what is left of the raw log, close the transcript and wait for the thread."""
        self._done.set()
        self.join(timeout)


def build(raw_path: str | os.PathLike[str], fmt: str, workspace: str = "", redactor: Redactor | None = None,
          out_path: str | os.PathLike[str] | None = None) -> Path:
    """Write the transcript of a whole raw log at once (replacing any); returns its path."""
    target = Path(out_path or transcript_path(raw_path))
    target.unlink(missing_ok=True)
    transcript = Transcript(target, fmt, workspace, redactor)
    with open(raw_path, "rb") as fh:
        while True:
            chunk = fh.read(1024 * 1024)
            if not chunk:
                break
            transcript.feed(chunk)
    transcript.close()
    return target


def read_tail(path: str | os.PathLike[str], limit: int = 300, window: int = 256 * 1024) -> tuple[list[dict], int]:
    """The last ``limit`` entries of a transcript, read from its last ``window`` bytes only, and the
    number of the last entry (0 for none). A damaged line is skipped."""
    lines = tail_text(path, window).split("\n")  # from a line's start when it began inside one
    entries = []
    for line in lines:
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("kind") in KINDS:
            entries.append(entry)
    last = entries[-1].get("n", 0) if entries else 0
    return entries[-limit:], last if isinstance(last, int) else 0


def read_head(path: str | os.PathLike[str], limit: int = 300, window: int = 256 * 1024) -> list[dict]:
    """The first ``limit`` entries of a transcript, read from its first ``window`` bytes only (a person
    reads a finished conversation from its start). A damaged line, or one cut by the window, is skipped."""
    with open(path, "rb") as fh:
        data = fh.read(window)
    entries = []
    for line in data.decode("utf-8", errors="replace").split("\n"):
        try:
            entry = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("kind") in KINDS:
            entries.append(entry)
            if len(entries) >= limit:
                break
    return entries


def append(path: str | os.PathLike[str], entries: list[dict], secrets=()) -> None:
    """Add entries an adapter learns only after the process ended (e.g. one CLI's refused commands, which
    its JSON stream leaves out) to a closed transcript, numbered on from its last entry, redacted."""
    if not entries:
        return
    _, last = read_tail(path, 1, 64 * 1024)
    redactor = Redactor(secrets)
    now = round(time.time(), 3)
    with open(path, "a", encoding="utf-8") as fh:
        for offset, entry in enumerate(entries, start=1):
            line = json.dumps({"n": last + offset, "t": now, **entry}, ensure_ascii=False).encode("utf-8")
            clean = redactor.fresh()
            fh.write((clean.feed(line) + clean.flush()).decode("utf-8", errors="replace") + "\n")
