"""The independent review: what a reviewer is told, and the verdict it must answer.

A reviewer is a fresh, read-only agent session. It gets the stage's requirement, its
acceptance criteria (the requirement and the frozen gate commands), the patch of the verified
files against the stage's starting checkpoint, and the check results, and must answer one
JSON object (``VERDICT_SCHEMA``)::

    {"verdict": "pass" | "repair" | "escalate",
     "findings": [{"file": "app/core.py", "line": 12, "severity": "major", "text": "..."}]}

``pass``: the requirement is met; ``repair``: defects an implementer can fix (they become the
failure evidence of a repair attempt); ``escalate``: a person must decide (an unclear or
impossible requirement, missing access). A verdict never overrides a failed command: a
review only runs on files whose every gate exited 0, and a ``pass`` only lets them go on.

The schema is checked with jsonschema (https://python-jsonschema.readthedocs.io/, Draft
2020-12); an answer that is not one valid object is ``invalid_review``.
"""
from __future__ import annotations

import json
import re

import jsonschema

VERDICTS = ("pass", "repair", "escalate")
SEVERITIES = ("info", "minor", "major", "critical")

VERDICT_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["verdict", "findings"],
    "additionalProperties": False,
    "properties": {
        "verdict": {"enum": list(VERDICTS)},
        "summary": {"type": "string", "maxLength": 4000},
        "findings": {
            "type": "array",
            "maxItems": 200,
            "items": {
                "type": "object",
                "required": ["severity", "text"],
                "additionalProperties": False,
                "properties": {
                    "file": {"type": ["string", "null"], "maxLength": 1000},
                    "line": {"type": ["integer", "null"], "minimum": 1},
                    "severity": {"enum": list(SEVERITIES)},
                    "text": {"type": "string", "minLength": 1, "maxLength": 4000},
                },
            },
        },
    },
    "allOf": [{"if": {"properties": {"verdict": {"enum": ["repair", "escalate"]}}},
               "then": {"properties": {"findings": {"minItems": 1}}}}],
}

_VALIDATOR = jsonschema.Draft202012Validator(VERDICT_SCHEMA)
#: Bytes of the patch put into a reviewer's prompt (the reviewer can read the files itself).
MAX_PATCH_BYTES = 200 * 1024


class InvalidVerdict(Exception):
    """The reviewer's answer is not one valid verdict; the message says what is wrong."""


def validate(answer: object) -> dict:
    """The verdict ``answer`` if it satisfies VERDICT_SCHEMA; raises InvalidVerdict naming the field."""
    errors = sorted(_VALIDATOR.iter_errors(answer), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(answer)"
        raise InvalidVerdict(f"{where}: {first.message}")
    return answer  # type: ignore[return-value]


_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.S)


def _answer(text: str):
    """The reviewer's answer: the last fenced block when there is one, else the JSON object the
    message ends with. Only that one counts: an earlier object (an example, a quotation) never
    stands in for a broken answer. Raises InvalidVerdict when it is missing or not JSON."""
    blocks = _FENCE.findall(text)
    if blocks:
        try:
            return json.loads(blocks[-1])
        except ValueError as exc:
            raise InvalidVerdict(f"the last ```json block of the final message is not valid JSON ({exc})") from None
    stripped = text.rstrip()
    if not stripped.endswith("}"):
        raise InvalidVerdict("the reviewer's final message holds no JSON object with a 'verdict' key at its end")
    decoder = json.JSONDecoder()
    for match in reversed([m.start() for m in re.finditer(r"\{", stripped)]):
        try:
            value, end = decoder.raw_decode(stripped, match)
        except ValueError:
            continue
        if end == len(stripped):
            return value
    raise InvalidVerdict("the JSON object at the end of the reviewer's final message is not valid JSON")


def parse(final_message: str, reported: object = None) -> dict:
    """The validated verdict of a reviewer attempt.

    ``reported``: a verdict the adapter returned as data (the scripted adapter), used as is;
    otherwise the reviewer's final message must end with its answer: the last fenced ``json``
    block, or a bare JSON object at its very end. Raises InvalidVerdict when there is none, it
    is not JSON, or it does not satisfy the schema.
    """
    if reported is not None:
        return validate(reported)
    if not (final_message or "").strip():
        raise InvalidVerdict("the reviewer gave no answer (empty final message)")
    answer = _answer(final_message)
    if not isinstance(answer, dict) or "verdict" not in answer:
        raise InvalidVerdict("the reviewer's answer is not a JSON object with a 'verdict' key")
    return validate(answer)


#: What, on an added line of the patch, can change how tests run from inside the runner's process.
TEST_RUN_CHANGES = re.compile(
    r"\bos\._exit\b|\bsys\.exit\b|\bpytest\.(?:exit|skip|xfail|importorskip)\b|\batexit\b|\bdef pytest_\w+|"
    r"\bpluginmanager\b|\bsys\.modules\[|\bsignal\.signal\b|\bos\.kill\b|\bunittest\.skip")


def test_run_changes(patch: str) -> list[str]:
    """``path:line: text`` of each added line of ``patch`` that matches TEST_RUN_CHANGES."""
    found, path, line_no = [], "", 0
    for line in patch.splitlines():
        if line.startswith("+++ "):
            path = line[4:].removeprefix("b/").strip()
        elif line.startswith("@@"):
            match = re.search(r"\+(\d+)", line)
            line_no = int(match.group(1)) if match else 0
        elif line.startswith("+"):
            if TEST_RUN_CHANGES.search(line):
                found.append(f"{path}:{line_no}: {line[1:].strip()[:200]}")
            line_no += 1
        elif not line.startswith("-"):
            line_no += 1
    return found


def _tests_line(tests: dict | None) -> str:
    """What a check's test runner recorded, in a few words for the reviewer."""
    if not tests:
        return "; no test runner record (only its exit status decided)"
    counts = tests.get("counts") or {}
    text = f"; {tests.get('runner') or 'pytest'} recorded " + ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped",
                                                                        "xfailed", "xpassed") if counts.get(k))
    agreed = tests.get("agreed")
    if agreed:
        text += (f"; all {agreed['count']} agreed tests passed again" if not agreed["missing"]
                 else f"; {agreed['missing']} of {agreed['count']} agreed tests did not pass again")
    return text


def prompt(*, pipeline: dict, stage: dict, worktree: str, patch: str, checks: list[dict], reviewer: str) -> str:
    """The prompt of one reviewer session.

    ``checks``: ``[{"name", "command", "exit_code", "passed", "tests", "new_tests"}]`` of the verified
    files (``tests``: what the test runner recorded, engine/checks/test_reports; ``new_tests``: ids that
    passed and are not agreed, engine/steps/agreed.py); the added lines that can change how tests
    run are listed for the reviewer (``test_run_changes``);
    ``patch``: the diff of those files against the stage's starting checkpoint (cut at
    MAX_PATCH_BYTES).
    """
    if len(patch.encode("utf-8")) > MAX_PATCH_BYTES:
        patch = patch.encode("utf-8")[:MAX_PATCH_BYTES].decode("utf-8", "ignore") + \
            "\n[... patch cut; read the files in the workspace for the rest]\n"
    gates = list(pipeline.get("baseline_checks") or []) + list(stage.get("gates") or [])
    lines = [
        f"# Independent review of stage '{stage['key']}' of pipeline '{pipeline['name']}'",
        "",
        f"You are {reviewer}, an independent reviewer in a fresh session. You may read the workspace; you may "
        "not change anything (your tools are read-only and any change stops the run). Decide whether the "
        "patch below meets the requirement. The engine already ran the checks listed below; their exit "
        "status is the evidence, not anyone's claim.",
        "",
        f"Workspace: {worktree}",
        "",
        "## Requirement",
        stage["requirement"].strip(),
        "",
        "## Acceptance criteria",
        "- The requirement above is met, in the stage's scope: " + ", ".join(stage["scope"]),
    ]
    lines += [f"- `{gate['command']}` exits 0 (check '{gate['name']}')" for gate in gates]
    lines += ["", "## Check results on these files"]
    lines += [f"- {c['name']}: `{c['command']}` -> exit {c['exit_code']} ({'passed' if c['passed'] else 'FAILED'})"
              + _tests_line(c.get("tests")) for c in checks] or ["- (none)"]
    added = sorted({test for c in checks for test in (c.get("new_tests") or [])})
    if added:
        lines += ["", "## Tests the patch adds (passed, not among the agreed tests)"]
        lines += [f"- {test}" for test in added[:40]] + ([f"- ... and {len(added) - 40} more"] if len(added) > 40 else [])
    others = {test: how for c in checks for test, how in (c.get("other_tests") or {}).items()}
    if others:
        lines += ["", "## Tests not among the agreed tests that did not pass",
                  "The repository's own skipped tests, and any the patch adds that it skips, expects to fail or "
                  "leaves failing: a test that does not pass proves nothing."]
        shown = sorted(others.items())
        lines += [f"- {test} ({how})" for test, how in shown[:40]] + (
            [f"- ... and {len(shown) - 40} more"] if len(shown) > 40 else [])
    changes = test_run_changes(patch)
    if changes:
        lines += ["", "## Changes how tests run",
                  "These added lines can end the test process, change its status, skip tests or hook into the "
                  "runner. Code in a new test module or in the code under test runs inside the test runner's "
                  "process, where no file rule sees it; read each one:"]
        lines += [f"- {line}" for line in changes[:40]]
    lines += ["", "## Patch (against the stage's starting checkpoint)", "```diff", patch.rstrip("\n") or "(empty)",
              "```", "",
              "## Your answer",
              "End your final message with exactly one JSON object in a ```json block, with this shape:",
              "```json",
              '{"verdict": "pass", "summary": "one sentence", "findings": []}',
              "```",
              "verdict: \"pass\" (the requirement is met), \"repair\" (defects the implementer can fix: list each) "
              "or \"escalate\" (a person must decide: the requirement is unclear or cannot be met). Each finding: "
              '{"file": "path or null", "line": 12 or null, "severity": "info|minor|major|critical", '
              '"text": "what is wrong"}. "repair" and "escalate" need at least one finding.']
    return "\n".join(lines) + "\n"
