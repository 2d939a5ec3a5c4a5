"""The network allow-list of an attempt and its egress proxy (no Django imports).

An agent runs in a network namespace of its own (engine/agents/sandbox.py); its only way out is
an ``engine.agents.netproxy.EgressProxy`` started for the attempt. ``network_allow(profile,
endpoint_url)`` is what that proxy lets through:

* the provider hosts of the profile's adapter (PROVIDER_HOSTS), unless the attempt talks to the
  scripted model endpoint (a simulated run reaches that endpoint only);
* the engine's model gateway of the attempt (engine/model_gateway, ``http://127.0.0.1:PORT``), or the
  scripted endpoint of a simulated attempt: ``endpoint_url``; then nothing else of the model's;
* without it (a CLI's own login, not metered): the profile's gateway: ``base_url``, or a gateway
  variable of a CLI (GATEWAY_ENV: each CLI's policy names its own) in its ``env``, as ``host:port``;
* the profile's ``network_allow`` entries (``host``, ``*.suffix``, ``host:port``).

Whatever the list says, the proxy never connects to the ``deny`` addresses the engine gives it
(the database, the broker, the Control Panel: engine/boundary.py ``service_addresses``).
"""
from __future__ import annotations

from contextlib import contextmanager
from urllib.parse import urlsplit

from . import registry
from .netproxy import EgressProxy, split_host_port
from .sandbox import NetworkPolicy

#: The provider hosts each adapter may reach by default (any port of the name): each CLI's policy
#: says which (engine/agents/<cli>/policy.py PROVIDER_HOSTS). The scripted test adapter talks to no model.
PROVIDER_HOSTS = registry.provider_hosts()
#: Gateway variables a profile's ``env`` may set; their host joins the allow-list: each CLI's policy names the
#: variable of its provider's API address (engine/agents/<cli>/policy.py GATEWAY_ENV), all of them here.
GATEWAY_ENV = registry.bundled_all("GATEWAY_ENV")


def url_entry(url: str) -> str | None:
    """``https://gw.example:8443/v1`` -> ``gw.example:8443``; ``http://127.0.0.1:9/`` -> ``127.0.0.1:9``;
    None for a URL without a host."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not parts.hostname:
        return None
    host = parts.hostname.lower()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def provider_hosts(profile: dict) -> tuple[str, ...]:
    """The provider hosts one attempt of ``profile`` may reach (PROVIDER_HOSTS, or its CLI's policy's
    ``hosts_for`` for a CLI of several providers: engine/agents/registry.py ``hosts_for``)."""
    return registry.hosts_for(profile)


def network_allow(profile: dict, endpoint_url: str | None = None) -> list[str]:
    """The attempt's allow-list (entries as ``EgressProxy`` takes them), without duplicates."""
    entries = [] if endpoint_url else list(provider_hosts(profile))
    # with the engine's model gateway (or the scripted endpoint) in front, the profile's upstream is the
    # gateway's to reach, from the worker: the sandbox reaches the engine's address only
    urls = [endpoint_url] if endpoint_url else [profile.get("base_url")] + [
        (profile.get("env") or {}).get(name) for name in GATEWAY_ENV]
    for url in urls:
        entry = url_entry(url) if url else None
        if entry:
            entries.append(entry)
    entries += [str(item).lower() for item in profile.get("network_allow") or []]
    return list(dict.fromkeys(entries))


def loopback_forwards(entries: list[str]) -> list[str]:
    """The entries on this host's loopback with a port (``127.0.0.1:PORT``): the bridge listens on
    the same address inside the sandbox, so a base URL on the worker's loopback keeps working."""
    forwards = []
    for entry in entries:
        host, port = split_host_port(entry)
        if port and host in ("127.0.0.1", "localhost"):
            forwards.append(f"127.0.0.1:{port}")
    return forwards


@contextmanager
def egress(profile: dict, endpoint_url: str | None = None, deny=()):
    """Start the attempt's egress proxy; yields ``(proxy, policy)`` for ``sandbox.wrap(network=policy)``
    and ``policy.env()``. ``deny``: ``(address, port)`` pairs never reached. Stopped when the block ends."""
    allow = network_allow(profile, endpoint_url)
    denied = {(str(a), int(p)) for a, p in deny}
    proxy = EgressProxy(allow=allow, deny=denied).start()
    forwards = [item for item in loopback_forwards(allow) if ("127.0.0.1", split_host_port(item)[1]) not in denied]
    try:
        yield proxy, NetworkPolicy(proxy.socket_dir, forwards)
    finally:
        proxy.stop()


def network_record(proxy: EgressProxy) -> dict:
    """What an attempt did on the network: ``{"allow": [...], "connected": [...], "refused": [...]}``."""
    return {"allow": list(proxy.allow), "connected": list(proxy.connected), "refused": list(proxy.refused)}
