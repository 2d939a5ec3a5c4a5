"""What happened to a tool call (engine/text/tool_outcomes.py): a missing program, a refusal, a failure.

The texts are those the real CLIs printed in their sandboxes (tests/test_*_adapter.py run them:
``test_*_says_what_happened_to_each_command``); here the classification alone.
"""
from __future__ import annotations

import pytest

from engine.text import tool_outcomes
from engine.agents.gemini.stream import outcome_of as of_gemini
from engine.agents.pi.stream import outcome_of as of_pi
from engine.text.tool_outcomes import classify, missing_program, of_message_result as of_claude, programs_of


@pytest.mark.parametrize("command, programs", [
    ("python -m pytest -q", ["python"]),
    ("/bin/bash -lc 'python -m pytest'", ["python"]),  # codex's way of running a command
    ('bash -lc "cd app && FOO=1 python3 -m x | tee log"', ["cd", "python3", "tee"]),
    ("(cd x; ./run.sh) 2>&1 | tail -5", ["cd", "./run.sh", "tail"]),
    ("cd app\npython -m pytest", ["cd", "python"]),
    ("env A=1 timeout 60 pytest", ["pytest"]),
    ("cat < missing.txt", ["cat"]),
    ("echo 'unclosed", []),
])
def test_the_programs_a_command_line_runs(command, programs):
    assert programs_of(command) == programs


def test_a_missing_program_as_each_shell_says_it():
    assert missing_program("/bin/bash: line 1: python: command not found") == "python"
    assert missing_program("/usr/bin/bash: line 4: python: command not found", "python -m pytest") == "python"
    assert missing_program("bash: python: command not found") == "python"
    assert missing_program("sh: 1: python: not found") == "python"
    assert missing_program("zsh:1: command not found: python") == "python"
    assert missing_program("bash: line 1: ./run.sh: No such file or directory", "./run.sh --fast") == "./run.sh"
    # a redirection from a missing file says the same words: not a missing program
    assert missing_program("/bin/bash: line 1: missing.txt: No such file or directory", "cat < missing.txt") is None
    assert missing_program("bash: line 1: ./run.sh: No such file or directory") is None  # no command to tell
    # a program a script of the command could not find is not the command's own
    assert missing_program("bash: line 1: python: command not found", "make test") is None
    assert missing_program("ssh: connect to host x port 22: Connection refused") is None
    # only the first lines count
    assert missing_program("\n".join(["ok"] * 20 + ["bash: line 1: python: command not found"])) is None


def test_exit_127_wins_over_refusal_wording_and_a_refusal_stays_a_refusal():
    assert classify(127, "bash: x: Permission denied") == "command_not_found"
    assert classify(127, "", refused=True) == "command_not_found"
    assert classify(1, "/bin/bash: line 1: /etc/x: Read-only file system") == "refused"
    assert classify(1, "open 'a.py': EROFS") == "refused"
    assert classify(None, "declined", refused=True) == "refused"
    assert classify(1, "F\n1 failed") == "failed"
    assert classify(2, "bash: line 1: python: command not found", "python x") == "failed"  # the status says 2
    assert classify(0, "", error=False) is None
    assert classify(None, "3 lines", "ls", error=False) is None
    # no exit status reported (gemini): the shell's own line says the program is missing
    assert classify(None, "/usr/bin/bash: line 4: python: command not found", "python -m pytest",
                    error=False) == "command_not_found"


def test_each_clis_words():
    assert of_claude("Bash", "Exit code 127\n/bin/bash: line 1: python: command not found", True,
                     "python -m pytest") == ("command_not_found", 127)
    assert of_claude("Bash", "Exit code 1\n/bin/bash: line 1: /etc/x: Read-only file system", True) == ("refused", 1)
    assert of_claude("Bash", "Exit code 1\nF", True) == ("failed", 1)
    assert of_claude("Bash", "ok", False) == (None, 0)
    assert of_claude("Write", "Claude requested permissions to write to /w/x, but you haven't granted it yet.",
                     True) == ("refused", None)
    assert of_claude("Write", "File has not been read yet. Read it first before writing to it.", True) == \
        ("failed", None)
    assert of_pi("bash", "/bin/bash: line 1: python: command not found\n\n\nCommand exited with code 127", True,
                 "python -m pytest") == ("command_not_found", 127)
    assert of_pi("bash", "(no output)\n\nCommand exited with code 1", True, "false") == ("failed", 1)
    assert of_pi("write", "Tool write not found", True) == ("refused", None)
    # the same call as the model gateway's conversation words it (the Messages shape): refused there too,
    # as run_status counts it (from a fresh try: the page said "failed" for pi's reviewer calling bash)
    assert of_claude("bash", "Tool bash not found", True) == ("refused", None)
    assert of_claude("Bash", "Tool bash not found", True) == ("refused", None)  # the wire names it Bash
    assert of_claude("Bash", "Tool bash not found here", True) == ("failed", None)
    assert of_pi("read", "ENOENT: no such file or directory, open 'x'", True) == ("failed", None)
    assert of_gemini("run_shell_command", "success", "", "/usr/bin/bash: line 4: python: command not found",
                     "python -m pytest") == ("command_not_found", None)
    assert of_gemini("run_shell_command", "success", "", "Command exited with code: 1", "false") == ("failed", 1)
    assert of_gemini("run_shell_command", "success", "", "Command exited with code: 127", "python") == \
        ("command_not_found", 127)
    assert of_gemini("run_shell_command", "success", "", "/usr/bin/bash: line 4: /etc/x: Read-only file system",
                     "echo hi > /etc/x") == ("refused", None)
    assert of_gemini("run_shell_command", "success", "", "a\nb", "ls") == (None, None)
    assert of_gemini("write_file", "error", "tool_not_registered", 'Tool "write_file" not found') == ("refused", None)
    assert of_gemini("replace", "error", "edit_no_occurrence_found", "0 occurrences found") == ("failed", None)


def test_counts_and_the_sentence_and_records_older_than_outcomes():
    records = [{"tool": "exec_command", "outcome": "command_not_found"}, {"tool": "Bash", "outcome": "failed"},
               {"tool": "bash", "outcome": "failed"}, {"tool": "Write", "outcome": "refused"},
               {"tool": "Bash", "message": "written before outcomes existed"}]
    counted = tool_outcomes.counts(records)
    assert counted == {"command_not_found": 1, "failed": 2, "refused": 1, "refused_or_failed": 1}
    assert tool_outcomes.sentence(counted) == ("1 command not found, 2 failed, 1 refused, "
                                               "1 tool call refused or failed")
    assert tool_outcomes.sentence(tool_outcomes.counts([{"outcome": "command_not_found"}] * 2)) == \
        "2 commands not found"
    assert tool_outcomes.counts(None) == dict.fromkeys(("command_not_found", "failed", "refused",
                                                        "refused_or_failed"), 0)
    assert tool_outcomes.sentence(tool_outcomes.counts([])) == ""
