"""What the adapters of real agent CLIs share (engine/agents/<cli>/adapter.py).

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

import dataclasses
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from .. import model_gateway
from ..redaction import redact_text
from . import executables, gateways, sandbox
from .base import Adapter, AgentRequest, AgentResult, PreflightProblem, empty_usage
from .netproxy import EgressProxy, split_host_port
from .network import GATEWAY_ENV, network_allow, url_entry

BASE_DIR = Path(__file__).resolve().parent.parent.parent
TOOLS_BIN = executables.TOOLS_BIN

var_dir = sandbox.var_dir
#: Seconds a CLI's ``--version`` or ``--help`` may take: about a second on a quiet machine, but a node CLI
#: took more than 30 on a CI machine running three test suites at once, and a probe that does not answer
#: makes the CLI look missing (its check refuses the profile).
PROBE_SECONDS = 90.0
#: Roles whose attempts may write in the worktree; every other role (the reviewer) runs read-only.
WRITE_ROLES = ("implementer", "documenter")


def sandboxed_view(argv: list[str], env: dict, request: AgentRequest, network=None, **extra) -> list[str]:
    """``argv`` inside the bubblewrap sandbox of an agent CLI's attempt (engine/agents/sandbox.py), the
    same view for every CLI: the attempt's HOME, TMPDIR and data folder read-write; its worktree
    read-write for a role of WRITE_ROLES and read-only for the others (its ``.git`` file read-only
    either way); read-only the original repository's git metadata, the CLI (``argv[0]``), tools/agents
    (node and the bundles), the Python install and the PATH folders of ``env``; hidden what encloses
    them (the var directory, the worker's HOME, the project's .env); nothing else of the host.
    ``network``: the attempt's ``sandbox.NetworkPolicy`` (None: no network at all). ``extra``: what one
    CLI adds (engine/agents/<cli>/adapter.py ``sandboxed``), passed to ``sandbox.wrap``."""
    writable = [request.home_dir, env.get("TMPDIR", ""), env.get("CP_DATA_DIR", "")]
    visible = sandbox.git_dirs(request.workspace)
    if request.role in WRITE_ROLES:
        writable.append(request.workspace)
    else:
        visible.append(request.workspace)
    visible += sandbox.tool_paths(env.get("PATH"), (argv[0],)) + [str(TOOLS_BIN.parent.parent)]
    return sandbox.wrap(argv, writable=[folder for folder in writable if folder],
                        read_only=[os.path.join(request.workspace, ".git")],
                        hide=sandbox.private_paths(var_dir()), visible=visible, network=network,
                        binds=request.binds, **extra)


def find_executable(name: str, configured: str | None = None) -> str | None:
    """The CLI to run: the profile's ``executable`` if the operator listed it, else the project's
    pinned install in tools/agents, else ``name`` on PATH if listed (engine/agents/executables.py
    ``resolve``); None when none may run or exists."""
    return executables.resolve(name, configured)


def probe_output(executable: str, args: tuple[str, ...], timeout: float = PROBE_SECONDS,
                 env: dict | None = None) -> str:
    """What ``executable args`` prints (stdout, then stderr), run inside the sandbox: no network, a
    throwaway HOME and TMPDIR (its only writable folder), the worker's var directory and HOME
    hidden, an allow-listed environment (PATH, LANG, and ``env``, where ``{home}`` in a value is that
    HOME). '' when it cannot run (no
    sandbox here, the file is gone, it timed out). A CLI is never probed outside the sandbox."""
    if not sandbox.available()[0]:
        return ""
    with tempfile.TemporaryDirectory(prefix="cp-probe-") as scratch:
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": scratch,
                       "TMPDIR": scratch, **{k: v.replace("{home}", scratch) for k, v in (env or {}).items()}}
        try:
            argv = sandbox.wrap([executable, *args], writable=[scratch],
                                visible=sandbox.tool_paths(environment["PATH"], (executable,)) + [str(TOOLS_BIN.parent.parent)],
                                hide=sandbox.private_paths(var_dir()))
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                 env=environment, cwd=scratch)
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            return ""
        return out.stdout + out.stderr


_versions: dict[tuple, str] = {}


def cli_version(executable: str, timeout: float = PROBE_SECONDS) -> str:
    """``<executable> --version``'s first line (run in the sandbox, ``probe_output``), or '' when it
    does not answer. A version is a fact of the file: once read, it is kept by path, inode, size and
    modification time, so that an attempt does not start the CLI once more only to ask it (a probe
    that timed out on a loaded machine is tried again next time)."""
    try:
        found = os.stat(executable)
        key = (os.path.realpath(executable), found.st_ino, found.st_size, found.st_mtime_ns)
    except (OSError, TypeError, ValueError):
        key = None
    if key is not None and key in _versions:
        return _versions[key]
    text = probe_output(executable, ("--version",), timeout).strip()
    version = text.splitlines()[0][:200] if text else ""
    if version and key is not None:
        _versions[key] = version
    return version


_checked: dict[tuple, tuple[str, str]] = {}


def probe(executable: str, timeout: float = PROBE_SECONDS,
          help_args: tuple[str, ...] = ("--help",)) -> tuple[str, str]:
    """``(version, help text)`` of an executable (``--version``'s first line, the output of
    ``help_args``, both run in the sandbox), cached by path, modification time and help arguments;
    ``("", "")`` when the file cannot be read. A probe that got no answer (it timed out on a loaded
    machine) is not kept: the next check asks again (CI once saw every later check of one process
    refuse one CLI because one run of its help command had timed out)."""
    try:
        key = (os.path.realpath(executable), os.stat(executable).st_mtime_ns, help_args)
    except OSError:
        return "", ""
    if key in _checked:
        return _checked[key]
    answer = (cli_version(executable, timeout), probe_output(executable, help_args, timeout))
    if all(answer):
        _checked[key] = answer
    return answer


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
    #: How the help text is asked for, as named in messages (e.g. ``<cli> --help``), and its arguments.
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
        exe, missing = self.executable_problem(profile)
        if exe is None:
            return [missing]
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

    def executable_problem(self, profile: dict) -> tuple[str | None, str]:
        """``(path, "")`` of the CLI the profile runs, or ``(None, why not)``: its ``executable`` is
        not one the operator listed (engine/agents/executables.py), or none was found."""
        refused = executables.refusal(profile.get("executable"))
        if refused:
            return None, f"executable {refused}"
        exe = find_executable(self.executable_name, profile.get("executable"))
        if exe is None:
            return None, (f"the {self.executable_name} executable was not found (profile executable: "
                          f"{profile.get('executable') or 'not set'}; run `make agents`)")
        return exe, ""

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
        endpoint's, e.g. ``/v1`` for one of the CLIs); None for a real model (no ``scripted_endpoint`` here)."""
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
        """``(path of the CLI, None)``, or ``(None, a not-launched result)``: ``executable_not_allowed``
        when the profile's ``executable`` is not one the operator listed, ``gateway_not_allowed`` when
        its gateway is not (engine/agents/gateways.py; either list may have changed since the run was
        created), ``missing_executable`` when the profile's ``executable``, the
        pinned install and a listed PATH entry have none (``find_executable``)."""
        refused = executables.refusal(request.profile.get("executable"))
        if refused:
            return None, self.not_launched(request, "executable_not_allowed", f"Not launched: executable {refused}.")
        if not request.profile.get("scripted_endpoint"):
            _, refused_gateway = gateways.of_profile(request.profile)
            if refused_gateway:
                field, why = refused_gateway[0]
                return None, self.not_launched(request, "gateway_not_allowed", f"Not launched: {field} {why}.")
        exe = find_executable(self.executable_name, request.profile.get("executable"))
        if exe is not None:
            return exe, None
        return None, self.not_launched(request, "missing_executable", (
            f"The {self.executable_name} executable was not found (profile executable: "
            f"{request.profile.get('executable') or 'not set'}; looked in {TOOLS_BIN} and on PATH)."))

    def run(self, request: AgentRequest) -> AgentResult:
        """One attempt (the subclass's ``run_attempt``); an attempt whose spend caps its model gateway could not
        keep (``UnmeteredCaps``) is not launched: ``budget_reached``."""
        try:
            return self.run_attempt(request)
        except UnmeteredCaps as exc:
            self.close_gateway()
            return self.not_launched(request, "budget_reached", str(exc))

    def run_attempt(self, request: AgentRequest) -> AgentResult:  # pragma: no cover - each CLI's own
        raise NotImplementedError

    # ------------------------------------------------------------------ the model gateway (engine/model_gateway)

    #: The attempt's model gateway (set by ``open_gateway``; None: the CLI's own login, not metered).
    gateway: model_gateway.ModelGateway | None = None

    def open_gateway(self, request: AgentRequest, env: dict, endpoint, upstream: str, key_vars: tuple[str, ...],
                     scripted_key_var: str = "") -> model_gateway.ModelGateway | None:
        """Start the attempt's model gateway in front of ``upstream`` (the provider's or listed gateway's
        base URL; for a simulated attempt, ``endpoint``, the scripted endpoint, whose URL ``upstream`` then
        extends) and move the key out of the CLI's environment ``env``: the first of ``key_vars`` that holds
        one gives the gateway its key and then holds the attempt's placeholder; the others are removed.
        A simulated attempt's placeholder goes to ``scripted_key_var`` (the endpoint's key stays with the
        gateway). Returns the gateway, or None when no key is there (the CLI's own login: its calls
        are not metered, docs/agents.md "The model gateway")."""
        self.gateway = None
        if endpoint is not None:
            key, holder = "scripted-endpoint-key", scripted_key_var or key_vars[0]
        else:
            holder = next((name for name in key_vars if (env.get(name) or "").strip()), "")
            if not holder:
                capped = capped_by((request.spend or {}).get("budgets"))
                if capped:
                    raise UnmeteredCaps(
                        f"Not launched: the pipeline caps the model spend ({', '.join(capped)}), and this attempt's "
                        f"{self.executable_name} has no key, only its own login, whose calls the model gateway cannot "
                        f"hold or meter: a cap would fail open. Give the workers a key ({', '.join(key_vars)}) or "
                        "continue the run without those caps.")
                return None
            key = env[holder]
        meter = model_gateway.Meter(**meter_parts(request.spend))
        ledger = os.path.join(request.control_dir, "model-calls.jsonl") if request.control_dir else ""
        stall = (request.spend or {}).get("stall") or {}
        watch = model_gateway.LoopWatch(stall.get("repeated_calls", model_gateway.meter.DEFAULT_REPEATED_CALLS))
        idle = model_gateway.IdleWatch(request.workspace, stall.get("idle_turns", model_gateway.meter.DEFAULT_IDLE_TURNS),
                                       stall.get("idle_minutes", model_gateway.meter.DEFAULT_IDLE_MINUTES))
        said = None
        if request.raw_path:  # what the model was sent and answered, beside the CLI's own account
            said = model_gateway.conversation.WireConversation(
                model_gateway.conversation.conversation_path(request.raw_path), request.workspace, request.secrets)
        secrets = list(request.secrets or [])
        gateway = model_gateway.ModelGateway(upstream, key, meter, ledger_path=ledger, simulated=endpoint is not None,
                                             watch=watch, idle=idle, conversation=said,
                                             redact=lambda text: redact_text(text, secrets)[0]).start()
        for name in key_vars:
            env.pop(name, None)
        env[holder] = gateway.placeholder
        self.gateway = gateway
        with open(request.log_path, "a", encoding="utf-8") as log:
            log.write(f"[run-engine] the model gateway of this attempt forwards the CLI's model calls to "
                      f"{model_gateway.server._shown(upstream)}, holding the key; the CLI has a placeholder\n")
        return gateway

    def close_gateway(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()

    def metered(self, result: AgentResult) -> AgentResult:
        """``result`` with what the gateway saw: its usage replaces the CLI's claim (kept in
        ``extra["cli_usage"]``), its ledger joins ``extra["gateway"]``, and a call it refused or an
        upstream it did not trust becomes the failure (``budget_reached``, ``stalled``, ``gateway_not_allowed``)."""
        gateway = self.gateway
        if gateway is None:
            result.extra = {**result.extra, "gateway": None}
            return result
        record = {**gateway.record(), "cli_usage": result.usage}
        result.extra = {**result.extra, "gateway": record}
        result.usage = record["usage"]
        if gateway.stop_kind:
            result.failure_kind, result.failure_message = gateway.stop_kind, gateway.stop_message
        return result

    #: The adapter's sandbox builder, ``(argv, env, request, network) -> argv``: the view every CLI gets
    #: (``sandboxed_view``) unless a CLI adds its own part (its engine/agents/<cli>/adapter.py ``sandboxed``).
    wrapper: Callable[..., list[str]] = staticmethod(sandboxed_view)

    def supervise(self, argv: list[str], env: dict, request: AgentRequest, endpoint_url: str | None = None):
        """Run ``argv`` for the attempt in its sandbox with its egress proxy (``Adapter.sandboxed_run``),
        the prompt file on stdin; ``endpoint_url``: the scripted endpoint of a simulated attempt. With the
        attempt's model gateway open (``open_gateway``), its address is the only model address the sandbox
        reaches, and a gateway that ended the attempt (a cap, an untrusted upstream) stops the tree."""
        gateway = self.gateway
        if gateway is not None:
            endpoint_url = gateway.origin
            asked, live = request.should_stop, LiveMeter(gateway, request.on_usage)
            request = dataclasses.replace(request, should_stop=lambda: live() or bool(gateway.stop_kind)
                                          or bool(asked and asked()))
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
        engine/pipeline/format.py keeps free of credentials: in practice, the environment's)."""
        from .. import boundary  # noqa: PLC0415 - engine/boundary.py imports this package

        found = boundary.credential_env(self.name, environ, profile)
        found.update({k: str(v) for k, v in (profile.get("env") or {}).items() if k in self.credential_names()})
        return found

    def credential_problem(self, profile: dict, environ) -> PreflightProblem | None:
        """A ``credentials_missing`` problem when neither a credential variable nor a login file
        is there for the CLI; None when one is (subclasses: engine/agents/<cli>/adapter.py)."""
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
        if gateways.uses_gateway(profile):  # the key the operator listed with the gateway is the only credential
            gateway, refused = gateways.of_profile(profile)
            if refused:
                return [PreflightProblem("gateway_not_allowed", f"{field}: {why}", field) for field, why in refused]
            missing = None if (environ.get(gateway.key_env) or "").strip() else PreflightProblem(
                "credentials_missing", f"its gateway {gateway.url} takes the key in {gateway.key_env} (the workers' "
                f"{gateways.SETTING}), which is not set in the workers' environment: set {gateway.key_env} to the "
                "gateway's key there (and here, where the run is created)", gateway.key_env)
        else:
            missing = self.credential_problem(profile, environ)
        if missing is not None:
            problems.append(missing)
        if deny is None:
            from .. import boundary  # noqa: PLC0415 - engine/boundary.py imports this package

            deny = boundary.service_addresses()
        return problems + gateway_problems(profile, deny)


#: Seconds between two live reports of an attempt's metered spend (``AgentRequest.on_usage``).
LIVE_SECONDS = 2.0


class LiveMeter:
    """Tells ``on_usage`` what the gateway has metered, when it changed and at most every LIVE_SECONDS;
    called where the process's supervisor polls (it returns False: it never stops anything)."""

    def __init__(self, gateway, on_usage):
        self.gateway, self.on_usage = gateway, on_usage
        self.told, self.at = -1, 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.on_usage is None or now - self.at < LIVE_SECONDS or self.gateway.call_count == self.told:
            return False
        self.told, self.at = self.gateway.call_count, now
        spent = self.gateway.meter.summary()["attempt"]
        self.on_usage(self.gateway.usage(), {key: spent[key] for key in ("tokens", "cost_usd", "unpriced_calls")})
        return False


class UnmeteredCaps(Exception):
    """A pipeline with spend caps, and an attempt whose CLI would run on its own login, unmetered."""


def capped_by(budgets: dict | None) -> list[str]:
    """The spend caps a pipeline's ``budgets`` sets (``budgets.max_tokens``, ``budgets.stage.max_cost_usd``...)."""
    found = []
    for level, caps in model_gateway.caps_of(budgets).items():
        for key, value in caps.items():
            if value is not None:
                found.append(model_gateway.meter.name_of(level, key))
    return found


def meter_parts(spend: dict | None) -> dict:
    """The ``Meter`` arguments of an attempt's ``AgentRequest.spend`` (``{"budgets": the pipeline's,
    "before": {"run": {"tokens", "cost_usd", "unpriced_calls"}, "stage": {...}}}``, engine/steps/attempts.py)."""
    spend = spend or {}
    before = {name: model_gateway.Spent(**found) for name, found in (spend.get("before") or {}).items()}
    return {"caps": model_gateway.caps_of(spend.get("budgets")), "before": before}


def gateway_key_hint(profile: dict) -> str:
    """The sentence an ``auth_failed`` message of a gateway profile ends with: the gateway refused
    the key of the variable the operator listed with it (engine/agents/gateways.py), not the CLI's
    usual credential."""
    gateway, _ = gateways.of_profile(profile)
    name = gateway.key_env if gateway is not None else (profile.get("api_key_env") or "its key variable")
    return (f"The gateway ({profile.get('base_url') or 'the profile base_url'}) refused the key of {name} "
            f"(listed with it in {gateways.SETTING}): set {name} to a key the gateway accepts in the workers' "
            "environment.")


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
    """The gateway URLs of a profile: its ``base_url``, then the GATEWAY_ENV variables of its ``env`` (each
    CLI's policy names its own: engine/agents/network.py), without duplicates."""
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
            problems.append(PreflightProblem("gateway_unreachable", f"a gateway URL of the profile (base_url, "
                                             f"{', '.join(GATEWAY_ENV[:-1])} or {GATEWAY_ENV[-1]}) names no host",
                                             "base_url"))
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
