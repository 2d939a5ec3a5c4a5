"""The value rules of single fields (names, repository-relative paths, gitignore patterns, hosts, URLs,
variable names) and the annotated field types built from them."""
import ipaddress
import re
import urllib.parse
from typing import Annotated, Optional, Union

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    StrictStr,
    Tag,
)
from pydantic_core import PydanticCustomError

from ...checks import globs
from ...agents import executables, gateways, registry
from ...agents.netproxy import is_internal_host, split_host_port
from .common import (
    _ENV_NAME_RE,
    _GLOB_CHARS,
    _HOST_RE,
    _SLUG_RE,
    MAX_DEADLINE_SECONDS,
    TAG,
    NoneIsDefault,
    Say,
    _errors,
    _fail,
    kind,
)

# --------------------------------------------------------------------------------------
# Value rules (after pydantic checked the type)


def _text(value: str) -> str:
    if "\x00" in value:
        _fail("must not contain NUL characters")
    return value.strip()


def _required_text(value: str) -> str:
    value = _text(value)
    if not value:
        raise PydanticCustomError("blank", "is blank")
    return value


def _optional_required_text(value: Optional[str]) -> Optional[str]:
    """``_required_text`` for a field that may be null (None passes as None)."""
    return None if value is None else _required_text(value)


def _text_or_none(value: str) -> Optional[str]:
    return _text(value) or None


def _unstripped_text_or_none(value: str) -> Optional[str]:
    if "\x00" in value:
        _fail("must not contain NUL characters")
    return value or None


def check_slug(value: str, what: str = "a name") -> str:
    """A name: 1-100 of ``A-Z a-z 0-9 - _ .``, starting with a letter or digit."""
    if len(value) > 100:
        _fail(f"is {len(value)} characters long; a {what} has at most 100")
    if not _SLUG_RE.fullmatch(value):
        _fail(f"{value!r} is not a valid {what}: use 1-100 letters, digits, '-', '_' or '.', "
              "starting with a letter or digit")
    return value


def _slug(what: str, required: bool):
    def check(value: str) -> str:
        value = _required_text(value) if required else _text(value)
        return check_slug(value, what) if value else value

    return check


def _slug_item(what: str):
    def check(value: str) -> str:
        return check_slug(value.strip(), what)

    return check


def check_relative(value: str, *, pattern: bool, what: str) -> str:
    """One repository-relative path or glob; returned without any leading ``./``.

    Refused: not a one-line string, absolute (``/...``, ``~...``, ``C:...``), backslashes,
    a ``..`` segment, or (for ``pattern=False``) glob characters.
    """
    value = value.strip()
    if not value:
        _fail(f"must not be empty ({what})")
    if "\x00" in value or "\n" in value or "\r" in value:
        _fail(f"must be a single line ({what})")
    if value.startswith("/") or value.startswith("~") or re.match(r"[A-Za-z]:", value):
        _fail(f"{value!r} must be relative to the repository root (no leading '/' or '~')")
    if "\\" in value:
        _fail(f"{value!r} must use '/' as the separator, not '\\'")
    if ".." in value.split("/"):
        _fail(f"{value!r} must not contain '..' segments (it must stay inside the repository)")
    while value.startswith("./"):
        value = value[2:].lstrip("/")
    if not value or value == ".":
        _fail(f"must name something inside the repository ({what})")
    if not pattern and _GLOB_CHARS & set(value):
        _fail(f"{value!r} must be a file path, not a pattern")
    return value


def _path_field(what: str):
    def check(value: str) -> Optional[str]:
        value = _text(value)
        return check_relative(value, pattern=False, what=what) if value else None

    return check


def _file_item(value: str) -> str:
    return check_relative(value, pattern=False, what="a repository-relative file path")


def _pattern(value: str, *, negation: bool) -> str:
    """One gitignore pattern of a path list (engine/checks/globs.py states the dialect), checked by
    compiling it as the engine matches it. A leading ``./`` anchors it at the repository root,
    as ``/`` does."""
    # not stripped: white space at either end is refused by globs.check (git would keep a leading
    # space and drop a trailing one; a silent strip would change what the pattern means)
    negated, body = (value.startswith("!"), value[1:]) if value.startswith("!") else (False, value)
    if body.startswith("./"):
        body = body[2:].lstrip("/")
        # "./x" names x at the root: anchor it when dropping "./" would let it match at any depth
        body = body if "/" in body.rstrip("/") else "/" + body
        value = ("!" if negated else "") + body
    try:
        return globs.check(value, negation=negation)
    except globs.GlobError as exc:
        _fail(str(exc))


def _glob_item(value: str) -> str:
    return _pattern(value, negation=True)


def _exclude_item(value: str) -> str:
    try:
        return _pattern(value, negation=False)
    except PydanticCustomError as exc:
        if "negation" in exc.context["problem"]:
            _fail(f"{value!r}: negation ('!') is not supported; exclude patterns only "
                  f"add to the engine's exclusions")
        raise


def _host_item(value: str) -> str:
    """A network allow-list entry: ``host``, ``*.suffix``, ``host:port``, ``1.2.3.4:port`` or ``[::1]:port``."""
    if not value.strip():
        _fail(f"must be a host name, optionally with :port, got {kind(value)}")
    text = value.strip().lower()
    try:
        host, port = split_host_port(text)
    except ValueError as exc:
        _fail(f"{value!r}: {exc}")
    if port is None and is_internal_host(host):
        _fail(f"{value!r} is a loopback or private address: name its port ({host}:PORT), so that "
              f"the agent reaches that one service and no other")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_RE.fullmatch(host):
            _fail(f"{value!r} is not a host name (letters, digits, '-' and '.', or '*.' before a "
                  f"domain), an IP address, or either with ':port'")
    return text


def _url(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    parts = urllib.parse.urlsplit(value)
    try:
        parts.port
    except ValueError:
        _fail(f"{value!r} has a port that is not a number from 1 to 65535")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _fail(f"{value!r} is not an http:// or https:// URL with a host")
    if "@" in parts.netloc:
        # a user part (user@, user:password@, a token@) would carry a credential into records and pages
        _fail("holds a user part before '@' (user@host, user:password@host): credentials never go in a "
              "definition; a gateway's key comes from the variable the operator lists for it")
    if parts.query or parts.fragment:
        _fail(f"{value!r} has a query or a fragment: a gateway's URL is its scheme, host, port and path")
    if not gateways.plain_path(parts.path):
        _fail(f"{value!r} has '.' or '..' path segments (written or percent-encoded) or a backslash, which the CLIs "
              "resolve before they send: write the path plainly")
    why = gateways.refusal(value)  # the operator's CP_GATEWAYS (engine/agents/gateways.py)
    if why:
        _fail(why)
    return value


def _executable(value: Optional[str]) -> Optional[str]:
    """A profile's ``executable``: one the operator listed (engine/agents/executables.py)."""
    why = executables.refusal(value)
    if why:
        _fail(why)
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME_RE.fullmatch(value):
        _fail(f"{value!r} is not a valid environment variable name")
    return value


#: Variables a profile's ``env`` may not set: the engine sets them for each attempt (its HOME and
#: temporary folder, the CLIs' configuration folders and trust, the egress proxy, git's and the
#: loader's paths, the engine's own CP_*), and one of them set by a profile would point the CLI at
#: the worker's own login and settings, past the attempt's proxy, or at code of the profile's choice
#: (the CLIs' adapters, engine/agents/<cli>/adapter.py ``environment``; each CLI's own names are its
#: policy's ENGINE_ENV and ENGINE_ENV_PREFIXES, engine/agents/<cli>/policy.py).
ENGINE_ENV = ("HOME", "TMPDIR", "TMP", "TEMP", "PATH", "SHELL", "USER", "LOGNAME", "PWD",
              "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "NODE_OPTIONS",
              "NODE_PATH", "BASH_ENV", "ENV", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
              *registry.bundled_all("ENGINE_ENV"))
ENGINE_ENV_PREFIXES = ("CP_", "XDG_", "GIT_", "SSL_CERT", "REQUESTS_CA", "NODE_EXTRA_CA",
                       *registry.bundled_all("ENGINE_ENV_PREFIXES"))


def _profile_env_name(value: str) -> str:
    """A name in a profile's ``env``: a variable name the engine does not set itself (ENGINE_ENV)."""
    _env_name(value)
    upper = value.upper()
    if upper in ENGINE_ENV or upper.startswith(ENGINE_ENV_PREFIXES):
        _fail(f"{value!r} is set by the engine for each attempt (its HOME, temporary and configuration folders, "
              "the egress proxy, git and the loader): a profile cannot set it")
    return value


#: Worker variables a profile's ``api_key_env`` may not name: the Control Panel's own settings and
#: secrets (controlpanel/settings.py reads them), the process basics and the usual cloud, git and
#: package-registry secrets. An agent's key is sent to its model endpoint, so naming one of these
#: would hand it to the gateway and to the agent. Beyond that, the name must be the one the operator
#: listed with the profile's gateway (CP_GATEWAYS, engine/agents/gateways.py).
RESERVED_KEY_ENV = ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "REDIS_URL", "SECRET_KEY",
                    "PATH", "HOME", "USER", "SHELL", "PWD", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH")
RESERVED_KEY_ENV_PREFIXES = ("CP_", "DJANGO_", "CELERY_", "EMAIL_", "PG", "MYSQL", "REDIS", "AWS_", "GITHUB_", "GH_",
                             "GIT_", "SSH_", "NPM_", "GOOGLE_APPLICATION")


def _key_env_name(value: Optional[str]) -> Optional[str]:
    """A profile's ``api_key_env``: a variable name, not one of the Control Panel's own."""
    if value is None:
        return None
    _env_name(value)
    if value.upper() in RESERVED_KEY_ENV or value.upper().startswith(RESERVED_KEY_ENV_PREFIXES):
        _fail(f"{value!r} is one of the Control Panel's own variables (its database, broker or settings) or a usual "
              "secret of the workers (a cloud, git or registry credential), never an agent's key: name the worker "
              "variable that holds the gateway's key, e.g. GATEWAY_API_KEY")
    return value


def _nonempty(value: str) -> str:
    if not value:
        _fail("must not be empty")
    return value


def _unique(items: list) -> list:
    """A list that names no item twice (compared as cleaned)."""
    seen, problems = {}, []
    for index, item in enumerate(items):
        if item in seen:
            problems.append(((index,), f"{item!r} is listed twice (also [{seen[item]}])"))
        else:
            seen[item] = index
    if problems:
        raise _errors("list", problems)
    return items


def _strip_ref(value):
    """A scenario reference: a path (stripped; blank is none) or an inline mapping."""
    if isinstance(value, str):
        return value.strip() or None
    return value


def _by_type(*tags):
    """Discriminate a union by the Python type of the value: str, list or dict."""
    types = {"str": str, "list": list, "dict": dict}

    def pick(value):
        for tag in tags:
            if isinstance(value, types[tag]):
                return TAG + tag
        return None

    return pick


def _union(str_type, other_type, other: str):
    """A value that is a string or (``other``) a list or a mapping; anything else is refused
    with the error type ``wrong_type`` (worded by the field's :class:`Say`)."""
    return Annotated[
        Union[Annotated[str_type, Tag(TAG + "str")], Annotated[other_type, Tag(TAG + other)]],
        Discriminator(_by_type("str", other), custom_error_type="wrong_type", custom_error_message="wrong type"),
    ]


# --------------------------------------------------------------------------------------
# Field types

Text = Annotated[StrictStr, AfterValidator(_text), NoneIsDefault]
NullableText = Optional[Annotated[StrictStr, AfterValidator(_text_or_none)]]
Pattern = Annotated[StrictStr, AfterValidator(_glob_item)]
ExcludePattern = Annotated[StrictStr, AfterValidator(_exclude_item)]
FilePath = Annotated[StrictStr, AfterValidator(_file_item)]
Host = Annotated[StrictStr, AfterValidator(_host_item)]
Argument = Annotated[StrictStr, AfterValidator(_nonempty)]
#: The lines an agent prints, and a reviewer role: a string or a list of strings.
Lines = _union(StrictStr, list[StrictStr], "list")

_PATTERNS = Say(type="must be a list of patterns, got {kind}", item="must be a string (a gitignore pattern), got {kind}{hint}")
_HOSTS = Say(type="must be a list of hosts, got {kind}", item="must be a host name, optionally with :port, got {kind}{hint}")
_PATHS = Say(type="must be a list of paths, got {kind}", item="must be a string (a repository-relative file path), got {kind}{hint}")
_ARGUMENTS = Say(type="must be a list of arguments, got {kind}")

Patterns = Annotated[list[Pattern], NoneIsDefault, AfterValidator(_unique), _PATTERNS]
Hosts = Annotated[list[Host], NoneIsDefault, AfterValidator(_unique), _HOSTS]


def _seconds(**bounds):
    return Annotated[float, Field(allow_inf_nan=False, **bounds)]


Deadline = _seconds(gt=0, le=MAX_DEADLINE_SECONDS)
