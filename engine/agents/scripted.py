"""The scripted test adapter: a real child process that follows a scenario (simulated runs only).

It exists for controlled failures and offline tests. It is chosen only explicitly (a profile
with ``adapter: scripted``), and every run that uses it is labelled simulated. The scenario
(docs/pipeline-format.md) gives, per stage and operation, a list of steps; the Nth attempt of
an operation takes the Nth step, the last one repeating. Stages the scenario does not name take
the ``default`` list.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid

from ..text import transcript
from ..redaction import Redactor
from . import sandbox
from .base import Adapter, AgentRequest, AgentResult, classify_process, empty_usage, interactive_prompt

AGENT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripted_agent.py")


def sandboxed(argv: list[str], env: dict, request: AgentRequest, network=None) -> list[str]:
    """``argv`` inside the sandbox every real CLI gets (engine/agents/sandbox.py), so that the
    simulated runs exercise the same boundary: the attempt's HOME, TMPDIR and data folder and (for
    writers) the worktree writable; the worktree read-only for the reviewer; the scripted agent,
    its step file, the Python install and the PATH folders visible; nothing else of the host."""
    writable = [request.home_dir, env.get("TMPDIR", ""), env.get("CP_DATA_DIR", "")]
    visible = sandbox.git_dirs(request.workspace) + [AGENT_SCRIPT, request.control_dir]
    if request.role in ("implementer", "documenter"):
        writable.append(request.workspace)
    else:
        visible.append(request.workspace)
    visible += sandbox.tool_paths(env.get("PATH"), (argv[0],))
    return sandbox.wrap(argv, writable=[folder for folder in writable if folder],
                        read_only=[os.path.join(request.workspace, ".git")],
                        hide=sandbox.private_paths(sandbox.var_dir()), visible=visible, network=network,
                        binds=request.binds)


def pick_step(scenario: dict, stage_key: str, operation: str, nth: int) -> dict:
    """The scenario step for the ``nth`` (1-based) attempt of ``operation`` in ``stage_key``.

    Returns {} when the scenario has nothing for it (the agent then changes nothing).
    """
    steps = ((scenario.get("stages") or {}).get(stage_key) or {}).get(operation)
    if steps is None:
        steps = scenario.get("default") if operation == "implement" else None
    if not steps:
        return {}
    return steps[min(nth, len(steps)) - 1]


class ScriptedAdapter(Adapter):
    """Runs ``scripted_agent.py`` with one scenario step; the result is labelled simulated."""

    name = "scripted"
    transcript_format = "scripted"
    simulated = True

    def version(self, profile: dict) -> str:
        return f"scripted-agent (simulated) on Python {sys.version.split()[0]}"

    def run(self, request: AgentRequest) -> AgentResult:
        nth = request.operation_attempt
        step = pick_step(request.profile.get("scenario") or {}, request.stage_key, request.operation, nth)
        session_id = str(uuid.uuid4())
        step_file = os.path.join(request.control_dir, f"scripted-step-{request.attempt_number}.json")
        with open(step_file, "w", encoding="utf-8") as fh:
            json.dump({"step": step, "stage": request.stage_key, "operation": request.operation,
                       "attempt": request.attempt_number, "session_id": session_id}, fh)
        if is_quiet(step):
            return self._quiet(request, step, session_id)
        argv = [sys.executable, AGENT_SCRIPT, step_file]
        if not sandbox.available()[0]:
            message = f"No sandbox can be made for the scripted agent: {sandbox.available()[1]}"
            with open(request.log_path, "a", encoding="utf-8") as log:
                log.write(f"[run-engine] {message}\n")
            return AgentResult(exit_code=None, signal=None, elapsed_seconds=0.0, failure_kind="boundary_not_enforced",
                               failure_message=message, usage=empty_usage(), simulated=True)
        result = self.sandboxed_run(argv, {**request.env, "HOME": request.home_dir}, request, sandboxed)
        failure_kind, failure_message = interactive_prompt(request.log_path, *classify_process(result))
        usage, final, extra = empty_usage(), "", {}
        parsed = _last_result_line(request.raw_path)
        if parsed is not None:
            reported = parsed.get("usage") or {}
            for key in usage:
                if reported.get(key) is not None:
                    usage[key] = reported[key]
            final = str(parsed.get("result") or "")
            if "verdict" in parsed:
                extra["verdict"] = parsed["verdict"]
        elif failure_kind is None:
            failure_kind, failure_message = "malformed_result", "The scripted agent printed no result line."
        return AgentResult(
            exit_code=result.exit_code, signal=result.signal, elapsed_seconds=result.elapsed_seconds,
            failure_kind=failure_kind, failure_message=failure_message, usage=usage,
            session_id=session_id if parsed is not None else "", final_message=final,
            cli_version=self.version(request.profile), simulated=True, output_bytes=result.output_bytes,
            redactions=result.redactions, pid=result.pid, extra={**extra, "network": self.network},
        )


    def _quiet(self, request: AgentRequest, step: dict, session_id: str) -> AgentResult:
        """A step that does nothing but answer (``is_quiet``), without a process: the lines
        ``scripted_agent.py`` would print (its header and its result line, plain ASCII: the result is
        ``json.dumps``'d), redacted and written to the raw and display logs, and the transcript made
        from them, in milliseconds instead of a sandboxed interpreter's start (issue 19). Nothing
        runs, so there is no pid, no network and nothing in the worktree changes."""
        started = time.monotonic()
        result = {"type": "result", "simulated": True, "is_error": False, "session_id": session_id,
                  "result": step.get("final_message", "Scripted step done."), "usage": step.get("usage") or {}}
        if "verdict" in step:
            result["verdict"] = step["verdict"]
        text = (f"[scripted agent] {request.operation} of stage {request.stage_key}, attempt "
                f"{request.attempt_number} (simulated, answered without a process: the step does nothing)\n"
                f"\n{json.dumps(result)}\n")
        redactor = Redactor(request.secrets)
        data = redactor.feed(text.encode()) + redactor.flush()
        for path in (request.raw_path, request.log_path):
            with open(path, "ab") as fh:
                fh.write(data)
        if request.stderr_path:
            open(request.stderr_path, "ab").close()
        if self.transcript_format and request.raw_path:
            transcript.build(request.raw_path, self.transcript_format, request.workspace, Redactor(request.secrets))
        self.network = {"allow": [], "connected": [], "refused": []}
        parsed = json.loads(data.decode().rstrip("\n").rsplit("\n", 1)[-1])
        usage = empty_usage()
        for key in usage:
            if (parsed.get("usage") or {}).get(key) is not None:
                usage[key] = parsed["usage"][key]
        return AgentResult(
            exit_code=0, signal=None, elapsed_seconds=time.monotonic() - started, failure_kind=None,
            failure_message="", usage=usage, session_id=session_id, final_message=str(parsed.get("result") or ""),
            cli_version=self.version(request.profile), simulated=True, output_bytes=len(data),
            redactions=redactor.count, pid=None,
            extra={**({"verdict": parsed["verdict"]} if "verdict" in parsed else {}), "network": self.network,
                   "in_process": True},
        )


#: Scenario step keys that make the scripted agent act (a process is started for them); a step with
#: none of them only answers (``ScriptedAdapter._quiet``).
ACTING_KEYS = ("write", "delete", "print", "sleep", "run")


def is_quiet(step: dict) -> bool:
    """Whether a scenario step does nothing but answer: no file written or deleted, nothing printed,
    no sleep, no command, exit status 0."""
    return not any(step.get(key) for key in ACTING_KEYS) and int(step.get("exit", 0) or 0) == 0


def _last_result_line(raw_path: str, window: int = 256 * 1024) -> dict | None:
    """The last ``{"type": "result"}`` JSON line in the tail of the raw log, or None."""
    try:
        with open(raw_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - window))
            tail = fh.read()
    except FileNotFoundError:
        return None
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("type") == "result":
            return data
    return None
