"""Which model gateways a profile may name, and which key each gets: the operator's list.

A profile's ``base_url`` (and the gateway variables of its ``env``, ``GATEWAY_URL_NAMES``) sends
the CLI's requests, and the key they carry, to another host. A pipeline author chooses them and is
less trusted than the operator (README.md, "Who decides what"), so:

* every gateway URL of a profile must match a gateway of the operator's ``CP_GATEWAYS`` (the
  workers' and the Control Panel's setting): entries ``URL=VARIABLE`` separated by commas, e.g.
  ``CP_GATEWAYS=http://127.0.0.1:4000=GATEWAY_API_KEY``. A URL matches an entry with the same
  scheme, host and port whose path is the URL's path or a folder above it;
* an attempt of such a profile gets, as its CLI's key (engine/boundary.py ``KEY_TARGETS``), the
  value of the variable the operator listed with that gateway, and nothing else: none of the CLI's
  usual credential variables and no copy of the worker's login (the worker's own provider keys go
  only to the provider's own hosts). A profile's ``api_key_env``, when given, must name that variable;
* a URL with a user part (``user@``, ``user:password@``, ``token@``) is refused wherever it is
  written, and so is one with a query or a fragment (engine/pipeline/schema/fields.py ``_url``).

``refusal`` is called when a definition is loaded or saved (engine/pipeline/schema/), when a run
is created (engine/agents/cli_adapter.py ``preflight``) and before each launch
(``CliAdapter.executable_or_result``): the operator's list may change after a run was created.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

SETTING = "CP_GATEWAYS"
#: The variables of a profile's ``env`` the CLIs read as their model endpoint (engine/agents/network.py
#: GATEWAY_ENV), and any name that reads like one: each must be a listed gateway too.
GATEWAY_URL_NAMES = re.compile(r"(?:^|_)(?:BASE_URL|API_BASE|API_URL|ENDPOINT|BASE_PATH)$", re.I)
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Gateway:
    """One entry of ``CP_GATEWAYS``: where the gateway is (``url``, cut into its parts) and the
    variable of the workers' environment that holds its key (``key_env``)."""

    url: str
    scheme: str
    host: str
    port: int
    path: str
    key_env: str

    def covers(self, url: str) -> bool:
        """Whether ``url`` is this gateway: same scheme, host and port, and a path at or below its path."""
        parts = _parts(url)
        if parts is None or parts[:3] != (self.scheme, self.host, self.port):
            return False
        path = parts[3]
        return not self.path or path == self.path or path.startswith(self.path + "/")


def _parts(url: str) -> tuple[str, str, int, str] | None:
    """``(scheme, host, port, path without trailing '/')`` of an http(s) URL with a host; None otherwise."""
    try:
        parts = urlsplit(str(url).strip())
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname or port is None or "@" in parts.netloc:
        return None  # a user part is a credential in a definition: never a gateway's URL
    if not plain_path(parts.path):
        return None  # the CLIs' URL parsers resolve '..' (and '%2e%2e', '\\'): /proxy/../other is /other
    return parts.scheme.lower(), parts.hostname.lower(), int(port), parts.path.rstrip("/")


def plain_path(path: str) -> bool:
    """Whether a URL's path has no ``.`` or ``..`` segment (percent-encoded or not), no backslash and
    no blank or control character: Node's URL parser (the CLIs') drops tabs and line breaks and then
    resolves those segments before a request, so what is sent would not start with the path checked."""
    decoded = unquote(path)
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in path + decoded):  # Node drops tabs and line breaks first
        return False
    return "\\" not in decoded and not any(segment in (".", "..") for segment in decoded.split("/"))


def parse_entry(entry: str) -> Gateway:
    """One ``URL=VARIABLE`` entry of ``CP_GATEWAYS``; ValueError with a sentence when it is not one."""
    text = entry.strip()
    url, _, key_env = text.rpartition("=")
    if not url or not _VARIABLE.fullmatch(key_env):
        raise ValueError(f"{text!r} is not URL=VARIABLE (the gateway's URL, then the variable of the workers' "
                         "environment that holds its key), e.g. http://127.0.0.1:4000=GATEWAY_API_KEY")
    try:
        split = urlsplit(url)
    except ValueError:
        split = None
    if split is not None and ("@" in split.netloc or split.query or split.fragment):
        raise ValueError(f"{text!r}: a gateway's URL has no user part, query or fragment; its key is the variable "
                         "named after '='")
    parts = _parts(url)
    if parts is None:
        raise ValueError(f"{text!r}: {url!r} is not an http:// or https:// URL with a host and a plain path "
                         "(no '.' or '..' segments, no backslash)")
    return Gateway(url, *parts, key_env=key_env)


def parse(value: str | list[str] | None) -> list[Gateway]:
    """Every entry of a ``CP_GATEWAYS`` value (a comma-separated text or a list of entries)."""
    entries = value.split(",") if isinstance(value, str) else list(value or [])
    return [parse_entry(entry) for entry in entries if str(entry).strip()]


def listed() -> list[Gateway]:
    """The operator's gateways: Django's ``settings.CP_GATEWAYS`` where Django is configured, else
    this process's environment variable (a malformed entry counts as none listed)."""
    try:
        from django.conf import settings  # noqa: PLC0415 - imported where Django is configured

        value = getattr(settings, SETTING, None) if settings.configured else None
    except ImportError:
        value = None
    if value is None:
        value = os.environ.get(SETTING, "")
    try:
        return parse(value)
    except ValueError:
        return []


def match(url: str) -> Gateway | None:
    """The listed gateway ``url`` is, or None."""
    return next((gateway for gateway in listed() if gateway.covers(url)), None)


def described() -> str:
    """The operator's list as a refusal quotes it: ``(now: URL, URL)`` or ``(CP_GATEWAYS is empty)``."""
    gateways = listed()
    return f"(now: {', '.join(g.url for g in gateways)})" if gateways else f"({SETTING} is empty)"


def shown(url: str) -> str:
    """``url`` as a message may quote it: without a user part (``user:password@``), query or fragment."""
    try:
        parts = urlsplit(str(url).strip())
        host = parts.netloc.rpartition("@")[2]
    except ValueError:
        return "(a URL that does not parse)"
    return f"{parts.scheme}://{host}{parts.path}"


def refusal(url: str | None) -> str | None:
    """Why ``url`` may not be a profile's gateway (a sentence), or None when it is a listed one (or unset)."""
    if not url:
        return None
    if match(url) is None:
        return (f"{shown(url)!r} is not a gateway the operator listed: a profile's base_url (or a *_BASE_URL of its env) "
                f"must be one of the workers' {SETTING} {described()}; without one, the CLI talks to its "
                "provider's own host with the workers' own key")
    return None


def urls(profile: dict) -> list[str]:
    """The gateway URLs of ``profile``: its ``base_url``, then each value of its ``env`` whose name
    is a gateway variable (``GATEWAY_URL_NAMES``), without duplicates."""
    found = [profile.get("base_url")] + [value for name, value in (profile.get("env") or {}).items()
                                         if GATEWAY_URL_NAMES.search(str(name))]
    return list(dict.fromkeys(str(url) for url in found if url))


def of_profile(profile: dict) -> tuple[Gateway | None, list[tuple[str, str]]]:
    """``(the gateway the profile's attempts talk to, problems)``; each problem ``(field, sentence)``
    with ``field`` ``base_url``, ``env.NAME`` or ``api_key_env``. No gateway URL: ``(None, [])``, or
    a problem when ``api_key_env`` is set (a gateway's key without a gateway)."""
    problems, found = [], []
    base = profile.get("base_url")
    for url in urls(profile):
        field = "base_url" if url == base else next(
            (f"env.{name}" for name, value in (profile.get("env") or {}).items() if str(value) == url), "env")
        gateway = match(url)
        if gateway is None:
            problems.append((field, refusal(url)))
        else:
            found.append(gateway)
    if len({g.key_env for g in found}) > 1:
        problems.append(("base_url", "the profile's gateway URLs are gateways of different keys ("
                         + ", ".join(sorted({g.key_env for g in found})) + "): a profile talks to one gateway"))
    gateway = found[0] if found and not problems else None
    key_env = profile.get("api_key_env")
    if key_env and not urls(profile):
        problems.append(("api_key_env", f"names {key_env}, a gateway's key, but the profile names no gateway "
                         f"(base_url): a gateway's key goes only to its gateway, one of the workers' {SETTING}"))
    elif key_env and gateway is not None and key_env != gateway.key_env:
        problems.append(("api_key_env", f"names {key_env}, but the operator listed the gateway {gateway.url} with "
                         f"{gateway.key_env} ({SETTING}): leave api_key_env out, or name {gateway.key_env}"))
    return (gateway if not problems else None), problems


def uses_gateway(profile: dict) -> bool:
    """Whether the profile's attempts talk to a gateway (so get no worker login or usual credential)."""
    return bool(urls(profile) or profile.get("api_key_env"))
