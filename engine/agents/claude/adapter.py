"""The Claude Code adapter: runs the real ``claude`` CLI headless for one attempt.

Checked on ``claude`` 2.1.197 (tests/test_claude_adapter.py and tests/test_scripted_endpoint.py,
against the real binary):

* argument array ``claude -p --output-format stream-json --verbose --max-turns N
  [--model M] <role flags> --settings FILE --setting-sources user``; the prompt comes on
  stdin (``-p`` without a prompt argument reads it), from the saved prompt file, so it ends
  in EOF and has no size limit of an argument;
* ``--max-turns`` is not in ``--help`` but works; always passed;
* a fresh ``HOME`` per attempt (no user-level settings of the worker can loosen the policy,
  docs/field-cases.md C28); only the login (``.credentials.json``) is copied in when present;
* ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (no telemetry or title side call),
  ``CLAUDE_CODE_MAX_RETRIES`` small, ``CLAUDE_CODE_DISABLE_BACKGROUND_TASKS=1`` (a long command
  is never moved to the background, where print mode loses its output), ``TMPDIR`` inside the
  attempt's HOME (the CLI keeps its commands' output there unredacted; removed with the HOME);
* role flags: reviewer ``--tools Read,Grep,Glob`` (removes every mutating tool, Bash
  included); implementer and documenter ``--permission-mode acceptEdits`` with Bash
  pre-approved (writes inside the working directory); what they changed is checked by
  manifest after the attempt: the flags are not trusted alone;
* the last stream-json line with ``"type": "result"`` carries ``is_error``,
  ``api_error_status``, ``result``, ``session_id``, ``usage`` and ``total_cost_usd``;
  ``subtype`` says "success" even on errors, so it is not used.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .. import gateways
from ..base import AgentRequest, AgentResult, PreflightProblem, classify_process, empty_usage, interactive_prompt
from ..cli_adapter import CliAdapter, cli_version, gateway_key_hint, login_present
from ..cli_adapter import find_executable  # noqa: F401 - the tests and tests/security/attacks.py take it from here
from .stream import AUTH_TEXTS, parse_stream, usage_of  # noqa: F401 - the tests take them from here

#: The Messages API's address, and the variables claude sends a key from (``x-api-key``; a token as
#: ``Authorization: Bearer``): the model gateway (engine/model_gateway) takes the key from the first set.
PROVIDER_URL = "https://api.anthropic.com"
KEY_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
#: Tools a reviewer gets: read-only; Write, Edit, Bash and the rest do not exist for it.
READ_ONLY_TOOLS = "Read,Grep,Glob"


#: Flags each role's boundary depends on; each must appear in ``claude --help`` (2.1.197 lists
#: them all; ``--max-turns`` works but is not listed, so it is not checked).
REQUIRED_FLAGS = {
    "reviewer": {"--tools": "read-only (removing every mutating tool)"},
    "implementer": {"--permission-mode": "writes only inside the working directory"},
    "documenter": {"--permission-mode": "writes only inside the working directory"},
}
COMMON_FLAGS = ("--print", "--output-format", "--verbose", "--settings", "--setting-sources")


def role_flags(role: str) -> list[str]:
    """The permission flags of a role (see the module docstring)."""
    if role == "reviewer":
        return ["--tools", READ_ONLY_TOOLS, "--permission-mode", "default"]
    return ["--permission-mode", "acceptEdits", "--allowedTools", "Bash", "--disallowedTools", "WebFetch,WebSearch"]


def build_argv(executable: str, request: AgentRequest, settings_path: str) -> list[str]:
    """The argument array of one attempt (the prompt is not in it: it comes on stdin)."""
    profile = request.profile
    argv = [executable, "-p", "--output-format", "stream-json", "--verbose",
            "--max-turns", str(int(profile.get("max_turns") or 40))]
    if profile.get("model"):
        argv += ["--model", profile["model"]]
    argv += role_flags(request.role)
    argv += ["--settings", settings_path, "--setting-sources", "user"]
    argv += list(profile.get("extra_args") or [])
    return argv


def policy_settings(role: str) -> dict:
    """The per-attempt settings file: denies what the role may never do, whatever else is configured."""
    deny = ["WebFetch", "WebSearch"]
    if role == "reviewer":
        deny += ["Write", "Edit", "NotebookEdit", "Bash"]
    return {"permissions": {"deny": deny}, "includeCoAuthoredBy": False}


def prepare_home(home: str, role: str, with_login: bool = True) -> str:
    """A fresh HOME for the attempt with only our policy and, when present, the worker's login.

    Returns the path of the settings file passed with ``--settings``.
    """
    home_path = Path(home)
    if home_path.exists():
        shutil.rmtree(home_path)
    (home_path / ".claude").mkdir(parents=True)
    settings_path = home_path / ".claude" / "settings.json"
    settings_path.write_text(json.dumps(policy_settings(role)), encoding="utf-8")
    login = login_file()
    if with_login and login.is_file():
        shutil.copy2(login, home_path / ".claude" / ".credentials.json")
    return str(settings_path)


def login_file() -> Path:
    """The worker's Claude Code login, ``~/.claude/.credentials.json`` (written by ``claude``'s
    /login, 2.1.197), which ``prepare_home`` copies into each attempt's HOME."""
    return Path(os.path.expanduser("~")) / ".claude" / ".credentials.json"



class ClaudeCodeAdapter(CliAdapter):
    """The real ``claude`` CLI (Claude Code), headless, stream-json output."""

    name = "claude-code"
    simulated = False
    executable_name = "claude"
    transcript_format = "claude"

    help_command = "claude --help"
    common_help = COMMON_FLAGS
    sandbox_boundary = "stops its shell tool from writing outside the worktree"

    def required_help(self, role: str) -> dict[str, str]:
        return REQUIRED_FLAGS.get(role, {})


    def credential_problem(self, profile: dict, environ) -> PreflightProblem | None:
        """``credentials_missing`` unless the attempt would get a credential: one of
        ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_OAUTH_TOKEN (engine/boundary.py
        ``CREDENTIALS``, the variables Claude Code reads) set in ``environ`` (or the profile's
        ``env``, which engine/pipeline/format.py refuses to hold a credential), or the login file ``~/.claude/.credentials.json`` of this process's HOME
        (``login_file``, what ``prepare_home`` copies). None when there is one."""
        names = self.credential_names()
        if any((self.worker_credentials(profile, environ).get(name) or "").strip() for name in names):
            return None
        login = login_file()
        if login_present(login):
            return None
        return PreflightProblem(
            "credentials_missing", f"no credentials for the claude CLI on the workers: set {names[0]} (or "
            f"{' or '.join(names[1:])}) in the workers' environment, or log in once as "
            f"the workers' user (run `claude`, then /login) so that ~/.claude/.credentials.json exists (looked "
            f"for {login})", names[0])

    def auth_hint(self, profile: dict) -> str:
        """What to set after an ``auth_failed`` attempt of a real model (claude 2.1.197 asks a
        person to "run /login", which a headless worker cannot do); '' for a scripted endpoint."""
        if profile.get("scripted_endpoint"):
            return ""
        if gateways.uses_gateway(profile):
            return gateway_key_hint(profile)
        names = self.credential_names()
        return (f"Set {names[0]} (or {' or '.join(names[1:])}) in the workers' environment, or log in as the "
                f"workers' user (`claude`, then /login: ~/.claude/.credentials.json); a "
                f"headless worker cannot log in by itself.")

    def environment(self, request: AgentRequest, home: str) -> dict:
        env = dict(request.env)
        env.update({
            "HOME": home,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": str(request.profile.get("max_retries", 2)),
            "DISABLE_AUTOUPDATER": "1",
            # headless, a command moved to the background loses its output when the session ends
            # (the CLI tells the model it "will be notified", which print mode never does): every
            # command runs in the foreground, within the attempt's deadline
            "CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1",
        })
        if request.profile.get("base_url"):  # a gateway (LLM proxy) in front of the Messages API
            env["ANTHROPIC_BASE_URL"] = str(request.profile["base_url"])
        env.update({k: str(v) for k, v in (request.profile.get("env") or {}).items()})
        # its own folder in the attempt's HOME, removed with it: claude keeps the output of its
        # commands there unredacted (<TMPDIR>/claude-<uid>/.../tasks/*.output), which must not outlive
        # the attempt in the run's shared scratch folder; and /tmp is read-only in the sandbox (without a
        # writable TMPDIR claude 2.1.197 cannot make that folder and exits 0 having printed nothing)
        env["TMPDIR"] = os.path.join(home, "tmp")
        os.makedirs(env["TMPDIR"], exist_ok=True)
        return env

    def run_attempt(self, request: AgentRequest) -> AgentResult:
        exe, missing = self.executable_or_result(request)
        if missing is not None:
            return missing
        version = cli_version(exe)
        home = request.home_dir
        # no login copy beside a key: a scripted endpoint's, a listed gateway's (CP_GATEWAYS) or the worker's,
        # which the model gateway holds (the login would sit in the sandbox for nothing)
        keyed = any((request.env.get(name) or "").strip() for name in KEY_VARS)
        settings_path = prepare_home(home, request.role, with_login=not (request.profile.get("scripted_endpoint")
                                                                         or gateways.uses_gateway(request.profile)
                                                                         or keyed))
        argv = build_argv(exe, request, settings_path)
        env = self.environment(request, home)
        endpoint = self.start_endpoint(request)
        try:
            upstream = endpoint.url if endpoint else env.get("ANTHROPIC_BASE_URL") or PROVIDER_URL
            if self.open_gateway(request, env, endpoint, upstream, KEY_VARS) is not None:
                env["ANTHROPIC_BASE_URL"] = self.gateway.url
            result = self.supervise(argv, env, request)
        finally:
            self.close_gateway()
            if endpoint is not None:
                endpoint.stop()
            Path(home, ".claude", ".credentials.json").unlink(missing_ok=True)  # the login copy leaves with it
        return self.metered(self._result(result, request, version))

    def _result(self, result, request: AgentRequest, version: str) -> AgentResult:
        parsed = parse_stream(request.raw_path, request.stderr_path)
        outcome = parsed["result"]
        failure_kind, failure_message = classify_process(result)
        if failure_kind in (None, "crashed"):
            if outcome is not None and outcome.get("is_error"):
                status = outcome.get("api_error_status")
                text = str(outcome.get("result") or "; ".join(outcome.get("errors") or []))
                if status in (401, 403) or any(t in text for t in AUTH_TEXTS):
                    failure_kind, failure_message = "auth_failed", f"The agent could not authenticate: {text}"
                else:
                    failure_kind, failure_message = "crashed", f"The agent reported an error: {text}"
            elif outcome is None and parsed["auth_error"]:
                failure_kind, failure_message = "auth_failed", "The agent reported that it is not logged in."
            elif outcome is None and failure_kind is None and not parsed["structured"] and parsed["plain_text"]:
                failure_kind = "malformed_result"
                failure_message = ("The agent exited 0 but printed text where its stream-json output was expected "
                                   "(structured: false); its text is kept as the final message.")
            elif outcome is None and failure_kind is None:
                failure_kind = "malformed_result"
                failure_message = "The agent exited 0 but its output has no complete result object."
            elif outcome is None:
                failure_kind, failure_message = interactive_prompt(request.log_path, failure_kind, failure_message)
        final = ""
        if outcome is not None:
            final = str(outcome.get("result") or "") or parsed["last_text"]
        elif not parsed["structured"]:
            final = parsed["plain_text"]  # what it printed instead of its stream: kept as its answer
        if failure_kind == "auth_failed" and self.auth_hint(request.profile):
            failure_message = f"{failure_message.rstrip().rstrip('.')}. {self.auth_hint(request.profile)}"
        usage = usage_of(outcome) if failure_kind != "auth_failed" else empty_usage()  # no model call was made
        return AgentResult(
            exit_code=result.exit_code, signal=result.signal, elapsed_seconds=result.elapsed_seconds,
            failure_kind=failure_kind, failure_message=failure_message, usage=usage,
            session_id=(outcome or {}).get("session_id") or parsed["session_id"], final_message=final,
            cli_version=version or parsed["version"], simulated=bool(request.profile.get("scripted_endpoint")),
            output_bytes=result.output_bytes, redactions=result.redactions, pid=result.pid,
            structured=parsed["structured"],
            extra={"permission_denials": (outcome or {}).get("permission_denials") or [],
                   "refusals": parsed["refusals"], "num_turns": (outcome or {}).get("num_turns"),
                   "network": self.network, "truncated_lines": parsed["truncated_lines"]},
        )


#: The adapter class engine/agents/registry.py registers.
ADAPTER = ClaudeCodeAdapter
