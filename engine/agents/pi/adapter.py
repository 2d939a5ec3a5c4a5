"""The Pi adapter: runs the real ``pi`` CLI (``@mariozechner/pi-coding-agent``) headless for one attempt.

Every fact below was checked on ``pi`` 0.73.1 (``pi --version`` prints ``0.73.1``), installed in
tools/agents, by reading its ``--help``, its docs (``docs/json.md``, ``models.md``, ``settings.md``,
``extensions.md`` in the package) and its ``dist/`` sources, and by running the binary against
engine/scripted_endpoint.py (tests/test_pi_adapter.py, tests/security/test_pi_project_files.py):

* argument array (the prompt is not in it: in print mode pi reads piped stdin, here the saved
  prompt file, as the first user message; ``dist/main.js`` ``readPipedStdin``)::

      pi --print --mode json --no-session --offline --no-extensions --no-skills
         --no-prompt-templates --no-themes --provider P --model M --tools LIST [profile extra_args]

* ``--mode json`` prints one JSON object a line on stdout (``docs/json.md``): first the session
  header ``{"type": "session", "version": 3, "id", "timestamp", "cwd"}``, then the agent's events:
  ``agent_start``; ``turn_start``; ``message_start`` / ``message_update`` (a streaming delta, with
  the whole partial message again: never parsed here) / ``message_end`` with ``message`` =
  ``{"role": "user"|"assistant"|"toolResult", "content": [...], ...}``; ``tool_execution_start
  {toolCallId, toolName, args}``, ``tool_execution_update`` (partial output, skipped),
  ``tool_execution_end {toolCallId, toolName, result: {content: [{type: text, text}]}, isError}``;
  ``turn_end {message, toolResults}``; ``agent_end {messages}`` (the last line of a finished run);
  and ``auto_retry_start {attempt, maxAttempts, delayMs, errorMessage}`` / ``auto_retry_end``,
  ``compaction_start`` / ``compaction_end``. An assistant message has ``content`` blocks
  ``{"type": "text", "text"}``, ``{"type": "thinking", "thinking"}`` and ``{"type": "toolCall", "id",
  "name", "arguments"}``, ``usage = {"input", "output", "cacheRead", "cacheWrite", "totalTokens",
  "cost": {"input", "output", "cacheRead", "cacheWrite", "total"}}`` (tokens; cost in USD from the
  model's price table, all 0 for a model without prices), ``stopReason`` (``stop``, ``toolUse``,
  ``length``, ``error``, ``aborted``) and, on an error, ``errorMessage`` (e.g. ``401 {"type":
  "error", "error": {"type": "authentication_error", ...}}``). pi-ai normalizes ``input`` to
  *exclude* the cached tokens for every provider (``openai-responses-shared.js``: ``input_tokens -
  cached_tokens``; Anthropic's ``input_tokens`` already does);
* exit status: 0 whenever the prompt was processed, **also when the model request failed** (json
  mode prints the error in the last assistant message and exits 0; ``dist/modes/print-mode.js``),
  so the adapter classifies from the last assistant message; 1 with ``No API key found for
  <provider>.`` on stderr when the provider has no key (nothing on stdout but the header); 143 on
  SIGTERM;
* tools (``pi --help``, "Built-in Tool Names"; input shapes from ``dist/core/tools/*.js``):
  ``read {path, offset?, limit?}``, ``bash {command, timeout?}``, ``edit {path, edits: [{oldText,
  newText}]}``, ``write {path, content}``, ``grep {pattern, path?, glob?, ignoreCase?, literal?,
  context?, limit?}``, ``find {pattern, path?, limit?}``, ``ls {path?, limit?}``. ``--tools`` is an
  allowlist that "applies to built-in, extension, and custom tools". grep and find need ``rg`` and
  ``fd``, which pi downloads when missing; offline they answer an error instead. A call of a tool
  not in the allowlist is answered ``Tool write not found`` with ``isError: true`` and the run goes
  on; a failed command is ``isError: true`` with ``Command exited with code N`` at the end. The
  tool calls of one assistant message run concurrently (every ``tool_execution_start`` before the
  first ``tool_execution_end``), so a scenario must not make one call of a turn depend on another;
* role boundary: reviewer ``--tools read,grep,find,ls`` (pi's own documented read-only mode: no
  bash, edit or write) plus its worktree mounted read-only by the engine's sandbox;
  implementer and documenter ``--tools read,bash,edit,write`` with the worktree writable, nothing
  else of the host. What an attempt changed is checked by manifest afterwards (documenter: only
  its documentation paths): the tool list is not trusted alone;
* configuration: ``PI_CODING_AGENT_DIR`` (default ``~/.pi/agent``) holds ``settings.json``,
  ``models.json``, ``auth.json`` (``/login`` credentials and API keys), ``extensions/``, ``skills/``,
  ``prompts/``, ``themes/``, ``AGENTS.md``, ``SYSTEM.md``, ``sessions/``. Each attempt gets a fresh
  HOME with ``HOME/.pi/agent`` written by the engine (``prepare_home``): our ``settings.json`` (no
  packages or resources, bounded retries) and ``models.json`` (the scripted provider, or the
  profile's ``base_url`` as the built-in provider's ``baseUrl``), and only the worker's
  ``auth.json`` when it holds a login for the profile's provider (removed when the attempt ends).
  Nothing else of the worker's ``~/.pi`` (its extensions, packages, models, settings) is read;
* the project folder: pi loads ``<cwd>/.pi/settings.json`` (deep-merged over the global one,
  unconditionally: ``dist/core/settings-manager.js``), ``.pi/extensions``, ``.pi/skills``,
  ``.pi/prompts``, ``.pi/themes``, ``.pi/SYSTEM.md`` (replaces the system prompt),
  ``.pi/APPEND_SYSTEM.md``, packages named in project settings (installed with ``npm`` or ``git``,
  or the settings' ``npmCommand``, unless offline), ``.agents/skills`` of the cwd and its parents,
  and ``AGENTS.md``/``CLAUDE.md`` of the cwd and its parents (context, like codex's AGENTS.md:
  kept). ``--no-extensions`` leaves only ``-e`` paths (none), ``--no-skills``,
  ``--no-prompt-templates`` and ``--no-themes`` the same for theirs, ``--offline`` (=
  ``PI_OFFLINE=1``) keeps pi from installing packages and from any startup network call (update
  check, telemetry, tool downloads); and the worktree's ``.pi`` folder is covered by an empty
  read-only folder in the sandbox (``sandboxed``), so no project setting (``shellPath``,
  ``shellCommandPrefix``, ``npmCommand``, ``packages``, ``extensions``, ``retry``...) nor system
  prompt of the repository reaches pi at all;
* API keys (``dist/env-api-keys.js`` of pi-ai): anthropic reads ``ANTHROPIC_OAUTH_TOKEN`` (first)
  or ``ANTHROPIC_API_KEY``, openai ``OPENAI_API_KEY``, google ``GEMINI_API_KEY``; a models.json
  provider's ``apiKey`` names an environment variable (or is a literal, or ``!command``);
* network: pi sets undici's ``EnvHttpProxyAgent`` as the global dispatcher (``dist/cli.js``), so
  ``HTTPS_PROXY``/``NO_PROXY`` (the attempt's egress proxy) apply to every model request; it sets
  no body or header timeout, so a model that never answers is ended by the engine's deadline only;
* ``--help`` (but not ``--version``) creates ``auth.json`` ({}) and ``sessions/`` in the agent dir:
  ``check`` runs it with a throwaway ``PI_CODING_AGENT_DIR``;
* pi has no turn limit option: the profile's ``max_turns`` is not applied, the deadline bounds
  the attempt. Retries: ``retry.maxRetries`` (agent level, on 429/5xx/network texts, 2 s, 4 s...
  backoff) from the profile's ``max_retries`` (default 2), provider SDK retries 0.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .. import gateways
from ...redaction import redact_text
from ..base import AgentRequest, AgentResult, PreflightProblem, classify_process, interactive_prompt
from ..cli_adapter import PROBE_SECONDS, CliAdapter, gateway_key_hint, cli_version, probe_output, sandboxed_view, WRITE_ROLES
from .stream import parse_stream, usage_of  # noqa: F401 - the tests take them from here
from .policy import CREDENTIALS, DEFAULT_PROVIDER, PROVIDERS, WRITE_TOOLS  # noqa: F401 - the tests take them from here

#: The tool allowlists (``--tools``): a reviewer's has no bash, edit or write (pi's documented
#: read-only mode); the writers get pi's default set, named, so that no extension tool joins it.
READ_ONLY_TOOLS = "read,grep,find,ls"
WRITER_TOOLS = "read,bash,edit,write"
#: Keys the model gateway takes from pi's environment (``base``: the provider's built-in base URL, which
#: the gateway forwards to). Not ANTHROPIC_OAUTH_TOKEN: pi picks its header style by the token's own
#: prefix, which a placeholder does not have; with only that token, pi's calls are not metered.
GATEWAY_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY")
#: The provider the adapter defines for the scripted endpoint (Anthropic Messages API, which
#: engine/scripted_endpoint.py speaks), its model and the variable holding its key.
SCRIPTED_PROVIDER = "cp-scripted"
SCRIPTED_MODEL = "pi-scripted"
SCRIPTED_KEY_ENV = "CP_SCRIPTED_KEY"
#: What each role's boundary needs from ``pi --help`` (0.73.1 lists them all).
REQUIRED_HELP = {
    "reviewer": {"--tools": "read-only (an allowlist of read, grep, find and ls: no bash, edit or write)",
                 "--no-extensions": "no extension of the repository or the worker adds a tool or runs code"},
    "implementer": {"--tools": "only pi's built-in tools (no extension or custom tool)",
                    "--no-extensions": "no extension of the repository or the worker adds a tool or runs code"},
    "documenter": {"--tools": "only pi's built-in tools (no extension or custom tool)",
                   "--no-extensions": "no extension of the repository or the worker adds a tool or runs code"},
}
#: Options every attempt passes (``pi --help`` of 0.73.1).
COMMON_HELP = ("--print", "--mode", "--no-session", "--offline", "--no-skills", "--no-prompt-templates",
               "--no-themes", "--provider", "--model")


def split_model(profile: dict, scripted: bool = False) -> tuple[str, str | None]:
    """``(provider, model id)`` of a profile: ``model: anthropic/claude-sonnet-4-5`` ->
    ``("anthropic", "claude-sonnet-4-5")``; no ``provider/`` prefix: DEFAULT_PROVIDER; no model:
    ``(provider, None)`` (pi's default model of the provider). A scripted attempt's provider is
    SCRIPTED_PROVIDER and its model the id part, or SCRIPTED_MODEL."""
    model = str(profile.get("model") or "").strip()
    provider, _, model_id = model.partition("/") if "/" in model else ("", "", model)
    if scripted:
        return SCRIPTED_PROVIDER, model_id or SCRIPTED_MODEL
    return provider or DEFAULT_PROVIDER, model_id or None


def tool_list(role: str) -> str:
    """The ``--tools`` allowlist of a role."""
    return WRITER_TOOLS if role in WRITE_ROLES else READ_ONLY_TOOLS


def build_argv(executable: str, request: AgentRequest, scripted: bool = False) -> list[str]:
    """The argument array of one attempt (the prompt comes on stdin; module docstring)."""
    provider, model = split_model(request.profile, scripted)
    argv = [executable, "--print", "--mode", "json", "--no-session", "--offline", "--no-extensions", "--no-skills",
            "--no-prompt-templates", "--no-themes", "--provider", provider]
    if model:
        argv += ["--model", model]
    argv += ["--tools", tool_list(request.role)]
    argv += list(request.profile.get("extra_args") or [])
    return argv


def agent_dir(home: str) -> Path:
    """The attempt's pi configuration folder (``PI_CODING_AGENT_DIR``): ``HOME/.pi/agent``."""
    return Path(home) / ".pi" / "agent"


def worker_agent_dir(environ) -> Path:
    """The worker's own pi folder: ``$PI_CODING_AGENT_DIR`` of ``environ``, else ``~/.pi/agent``."""
    return Path(environ.get("PI_CODING_AGENT_DIR") or os.path.join(os.path.expanduser("~"), ".pi", "agent"))


def login_for(path: Path, provider: str) -> bool:
    """Whether the pi ``auth.json`` at ``path`` holds a credential for ``provider`` (``{"anthropic":
    {"type": "oauth" | "api_key", ...}}``, written by ``/login``; pi writes ``{}`` on first start)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and isinstance(found.get(provider), dict) and bool(found[provider])


def settings_for(profile: dict) -> dict:
    """The attempt's ``settings.json``: no packages or resources, no telemetry, bounded retries."""
    return {"packages": [], "extensions": [], "skills": [], "prompts": [], "themes": [],
            "enableInstallTelemetry": False, "quietStartup": True, "enableSkillCommands": False,
            "retry": {"enabled": True, "maxRetries": int(profile.get("max_retries", 2)), "provider": {"maxRetries": 0}}}


def models_for(profile: dict, endpoint_url: str | None = None, base_url: str | None = None) -> dict:
    """The attempt's ``models.json``: the scripted provider at ``endpoint_url`` (Anthropic Messages
    API, key from SCRIPTED_KEY_ENV), else ``base_url`` (the attempt's model gateway) or the profile's
    ``base_url`` as its provider's ``baseUrl`` (pi's override of a built-in provider: its models and
    keys stay), else no provider."""
    if endpoint_url:
        _, model = split_model(profile, scripted=True)
        return {"providers": {SCRIPTED_PROVIDER: {
            "baseUrl": endpoint_url, "api": "anthropic-messages", "apiKey": SCRIPTED_KEY_ENV,
            "models": [{"id": model, "contextWindow": 200000, "maxTokens": 16384,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}]}}}
    if base_url or profile.get("base_url"):
        provider, _ = split_model(profile)
        return {"providers": {provider: {"baseUrl": str(base_url or profile["base_url"])}}}
    return {"providers": {}}


def prepare_home(home: str, profile: dict, endpoint_url: str | None = None, environ=None,
                 with_login: bool = True, base_url: str | None = None) -> Path:
    """A fresh HOME for the attempt with ``HOME/.pi/agent`` holding our settings.json and
    models.json and, for a real model and ``with_login``, the worker's ``auth.json`` (of
    ``worker_agent_dir(environ)``, default this process's environment) when it has a login for the
    profile's provider; and ``HOME/tmp`` (the attempt's TMPDIR). Returns the agent folder."""
    home_path = Path(home)
    if home_path.exists():
        shutil.rmtree(home_path)
    folder = agent_dir(home)
    folder.mkdir(parents=True)
    (home_path / "tmp").mkdir()
    (folder / "settings.json").write_text(json.dumps(settings_for(profile), indent=2), encoding="utf-8")
    (folder / "models.json").write_text(json.dumps(models_for(profile, endpoint_url, base_url), indent=2),
                                        encoding="utf-8")
    if endpoint_url is None and with_login:
        login = worker_agent_dir(os.environ if environ is None else environ) / "auth.json"
        if login_for(login, split_model(profile)[0]):
            shutil.copy2(login, folder / "auth.json")
            os.chmod(folder / "auth.json", 0o600)
    return folder


def project_config_mask(workspace: str) -> list[str]:
    """bubblewrap arguments covering the worktree's ``.pi`` folder with an empty read-only tmpfs,
    so no project setting, extension or system prompt of the repository reaches pi. A ``.pi`` that
    is a symbolic link is covered where it leads when that is inside the worktree (``PiAdapter.run``
    launches no attempt beside such a link); nothing when there is no ``.pi`` folder (a mount point cannot be
    made in a read-only worktree, and pi then has nothing to read)."""
    top = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(workspace, ".pi"))
    if not os.path.isdir(target) or not (target == top or target.startswith(top + os.sep)) or target == top:
        return []
    return ["--tmpfs", target, "--remount-ro", target]


def sandboxed(argv: list[str], env: dict, request: AgentRequest, network=None) -> list[str]:
    """``argv`` inside the bubblewrap sandbox of the attempt: the view every agent CLI gets
    (engine/agents/cli_adapter.py ``sandboxed_view``; the attempt's HOME holds the pi folder), with the
    worktree's ``.pi`` folder covered (``project_config_mask``)."""
    wrapped = sandboxed_view(argv, env, request, network)
    mask = project_config_mask(request.workspace)
    if mask:  # after every bind of wrap(), before the root is made read-only and the command starts
        end = wrapped.index("--")
        at = end - 2 if wrapped[end - 2:end] == ["--remount-ro", "/"] else end
        wrapped[at:at] = mask
    return wrapped


_probed: dict[tuple, tuple[str, str]] = {}


def probe(executable: str, timeout: float = PROBE_SECONDS) -> tuple[str, str]:
    """``(version, help text)`` of a pi executable, as cli_adapter.probe (in the sandbox, with a
    throwaway HOME), with ``PI_CODING_AGENT_DIR`` inside that HOME (``pi --help`` 0.73.1 writes
    auth.json and sessions/ there) and ``PI_OFFLINE``."""
    try:
        key = (os.path.realpath(executable), os.stat(executable).st_mtime_ns)
    except OSError:
        return "", ""
    if key not in _probed:
        env = {"PI_OFFLINE": "1", "PI_CODING_AGENT_DIR": "{home}/agent"}
        _probed[key] = (cli_version(executable, timeout), probe_output(executable, ("--help",), timeout, env))
    return _probed[key]


class PiAdapter(CliAdapter):
    """The real ``pi`` CLI (Pi coding agent), headless, ``--mode json`` output."""

    name = "pi"
    simulated = False
    executable_name = "pi"
    transcript_format = "pi"

    help_command = "pi --help"
    common_help = COMMON_HELP
    sandbox_boundary = "stops its bash tool from writing outside the worktree"

    def required_help(self, role: str) -> dict[str, str]:
        return REQUIRED_HELP.get(role, REQUIRED_HELP["reviewer"])

    wrapper = staticmethod(sandboxed)

    def check(self, profile: dict, role: str) -> list[str]:
        """As ``CliAdapter.check`` (binary, ``--version``, the help words of the role's boundary, the
        sandbox), with pi's help read in a throwaway folder (``probe``), and the profile's provider
        one this adapter runs (PROVIDERS; its key would not reach the attempt otherwise)."""
        exe, missing = self.executable_problem(profile)
        if exe is None:
            return [missing]
        version, helptext = probe(exe)
        if not version:
            return [f"{exe} --version does not answer"]
        problems = [f"{word} is not in `{self.help_command}`, so it cannot enforce: {boundary}"
                    for word, boundary in self.required_help(role).items() if word not in helptext]
        problems += [f"{word} is not in `{self.help_command}`" for word in self.common_help if word not in helptext]
        provider, _ = split_model(profile)
        if not profile.get("scripted_endpoint") and provider not in PROVIDERS:
            problems.append(f"the pi provider '{provider}' (the prefix of the profile's model) is not one this adapter "
                            f"runs: {', '.join(sorted(PROVIDERS))} (write the model as provider/model-id)")
        ok, why = self.sandbox_available()
        if not ok:
            problems.append(f"no operating-system sandbox, so nothing {self.sandbox_boundary}: {why}")
        return problems

    def environment(self, request: AgentRequest, home: str) -> dict:
        """The attempt's environment: the run's, then the profile's ``env``, then what the engine
        owns: HOME and PI_CODING_AGENT_DIR (the attempt's), PI_OFFLINE=1, PI_SKIP_VERSION_CHECK=1,
        PI_TELEMETRY=0 and TMPDIR in the attempt's HOME (pi's bash keeps long outputs there
        unredacted; removed with the HOME); no PI_PACKAGE_DIR or PI_CODING_AGENT_SESSION_DIR.

        Credentials: only the variables of the profile's provider (PROVIDERS) stay; a gateway's key
        (``api_key_env``, which engine/boundary.py puts under ``KEY_TARGETS["pi"]``,
        ANTHROPIC_API_KEY) is moved to the variable the provider reads (OPENAI_API_KEY for openai...)."""
        from ... import boundary  # noqa: PLC0415 - engine/boundary.py imports this package

        env = dict(request.env)
        provider, _ = split_model(request.profile)
        wanted = PROVIDERS.get(provider, {}).get("keys", ())
        target = boundary.KEY_TARGETS.get(self.name)
        if gateways.uses_gateway(request.profile) and target and wanted and target not in wanted and env.get(target):
            env[wanted[0]] = env.pop(target)
        for name in credential_env_names():
            if name not in wanted:
                env.pop(name, None)
        env.update({k: str(v) for k, v in (request.profile.get("env") or {}).items()})
        for name in ("PI_PACKAGE_DIR", "PI_CODING_AGENT_SESSION_DIR"):
            env.pop(name, None)
        env.update({"HOME": home, "PI_CODING_AGENT_DIR": str(agent_dir(home)), "PI_OFFLINE": "1",
                    "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0", "TMPDIR": os.path.join(home, "tmp")})
        return env

    def credential_problem(self, profile: dict, environ) -> PreflightProblem | None:
        """``credentials_missing`` unless the attempt would get a key of the profile's provider (its
        PROVIDERS variables in ``environ`` or the profile's ``env``) or the worker's pi ``auth.json``
        (``worker_agent_dir`` of ``environ``) holds a login for it. None when there is one."""
        provider, _ = split_model(profile)
        names = PROVIDERS.get(provider, {}).get("keys", ())
        found = self.worker_credentials(profile, environ)
        if any((found.get(name) or "").strip() for name in names):
            return None
        login = worker_agent_dir(environ) / "auth.json"
        if login_for(login, provider):
            return None
        wanted = " or ".join(names) if names else f"a key for the pi provider '{provider}'"
        return PreflightProblem(
            "credentials_missing", f"no credentials for the pi CLI's provider '{provider}' on the workers: set "
            f"{wanted} in the workers' environment, or log in once as the workers' user (run `pi`, then /login) so "
            f"that its auth.json holds a '{provider}' entry (looked for {login})", names[0] if names else provider)

    def auth_hint(self, profile: dict) -> str:
        """What to set after an ``auth_failed`` attempt of a real model; '' for a scripted endpoint."""
        if profile.get("scripted_endpoint"):
            return ""
        if gateways.uses_gateway(profile):
            return gateway_key_hint(profile)
        provider, _ = split_model(profile)
        names = PROVIDERS.get(provider, {}).get("keys", ())
        wanted = " or ".join(names) if names else f"the key of the pi provider '{provider}'"
        return (f"Set {wanted} in the workers' environment, or log in as the workers' user (`pi`, then /login: "
                f"~/.pi/agent/auth.json); a headless worker cannot log in by itself.")

    def run_attempt(self, request: AgentRequest) -> AgentResult:
        exe, missing = self.executable_or_result(request)
        if missing is not None:
            return missing
        linked = os.path.join(request.workspace, ".pi")
        if os.path.islink(linked):
            # pi would read the repository's project settings through it, and covering where it leads
            # would hide that folder (docs/, say) from the attempt: it is not launched at all
            message = (f"The agent was not launched: the worktree's .pi is a symbolic link (to "
                       f"{os.readlink(linked)!r}), through which pi 0.73.1 would read project settings, "
                       "extensions and a system prompt of the repository's. Remove the link from the branch.")
            return self.not_launched(request, "boundary_not_enforced", message)
        version = cli_version(exe)
        home = request.home_dir
        endpoint = self.start_endpoint(request)
        try:
            env = self.environment(request, home)
            provider, _ = split_model(request.profile)
            upstream = endpoint.url if endpoint else str(request.profile.get("base_url")
                                                         or PROVIDERS.get(provider, {}).get("base") or "")
            gateway = None
            if endpoint is not None or upstream:
                gateway = self.open_gateway(request, env, endpoint, upstream, GATEWAY_KEYS, SCRIPTED_KEY_ENV)
            if gateway is not None:  # the placeholder is the attempt's one credential variable
                for info in PROVIDERS.values():
                    for key in info["keys"]:
                        if env.get(key) != gateway.placeholder:
                            env.pop(key, None)
            # a scripted endpoint, a gateway's key (CP_GATEWAYS) or a key the model gateway holds is the
            # attempt's only credential: no login copy
            prepare_home(home, request.profile, gateway.url if endpoint is not None else None,
                         with_login=not (gateways.uses_gateway(request.profile) or gateway is not None),
                         base_url=gateway.url if gateway is not None and endpoint is None else None)
            argv = build_argv(exe, request, scripted=endpoint is not None)
            result = self.supervise(argv, env, request)
        finally:
            self.close_gateway()
            if endpoint is not None:
                endpoint.stop()
            (agent_dir(home) / "auth.json").unlink(missing_ok=True)  # the login copy leaves with the attempt
        return self.metered(self._result(result, request, version))

    def _result(self, result, request: AgentRequest, version: str) -> AgentResult:
        parsed = parse_stream(request.raw_path, request.stderr_path)
        failure_kind, failure_message = classify_process(result)
        if failure_kind in (None, "crashed"):
            reported = parsed["error"] or " | ".join(parsed["stderr_tail"])
            completed = failure_kind is None and parsed["ended"] and not parsed["error"]
            if parsed["auth_error"] and not completed:  # a stray "Unauthorized" of a finished run is no failure
                failure_kind, failure_message = "auth_failed", f"The agent could not authenticate: {reported}"
            elif parsed["error"]:
                failure_kind, failure_message = "crashed", f"The agent reported an error: {parsed['error']}"
            elif failure_kind is None and not parsed["structured"] and parsed["plain_text"]:
                failure_kind = "malformed_result"
                failure_message = ("The agent exited 0 but printed text where its JSON events were expected "
                                   "(structured: false); its text is kept as the final message.")
            elif failure_kind is None and not parsed["ended"]:
                failure_kind = "malformed_result"
                failure_message = "The agent exited 0 but its output has no agent_end event."
            elif failure_kind == "crashed":
                if parsed["stderr_tail"]:
                    failure_message += f" Last output: {' | '.join(parsed['stderr_tail'])}"
                elif not parsed["ended"]:
                    failure_kind, failure_message = interactive_prompt(request.log_path, failure_kind,
                                                                       failure_message)
        if failure_kind == "auth_failed" and self.auth_hint(request.profile):
            failure_message = f"{failure_message.rstrip().rstrip('.')}. {self.auth_hint(request.profile)}"
        refusals = parsed["refusals"]
        for refusal in refusals:  # the messages are of the redacted raw log; redacted again whole
            for key in ("message", "command", "path"):
                if key in refusal:
                    refusal[key], _ = redact_text(refusal[key], request.secrets)
        final, _ = redact_text(parsed["last_text"] or ("" if parsed["structured"] else parsed["plain_text"]),
                               request.secrets)
        return AgentResult(
            exit_code=result.exit_code, signal=result.signal, elapsed_seconds=result.elapsed_seconds,
            failure_kind=failure_kind, failure_message=failure_message, usage=usage_of(parsed["usage"]),
            session_id=parsed["session_id"], final_message=final, cli_version=version,
            simulated=bool(request.profile.get("scripted_endpoint")), output_bytes=result.output_bytes,
            redactions=result.redactions, pid=result.pid, structured=parsed["structured"],
            extra={"turns": parsed["turns"], "tool_calls": parsed["tool_calls"], "refusals": refusals,
                   "retries": parsed["retries"], "network": self.network,
                   "truncated_lines": parsed["truncated_lines"]},
        )


def credential_env_names() -> tuple[str, ...]:
    """Every credential variable of PROVIDERS, most usual first (engine/agents/pi/policy.py CREDENTIALS)."""
    return tuple(CREDENTIALS)


__all__ = ["PiAdapter", "build_argv", "parse_stream", "usage_of", "split_model"]


#: The adapter class engine/agents/registry.py registers.
ADAPTER = PiAdapter
