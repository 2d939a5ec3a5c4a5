"""The Gemini CLI adapter: runs the real ``gemini`` CLI (``@google/gemini-cli``) headless for one attempt.

Every fact below was checked on ``gemini`` 0.61.0 (``gemini --version``), the binary of
tools/agents, against engine/scripted_endpoint.py (tests/test_gemini_adapter.py):

* argument array (the prompt is not in it: ``-p ""`` runs headless and, as ``--help`` says,
  "Appended to input on stdin", so the prompt comes whole from stdin, the saved prompt file)::

      gemini -p "" -o stream-json [-m MODEL] --approval-mode MODE [--skip-trust]
             --policy HOME/.gemini/cp-policy.toml --allowed-mcp-server-names cp-none
             -e cp-none [profile extra_args]

* the per-attempt ``HOME`` (= ``GEMINI_CLI_HOME``) holds only ``.gemini/settings.json``
  (``settings_for``) and the role's policy file: the worker's ``~/.gemini`` (settings, MCP
  servers, extensions, skills, policies, its OAuth login) never reaches the attempt. The
  settings select the API-key auth (``security.auth.selectedType: gemini-api-key``: without it a
  set ``GOOGLE_GEMINI_BASE_URL`` selects a "gateway" auth and the CLI exits 41 "Invalid auth
  method selected"), turn folder trust off (``security.folderTrust.enabled: false``: else an
  untrusted folder exits 55), exclude the tools no role gets (``EXCLUDED_TOOLS``: web search and
  fetch, plan mode, which lets ``write_file`` write ``*.md`` files, sub-agents, skills), turn
  usage statistics and hooks off and set ``model.maxSessionTurns`` from ``max_turns``;
* reviewer (every role but implementer and documenter): the worktree is **untrusted**
  (``GEMINI_CLI_TRUST_WORKSPACE=false``): the repository's ``.gemini/settings.json``,
  ``.gemini/policies``, hooks, skills and ``GEMINI.md`` are not read, and the CLI forces the
  ``default`` approval mode, whose tools under ``-p`` are ``update_topic, list_directory,
  read_file, grep_search, glob`` only (``write_file``, ``replace`` and ``run_shell_command`` are
  not registered: a call gets ``tool_result`` status ``error``, error type
  ``tool_not_registered``, "Tool "write_file" not found"). Its policy file denies the writing
  tools again, and the engine's sandbox mounts the worktree read-only;
* implementer and documenter: ``--skip-trust`` (a trusted folder is needed: in an untrusted
  one the CLI overrides every approval mode to ``default``, and there even with a policy that
  allows ``run_shell_command`` every command "requires user confirmation, which is not
  supported in non-interactive mode") and ``--approval-mode yolo``: ``write_file``,
  ``replace``, ``run_shell_command`` run without asking (``auto_edit`` offers no shell). What
  bounds them is the engine's sandbox (the worktree writable, the rest of the host read-only or
  absent) and the manifest check after the attempt. A trusted folder lets the repository's
  ``.gemini/settings.json``, ``.gemini/.env`` / ``.env`` (for variables not already set),
  ``GEMINI.md`` and hooks in; ``--allowed-mcp-server-names cp-none`` and ``-e cp-none`` keep
  its MCP servers and extensions out, and everything else runs inside the same sandbox;
* environment: HOME = GEMINI_CLI_HOME = the attempt's HOME, ``TMPDIR`` inside it (the CLI writes
  ``gemini-client-error-*.json`` reports there), ``GEMINI_CLI_NO_RELAUNCH=true`` (one node
  process instead of a relaunched child), ``GOOGLE_GEMINI_BASE_URL`` (the profile's
  ``base_url``, the scripted endpoint, or the default ``DEFAULT_BASE_URL``: set, so that a
  repository ``.env`` cannot point it elsewhere), ``GEMINI_API_KEY`` (sent as
  ``x-goog-api-key``; ``GOOGLE_API_KEY`` alone is refused with rc 41 "you must specify the
  GEMINI_API_KEY environment variable", so the adapter copies it into GEMINI_API_KEY);
* ``-m`` avoids the model router: without it the CLI first calls
  ``POST /v1beta/models/<router model>:generateContent``; with it, one
  ``POST /v1beta/models/<model>:streamGenerateContent?alt=sse`` per model turn;
* stdout is JSONL (``-o stream-json``): ``init{session_id, model}``,
  ``message{role: user|assistant, content, delta}`` (assistant text arrives in deltas),
  ``tool_use{tool_name, tool_id, parameters}``, ``tool_result{tool_id, status: success|error,
  output, error{type, message}}``, ``error{severity, message}`` and the final
  ``result{status: success|error, error{type, message}, stats{total_tokens, input_tokens,
  output_tokens, cached, input, duration_ms, tool_calls, models{...}}}``: ``input_tokens`` is
  the summed ``promptTokenCount`` (cached included), ``output_tokens`` the summed
  ``candidatesTokenCount``, ``cached`` the summed ``cachedContentTokenCount``; thoughts are not
  in it. The session record ``HOME/.gemini/tmp/<project>/chats/session-*.jsonl`` holds each
  model message's ``tokens{input, output, cached, thoughts, tool, total}``; reasoning tokens
  are summed from there (None when the record is not found);
* failures: no key: rc 41 in ~1 s ("When using Gemini API, you must specify the GEMINI_API_KEY
  environment variable", or "Please set an Auth method"); a 401 from the endpoint: rc 145
  within ~2 s, no retry, ``result`` status ``error`` with "[API Error: {"error":{"code":401,
  ...,"status":"UNAUTHENTICATED"}}]"; an untrusted folder with folder trust on: rc 55; no
  network: rc 1 after minutes of retries (only the engine's deadline ends it sooner).
  bubblewrap reports an exit status above 128 as a signal (128 + N); SIGCHLD (17) cannot end a
  process, so "signal 17" is gemini's own rc 145 and is given back as such.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

from .. import gateways
from ...redaction import redact_text
from ..base import AgentRequest, AgentResult, PreflightProblem, classify_process, empty_usage, interactive_prompt
from ..cli_adapter import CliAdapter, gateway_key_hint, cli_version, WRITE_ROLES
from .stream import parse_stream, session_tokens, usage_of  # noqa: F401 - the tests take them from here

#: The model of a scripted attempt when the profile names none: a name the CLI knows (no router call).
SCRIPTED_MODEL = "gemini-2.5-pro"
#: The variables the CLI sends a key from (``x-goog-api-key``; GOOGLE_API_KEY is copied into
#: GEMINI_API_KEY): the model gateway takes it.
KEY_VARS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
#: The Gemini API's own address (what the CLI uses when GOOGLE_GEMINI_BASE_URL is not set).
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
#: Tools no role gets (settings ``tools.exclude``; names as the 0.61.0 request declares them).
EXCLUDED_TOOLS = ("google_web_search", "web_fetch", "enter_plan_mode", "exit_plan_mode", "invoke_agent",
                  "activate_skill")
#: The tools that change files or run commands (0.61.0); a reviewer's policy denies them.
WRITE_TOOLS = ("write_file", "replace", "run_shell_command")
#: A name no MCP server or extension has: ``--allowed-mcp-server-names`` / ``-e`` with it allow none.
NONE_NAME = "cp-none"
#: Exit codes of gemini 0.61.0 (seen): no usable auth, an untrusted folder, an API error.
AUTH_EXIT, TRUST_EXIT, API_ERROR_EXIT = 41, 55, 145
#: What each role's boundary needs from ``gemini --help`` (0.61.0 lists them all).
REQUIRED_HELP = {
    "reviewer": {"--approval-mode": "read-only (the default approval mode: no writing or shell tools)",
                 "--policy": "read-only (a policy denying the writing and shell tools)"},
    "implementer": {"--approval-mode": "writes only inside the worktree (tools without asking, in the sandbox)",
                    "--skip-trust": "writes only inside the worktree (a trusted folder for the approval mode)"},
    "documenter": {"--approval-mode": "writes only inside the worktree (tools without asking, in the sandbox)",
                   "--skip-trust": "writes only inside the worktree (a trusted folder for the approval mode)"},
}
#: Options every attempt passes.
COMMON_HELP = ("--prompt", "--output-format", "stream-json", "--model", "--allowed-mcp-server-names",
               "--extensions")


def settings_for(request: AgentRequest) -> dict:
    """The attempt's ``HOME/.gemini/settings.json`` (module docstring)."""
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "tools": {"exclude": list(EXCLUDED_TOOLS)},
        "privacy": {"usageStatisticsEnabled": False},
        "hooksConfig": {"enabled": False},
    }
    max_turns = request.profile.get("max_turns")
    if max_turns:
        settings["model"] = {"maxSessionTurns": int(max_turns)}
    return settings


def policy_for(role: str) -> str:
    """The role's policy file (TOML, the CLI's policy engine): a reviewer's denies the writing and
    shell tools; a writer's denies nothing more than the settings exclude."""
    if role in WRITE_ROLES:
        return "# writers: bounded by the engine's sandbox (docs/agents.md, Gemini CLI)\n"
    return ("[[rule]]\n"
            f"toolName = {json.dumps(list(WRITE_TOOLS))}\n"
            'decision = "deny"\n'
            "priority = 900\n"
            'denyMessage = "This role is read-only: it may not change files or run commands."\n')


def policy_path(home: str) -> str:
    return str(Path(home) / ".gemini" / "cp-policy.toml")


def prepare_home(request: AgentRequest) -> None:
    """A fresh HOME for the attempt holding only our settings, the role's policy and a TMPDIR."""
    home = Path(request.home_dir)
    if home.exists():
        shutil.rmtree(home)
    (home / ".gemini").mkdir(parents=True)
    (home / "tmp").mkdir()
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings_for(request), indent=1), encoding="utf-8")
    Path(policy_path(str(home))).write_text(policy_for(request.role), encoding="utf-8")


def role_args(role: str) -> list[str]:
    """The approval mode (and trust) of a role (module docstring)."""
    if role in WRITE_ROLES:
        return ["--approval-mode", "yolo", "--skip-trust"]
    return ["--approval-mode", "default"]


def build_argv(executable: str, request: AgentRequest, endpoint_url: str | None = None) -> list[str]:
    """The argument array of one attempt; the prompt comes on stdin (``-p ""``).

    ``-m`` is the profile's model, else ``SCRIPTED_MODEL`` for a scripted attempt (a real one
    without a model lets the CLI choose, with its router calls)."""
    profile = request.profile
    argv = [executable, "-p", "", "-o", "stream-json"]
    model = profile.get("model") or (SCRIPTED_MODEL if endpoint_url else None)
    if model:
        argv += ["-m", str(model)]
    argv += role_args(request.role)
    argv += ["--policy", policy_path(request.home_dir), "--allowed-mcp-server-names", NONE_NAME, "-e", NONE_NAME]
    argv += list(profile.get("extra_args") or [])
    return argv



class GeminiCliAdapter(CliAdapter):
    """The real ``gemini`` CLI (Google Gemini CLI), headless, stream-json output."""

    name = "gemini-cli"
    simulated = False
    executable_name = "gemini"
    transcript_format = "gemini"

    help_command = "gemini --help"
    common_help = COMMON_HELP
    sandbox_boundary = "keeps its shell tool from writing outside the worktree"

    def required_help(self, role: str) -> dict[str, str]:
        return REQUIRED_HELP.get(role, REQUIRED_HELP["reviewer"])


    def environment(self, request: AgentRequest, home: str) -> dict:
        """The attempt's environment (module docstring): the run's and the profile's ``env``, then
        HOME = GEMINI_CLI_HOME = ``home``, TMPDIR in it, the key as GEMINI_API_KEY, the base URL and
        the role's trust; the CLI's own path variables that could point elsewhere are removed."""
        # the profile's env first, so that nothing the engine sets below can be set back by it
        # (engine/pipeline/schema/fields.py ENGINE_ENV refuses those names in a profile as well)
        env = {**request.env, **{k: str(v) for k, v in (request.profile.get("env") or {}).items()}}
        for name in ("GEMINI_CLI_SYSTEM_SETTINGS_PATH", "GEMINI_CLI_SYSTEM_DEFAULTS_PATH",
                     "GEMINI_CLI_TRUSTED_FOLDERS_PATH", "GEMINI_CLI_IDE_WORKSPACE_PATH", "GEMINI_SANDBOX",
                     "GEMINI_CLI_TRUST_WORKSPACE", "GEMINI_MODEL", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA"):
            env.pop(name, None)
        env.update({"HOME": home, "GEMINI_CLI_HOME": home, "TMPDIR": os.path.join(home, "tmp"),
                    "GEMINI_CLI_NO_RELAUNCH": "true"})
        if not env.get("GEMINI_API_KEY") and env.get("GOOGLE_API_KEY"):
            env["GEMINI_API_KEY"] = env["GOOGLE_API_KEY"]
        env["GOOGLE_GEMINI_BASE_URL"] = str(request.profile.get("base_url")
                                            or (request.profile.get("env") or {}).get("GOOGLE_GEMINI_BASE_URL")
                                            or DEFAULT_BASE_URL)
        if request.role not in WRITE_ROLES:
            env["GEMINI_CLI_TRUST_WORKSPACE"] = "false"  # the repository's .gemini and GEMINI.md unread
        return env

    def credential_problem(self, profile: dict, environ) -> PreflightProblem | None:
        """``credentials_missing`` unless the attempt would send a key: GEMINI_API_KEY in the
        environment ``environment`` builds (from GEMINI_API_KEY or GOOGLE_API_KEY of ``environ``,
        engine/boundary.py ``CREDENTIALS``). A Google login (OAuth) of the worker is not copied
        into the attempt's HOME, so it does not count. None when there is a key."""
        attempt = SimpleNamespace(env=self.worker_credentials({}, environ), profile=profile, role="reviewer")
        if (self.environment(attempt, "").get("GEMINI_API_KEY") or "").strip():
            return None
        return PreflightProblem(
            "credentials_missing", "no credentials for the gemini CLI on the workers: set GEMINI_API_KEY (or "
            "GOOGLE_API_KEY, which the adapter copies into GEMINI_API_KEY) in the workers' environment; a Google "
            "login of the workers' user is not used (each attempt has its own HOME)", "GEMINI_API_KEY")

    def auth_hint(self, profile: dict) -> str:
        """What to set after an ``auth_failed`` attempt of a real model; '' for a scripted endpoint."""
        if profile.get("scripted_endpoint"):
            return ""
        if gateways.uses_gateway(profile):
            return gateway_key_hint(profile)
        return ("Set GEMINI_API_KEY (or GOOGLE_API_KEY, which the adapter copies into GEMINI_API_KEY) in the "
                "workers' environment; a headless worker cannot log in to Google by itself.")

    def run_attempt(self, request: AgentRequest) -> AgentResult:
        exe, missing = self.executable_or_result(request)
        if missing is not None:
            return missing
        version = cli_version(exe)
        prepare_home(request)
        env = self.environment(request, request.home_dir)
        endpoint = self.start_endpoint(request)
        try:
            upstream = endpoint.url if endpoint else env["GOOGLE_GEMINI_BASE_URL"]
            if self.open_gateway(request, env, endpoint, upstream, KEY_VARS) is not None:
                env["GOOGLE_GEMINI_BASE_URL"] = self.gateway.url
            argv = build_argv(exe, request, endpoint.url if endpoint else None)
            result = self.supervise(argv, env, request)
        finally:
            self.close_gateway()
            if endpoint is not None:
                endpoint.stop()
        return self.metered(self._result(result, request, version))  # reads the session record before the engine removes HOME

    def _result(self, result, request: AgentRequest, version: str) -> AgentResult:
        if result.signal == signal.SIGCHLD and not (result.timed_out or result.cancelled):
            result.signal, result.exit_code = None, 128 + signal.SIGCHLD  # gemini's own rc 145 (module docstring)
        parsed = parse_stream(request.raw_path, request.stderr_path)
        outcome = parsed["result"]
        failure_kind, failure_message = classify_process(result)
        error = (outcome or {}).get("error") if isinstance((outcome or {}).get("error"), dict) else {}
        reported = str(error.get("message") or "") or (parsed["errors"][-1] if parsed["errors"] else "")
        if failure_kind in (None, "crashed"):
            completed = failure_kind is None and outcome is not None and outcome.get("status") == "success"
            if (parsed["auth_error"] and not completed) or result.exit_code == AUTH_EXIT:
                failure_kind = "auth_failed"
                failure_message = ("The agent could not authenticate: "
                                   f"{reported or ' | '.join(parsed['stderr_tail']) or f'exit status {AUTH_EXIT}'}")
            elif parsed["trust_error"] or result.exit_code == TRUST_EXIT:
                failure_kind = "crashed"
                failure_message = ("The agent refused the worktree as an untrusted folder (exit status 55): "
                                   f"{' | '.join(parsed['stderr_tail'])}")
            elif outcome is not None and outcome.get("status") == "error":
                failure_kind, failure_message = "crashed", f"The agent reported an error: {reported or 'no message'}"
            elif outcome is None and failure_kind is None and not parsed["structured"] and parsed["plain_text"]:
                failure_kind = "malformed_result"
                failure_message = ("The agent exited 0 but printed text where its stream-json output was expected "
                                   "(structured: false); its text is kept as the final message.")
            elif outcome is None and failure_kind is None:
                failure_kind = "malformed_result"
                failure_message = "The agent exited 0 but its output has no result event."
            elif failure_kind == "crashed":
                failure_kind, failure_message = interactive_prompt(request.log_path, failure_kind, failure_message)
                tail = reported or " | ".join(parsed["stderr_tail"])
                if failure_kind == "crashed" and tail:
                    failure_message += f" Last output: {tail}"
        if failure_kind == "auth_failed" and self.auth_hint(request.profile):
            failure_message = f"{failure_message.rstrip().rstrip('.')}. {self.auth_hint(request.profile)}"
        tokens = session_tokens(request.home_dir, parsed["session_id"])
        usage = usage_of(outcome, tokens) if failure_kind != "auth_failed" else empty_usage()
        refusals = parsed["refusals"]
        for refusal in refusals:  # the stream is redacted at capture; the messages go to the database
            for key in ("message", "command"):
                if key in refusal:
                    refusal[key], _ = redact_text(refusal[key], request.secrets)
        return AgentResult(
            exit_code=result.exit_code, signal=result.signal, elapsed_seconds=result.elapsed_seconds,
            failure_kind=failure_kind, failure_message=failure_message, usage=usage,
            session_id=parsed["session_id"],
            final_message=parsed["last_text"] if outcome is not None else
            ("" if parsed["structured"] else parsed["plain_text"]),
            cli_version=version, simulated=bool(request.profile.get("scripted_endpoint")),
            output_bytes=result.output_bytes, redactions=result.redactions, pid=result.pid,
            structured=parsed["structured"],
            extra={"tool_calls": parsed["tool_calls"], "refusals": refusals, "model": parsed["model"],
                   "session_tokens": tokens, "network": self.network, "truncated_lines": parsed["truncated_lines"]},
        )


#: The adapter class engine/agents/registry.py registers.
ADAPTER = GeminiCliAdapter
