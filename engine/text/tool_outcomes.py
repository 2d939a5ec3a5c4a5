"""What happened to an agent's tool call that did not succeed, in one word, the same everywhere.

The adapters (engine/agents/<cli>/adapter.py) record the tool calls of an attempt that did not
succeed in ``Attempt.refusals``; each record carries an ``"outcome"`` (``classify``), the conversation
(engine/text/transcript.py, engine/agents/<cli>/stream.py) words each result by the same outcome, and
``run_status``, the API and the run page count them (``counts``, ``sentence``):

* ``command_not_found``: the program was missing: exit status 127 (bash, sh and env say so), or,
  when the CLI reports no exit status, the output's first lines say so the way a shell prints it
  (``bash: line 1: python: command not found``, ``sh: 1: python: not found``, ``zsh:1: command not
  found: python``, or ``bash: ./run.sh: No such file or directory`` for the program the command
  itself runs). Exit status 127 wins over any refusal wording;
* ``refused``: the sandbox or the CLI's own rules refused it: a sandbox denial in the output
  (``DENIAL``: read-only file system, EROFS, EACCES, EPERM, permission denied, operation not
  permitted; some CLIs' own denial texts are of it), or what the caller knows from the CLI itself
  (``refused=True``: a declined command, a tool not available to the role, a policy's or a
  permission rule's refusal);
* ``failed``: any other non-zero exit status or error.

Each CLI says these its own way: its package reads its words and calls ``classify`` (its
stream module's ``outcome_of``, or its adapter's records); an Anthropic Messages-shaped tool
result ("Exit code N") is read here (``of_message_result``). Some CLIs report a command that exited
non-zero as a success whose output is what the command printed: then its exit status is unknown, and
only a line the shell itself printed ("bash: line 4: python: command not found", "bash: line 4:
/etc/x: Read-only file system", ``shell_denial``) says what happened.

A record written before outcomes existed has none: it counts as ``refused_or_failed`` (what such a
record meant then: "tool calls the CLI refused or that failed").
"""
from __future__ import annotations

import re
import shlex

#: The outcomes of a tool call that did not succeed, in the order a sentence names them.
OUTCOMES = ("command_not_found", "failed", "refused")
#: The count of a record without an outcome (written before outcomes existed).
LEGACY = "refused_or_failed"
#: The words a person reads for each outcome.
WORDS = {"command_not_found": "command not found", "failed": "failed", "refused": "refused",
         LEGACY: "refused or failed"}
#: The exit status of a program the shell (or env, timeout, xargs ...) could not find.
NOT_FOUND_EXIT = 127
#: Texts of an output that say the sandbox refused what the command did.
DENIAL = re.compile(r"read-only file system|\bEROFS\b|\bEACCES\b|\bEPERM\b|permission denied|"
                    r"operation not permitted", re.IGNORECASE)
#: How many first non-empty lines of an output are read for a shell's "command not found".
FIRST_LINES = 10

_SHELL = r"(?:\S*/)?(?:ba|da|k|z)?sh"
#: bash ("bash: line 1: python: command not found", "bash: x: No such file or directory"), dash
#: ("sh: 1: python: not found") and zsh ("zsh:1: command not found: python"), one a line.
_NOT_FOUND = re.compile(
    rf"^{_SHELL}:\s?(?:line \d+:\s|\d+:\s)?(?P<name>[^\s:][^:]*?):\s(?P<why>command not found|not found|"
    r"No such file or directory)\s*$"
    rf"|^{_SHELL}:\s?(?:\d+:\s)?command not found:\s(?P<zname>\S+)\s*$", re.MULTILINE)
#: A line a shell printed about itself: "bash: line 1: ...", "sh: 1: ...".
_SHELL_LINE = re.compile(rf"^{_SHELL}:\s?(?:line \d+:\s|\d+:\s)")
_SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
#: Words before a program that run it (``env FOO=1 python``, ``exec python``, ``timeout 60 python``).
_RUNNERS = ("env", "exec", "command", "nohup", "time", "sudo")


def programs_of(command: str) -> list[str]:
    """The programs a shell command line runs itself, in order, approximately: the first word of each
    part between ``&&``, ``||``, ``;``, ``|``, ``(`` and lines, after variable assignments and ``env``-like
    words; ``bash -lc 'python -m pytest'`` (a shell tool's way) gives the programs of its script. [] when
    the line cannot be split."""
    try:
        lexer = shlex.shlex(str(command or "").replace("\n", " ; "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return []
    found: list[str] = []
    at_start, index = True, 0
    while index < len(words):
        word = words[index]
        index += 1
        if set(word) <= set("&|;()"):
            at_start = not word.endswith(")")
        elif set(word) <= set("<>&|0123456789") and ("<" in word or ">" in word):
            index += 1  # a redirection: the next word is its file
        elif not at_start or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word, re.DOTALL) or word in _RUNNERS:
            continue
        elif word == "timeout" and index < len(words) and re.fullmatch(r"[\d.]+[smhd]?", words[index]):
            index += 1
        else:
            at_start = False
            script = None
            if word.rsplit("/", 1)[-1] in _SHELLS:
                flag = index
                while flag < len(words) and re.fullmatch(r"-[A-Za-z]+", words[flag]):
                    if "c" in words[flag] and flag + 1 < len(words):
                        script = flag + 1
                        break
                    flag += 1
            if script is None:
                found.append(word)
            else:
                found += programs_of(words[script])
                index = script + 1
    return found


def missing_program(output: str, command: str = "") -> str | None:
    """The program a shell said it could not find, from the output's first FIRST_LINES non-empty
    lines, or None. With ``command`` (the line the tool ran), only a program it runs itself counts
    (not one a script it runs could not find); without it, only "command not found" and "not found"
    count ("No such file or directory" is also what a redirection from a missing file says)."""
    rows = [row for row in str(output or "").splitlines() if row.strip()][:FIRST_LINES]
    programs = programs_of(command) if command else None
    for found in _NOT_FOUND.finditer("\n".join(rows)):
        name = (found.group("zname") or found.group("name")).strip()
        if programs is None and found.group("why") != "No such file or directory":
            return name
        if programs is not None and name in programs:
            return name
    return None


def shell_denial(output: str) -> bool:
    """Whether a line the shell itself printed, among the output's first FIRST_LINES, is a sandbox
    denial (``bash: line 1: /etc/x: Read-only file system``): for a CLI that reports no exit status."""
    rows = [row for row in str(output or "").splitlines() if row.strip()][:FIRST_LINES]
    return any(_SHELL_LINE.match(row) and DENIAL.search(row) for row in rows)


def classify(exit_code: int | None = None, output: str = "", command: str = "", *, refused: bool = False,
             error: bool = True) -> str | None:
    """The outcome (OUTCOMES) of a finished tool call, or None when it succeeded.

    ``exit_code``: the command's exit status when the CLI reports one (None: not reported, or not a
    command); ``output``: what it printed, or the CLI's error text (pass what is also recorded, so a
    record and its conversation entry agree); ``command``: the shell command line, when it is one;
    ``refused``: the CLI itself says it refused the call (module docstring); ``error``: the CLI
    reports the call as failed. A call with ``error`` False and no non-zero exit status succeeded,
    unless its output says its program was not found (a CLI that reports no exit status).
    """
    if exit_code == NOT_FOUND_EXIT:
        return "command_not_found"
    failed = error or (exit_code is not None and exit_code != 0) or refused
    if exit_code is None and (failed or command) and missing_program(output, command):
        return "command_not_found"
    if not failed:
        return None
    if refused or DENIAL.search(str(output or "")):
        return "refused"
    return "failed"


# ----------------------------------------------------------------------------- each CLI's words

#: Texts of a tool error that say the CLI's permission rules refused the call (one of the CLIs, at its
#: version 2.1.197: a denied permission, a removed tool; other CLIs word theirs alike).
CLI_REFUSAL = re.compile(r"permission|denied|not allowed|haven't granted|No such tool available|blocked|"
                         r"requires approval|declined", re.IGNORECASE)
#: A failed Bash command's ``tool_result`` text in the Messages shape (as an agent CLI whose stream has
#: that shape words it): "Exit code N".
EXIT_CODE_TEXT = re.compile(r"Exit code:?\s*(-?\d+)")


def _exit(pattern: re.Pattern, text: str) -> int | None:
    found = pattern.search(text)
    return int(found.group(1)) if found else None


#: "Tool X not found": a tool the role's allowlist left out, as an agent CLI words its refusal of it.
UNAVAILABLE_TOOL = re.compile(r"Tool [\w.:-]+ not found", re.IGNORECASE)


def unavailable_tool(tool: str, content: str) -> bool:
    """Whether a failed call's text is "Tool X not found" (UNAVAILABLE_TOOL), a refusal, the same in the
    CLI's stream and on the wire, whatever the name ``tool`` goes by there (the model gateway's conversation
    names a CLI's tools as the Messages shape does: engine/model_gateway/conversation.py ``TOOLS``)."""
    return bool(UNAVAILABLE_TOOL.fullmatch(str(content or "").strip()))


def of_message_result(tool: str, content: str, error: bool, command: str = "") -> tuple[str | None, int | None]:
    """``(outcome, exit status)`` of an Anthropic Messages-shaped ``tool_result`` (that of an agent CLI
    whose stream has that shape, and the model gateway's conversation, which words every CLI's results
    so): ``content`` its text, ``error`` its ``is_error``. A failed Bash command is an error with
    "Exit code N" (EXIT_CODE_TEXT); a Bash result that is no error exited 0."""
    code = _exit(EXIT_CODE_TEXT, content) if error else (0 if tool == "Bash" else None)
    refused = error and (bool(CLI_REFUSAL.search(content[:500])) or unavailable_tool(tool, content))
    return classify(code, content[:500], command, refused=refused, error=error), code


def not_found_text(output: str = "", command: str = "", exit_code: int | None = None) -> str:
    """The conversation's sentence of a missing program: ``command not found: python (exit status 127)``."""
    name = missing_program(output, command) or next(iter(programs_of(command)), "")
    said = f"command not found: {name}" if name else "command not found"
    return said + (f" (exit status {exit_code})" if exit_code is not None else "")


def outcome_of(record) -> str:
    """The outcome of one refusal record (``Attempt.refusals``); LEGACY for one without a known outcome."""
    outcome = record.get("outcome") if isinstance(record, dict) else None
    return outcome if outcome in OUTCOMES else LEGACY


def counts(records) -> dict:
    """``{"command_not_found": n, "failed": n, "refused": n, "refused_or_failed": n}`` of an attempt's
    refusal records (every key, zeros included; the last one counts records without an outcome)."""
    found = dict.fromkeys((*OUTCOMES, LEGACY), 0)
    for record in records if isinstance(records, list) else []:
        found[outcome_of(record)] += 1
    return found


def sentence(counted: dict | None) -> str:
    """``1 command not found, 2 failed, 1 refused`` ('' for none) of ``counts``."""
    parts = []
    for outcome in (*OUTCOMES, LEGACY):
        n = (counted or {}).get(outcome) or 0
        if not n:
            continue
        if outcome == "command_not_found":
            parts.append(f"{n} command{'s' if n != 1 else ''} not found")
        elif outcome == LEGACY:
            parts.append(f"{n} tool call{'s' if n != 1 else ''} refused or failed")
        else:
            parts.append(f"{n} {WORDS[outcome]}")
    return ", ".join(parts)
