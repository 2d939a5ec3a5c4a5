#!/usr/bin/env python3
"""The stand-in agent process of the scripted test adapter (simulated runs only).

Usage: ``python scripted_agent.py STEP.json``. The step file holds one scenario step (see
docs/pipeline-format.md, "Scenario format"): files to write or delete in the working
directory, lines to print, seconds to sleep, a command to run (its output is the agent's; its
exit status is the agent's unless ``exit`` is given), the exit status, and the
usage and final message to report. It imports nothing from the project, so it runs with
any Python 3.11 whatever the working directory is.

Output: the printed lines, then one JSON line ``{"type": "result", ...}`` with usage,
final message and session id, like a CLI's stream-json result event.
"""
import json
import os
import subprocess
import sys
import time


def _inside(root: str, rel: str) -> str:
    path = os.path.realpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not (path == root or path.startswith(root + os.sep)):
        raise SystemExit(f"scripted agent: refusing path outside the workspace: {rel}")
    return path


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    step = spec.get("step") or {}
    root = os.path.realpath(os.getcwd())
    sys.stdout.write(f"[scripted agent] {spec.get('operation', 'implement')} of stage {spec.get('stage', '?')}, "
                     f"attempt {spec.get('attempt', '?')} (simulated)\n")
    sys.stdout.flush()
    printed = step.get("print") or []
    if isinstance(printed, str):
        printed = [printed]
    for line in printed:
        sys.stdout.write(str(line) + "\n")
        sys.stdout.flush()
    for rel, content in (step.get("write") or {}).items():
        path = _inside(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(content)
        sys.stdout.write(f"wrote {rel}\n")
    for rel in step.get("delete") or []:
        path = _inside(root, rel)
        if os.path.lexists(path):
            os.remove(path)
            sys.stdout.write(f"deleted {rel}\n")
    sys.stdout.flush()
    if step.get("sleep"):
        time.sleep(float(step["sleep"]))
    exit_status = int(step.get("exit", 0))
    if step.get("run"):
        sys.stdout.write(f"running {' '.join(step['run'])}\n")
        sys.stdout.flush()
        try:
            status = subprocess.call(list(step["run"]))  # same stdout; a child of this agent
        except OSError as exc:
            sys.stdout.write(f"scripted agent: cannot run {step['run'][0]}: {exc}\n")
            status = 127
        if "exit" not in step:
            exit_status = status if status >= 0 else 128 - status
    result = {
        "type": "result",
        "simulated": True,
        "is_error": exit_status != 0,
        "session_id": spec.get("session_id", ""),
        "result": step.get("final_message", "Scripted step done."),
        "usage": step.get("usage") or {},
    }
    if "verdict" in step:
        result["verdict"] = step["verdict"]
    sys.stdout.write("\n" + json.dumps(result) + "\n")  # on a line of its own, whatever came before
    sys.stdout.flush()
    return exit_status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
