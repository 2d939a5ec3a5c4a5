"""The stand-in and scripted claude the tests share: the scripted model's turns for an implementer that
writes the answer and a reviewer that tries to write, the profile that plays them, and a stand-in
executable answering ``--version`` and ``--help`` like the pinned claude."""
from pathlib import Path

from ..conftest import ANSWER_STEP

WRITE_ANSWER = {"turns": [
    {"tools": [{"tool": "Read", "input": {"file_path": "{cwd}/app/core.py"}}],
     "usage": {"input_tokens": 1000, "output_tokens": 20, "cache_read_input_tokens": 2000,
               "cache_creation_input_tokens": 100}},
    {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/app/core.py",
                                            "content": ANSWER_STEP["write"]["app/core.py"]}}],
     "usage": {"input_tokens": 200, "output_tokens": 25, "cache_read_input_tokens": 3000}},
    {"text": "Done: answer() returns 42.", "usage": {"input_tokens": 1300, "output_tokens": 300}},
]}


#: A reviewer whose scripted model tries Write, Edit and a Bash `touch`, then answers a verdict.
REVIEW_TURNS = {"turns": [
    {"tools": [{"tool": "Write", "input": {"file_path": "{cwd}/review-was-here.txt", "content": "x"}},
               {"tool": "Edit", "input": {"file_path": "{cwd}/app/core.py", "old_string": "42",
                                          "new_string": "43"}},
               {"tool": "Bash", "input": {"command": "touch made-by-reviewer.txt", "description": "touch"}}],
     "usage": {"input_tokens": 700, "output_tokens": 40}},
    {"text": 'Reviewed the patch.\n```json\n{"verdict": "pass", "summary": "answer() returns 42", '
             '"findings": []}\n```', "usage": {"input_tokens": 900, "output_tokens": 60}}]}


def claude_profile(endpoint: dict, **extra) -> dict:
    return {"adapter": "claude-code", "max_turns": 6, "scripted_endpoint": endpoint, **extra}


def stub_claude(path: Path, body: str) -> Path:
    """A stand-in claude that answers --version and --help like 2.1.197 and runs ``body`` otherwise."""
    real_help = "--print --output-format --verbose --settings --setting-sources --tools --permission-mode"
    path.write_text(f"#!/bin/sh\ncase \"$1\" in\n  --version) echo '2.1.197 (Claude Code)';;\n"
                    f"  --help) echo '{real_help}';;\n  *) {body};;\nesac\n")
    path.chmod(0o755)
    return path
