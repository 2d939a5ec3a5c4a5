"""Every adapter's parser reads the CLI's output with a bounded line buffer (engine/agents/lines.py).

Issue 13: a 50 MB single-line output through the claude adapter grew the worker's pool process by
~98 MB, its parser reading the line whole. Here each parser reads a capture holding such a line
between real events, in a process of its own whose peak resident size is measured before and after.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.agents.lines import MAX_LINE_BYTES, BoundedLines

ROOT = Path(__file__).resolve().parents[1]
BIG = 50 * 1024 * 1024

MEASURE = r"""
import json, os, resource, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.test_settings")
django.setup()
from engine.agents.claude import adapter as claude
from engine.agents.codex import adapter as codex
parse = {"claude": claude.parse_stream, "codex": codex.parse_events}[sys.argv[1]]
parse(sys.argv[3])  # a small capture first: imports and caches warm
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
found = parse(sys.argv[2])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": after - before, "found": found}, default=str))
"""

CLAUDE_EVENTS = [
    {"type": "system", "subtype": "init", "session_id": "s-1", "claude_code_version": "2.1.197"},
    None,  # the 50 MB line: a tool result whose output is one line
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "Done."}]}},
    {"type": "result", "subtype": "success", "result": "Done.", "usage": {"input_tokens": 3, "output_tokens": 2}},
]
CODEX_EVENTS = [
    {"type": "thread.started", "thread_id": "t-1"},
    None,
    {"type": "item.completed", "item": {"type": "agent_message", "text": "Done."}},
    {"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 2}},
]


def write_capture(path: Path, events: list, big: int) -> None:
    with path.open("wb") as fh:
        for event in events:
            if event is None:
                fh.write(b'{"type":"user","message":{"content":[{"type":"tool_result","content":"')
                chunk = b"x" * (1024 * 1024)
                for _ in range(big // len(chunk)):
                    fh.write(chunk)
                fh.write(b'"}]}}\n')
            else:
                fh.write(json.dumps(event).encode() + b"\n")


@pytest.mark.slow
@pytest.mark.parametrize("cli,events", [("claude", CLAUDE_EVENTS), ("codex", CODEX_EVENTS)])
def test_a_50_mb_line_grows_the_parsing_process_by_under_20_mb(tmp_path, cli, events):
    big, small = tmp_path / "big.raw", tmp_path / "small.raw"
    write_capture(big, events, BIG)
    write_capture(small, [e for e in events if e is not None], 0)
    assert big.stat().st_size > BIG  # the raw bytes stay whole in the log
    proc = subprocess.run([sys.executable, "-c", MEASURE, cli, str(big), str(small)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    assert said["growth_kib"] < 20 * 1024, f"{cli}: the parser grew by {said['growth_kib']} KiB"
    found = said["found"]
    assert found["truncated_lines"] == 1
    if cli == "claude":
        assert found["session_id"] == "s-1" and found["last_text"] == "Done." and found["result"]["result"] == "Done."
    else:
        assert found["session_id"] == "t-1" and found["last_text"] == "Done." and found["turns_completed"] == 1


def test_bounded_lines_skips_only_the_overlong_line_and_counts_it():
    data = b"a\n" + b"y" * 25 + b"\n" + b"b\n" + b"z" * 10 + b"\nc"
    lines = BoundedLines(io.BytesIO(data), limit=10)
    assert list(lines) == [b"a\n", b"b\n", b"c"]
    assert lines.truncated == 2  # 25 bytes and exactly 10 without their newline within the limit
    assert MAX_LINE_BYTES == 1024 * 1024
