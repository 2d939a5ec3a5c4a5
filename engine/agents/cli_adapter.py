"""What the adapters of real agent CLIs share (engine/agents/claude.py, engine/agents/codex.py).

* ``find_executable``: the profile's ``executable``, else the project's pinned install in
  tools/agents (``TOOLS_BIN``), else the name on PATH;
* ``cli_version`` and ``probe``: ``--version``'s first line and the help text, the latter cached
  by path, modification time and help arguments;
* ``endpoint_turns``: the scripted model endpoint's scenario of one attempt (simulated runs);
* ``CliAdapter``: the ``Adapter`` base of a real CLI: ``check`` (the binary, its version, the
  help words each role's boundary needs, the operating-system sandbox), ``version`` and
  ``supervise`` (the attempt in the subclass's sandbox, ``wrapper``, with the prompt on stdin),
  and ``preflight`` (at run creation: the CLI's credential, ``gateway_problems``).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Callable

from . import sandbox
from .base import Adapter, AgentRequest, AgentResult, PreflightProblem, empty_usage
from .netproxy import EgressProxy, split_host_port
from .network import GATEWAY_ENV, network_allow, url_entry

BASE_DIR = Path(__file__).resolve().parent.parent.parent
TOOLS_BIN = BASE_DIR / "tools" / "agents" / "node_modules" / ".bin"

var_dir = sandbox.var_dir


def find_executable(name: str, configured: str | None = None) -> str | None:
    """The CLI to run: the profile's ``executable`` (a path or a name on PATH), else the
    project's pinned install in tools/agents, else ``name`` on PATH; None when none exists."""
    if configured:
        if os.sep in configured:
            return configured if os.access(configured, os.X_OK) else None
        return shutil.which(configured)
    pinned = TOOLS_BIN / name
    if os.access(pinned, os.X_OK):
        return str(pinned)
    return shutil.which(name)


def cli_version(executable: str, timeout: float = 30.0) -> str:
    """``<executable> --version``'s first line, or '' when it does not answer."""
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0][:200] if text else ""


_checked: dict[tuple, tuple[str, str]] = {}


def probe(executable: str, timeout: float = 30.0, help_args: tuple[str, ...] = ("--help",)) -> tuple[str, str]:
    """``(version, help text)`` of an executable (``--version``'s first line, the output of
    ``help_args``), cached by path, modification time and help arguments; ``("", "")`` when the
    file cannot be read."""
    try:
        key = (os.path.realpath(executable), os.stat(executable).st_mtime_ns, help_args)
    except OSError:
        return "", ""
    if key not in _checked:
        helptext = ""
        try:
            out = subprocess.run([executable, *help_args], capture_output=True, text=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
            helptext = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired):
            pass
        _checked[key] = (cli_version(executable, timeout), helptext)
    return _checked[key]


def endpoint_turns(spec: dict | None, stage_key: str, operation: str):
    """The scripted endpoint's scenario for one attempt, or None (a real model)."""
    if not spec:
        return None
    stage = ((spec.get("stages") or {}).get(stage_key) or {}).get(operation)
    if stage is None:
        stage = spec.get("default")
    return stage if stage is not None else []  # nothing scripted: the endpoint says so and ends


class CliAdapter(Adapter):
    """What the adapters of real CLIs share: the executable (``executable_name``) and its version."""

    executable_name = ""
    #: How the help text is asked for, as named in messages (e.g. ``claude --help``), and its arguments.
    help_command = ""
    help_args: tuple[str, ...] = ("--help",)
    #: Words of the help text that must be there for every role.
    common_help: tuple[str, ...] = ()
    #: What the sandbox problem keeps from being enforced, for the message.
    sandbox_boundary = ""

    def required_help(self, role: str) -> dict[str, str]:
        """``{word of the help text: the boundary it enforces}`` that ``role`` needs."""
        return {}

    def sandbox_available(self) -> tuple[bool, str]:
        """``(True, path)`` when this CLI's operating-system sandbox can be made here."""
        return sandbox.available()

    def check(self, profile: dict, role: str) -> list[str]:
        """Problems that keep ``profile`` from playing ``role`` (empty when it can): the binary is
        missing, ``--version`` does not answer, a word the role's boundary needs is not in the
        help text (the boundary is named), or the operating-system sandbox cannot be made."""
        exe = find_executable(self.executable_name, profile.get("executable"))
        if exe is None:
            return [f"the {self.executable_name} executable was not found (profile executable: "
                    f"{profile.get('executable') or 'not set'}; run `make agents`)"]
        version, helptext = probe(exe, help_args=self.help_args)
        if not version:
            return [f"{exe} --version does not answer"]
        problems = [f"{word} is not in `{self.help_command}`, so it cannot enforce: {boundary}"
                    for word, boundary in self.required_help(role).items() if word not in helptext]
        problems += [f"{word} is not in `{self.help_command}`" for word in self.common_help if word not in helptext]
        ok, why = self.sandbox_available()
        if not ok:
            problems.append(f"no operating-system sandbox, so nothing {self.sandbox_boundary}: {why}")
        return problems

    def version(self, profile: dict) -> str:
        exe = find_executable(self.executable_name, profile.get("executable"))
        return cli_version(exe) if exe else ""

    def not_launched(self, request: AgentRequest, kind: str, message: str) -> AgentResult:
        """The result of an attempt that was not launched (``kind``: ``missing_executable``,
        ``boundary_not_enforced``), ``message`` noted on its own line of the attempt's log; usage unknown."""
        with open(request.log_path, "a", encoding="utf-8") as log:
            log.write(f"[run-engine] {message}\n")
        return AgentResult(exit_code=None, signal=None, elapsed_seconds=0.0, failure_kind=kind,
                           failure_message=message, usage=empty_usage())

    def start_endpoint(self, request: AgentRequest, path: str = ""):
        """The scripted model endpoint of a simulated attempt, started (engine/scripted_endpoint.py),
        with the SIMULATED line in the attempt's log (``path``: what the CLI's base URL adds to the
        endpoint's, e.g. codex's ``/v1``); None for a real model (no ``scripted_endpoint`` here)."""
        from ..scripted_endpoint import ScriptedEndpoint  # noqa: PLC0415 - only simulated attempts need it

        scenario = endpoint_turns(request.profile.get("scripted_endpoint"), request.stage_key, request.operation)
        if scenario is None:
            return None
        endpoint = ScriptedEndpoint(scenario, cwd=request.workspace).start()
        with open(request.log_path, "a", encoding="utf-8") as log:
            log.write(f"[run-engine] SIMULATED: the real {self.executable_name} talks to a scripted model endpoint "
                      f"at {endpoint.url}{path}\n")
        return endpoint

    def executable_or_result(self, request: AgentRequest) -> tuple[str | None, AgentResult | None]:
        """``(path of the CLI, None)``, or ``(None, a missing_executable result)`` when the profile's
        ``executable``, the pinned install and PATH have none (``find_executable``)."""
        exe = find_executable(self.executable_name, request.profile.get("executable"))
        if exe is not None:
            return exe, None
        return None, self.not_launched(request, "missing_executable", (
            f"The {self.executable_name} executable was not found (profile executable: "
            f"{request.profile.get('executable') or 'not set'}; looked in {TOOLS_BIN} and on PATH)."))

    #: The adapter's sandbox builder, ``(argv, env, request, network) -> argv``: each subclass sets
    #: its own (engine/agents/claude.py and engine/agents/codex.py ``sandboxed``).
    wrapper: Callable[..., list[str]]

    def supervise(self, argv: list[str], env: dict, request: AgentRequest, endpoint_url: str | None = None):
        """Run ``argv`` for the attempt in its sandbox with its egress proxy (``Adapter.sandboxed_run``),
        the prompt file on stdin; ``endpoint_url``: the scripted endpoint of a simulated attempt."""
        return self.sandboxed_run(argv, env, request, self.wrapper, endpoint_url, stdin_path=request.prompt_path)

    # ------------------------------------------------------------------ pre-flight (at run creation)

    def credential_names(self) -> tuple[str, ...]:
        """The credential variables the engine passes to this CLI's agents (engine/boundary.py
        ``CREDENTIALS``, through ``credential_env``), most usual first."""
        from .. import boundary  # noqa: PLC0415 - engine/boundary.py imports this package

        return tuple(boundary.CREDENTIALS.get(self.name, ()))

    def worker_credentials(self, profile: dict, environ) -> dict[str, str]:
        """The credential variables an attempt of ``profile`` would get: those of ``environ`` that
        engine/boundary.py ``credential_env`` lets through, then the profile's ``env`` (which
        engine/pipeline_format.py keeps free of credentials: in practice, the environment's)."""
        from .. import boundary  # noqa: PLC0415 - engine/boundary.py imports this package

        found = boundary.credential_env(self.name, environ, profile)
        found.update({k: str(v) for k, v in (profile.get("env") or {}).items() if k in self.credential_names()})
        return found

    def credential_problem(self, profile: dict, environ) -> PreflightProblem | None:
        """A ``credentials_missing`` problem when neither a credential variable nor a login file
        is there for the CLI; None when one is (subclasses: engine/agents/claude.py, codex.py)."""
        return None

    def preflight(self, profile: dict, environ: dict | None = None, deny=None) -> list[PreflightProblem]:
        """What ``profile`` lacks to run unattended: its CLI's credential (``credential_problem``)
        and its gateway (``gateway_problems``). A profile with ``scripted_endpoint`` needs neither
        (the adapter starts the endpoint and gives the CLI its key); one with ``api_key_env`` needs
        that variable set (engine/boundary.py ``credential_env``) instead of the CLI's own.

        It runs in the process that creates the run (the Control Panel, the API or a command),
        with that process's environment and HOME (``environ``, default ``os.environ``): a
        worker started with another environment or as another user is not what was checked, so
        the workers and the Control Panel must share one (README.md, "Processes"). ``deny``:
        ``(address, port)`` pairs the egress proxy never reaches (default: engine/boundary.py
        ``service_addresses``). Returns a list of ``PreflightProblem`` (empty: nothing lacking)."""
        if profile.get("scripted_endpoint"):
            return []
        environ = os.environ if environ is None else environ
        problems = []
        key_env = profile.get("api_key_env")
        if key_env:  # a gateway's key: the named variable is the only credential the attempt gets
            from .. import boundary  # noqa: PLC0415 - engine/boundary.py imports this package

            if key_env not in boundary.gateway_keys(environ):
                missing = PreflightProblem(
                    "credentials_missing", f"the profile's api_key_env names {key_env}, which the workers' "
                    f"{boundary.GATEWAY_KEYS_ENV} does not list: the operator lists there (comma-separated) the "
                    f"variables that hold gateway keys, e.g. {boundary.GATEWAY_KEYS_ENV}={key_env}", key_env)
            else:
                missing = None if (environ.get(key_env) or "").strip() else PreflightProblem(
                    "credentials_missing", f"the profile's api_key_env names {key_env}, which is not set in the "
                    f"workers' environment: set {key_env} to the gateway's key there (and here, where the run is "
                    "created)", key_env)
        else:
            missing = self.credential_problem(profile, environ)
        if missing is not None:
            problems.append(missing)
        if deny is None:
            from .. import boundary  # noqa: PLC0415 - engine/boundary.py imports this package

            deny = boundary.service_addresses()
        return problems + gateway_problems(profile, deny)


def gateway_key_hint(profile: dict) -> str:
    """The sentence an ``auth_failed`` message of a gateway profile ends with (``api_key_env``):
    the gateway refused the key of the variable it names, not the CLI's usual credential."""
    return (f"The gateway ({profile.get('base_url') or 'the profile base_url'}) refused the key of "
            f"{profile['api_key_env']} (the profile's api_key_env): set {profile['api_key_env']} to a key the gateway "
            f"accepts in the workers' environment (listed in CP_GATEWAY_KEYS).")


def login_present(path: Path) -> bool:
    """Whether ``path`` is a CLI's login file that holds something: a JSON object with at least one
    key (an empty file or ``{}``, which a half-finished login leaves, is no credential)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and bool(found)


#: Seconds a gateway's host:port has to answer a TCP connect in the pre-flight check.
GATEWAY_CONNECT_SECONDS = 3.0


def gateway_urls(profile: dict) -> list[str]:
    """The gateway URLs of a profile: its ``base_url``, then the GATEWAY_ENV variables of its
    ``env`` (``ANTHROPIC_BASE_URL``, ``OPENAI_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL``: engine/agents/network.py), without duplicates."""
    urls = [profile.get("base_url")] + [(profile.get("env") or {}).get(name) for name in GATEWAY_ENV]
    return list(dict.fromkeys(str(url) for url in urls if url))


def gateway_problems(profile: dict, deny=(), timeout: float = GATEWAY_CONNECT_SECONDS) -> list[PreflightProblem]:
    """For each gateway of ``profile`` (``gateway_urls``): ``gateway_not_allowed`` when the
    attempt's egress proxy would refuse its host:port (``EgressProxy.check`` on the attempt's own
    allow-list, ``network_allow``, with ``deny``: the Control Panel's services), else
    ``gateway_unreachable`` when a TCP connect to the address the proxy would use does not
    succeed within ``timeout`` seconds. The proxy connects from the worker's host, as this check
    does from the process that creates the run. Messages name host:port only (a URL's
    user:password never reaches them)."""
    urls = gateway_urls(profile)
    if not urls:
        return []
    proxy = EgressProxy(allow=network_allow(profile), deny={(str(a), int(p)) for a, p in deny})
    problems = []
    for url in urls:
        entry = url_entry(url)
        if entry is None:
            problems.append(PreflightProblem("gateway_unreachable", "a gateway URL of the profile (base_url, "
                                             "ANTHROPIC_BASE_URL, OPENAI_BASE_URL or GOOGLE_GEMINI_BASE_URL) names no host", "base_url"))
            continue
        host, port = split_host_port(entry)
        ok, why, address = proxy.check(host, port)
        if not ok:
            problems.append(PreflightProblem("gateway_not_allowed", f"the attempt's egress proxy would refuse its "
                                             f"gateway {entry}: {why}", entry))
            continue
        try:
            socket.create_connection((address, port), timeout=timeout).close()
        except OSError as exc:
            problems.append(PreflightProblem(
                "gateway_unreachable", f"its gateway {entry} ({address}) did not answer a TCP connect within "
                f"{timeout:g} s ({exc.strerror or exc.__class__.__name__}): start it, or correct the profile's "
                f"base_url (or the *_BASE_URL of its env)", entry))
    return problems
