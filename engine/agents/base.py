"""The adapter interface: (role, prompt, workspace, profile, deadline) -> AgentResult.

Adapters build an argument array, pass the prompt by the CLI's supported mechanism, run it
under ``engine.processes.process.run_supervised`` (own session, stdin from /dev/null, streamed and
redacted capture, deadline with tree kill) and turn what it printed into an AgentResult.
This module imports no Django models.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..text import transcript
from ..processes import limits
from ..redaction import Redactor
from .network import egress, network_record

#: Usage keys every adapter reports; None means "not reported" and is never shown as 0.
USAGE_KEYS = ("input_tokens", "output_tokens", "cached_tokens", "cache_creation_tokens", "reasoning_tokens",
              "cost_usd")

#: Failure kinds an attempt can end with (besides none).
FAILURE_KINDS = ("missing_executable", "executable_not_allowed", "gateway_not_allowed", "process_limit",
                 "memory_limit", "write_limit", "output_too_large", "budget_reached", "stalled", "auth_failed", "timeout", "malformed_result", "crashed", "cancelled",
                 "interactive_prompt")

#: What a CLI waiting for a person prints (docs/field-cases.md C10: an approval or login prompt). The
#: agent's stdin is /dev/null or the prompt file, so it reads EOF and exits; this names why.
_PROMPT_PATTERNS = re.compile(
    r"\[(?:Y/n|y/N|y/n|Y/N)\]|\((?:y/n|Y/n|y/N|yes/no)\)|Press (?:Enter|any key)|Enter (?:the )?(?:authorization )?code"
    r"|Do you want to (?:continue|proceed)|Waiting for (?:approval|input)|Please visit .* to authori[sz]e")


def empty_usage() -> dict:
    """A usage mapping with every key unknown (None)."""
    return {key: None for key in USAGE_KEYS}


@dataclass
class AgentRequest:
    """Everything an adapter needs for one attempt.

    ``deadline_seconds`` is wall-clock seconds from launch; ``log_path``/``raw_path`` are
    absolute paths of the display log and the raw (redacted) byte log; ``env`` is the run's
    environment for the process; ``marker`` tags every descendant for the tree kill;
    ``should_stop`` is polled while the process runs (a lost lease stops it);
    ``on_start(pid, create_time)`` lets the engine persist the pid before it matters;
    ``prompt_path`` is the saved prompt (a CLI that reads its prompt on stdin gets this file);
    ``home_dir`` is a fresh folder for the attempt's HOME, outside the worktree and the control
    records; ``operation_attempt`` is 1 for the first attempt of this operation in this stage, 2 for the next...;
    ``deny_addresses`` are ``(address, port)`` pairs the attempt's egress proxy never connects to
    (the database, the broker, the Control Panel: engine/boundary.py ``service_addresses``);
    ``stderr_path`` is where the CLI's stderr is kept apart from its stdout (``raw_path`` then holds
    stdout alone, what the adapter parses); '' keeps both in ``raw_path``. ``limits``: the attempt's
    limits (engine/processes/limits.py ``Limits``; None: the operator's). ``spend``: the pipeline's ``budgets`` and
    what the run and the stage spent before this attempt, for its model gateway's meter
    (engine/agents/cli_adapter.py ``meter_parts``). ``on_usage(usage, spend)``: told, while the attempt
    runs, what its model gateway has metered so far (at most every ``LIVE_SECONDS``, from the thread that
    supervises the process), so that the run's pages and API show the spend live.
    """

    role: str
    operation: str
    prompt: str
    workspace: str
    profile: dict
    deadline_seconds: float
    log_path: str
    raw_path: str
    env: dict
    stage_key: str
    attempt_number: int
    control_dir: str
    operation_attempt: int = 1
    prompt_path: str = ""
    home_dir: str = ""
    marker: str = ""
    secrets: list = field(default_factory=list)
    should_stop: Callable[[], bool] | None = None
    on_start: Callable[[int, float], None] | None = None
    deny_addresses: list = field(default_factory=list)
    stderr_path: str = ""
    limits: object = None
    spend: dict | None = None
    on_usage: Callable[[dict, dict], None] | None = None
    #: the run's setup environment, read-only: ``sandbox.wrap``'s ``binds`` (engine/environments.py)
    binds: list = field(default_factory=list)


@dataclass
class AgentResult:
    """What one attempt produced. ``usage`` has the keys of USAGE_KEYS (tokens, cost in USD).

    ``structured``: True when the CLI's documented output (its JSON stream) was read, False when
    it printed only text where that was expected (the text is then ``final_message``), None when
    the adapter has no such output (the scripted test adapter) or the CLI never ran."""

    exit_code: int | None
    signal: int | None
    elapsed_seconds: float
    failure_kind: str | None
    failure_message: str = ""
    usage: dict = field(default_factory=empty_usage)
    session_id: str = ""
    final_message: str = ""
    cli_version: str = ""
    simulated: bool = False
    output_bytes: int = 0
    redactions: int = 0
    pid: int | None = None
    structured: bool | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class Adapter:
    """Base class of the adapters. Subclasses set ``name`` and ``simulated`` and implement ``run``.

    ``network``: what the last attempt did on the network (``engine.agents.network.network_record``),
    set by ``sandboxed_run``; adapters put it in their result's ``extra["network"]``."""

    name = ""
    simulated = False
    network: dict | None = None
    #: What bounded the last attempt's process tree (engine/processes/limits.py ``Bounds.record``), set by ``sandboxed_run``.
    bounds: dict | None = None
    #: The format of the CLI's output that engine/text/transcript.py normalizes ('' for none): while the
    #: process runs, ``sandboxed_run`` keeps the attempt's ``transcript.jsonl`` beside its raw log.
    transcript_format = ""

    def sandboxed_run(self, argv: list[str], env: dict, request: AgentRequest, wrapper, endpoint_url: str | None = None,
                      **run_options):
        """Run ``argv`` for the attempt inside its sandbox with its egress proxy.

        ``wrapper(argv, env, request, policy) -> argv`` is the adapter's sandbox builder
        (``sandbox.wrap`` with the attempt's folders); ``endpoint_url`` the scripted endpoint of a
        simulated attempt. The proxy variables join ``env``; the proxy stops when the process
        ends and ``self.network`` keeps its record. Returns ``engine.processes.process.ProcessResult``."""
        follower = None
        if self.transcript_format and request.raw_path:
            follower = transcript.Follower(request.raw_path, self.transcript_format, request.workspace,
                                           Redactor(request.secrets))
            follower.start()
        folders = [request.workspace, request.home_dir, env.get("TMPDIR", ""), env.get("CP_DATA_DIR", "")]
        bounds = limits.Bounds(limits.operator_limits() if request.limits is None else request.limits, "attempt",
                               folders, marker=request.marker)
        with egress(request.profile, endpoint_url, request.deny_addresses) as (proxy, policy):
            env = {**env, **policy.env()}
            try:
                result = bounds.run(
                    wrapper(argv, env, request, policy), cwd=request.workspace, env=env,
                    deadline_seconds=request.deadline_seconds, log_path=request.log_path, raw_path=request.raw_path,
                    redactor=Redactor(request.secrets), should_stop=request.should_stop,
                    on_start=request.on_start, grace_seconds=float(request.profile.get("grace_seconds", 5.0)),
                    stderr_path=request.stderr_path or None, **run_options)
            finally:
                self.bounds = bounds.record()
                self.network = network_record(proxy)
                if follower is not None:
                    follower.finish()
        if result.signal is None and result.exit_code is not None and result.exit_code > 128:
            # bubblewrap reports a command killed by signal N as exit 128 + N
            result.signal, result.exit_code = result.exit_code - 128, None
        return result

    def run(self, request: AgentRequest) -> AgentResult:  # pragma: no cover - interface
        raise NotImplementedError

    def version(self, profile: dict) -> str:
        """The CLI's version string, or '' when it cannot be told."""
        return ""

    def check(self, profile: dict, role: str) -> list[str]:
        """Problems that keep ``profile`` from playing ``role`` (missing binary, no answer to
        ``--version``, a boundary the CLI cannot enforce); empty when it can."""
        return []

    def preflight(self, profile: dict, environ: dict | None = None, deny=None) -> list["PreflightProblem"]:
        """What ``profile`` lacks to run unattended on the workers (a credential, a reachable
        gateway): a list of ``PreflightProblem``, empty when nothing is lacking. ``environ`` is the
        environment the workers share (default: this process's ``os.environ``); ``deny`` the
        ``(address, port)`` pairs the egress proxy never reaches (default: the Control Panel's
        services). The base adapter (the scripted test adapter) needs nothing."""
        return []

    def auth_hint(self, profile: dict) -> str:
        """The sentence an ``auth_failed`` message ends with: which variable or login to provide
        (the CLIs' adapters, engine/agents/<cli>/adapter.py); '' when there is nothing to set."""
        return ""


@dataclass(frozen=True)
class PreflightProblem:
    """One thing a profile lacks to run unattended, found before a run is created.

    ``code``: ``credentials_missing`` (no credential variable and no login file),
    ``gateway_not_allowed`` (the gateway is not one the operator listed in ``CP_GATEWAYS``, or the
    attempt's egress proxy would refuse it) or
    ``gateway_unreachable`` (the gateway's host:port does not answer a TCP connect);
    ``message``: a sentence naming what to provide; ``provide``: the variable, file or address
    (e.g. ``ANTHROPIC_API_KEY``, a CLI's login file under ``~/.<cli>/``, ``gw.example:443``).
    """

    code: str
    message: str
    provide: str = ""

    #: A few words per code for a choice list (controlpanel/forms.py CreateRunForm).
    LABELS = {"credentials_missing": "no credentials: set {provide}",
              "gateway_not_allowed": "gateway {provide} not allowed",
              "gateway_unreachable": "gateway {provide} does not answer"}

    def label(self) -> str:
        """A few words for a choice list, e.g. ``no credentials: set ANTHROPIC_API_KEY``."""
        return self.LABELS.get(self.code, self.code).format(provide=self.provide)


def classify_process(result) -> tuple[str | None, str]:
    """Failure kind and sentence for a finished ``engine.processes.process.ProcessResult`` (None when clean)."""
    if result.missing_executable:
        return "missing_executable", f"The agent command was not found: {result.error or result.argv[0]}"
    if result.limit:
        return result.limit, (f"The attempt was stopped: {limits.REASONS.get(result.limit, result.limit)} "
                              f"(after {result.elapsed_seconds:.1f} s; what it wrote and printed up to the limit "
                              "is kept).")
    if result.cancelled:
        return "cancelled", "The attempt was stopped because the run's lease was lost or the run was failed."
    if result.timed_out:
        return "timeout", f"The attempt passed its deadline and its process tree was terminated after {result.elapsed_seconds:.1f} s."
    if result.signal is not None:
        return "crashed", f"The agent process was killed by signal {result.signal}."
    if result.exit_code != 0:
        return "crashed", f"The agent process exited with status {result.exit_code}."
    return None, ""


def interactive_prompt(log_path: str, failure_kind: str | None, failure_message: str,
                       window: int = 8192) -> tuple[str | None, str]:
    """Turn a ``crashed`` attempt whose output ends at a question for a person into
    ``interactive_prompt`` (docs/field-cases.md C10); other outcomes are returned unchanged."""
    if failure_kind != "crashed":
        return failure_kind, failure_message
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - window))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return failure_kind, failure_message
    found = _PROMPT_PATTERNS.search(tail)
    if found is None:
        return failure_kind, failure_message
    return "interactive_prompt", (f"The agent stopped at a question for a person ({found.group(0)!r}) and read "
                                  f"end-of-input: nothing may wait for input in an unattended run. {failure_message}")
