"""The Codex adapter: runs the real ``codex exec`` CLI headless for one attempt.

Every fact below was checked on ``codex-cli 0.171.0`` (``codex --version``) by running the
binary from tools/agents against engine/scripted_endpoint.py (tests/test_codex_adapter.py):

* argument array (the prompt is not in it: ``-`` makes ``codex exec`` read the
  instructions from stdin, which is the saved prompt file and so ends in EOF)::

      codex exec --json --skip-git-repo-check --ignore-user-config --ignore-rules
                 -C WORKSPACE --sandbox MODE [role -c overrides] -c web_search="disabled"
                 -o HOME/codex-last-message-N.txt [-m MODEL]
                 [scripted provider -c overrides] [profile extra_args] -

* role sandbox: reviewer ``read-only`` (a write fails inside the command with "Read-only
  file system"); implementer and documenter ``workspace-write`` plus
  ``sandbox_workspace_write.network_access=false``: besides the worktree, /tmp and $TMPDIR are
  writable, as for every other CLI's shell. Both are the attempt's own (the sandbox's private
  /tmp, gone with it; the attempt's TMPDIR), so a repository's tests that write ``/tmp/foo``
  (freezegun's) pass in codex's shell as in a gate (docs/real-repositories.md). A refused write is
  not a tool error: the command's own output says so and the run still exits 0. What an
  attempt changed is checked by manifest afterwards: the sandbox is not trusted alone;
* ``-c web_search="disabled"`` removes the ``web_search`` tool from the request;
* a fresh ``HOME`` = ``CODEX_HOME`` per attempt, so the worker's ``~/.codex/config.toml``
  (and its rules) cannot loosen a role; only ``auth.json`` (a ``codex login``) is copied in.
  ``--ignore-user-config`` ("Do not load $CODEX_HOME/config.toml; auth still uses
  CODEX_HOME") and ``--ignore-rules`` make that explicit. A ``.codex/config.toml`` inside
  an untrusted workspace was not applied (checked with ``sandbox_mode="danger-full-access"``
  in it: the reviewer still could not write);
* API key for real use: the built-in OpenAI provider sends ``CODEX_API_KEY`` as the bearer
  token; ``OPENAI_API_KEY`` in the environment is **not** sent by ``codex exec`` 0.171.0
  (checked against a loopback ``openai_base_url``). The adapter therefore copies the
  worker's ``OPENAI_API_KEY`` into ``CODEX_API_KEY`` when that is not set;
* stdout is JSONL: ``thread.started{thread_id}``, ``turn.started``,
  ``item.started``/``item.completed`` (item types ``command_execution``, ``agent_message``,
  ``error``: the last is a warning such as "Model metadata ... not found", not a failure),
  ``turn.completed{usage{input_tokens, cached_input_tokens, cache_write_input_tokens,
  output_tokens, reasoning_output_tokens}}`` (summed over the turn's model requests;
  ``input_tokens`` *includes* ``cached_input_tokens``, OpenAI's convention, unlike Claude's),
  ``turn.failed{error{message}}``, ``error{message}``. stderr carries one harmless
  "WARNING: proceeding, even though we could not create PATH aliases" line when HOME is
  under /tmp. Commands that the sandbox refused (read-only file system) do **not** appear
  as ``command_execution`` items; they are in the session record
  ``CODEX_HOME/sessions/YYYY/MM/DD/rollout-*-<thread_id>.jsonl`` (``function_call`` +
  ``function_call_output``), from which the adapter copies them into the log and records
  every non-zero command (refused or failed) in ``extra["refusals"]``, with what the JSONL
  reports as refused itself (``rejected_item``: a declined command, a failed patch; neither
  seen offline); each says its ``outcome`` (engine/text/tool_outcomes.py): exit status 127 is
  ``command_not_found`` (``bash: python: command not found``, which codex reports in its JSONL),
  a sandbox denial ``refused``, anything else ``failed``;
* ``check()``: the role's options and sandbox mode must be listed in ``codex exec --help``
  (0.171.0 lists ``--sandbox`` with ``read-only, workspace-write, danger-full-access``);
* the ``-o`` file holds the final agent text; it is written empty when the turn fails. It is
  in the attempt's HOME (writable in the sandbox, unlike the control folder), read when the
  process has ended and kept redacted in the control folder;
* failures: a 401/403 from the provider gives rc 1 within a second, ``turn.failed``
  "unexpected status 401 Unauthorized: <message>, url: ..."; a missing or empty
  ``env_key`` variable gives rc 1, "Missing environment variable: `NAME`."; a 500 gives
  rc 1 "We're currently experiencing high demand..." (no retry with
  ``request_max_retries=0``); an endpoint that never answers, or no network, is never
  ended by codex itself (it waits, or emits "Reconnecting... waiting for network" events
  forever): only the engine's deadline ends it. SIGINT/SIGTERM to the tree leaves nothing
  behind (§7);
* codex reports no cost and has no turn limit option: ``max_turns`` of the profile is not
  applied, the deadline bounds the attempt;
* codex runs inside engine/agents/sandbox.py (``sandboxed``: the var directory, the worker's
  HOME and the project's .env hidden, as for claude) and its commands inside codex's own
  bubblewrap within it. That nesting needs the sandbox's user-namespace mode (codex's inner
  bubblewrap cannot map uid 0 without capabilities: "bwrap: setting up uid map: Operation not
  permitted", every command failing while codex exits 0) and a private writable /tmp (codex
  makes ``/tmp/codex-daemon-<uid>`` whatever TMPDIR says). Its commands then cannot read the
  hidden folders nor signal the host's processes, and codex's own rules still apply inside
  (docs/agents.md, Codex; tests/test_codex_adapter.py ``test_codex_runs_in_the_engine_sandbox``).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from types import SimpleNamespace

from .. import gateways, sandbox
from ...text import transcript
from ...redaction import redact_text
from ..base import AgentRequest, AgentResult, PreflightProblem, classify_process
from ..cli_adapter import (WRITE_ROLES, CliAdapter, cli_version, gateway_key_hint,
                          login_present, sandboxed_view)
from .stream import MAX_REFUSALS, parse_events, refusals_of, session_record, usage_of  # noqa: F401 - the tests take them from here

#: ``-c`` overrides of the writing roles (checked on 0.171.0: no network). /tmp and $TMPDIR stay writable:
#: both are the attempt's own (module docstring).
WORKSPACE_WRITE_OVERRIDES = ("sandbox_workspace_write.network_access=false",)
#: The Responses API's base URL, and the variables codex exec sends a key from (as ``Authorization:
#: Bearer``; the adapter copies OPENAI_API_KEY into CODEX_API_KEY): the model gateway takes it.
PROVIDER_URL = "https://api.openai.com/v1"
KEY_VARS = ("CODEX_API_KEY", "OPENAI_API_KEY")
#: Name of the provider the adapter defines for the scripted endpoint, and the variable holding its key.
SCRIPTED_PROVIDER = "scripted"
SCRIPTED_KEY_ENV = "CP_SCRIPTED_KEY"
SCRIPTED_MODEL = "gpt-scripted"
#: What each role's boundary needs from ``codex exec --help`` (0.171.0 lists them all): a flag
#: or a sandbox mode name, and the boundary it enforces.
REQUIRED_HELP = {
    "reviewer": {"--sandbox": "read-only (the read-only sandbox)", "read-only": "read-only (the read-only sandbox)"},
    "implementer": {"--sandbox": "writes only inside the worktree", "workspace-write": "writes only inside the worktree",
                    "--config": "no network for its commands"},
    "documenter": {"--sandbox": "writes only inside the worktree", "workspace-write": "writes only inside the worktree",
                   "--config": "no network for its commands"},
}
#: Options every attempt passes (``codex exec --help`` of 0.171.0).
COMMON_HELP = ("--json", "--skip-git-repo-check", "--ignore-user-config", "--ignore-rules", "--output-last-message",
               "--cd")
def sandbox_args(role: str) -> list[str]:
    """``--sandbox`` and its ``-c`` overrides for a role (module docstring)."""
    if role in WRITE_ROLES:
        args = ["--sandbox", "workspace-write"]
        for override in WORKSPACE_WRITE_OVERRIDES:
            args += ["-c", override]
        return args
    return ["--sandbox", "read-only"]


def provider_args(url: str) -> list[str]:
    """``-c`` overrides that make codex talk to the scripted endpoint at ``url`` (``http://127.0.0.1:PORT``).

    A custom provider on the Responses API with zero retries, its key read from
    ``CP_SCRIPTED_KEY`` (checked on 0.171.0; the key variable must be set and non-empty).
    """
    prefix = f"model_providers.{SCRIPTED_PROVIDER}"
    overrides = [f"model_provider={SCRIPTED_PROVIDER}", f"{prefix}.name={SCRIPTED_PROVIDER}",
                 f'{prefix}.base_url="{url}/v1"', f"{prefix}.wire_api=responses", f"{prefix}.env_key={SCRIPTED_KEY_ENV}",
                 f"{prefix}.request_max_retries=0", f"{prefix}.stream_max_retries=0"]
    args = []
    for override in overrides:
        args += ["-c", override]
    return args


def last_message_path(request: AgentRequest) -> str:
    """Where ``-o`` writes the final agent text: a file of the attempt's HOME, writable inside the
    sandbox (the control folder is hidden there). Read by the adapter when the process has ended
    (the engine removes the HOME after the attempt), then kept redacted in the control folder
    (``kept_message_path``)."""
    return str(Path(request.home_dir) / f"codex-last-message-{request.attempt_number}.txt")


def kept_message_path(request: AgentRequest) -> str:
    """The redacted copy of the ``-o`` file kept in the attempt's control folder."""
    return str(Path(request.control_dir) / f"codex-last-message-{request.attempt_number}.txt")


def sandboxed(argv: list[str], env: dict, request: AgentRequest, network=None) -> list[str]:
    """``argv`` inside the bubblewrap sandbox of the attempt: the view every agent CLI gets
    (engine/agents/cli_adapter.py ``sandboxed_view``; the attempt's HOME is CODEX_HOME, holding the
    ``-o`` file), in the user-namespace mode that codex's own sandbox needs inside it (sandbox.wrap
    ``user_namespace``; ``/tmp`` is the sandbox's own, as codex writes ``/tmp/codex-daemon-<uid>``
    whatever TMPDIR says).

    Codex 0.171.0 starts the first ``bwrap`` on PATH before its bundled one (its strings name a
    ``system_bwrap_candidate`` and a ``bundled_bwrap_candidate``), and with Debian's bubblewrap
    0.8.0, which has no ``--argv0``, every command fails with "bwrap: execvp codex-linux-sandbox:
    No such file or directory" while codex exits 0. So each ``bwrap`` on the agent's PATH (and in
    /usr/local/bin, /usr/bin, /bin) is replaced in the view by the bundled one
    (``sandbox.bundled_bwrap``; tests/test_codex_adapter.py runs with whichever the host has).
    """
    bundled = sandbox.bundled_bwrap()
    replace = {}
    if bundled:
        for folder in [*(env.get("PATH") or "").split(os.pathsep), "/usr/local/bin", "/usr/bin", "/bin"]:
            if folder and os.path.isfile(os.path.join(folder, "bwrap")):
                replace[os.path.join(folder, "bwrap")] = bundled
    return sandboxed_view(argv, env, request, network, user_namespace=True, replace=replace)


def build_argv(executable: str, request: AgentRequest, endpoint_url: str | None = None,
               base_url: str | None = None) -> list[str]:
    """The argument array of one attempt; the prompt comes on stdin (the final ``-``).

    ``endpoint_url`` (``http://127.0.0.1:PORT``) selects the scripted provider; then ``-m`` is
    the profile's model or ``gpt-scripted``. Else ``base_url`` (the attempt's model gateway), or
    else a profile's ``base_url`` (a gateway), becomes ``-c openai_base_url=...``, the built-in
    provider's base URL in codex 0.171.0's configuration.
    """
    profile = request.profile
    argv = [executable, "exec", "--json", "--skip-git-repo-check", "--ignore-user-config", "--ignore-rules",
            "-C", request.workspace]
    argv += sandbox_args(request.role)
    argv += ["-c", 'web_search="disabled"', "-o", last_message_path(request)]
    model = profile.get("model") or (SCRIPTED_MODEL if endpoint_url else None)
    if model:
        argv += ["-m", model]
    if endpoint_url:
        argv += provider_args(endpoint_url)
    elif base_url or profile.get("base_url"):  # a gateway in front of the Responses API: the built-in provider's
        argv += ["-c", f"openai_base_url={json.dumps(str(base_url or profile['base_url']))}"]
    argv += list(profile.get("extra_args") or [])
    argv.append("-")
    return argv


def worker_codex_home(env: dict) -> Path:
    """The worker's own codex folder: ``$CODEX_HOME`` of the run's environment, else ``~/.codex``."""
    return Path(env.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex"))


def prepare_home(home: str, env: dict, with_login: bool = True) -> None:
    """A fresh HOME (= CODEX_HOME) for the attempt holding, when present and ``with_login``, only the
    worker's ``auth.json``.

    No config.toml, rules or skills of the worker are copied: nothing there can loosen a role.
    """
    home_path = Path(home)
    if home_path.exists():
        shutil.rmtree(home_path)
    home_path.mkdir(parents=True)
    login = worker_codex_home(env) / "auth.json"
    if with_login and login.is_file():
        shutil.copy2(login, home_path / "auth.json")
        os.chmod(home_path / "auth.json", 0o600)


class CodexAdapter(CliAdapter):
    """The real ``codex exec`` CLI (OpenAI Codex), headless, JSONL output."""

    name = "codex"
    simulated = False
    executable_name = "codex"
    transcript_format = "codex"

    help_command = "codex exec --help"
    help_args = ("exec", "--help")
    common_help = COMMON_HELP
    sandbox_boundary = "keeps its commands from reading the var directory and the worker's HOME"

    def required_help(self, role: str) -> dict[str, str]:
        return REQUIRED_HELP.get(role, REQUIRED_HELP["reviewer"])

    def sandbox_available(self) -> tuple[bool, str]:
        return sandbox.user_namespace_available()

    def environment(self, request: AgentRequest, home: str) -> dict:
        """The attempt's environment: the run's, with HOME = CODEX_HOME = ``home`` and the API key
        under the name codex exec reads (CODEX_API_KEY), then the profile's ``env``."""
        env = dict(request.env)
        env.update({"HOME": home, "CODEX_HOME": home})
        if not env.get("CODEX_API_KEY") and env.get("OPENAI_API_KEY"):
            env["CODEX_API_KEY"] = env["OPENAI_API_KEY"]
        env.update({k: str(v) for k, v in (request.profile.get("env") or {}).items()})
        return env

    def credential_problem(self, profile: dict, environ) -> PreflightProblem | None:
        """``credentials_missing`` unless the attempt would send a key or has a login: CODEX_API_KEY
        in the environment ``environment`` builds (from CODEX_API_KEY or OPENAI_API_KEY of ``environ``,
        engine/boundary.py ``CREDENTIALS``; codex exec 0.171.0 sends only CODEX_API_KEY, module
        docstring), or ``auth.json`` (``codex login``) in
        the worker's CODEX_HOME (``worker_codex_home`` of ``environ``, what ``prepare_home``
        copies). None when there is one."""
        # the worker's variables as the run's environment, the profile's env applied by ``environment`` itself
        attempt = SimpleNamespace(env=self.worker_credentials({}, environ), profile=profile)
        if (self.environment(attempt, "").get("CODEX_API_KEY") or "").strip():
            return None
        login = worker_codex_home(environ) / "auth.json"
        if login_present(login):
            return None
        return PreflightProblem(
            "credentials_missing", "no credentials for the codex CLI on the workers: set CODEX_API_KEY (or "
            "OPENAI_API_KEY, which the adapter copies into CODEX_API_KEY) in the workers' environment, or "
            "run `codex login` once as the workers' user so that "
            f"auth.json exists in its CODEX_HOME (looked for {login})", "CODEX_API_KEY")

    def auth_hint(self, profile: dict) -> str:
        """What to set after an ``auth_failed`` attempt of a real model; '' for a scripted endpoint
        (its failure message already names the scripted key variable)."""
        if profile.get("scripted_endpoint"):
            return ""
        if gateways.uses_gateway(profile):
            return gateway_key_hint(profile)
        return ("Set CODEX_API_KEY (or OPENAI_API_KEY, which the adapter copies into CODEX_API_KEY) in the "
                "workers' environment, or run `codex login` as the "
                "workers' user (auth.json in its CODEX_HOME); a headless worker cannot log in by itself.")

    def run_attempt(self, request: AgentRequest) -> AgentResult:
        exe, missing = self.executable_or_result(request)
        if missing is not None:
            return missing
        version = cli_version(exe)
        home = request.home_dir
        # the worker's login (its CODEX_HOME), never the run's environment; none beside a gateway's key (CP_GATEWAYS)
        prepare_home(home, os.environ, with_login=not gateways.uses_gateway(request.profile))
        env = self.environment(request, home)
        for stale in (last_message_path(request), kept_message_path(request)):
            Path(stale).unlink(missing_ok=True)
        endpoint = self.start_endpoint(request, "/v1")
        try:
            upstream = endpoint.url + "/v1" if endpoint else str(request.profile.get("base_url") or PROVIDER_URL)
            gateway = self.open_gateway(request, env, endpoint, upstream, KEY_VARS, SCRIPTED_KEY_ENV)
            if endpoint is not None:
                argv = build_argv(exe, request, gateway.origin)
            else:
                argv = build_argv(exe, request, base_url=gateway.url if gateway else None)
            result = self.supervise(argv, env, request)
        finally:
            self.close_gateway()
            if endpoint is not None:
                endpoint.stop()
        return self.metered(self._result(result, request, version))  # reads the -o file before the engine removes HOME

    wrapper = staticmethod(sandboxed)

    def _result(self, result, request: AgentRequest, version: str) -> AgentResult:
        parsed = parse_events(request.raw_path, request.stderr_path)
        failure_kind, failure_message = classify_process(result)
        if failure_kind == "timeout" and parsed["turns_completed"] == 0 and parsed["reconnects"]:
            failure_message += (f" Codex never reached its model: {parsed['reconnects']} reconnect notices, the last "
                                f"\"{parsed['last_reconnect']}\".")
        elif failure_kind in (None, "crashed"):
            reported = parsed["failure"] or (parsed["errors"][-1] if parsed["errors"] and failure_kind else "")
            completed = failure_kind is None and parsed["turns_completed"] and not parsed["failure"]
            if parsed["auth_error"] and not completed:  # a stray auth text of a finished turn is no failure
                failure_kind = "auth_failed"
                failure_message = f"The agent could not authenticate: {reported or '; '.join(parsed['stderr_tail'])}"
            elif parsed["failure"]:
                failure_kind, failure_message = "crashed", f"The agent reported an error: {parsed['failure']}"
            elif failure_kind is None and not parsed["structured"] and parsed["plain_text"]:
                failure_kind = "malformed_result"
                failure_message = ("The agent exited 0 but printed text where its JSONL events were expected "
                                   "(structured: false); its text is kept as the final message.")
            elif failure_kind is None and parsed["turns_completed"] == 0:
                failure_kind = "malformed_result"
                failure_message = "The agent exited 0 but its output has no turn.completed event."
            elif failure_kind == "crashed" and (reported or parsed["stderr_tail"]):
                failure_message += f" Last output: {reported or ' | '.join(parsed['stderr_tail'])}"
        if failure_kind == "auth_failed" and self.auth_hint(request.profile):
            failure_message = f"{failure_message.rstrip().rstrip('.')}. {self.auth_hint(request.profile)}"
        final = self._final_message(request) or parsed["last_text"]
        if not final and not parsed["structured"]:
            final = parsed["plain_text"]  # what it printed instead of its events: kept as its answer
        refusals = refusals_of(session_record(request.home_dir, parsed["session_id"]))
        refusals += parsed["rejected"][:max(0, MAX_REFUSALS - len(refusals))]
        for refusal in refusals:  # the session record is not redacted: these go to the database
            refusal["command"], _ = redact_text(refusal["command"], request.secrets)
            refusal["message"], _ = redact_text(refusal["message"], request.secrets)
        # codex's JSON leaves out what its sandbox refused (a missing program it reports: exit 127), mostly:
        # one it did report (its own guess of a denial can say no, as under load) is in the conversation already
        shown = set(parsed["failed_outputs"])
        denials = [r for r in refusals if r["sandbox_denied"] and r.get("outcome") == "refused"
                   and r["message"].strip() not in shown]
        if denials:
            self._log_denials(request, denials)
        return AgentResult(
            exit_code=result.exit_code, signal=result.signal, elapsed_seconds=result.elapsed_seconds,
            failure_kind=failure_kind, failure_message=failure_message, usage=usage_of(parsed["usage"]),
            session_id=parsed["session_id"], final_message=final, cli_version=version,
            simulated=bool(request.profile.get("scripted_endpoint")), output_bytes=result.output_bytes,
            redactions=result.redactions, pid=result.pid, structured=parsed["structured"],
            extra={"turns_completed": parsed["turns_completed"], "commands": parsed["commands"],
                   "refusals": refusals, "reconnects": parsed["reconnects"], "network": self.network,
                   "truncated_lines": parsed["truncated_lines"]},
        )

    @staticmethod
    def _final_message(request: AgentRequest) -> str:
        """The ``-o`` file's text (first MiB), redacted; that redacted text is kept in the control
        folder (``kept_message_path``), the file itself goes with the attempt's HOME."""
        path = Path(last_message_path(request))
        try:  # never through a symlink, never a FIFO: the file lies in a folder the agent could write
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, encoding="utf-8", errors="replace") as fh:
                text = fh.read(1024 * 1024) if stat.S_ISREG(os.fstat(fd).st_mode) else ""
        except OSError:
            return ""
        redacted, _ = redact_text(text, request.secrets)
        path.unlink(missing_ok=True)
        try:
            kept = Path(kept_message_path(request))
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(redacted, encoding="utf-8")
        except OSError:
            pass  # the final message is in the result all the same
        return redacted.strip()

    @staticmethod
    def _log_denials(request: AgentRequest, denials: list[dict]) -> None:
        """Append the sandbox's refusals (which codex's JSONL leaves out) to the display log, redacted."""
        lines = [f"[run-engine] codex's sandbox refused {len(denials)} command(s) (from its session record: "
                 "codex exec --json leaves refused commands out):"]
        for denial in denials:
            output = " | ".join(line for line in denial["message"].splitlines() if line.strip())
            lines.append(f"[run-engine]   $ {denial['command']}  ->  {output}")
        text, _ = redact_text("\n".join(lines) + "\n", request.secrets)
        with open(request.log_path, "a", encoding="utf-8") as log:
            log.write(text)
        entries = []
        for denial in denials:
            entries.append({"kind": "tool_call", "tool": "shell", "text": f"Runs `{denial['command'][:300]}`"})
            said, code = transcript.first_lines(denial["message"], 1), denial.get("exit_code")
            entries.append({"kind": "refusal", "tool": "shell", "ok": False, "exit": code,
                            "text": "The sandbox refused it" + (f" (exit status {code})" if code is not None else "")
                                    + (f": {said}" if said else ""),
                            "detail": transcript.first_lines(denial["message"])})
        transcript.append(transcript.transcript_path(request.raw_path), entries, request.secrets)


#: The adapter class engine/agents/registry.py registers.
ADAPTER = CodexAdapter
