"""What crosses the sandbox boundary: the environment, the network allow-list, and the self-check.

Everything an agent or a gate runs is treated as hostile (docs/agents.md, "The sandbox boundary"). The
sandbox (engine/agents/sandbox.py) gives it an allow-listed filesystem and a network namespace of
its own; this module decides the rest:

* ``base_env``: the variables a command gets from the worker, by allow-list (ENV_NAMES and
  ENV_PREFIXES): nothing else of the worker's environment (no ``AWS_SECRET_ACCESS_KEY``,
  ``GITHUB_TOKEN``, ``PGPASSWORD``, ``DATABASE_URL``...). ``credential_env`` adds the one
  credential variable family of the profile's CLI (CREDENTIALS), for agents only.
* the hosts an attempt may reach through its egress proxy are engine/agents/network.py's
  ``network_allow`` (the provider, the gateway, the scripted endpoint, ``network_allow``).
* ``service_addresses``: the database, the broker and the Control Panel's web port: never
  reached through the proxy, and probed by ``self_check``.
* ``self_check``: a probe launched inside the sandbox tries to connect to each service address;
  if one answers, or no sandbox can be made, agents and gates are refused with
  ``boundary_not_enforced`` (naming the address) rather than run unguarded. Run at worker start
  (engine/tasks.py) and before the first launch in each process.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

from django.conf import settings

from .agents import gateways, registry, sandbox
from .agents.netproxy import split_host_port

log = logging.getLogger("engine.boundary")

#: Variables of the worker that reach agents and gates (with ENV_PREFIXES); everything else stays.
ENV_NAMES = ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "COLORTERM", "NO_COLOR")
ENV_PREFIXES = ("LC_",)
#: The credential variables of each adapter's CLI, passed to its agents only (never to gates): each
#: CLI's policy says which (engine/agents/<cli>/policy.py CREDENTIALS, its documentation on authentication).
CREDENTIALS = registry.credentials()
#: The variable each CLI reads its API key from, which the key of a profile's gateway fills
#: (engine/agents/gateways.py): the first name of CREDENTIALS for each.
KEY_TARGETS = {adapter: names[0] for adapter, names in CREDENTIALS.items() if names}
class BoundaryNotEnforced(Exception):
    """The sandbox cannot keep an agent or a gate from the Control Panel's services.

    ``problems``: one sentence each, naming the address that answered from inside or why no
    sandbox could be made."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


# ----------------------------------------------------------------------------- environment


def base_env(source: dict | None = None) -> dict[str, str]:
    """The allow-listed part of ``source`` (the worker's environment by default)."""
    source = os.environ if source is None else source
    return {k: v for k, v in source.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


def credential_env(adapter: str, source: dict | None = None, profile: dict | None = None) -> dict[str, str]:
    """The worker's credential variables for ``adapter``'s CLI (CREDENTIALS), those that are set.

    A profile that talks to a gateway (a ``base_url`` or a gateway variable of its ``env``,
    engine/agents/gateways.py) gets instead the value of the variable the operator listed with
    that gateway (``CP_GATEWAYS``), under the name the CLI reads (KEY_TARGETS), and none of the
    CLI's usual variables: the workers' own provider keys go only to the provider's own hosts.
    A gateway the operator did not list (or a profile's ``api_key_env`` that is not its key) gets
    nothing. The value is read here, at launch, from ``source`` (the worker's environment); it is
    never stored in a definition, a record or a log (the attempt's redactor gets it as a secret).
    Returns ``{variable: value}``."""
    source = os.environ if source is None else source
    profile = profile or {}
    if gateways.uses_gateway(profile):
        gateway, _ = gateways.of_profile(profile)
        target = KEY_TARGETS.get(adapter)
        value = source.get(gateway.key_env) if gateway is not None else None
        return {target: value} if target and value else {}
    return {k: source[k] for k in CREDENTIALS.get(adapter, ()) if source.get(k)}


# ----------------------------------------------------------------------------- network


def _address(host: str | None, port: int | None, default_port: int) -> list[tuple[str, int]]:
    host = (host or "").strip()
    if not host or host.startswith("/"):
        return []  # a Unix socket: not in the sandbox's view (/run, /var/run and /tmp are not)
    port = int(port or default_port)
    found = {(host, port)}
    try:
        for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            found.add((info[4][0], port))
    except OSError:
        pass
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0"):
        found |= {("127.0.0.1", port), ("::1", port)}
    return sorted(found)


def service_addresses() -> list[tuple[str, int]]:
    """``(address, port)`` of the database, the broker and the Control Panel's web server
    (``CP_WEB_ADDRESS``, default ``127.0.0.1:8000``, ``make web``'s), each name resolved."""
    found: list[tuple[str, int]] = []
    db = settings.DATABASES["default"]
    if "sqlite" not in db["ENGINE"]:
        found += _address(db.get("HOST") or "localhost", db.get("PORT"), 5432 if "postgres" in db["ENGINE"] else 3306)
    broker = settings.CELERY_BROKER_URL
    if not broker.startswith(("filesystem", "memory")):
        parts = urlsplit(broker)
        default = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671}.get(parts.scheme, 0)
        found += _address(parts.hostname or "localhost", parts.port, default)
    web_host, web_port = split_host_port(getattr(settings, "CP_WEB_ADDRESS", "127.0.0.1:8000"), 8000)
    found += _address(web_host, web_port, 8000)
    return list(dict.fromkeys(found))


# ----------------------------------------------------------------------------- self-check

_PROBE = """
import json, socket, sys
answered = []
for host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        answered.append(f"{host}:{port}")
    except OSError:
        pass
print(json.dumps(answered))
"""

_checked: dict[str, object] = {"at": 0.0, "problems": None}
_check_lock = threading.Lock()
#: Seconds a passed self-check is trusted in one process before it is run again.
SELF_CHECK_TTL_SECONDS = 600.0


def probe(addresses: list[tuple[str, int]] | None = None) -> list[str]:
    """Run the probe inside a sandbox (as a gate runs: no network policy) and return the problems:
    each address that answered from inside, or why no sandbox could be made. Empty: enforced."""
    ok, why = sandbox.available()
    if not ok:
        return [f"no sandbox can be made here: {why}"]
    addresses = service_addresses() if addresses is None else addresses
    if not addresses:
        return []
    with tempfile.TemporaryDirectory(prefix="cp-probe-") as tmp:
        argv = sandbox.wrap([os.path.realpath(sys.executable), "-I", "-S", "-c", _PROBE, json.dumps(addresses)],
                            writable=[tmp], visible=sandbox.tool_paths(None), hide=sandbox.private_paths(
                                str(settings.VAR_DIR)))
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                                 env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"the sandbox probe could not run: {exc}"]
    try:
        answered = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [f"the sandbox probe failed (exit {out.returncode}): {out.stderr.strip()[:300]}"]
    return [f"{address} (a Control Panel service) answers from inside the sandbox" for address in answered]


def self_check(force: bool = False) -> None:
    """Raise BoundaryNotEnforced when ``probe()`` finds a problem; cached per process
    (SELF_CHECK_TTL_SECONDS for a pass; a failure is checked again at the next call)."""
    with _check_lock:
        fresh = time.monotonic() - float(_checked["at"]) < SELF_CHECK_TTL_SECONDS
        if force or _checked["problems"] is None or _checked["problems"] or not fresh:
            _checked["problems"] = probe()
            _checked["at"] = time.monotonic()
            if _checked["problems"]:
                log.error("sandbox boundary not enforced: %s", "; ".join(_checked["problems"]))
        problems = list(_checked["problems"])
    if problems:
        raise BoundaryNotEnforced(problems)
