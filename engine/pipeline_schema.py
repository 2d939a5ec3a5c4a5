"""The one schema of pipeline files and scripted scenarios, as pydantic models.

Every level of a pipeline document (docs/pipeline-format.md, pipelines/example.yaml) is a
model here: :class:`Pipeline`, :class:`Stage`, :class:`Gate`, :class:`Profile`,
:class:`Roles`, :class:`Budgets`, :class:`Deadlines`, and for the scripted test adapter's
scenarios :class:`Scenario`, :class:`Operations`, :class:`Step` and :class:`Usage`. The models
are strict (no conversion: ``"40"`` is not a number, ``yes`` is not a string) and refuse
unknown keys (``extra="forbid"``); the rules of this project (names, repository-relative
paths, gitignore patterns through engine/globs.py, hosts, URLs, refused adapter arguments,
stage order, roles naming profiles) are validators on the models.

pydantic's own errors (a ``loc`` and a ``type``) are worded as the engine words them:
each level translates the errors of its own fields (see :class:`Say` and
``_Level._speak``) and orders them as a reader walks the file: problems of the level
itself, unknown keys, then the fields in order, then the rules that span fields. What
leaves a model is always an error of type ``pipeline_format`` whose ``ctx["problem"]`` is
the final text and whose ``loc`` is the field path; engine/pipeline_format.py turns that
into ``(file, field, problem)`` tuples and builds the normalized definition.

Use :meth:`Pipeline.check` (a whole pipeline, with the context its cross-level rules need)
and :meth:`Scenario.check`; both raise :class:`pydantic.ValidationError`.
"""
import copy
import difflib
import ipaddress
import os
import re
import urllib.parse
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, PydanticUseDefault

from . import globs, limits
from .model_gateway.meter import DEFAULT_IDLE_MINUTES, DEFAULT_IDLE_TURNS, DEFAULT_REPEATED_CALLS
from .scripted_endpoint import ScenarioError, normalize_scenario
from .agents import executables, gateways
from .agents.cli_options import _PERMISSION_ARGS, _refused_args
from .agents.netproxy import is_internal_host, split_host_port

#: The only format version this module reads (top-level key ``format``).
FORMAT_VERSION = 1
#: Adapters of real agent CLIs (engine/agents/): each talks to a model endpoint.
CLI_ADAPTERS = ("claude-code", "codex", "gemini-cli", "pi")
#: Adapter names a profile may use. ``scripted`` is the test adapter (simulated runs).
ADAPTERS = (*CLI_ADAPTERS, "scripted")
#: Roles a pipeline assigns to profiles.
ROLES = ("implementer", "reviewer", "documenter")
#: Agent operations of a stage; a scripted scenario lists steps per operation.
OPERATIONS = ("implement", "review", "repair", "document")
#: Per-operation process deadlines in seconds when the file does not set them.
DEFAULT_DEADLINES = {
    "implement": 1800.0,
    "review": 600.0,
    "repair": 1800.0,
    "document": 900.0,
    "gate": 900.0,
}
#: The longest deadline accepted, in seconds (24 h): larger values are usually a unit
#: mistake (milliseconds written for seconds).
MAX_DEADLINE_SECONDS = 86400
DEFAULT_MAX_TURNS = 40
DEFAULT_REPAIR_ALLOWANCE = 2
DEFAULT_SPEC_INDEX = "docs/INDEX.md"
DEFAULT_DOCUMENTATION_PATHS = ("docs/**",)

#: The type of every error that leaves a model: ``ctx["problem"]`` is the final wording.
ERROR_TYPE = "pipeline_format"
#: Prefix of the ``loc`` parts that are tags of a union (dropped from field paths).
TAG = "\x01"
#: Prefix of a ``loc`` part that names another file (a scenario file): the rest of the
#: ``loc`` is a path inside that file.
SOURCE = "\x00"

_SLUG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB_CHARS = set("*?[")
_HOST_RE = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?)*")



# --------------------------------------------------------------------------------------
# Wording


def kind(value) -> str:
    """Describe a YAML value's type for a message ("the string 'x'", "a list", ...)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__} ({value!r})"


def type_hint(value) -> str:
    """How to write a scalar YAML read as something else as a string."""
    if isinstance(value, bool):
        return " (YAML reads unquoted yes/no/true/false/on/off as booleans: quote it)"
    if isinstance(value, (int, float)):
        return " (quote it)"
    return ""


def key_path(prefix: str, key) -> str:
    """``prefix.key`` (or ``prefix["key"]`` when the key would be ambiguous in a path)."""
    key = str(key)
    part = key if re.fullmatch(r"[A-Za-z0-9_.\-/*?]+", key) else '"' + key.replace('"', '\\"') + '"'
    if not prefix:
        return part
    return f"{prefix}.{part}" if part[0] != '"' else f"{prefix}[{part}]"


def unknown_key_problem(key: str, allowed) -> str:
    """The problem with an unknown key: the allowed keys, and the closest one."""
    allowed = list(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown key '{key}'{hint}; allowed keys: {', '.join(allowed)}"


def _fail(problem: str):
    """Refuse a value from a validator with the final wording of the problem."""
    raise PydanticCustomError(ERROR_TYPE, "{problem}", {"problem": problem})


def _errors(title: str, records) -> ValidationError:
    """A ValidationError of several worded problems: ``records`` are ``(loc, problem)`` or
    ``(loc, problem, input)``. Raised inside a validator, pydantic prefixes each ``loc``
    with the location of the value being validated."""
    details = []
    for record in records:
        loc, problem = record[0], record[1]
        details.append(InitErrorDetails(type=PydanticCustomError(ERROR_TYPE, "{problem}", {"problem": problem}),
                                        loc=tuple(loc), input=record[2] if len(record) > 2 else None))
    return ValidationError.from_exception_data(title, details)


@dataclass(frozen=True)
class Say:
    """How the problems of one field are worded (put it in the field's ``Annotated``).

    ``required``: a required field is absent, null or blank. ``type``: the field has the
    wrong type (``{kind}`` and ``{hint}`` are filled; the default depends on the type).
    ``empty``: a list or mapping that must not be empty is. ``item``: an item of a list, or
    a value of a mapping, has the wrong type. ``key``: a key of a mapping is not a string.
    ``unit`` follows numbers and bounds. ``choices``: the names of a ``Literal``.
    ``first_only``: only the first problem with an item is reported; ``per_entry``: only
    the first problem with an entry of a mapping (its key, else its value).
    ``key_at_field``: a key that is not a string is reported at the field itself.
    """

    required: str = "is required"
    type: Optional[str] = None
    empty: Optional[str] = None
    item: Optional[str] = None
    key: str = "keys must be strings, got {kind}"
    unit: str = ""
    choices: tuple = ()
    first_only: bool = False
    per_entry: bool = False
    key_at_field: bool = False

    def problem(self, error_type: str, value, ctx: dict, rest: tuple, required: bool, message: str = "") -> str:
        """Word one pydantic error of this field; ``rest`` is its ``loc`` below the field;
        ``message`` is pydantic's own wording, used for an error type not worded here."""
        if not rest and required and (value is None or error_type in ("missing", "blank")):
            return self.required
        if error_type == ERROR_TYPE:
            return ctx["problem"]
        if error_type in ("missing", "blank"):
            return self.required
        fill = {"kind": kind(value), "hint": type_hint(value)}
        if rest:
            if rest[-1] == "[key]":
                return self.key.format(**fill)
            return (self.item or "must be a string, got {kind}{hint}").format(**fill)
        if error_type == "too_short":
            return self.empty or self.required
        if error_type == "literal_error":
            names = ", ".join(self.choices)
            if not isinstance(value, str):
                return f"must be one of {names}, got {fill['kind']}"
            return self.required if value == "" else f"{value!r} is not one of {names}"
        if self.type:
            return self.type.format(**fill)
        unit = f" {self.unit}" if self.unit else ""
        if error_type == "string_type":
            return "must be a string, got {kind}{hint}".format(**fill)
        if error_type == "int_type":
            return f"must be a whole number, got {fill['kind']}"
        if error_type == "float_type":
            return f"must be a number{' of ' + self.unit if self.unit else ''}, got {fill['kind']}"
        if error_type == "bool_type":
            return f"must be true or false, got {fill['kind']}"
        if error_type == "finite_number":
            return "must be a finite number"
        if error_type == "greater_than":
            return f"must be greater than {_bound(ctx['gt'])}{unit}, got {float(value):g}"
        if error_type == "greater_than_equal":
            return f"must be at least {_bound(ctx['ge'])}{unit}"
        if error_type == "less_than_equal":
            return f"must be at most {_bound(ctx['le'])}{unit}"
        return message


def _bound(value) -> str:
    """A bound as the file writes it (``86400``, not ``86400.0``)."""
    return str(int(value)) if float(value).is_integer() else str(value)


_PLAIN = Say()


def _say(info) -> Say:
    return next((m for m in info.metadata if isinstance(m, Say)), _PLAIN)


def _none_is_default(value):
    """Before-validator: an explicit null means the field's default."""
    if value is None:
        raise PydanticUseDefault()
    return value


NoneIsDefault = BeforeValidator(_none_is_default)


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
    """One gitignore pattern of a path list (engine/globs.py states the dialect), checked by
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
#: (engine/agents/claude.py, codex.py, gemini.py, pi.py ``environment``).
ENGINE_ENV = ("HOME", "TMPDIR", "TMP", "TEMP", "PATH", "SHELL", "USER", "LOGNAME", "PWD",
              "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "NODE_OPTIONS",
              "NODE_PATH", "BASH_ENV", "ENV", "CODEX_HOME", "CLAUDE_CONFIG_DIR", "GEMINI_SANDBOX",
              "PI_CODING_AGENT_DIR", "PI_OFFLINE", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA",
              "GOOGLE_APPLICATION_CREDENTIALS", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
ENGINE_ENV_PREFIXES = ("CP_", "GEMINI_CLI_", "XDG_", "GIT_", "SSL_CERT", "REQUESTS_CA", "NODE_EXTRA_CA")


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


# --------------------------------------------------------------------------------------
# The base of every level


class _Level(BaseModel):
    """A mapping level of the document (strict, unknown keys refused), whose errors leave
    it worded and in reading order.

    Class settings: ``what`` names the level in "must be a mapping (...)"; ``report_order``
    orders the fields' problems when it differs from the declaration order (which is the
    order of "allowed keys"); ``data_order`` orders them as the keys are written instead;
    ``any_key_unknown`` reports a key that is not a string as an unknown key (else: "keys
    must be strings" at the level).
    Subclasses add rules that span fields with :meth:`_rules` (run on the fields that
    passed, also when others failed) and work that needs the whole level valid with
    :meth:`_finish`.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=False)

    what: ClassVar[str] = ""
    report_order: ClassVar[tuple] = ()
    data_order: ClassVar[bool] = False
    any_key_unknown: ClassVar[bool] = False

    @classmethod
    def _not_a_mapping(cls, value) -> str:
        return f"must be a mapping ({cls.what}), got {kind(value)}"

    @classmethod
    def _unknown_key(cls, key: str) -> str:
        return unknown_key_problem(key, cls.model_fields)

    @classmethod
    def _rules(cls, data: dict, values: dict, failed: set, context: dict) -> list:
        """Problems of rules spanning fields: ``(loc, problem, after)``; ``after`` puts the
        problem after every field's problems, else it sits at its field."""
        return []

    def _finish(self, context: dict) -> list:
        """Work needing the whole level valid; returns ``(loc, problem)`` problems."""
        return []

    @classmethod
    def _record(cls, error: dict):
        """``(loc, problem, group)`` of one pydantic error of this level."""
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith(TAG)))
        error_type, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
        if not loc:
            return (), ctx["problem"] if error_type == ERROR_TYPE else cls._not_a_mapping(value), 0
        if len(loc) == 1 and error_type == "extra_forbidden":
            return loc, cls._unknown_key(str(loc[0])), 1
        if len(loc) == 1 and error_type == "invalid_key":
            if cls.any_key_unknown:
                return (str(value),), cls._unknown_key(str(value)), 1
            return (), f"keys must be strings, got {kind(value)}", 1
        field = cls.model_fields[loc[0]]
        say = _say(field)
        return loc, say.problem(error_type, value, ctx, loc[1:], field.is_required(), error.get("msg", "")), 2

    @classmethod
    def _partial(cls, data: dict, failed: set) -> dict:
        """The cleaned values of the fields that passed, when others did not."""
        values = {}
        for name, field in cls.model_fields.items():
            if name in failed:
                continue
            if name not in data:
                values[name] = field.get_default(call_default_factory=True)
                continue
            try:
                values[name] = _field_adapter(cls, name).validate_python(data[name])
            except Exception:  # noqa: BLE001 - a field that does not pass alone is left out
                values[name] = field.get_default(call_default_factory=True)
        return values

    @model_validator(mode="wrap")
    @classmethod
    def _speak(cls, data, handler, info: ValidationInfo):
        context = info.context or {}
        records, model = [], None
        try:
            model = handler(data)
        except ValidationError as exc:
            records = _first_problems(cls, [cls._record(e) for e in exc.errors()])
        if isinstance(data, dict):
            failed = {r[0][0] for r in records if r[0] and r[2] == 2}
            values = dict(model) if model is not None else cls._partial(data, failed)
            records += [(loc, problem, 0 if not loc else 3 if after else 2)
                        for loc, problem, after in cls._rules(data, values, failed, context)]
        order = list(cls.report_order or cls.model_fields)
        keys = list(data) if isinstance(data, dict) else []

        def rank(record):
            loc, _, group = record
            if group != 2:
                return (group, 0)
            if cls.data_order:
                return (2, keys.index(loc[0]) if loc[0] in keys else len(keys))
            return (2, order.index(loc[0]) if loc[0] in order else len(order))

        records.sort(key=rank)
        if model is not None and not records:
            records = [(loc, problem, 3) for loc, problem in model._finish(context)]
        if records:
            raise _errors(cls.__name__, [(loc, problem, data if not loc else None) for loc, problem, _ in records])
        return model


@cache
def _field_adapter(model: type, name: str) -> TypeAdapter:
    field = model.model_fields[name]
    annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return TypeAdapter(annotation, config=ConfigDict(strict=True))


def _first_problems(model: type, records: list) -> list:
    """Drop the problems a field reports once: after the first with an item
    (``first_only``); an entry of a mapping whose key is refused (``per_entry``) reports
    only that."""
    def say(loc):
        return _say(model.model_fields[loc[0]]) if len(loc) > 1 and loc[0] in model.model_fields else _PLAIN

    bad_keys = {r[0][:2] for r in records if r[2] == 2 and len(r[0]) == 3 and r[0][-1] == "[key]" and say(r[0]).per_entry}
    kept, seen = [], set()
    for record in records:
        loc = record[0]
        if record[2] == 2 and len(loc) > 1:
            field_say = say(loc)
            if field_say.per_entry and loc[:2] in bad_keys and not (len(loc) == 3 and loc[-1] == "[key]"):
                continue
            if field_say.first_only:
                if loc[:1] in seen:
                    continue
                seen.add(loc[:1])
            if field_say.key_at_field and len(loc) == 3 and loc[-1] == "[key]":
                record = (loc[:1], *record[1:])
        kept.append(record)
    return kept


# --------------------------------------------------------------------------------------
# Scenarios (the scripted test adapter)


class Usage(_Level):
    """Usage a scripted step reports (tokens and cost); every key optional."""

    what: ClassVar[str] = "usage"

    input_tokens: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    output_tokens: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    cached_tokens: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    reasoning_tokens: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    cost_usd: Annotated[Optional[_seconds(ge=0)], Say(unit="USD")] = None


class Step(_Level):
    """One step of a scripted scenario: what the test adapter does for one attempt."""

    what: ClassVar[str] = "a step"

    write: Annotated[dict[FilePath, StrictStr], NoneIsDefault,
                     Say(type="must be a mapping of paths to file contents, got {kind}",
                         item="file content must be a string, got {kind}{hint}", per_entry=True)] = {}
    delete: Annotated[list[FilePath], NoneIsDefault, _PATHS] = []
    print: Annotated[Optional[Lines], Say(type="must be a string or a list of strings, got {kind}", first_only=True)] = None
    sleep: Annotated[Optional[_seconds(ge=0)], Say(unit="seconds")] = None
    exit: Optional[Annotated[StrictInt, Field(ge=0, le=255)]] = None
    run: Annotated[Optional[Annotated[list[Argument], Field(min_length=1)]],
                   Say(type="must be a list of arguments, got {kind}",
                       empty="must list the command and its arguments (argv), e.g. ['sh', '-c', 'sleep 600']")] = None
    verdict: Annotated[dict[StrictStr, Any], NoneIsDefault, Say(type="must be a mapping of verdict fields, got {kind}",
                                                               per_entry=True)] = {}
    final_message: Optional[Annotated[StrictStr, AfterValidator(_unstripped_text_or_none)]] = None
    usage: Optional[Usage] = None


_STEPS = Say(type="must be a list of steps (one per attempt), got {kind}", empty="must list at least one step")
Steps = Annotated[list[Step], Field(min_length=1), _STEPS]


class Operations(_Level):
    """A scenario's steps for one stage, per operation."""

    what: ClassVar[str] = "operations"
    data_order: ClassVar[bool] = True
    any_key_unknown: ClassVar[bool] = True

    implement: Steps = None
    review: Steps = None
    repair: Steps = None
    document: Steps = None

    @classmethod
    def _not_a_mapping(cls, value) -> str:
        return f"must be a mapping of operations ({', '.join(OPERATIONS)}) to steps, got {kind(value)}"

    @classmethod
    def _unknown_key(cls, key: str) -> str:
        return f"unknown operation '{key}'; operations are: {', '.join(OPERATIONS)}"


def _scenario_stage_key(value, info: ValidationInfo):
    stage_keys = (info.context or {}).get("scenario_stage_keys")
    if stage_keys is not None and value not in stage_keys:
        _fail(f"names no stage of this pipeline; its stages are: {', '.join(stage_keys) or 'none'}")
    return value


class Scenario(_Level):
    """A scripted test adapter's scenario: ``default``: [step], ``stages``: {stage key:
    {operation: [step]}}, and a ``description``. Stage keys are checked against the
    context's ``scenario_stage_keys`` when it names them (any YAML key is compared; one
    that is not a string names no stage)."""

    any_key_unknown: ClassVar[bool] = True

    description: Annotated[StrictStr, Say(type="must be a string, got {kind}")] = ""
    default: Annotated[Optional[Annotated[list[Step], Field(min_length=1)]], _STEPS] = None
    stages: Annotated[Optional[dict[Annotated[Any, AfterValidator(_scenario_stage_key)], Operations]],
                      Say(type="must be a mapping of stage keys to operations, got {kind}")] = None

    @classmethod
    def _not_a_mapping(cls, value) -> str:
        return f"a scenario must be a mapping with 'default' and/or 'stages', got {kind(value)}"

    @classmethod
    def check(cls, data, stage_keys=None) -> dict:
        """Validate a scenario document; return a deep copy of it as written.

        Raises ValidationError (worded errors, see the module docstring)."""
        cls.model_validate(data, context={"scenario_stage_keys": None if stage_keys is None else list(stage_keys)})
        return copy.deepcopy(data)


# --------------------------------------------------------------------------------------
# Gates and stages


class Gate(_Level):
    """One gate written as a mapping: a named shell command, optionally with a deadline and
    the hosts it may reach (none otherwise)."""

    what: ClassVar[str] = "a gate"

    name: Annotated[StrictStr, NoneIsDefault, AfterValidator(_slug("gate name", required=False))] = ""
    command: Annotated[StrictStr, AfterValidator(_required_text),
                       Say(required="is required (the shell command whose exit status decides the gate)")]
    deadline: Annotated[Optional[Deadline], Say(unit="seconds")] = None
    network_allow: Hosts = []


def _command(value: str) -> str:
    value = value.strip()
    if not value:
        _fail("is an empty command")
    return value


def _gate_names(value, handler):
    """Gate names are unique in one list; a gate without a name is ``gate-<n>`` (its place)."""
    try:
        gates, problems = handler(value), []
    except ValidationError as exc:
        if any(not e["loc"] for e in exc.errors()):
            raise
        gates = None
        problems = [(tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith(TAG))),
                     e["ctx"]["problem"] if e["type"] == ERROR_TYPE else
                     f"must be a command string or a mapping with name, command, deadline; got {kind(e['input'])}", 0)
                    for e in exc.errors()]
    seen = {}
    for index, raw in enumerate(value or []):
        name = f"gate-{index + 1}"
        if isinstance(raw, dict):
            name = raw.get("name") if raw.get("name") is not None else name
            name = name.strip() if isinstance(name, str) else name
        elif not isinstance(raw, str):
            continue
        if isinstance(name, str) and name in seen:
            where = (index, "name") if isinstance(raw, dict) and "name" in raw else (index,)
            problems.append((where, f"duplicate gate name '{name}' in this list (also [{seen[name]}])", 1))
        elif isinstance(name, str):
            seen[name] = index
    if problems:
        problems.sort(key=lambda p: (p[0][0], p[2]))
        raise _errors("gates", [p[:2] for p in problems])
    return gates


Gates = Annotated[
    list[_union(Annotated[StrictStr, AfterValidator(_command)], Gate, "dict")],
    WrapValidator(_gate_names),
    NoneIsDefault,
    Say(type="must be a list of gates (commands, or mappings with name, command, deadline), got {kind}"),
]


def gate_definitions(gates: list) -> list[dict]:
    """The normalized gates of a validated list: ``{"name", "command", "deadline"}`` plus
    ``"network_allow"`` when the gate names hosts."""
    result = []
    for index, gate in enumerate(gates):
        name = f"gate-{index + 1}"
        if isinstance(gate, str):
            result.append({"name": name, "command": gate, "deadline": None})
            continue
        item = {"name": gate.name or name, "command": gate.command, "deadline": gate.deadline}
        if gate.network_allow:  # no network at all unless the gate names its hosts
            item["network_allow"] = list(gate.network_allow)
        result.append(item)
    return result


def _place(data, context_key: str, context: dict):
    """Where ``data`` (this very object) sits in the context's raw list or mapping."""
    container = context.get(context_key)
    pairs = container.items() if isinstance(container, dict) else enumerate(container or [])
    return next((place for place, item in pairs if item is data), None)


class Stage(_Level):
    """One stage. Its rules that look at other stages (unique keys, ``depends_on`` naming
    earlier stages) read the context of :meth:`Pipeline.check`."""

    what: ClassVar[str] = "a stage"

    key: Annotated[StrictStr, AfterValidator(_slug("stage key", required=True)),
                   Say(required="is required (a short unique name, e.g. 'word-count')")]
    title: Text = ""
    requirement: Annotated[StrictStr, AfterValidator(_required_text),
                           Say(required="is required (what the stage must achieve, in words the agent reads)")]
    scope: Annotated[list[Pattern], Field(min_length=1), AfterValidator(_unique),
                     Say(required="is required: list at least one glob of the files this stage may change (e.g. 'src/**')",
                         type=_PATTERNS.type, item=_PATTERNS.item)]
    docs: Annotated[list[FilePath], NoneIsDefault, AfterValidator(_unique), _PATHS] = []
    depends_on: Annotated[list[Annotated[StrictStr, AfterValidator(_slug_item("stage key"))]], NoneIsDefault,
                          AfterValidator(_unique),
                          Say(type="must be a list of stage keys, got {kind}", item="must be a stage key, got {kind}{hint}")] = []
    repair_allowance: Annotated[StrictInt, Field(ge=0), NoneIsDefault] = DEFAULT_REPAIR_ALLOWANCE
    human_gate: Annotated[StrictBool, NoneIsDefault] = False
    gates: Gates = []

    @classmethod
    def _rules(cls, data, values, failed, context):
        problems = []
        index = _place(data, "raw_stages", context)
        written = context.get("written_stage_keys", [])
        if index is not None and "depends_on" not in failed:
            earlier = [k for k in written[:index] if isinstance(k, str)]
            later = [k for k in written if isinstance(k, str)]
            own = data.get("key")
            for at, key in enumerate(values.get("depends_on") or []):
                if key == own:
                    problems.append((("depends_on", at), f"'{key}' is this stage itself; a stage cannot depend on itself", False))
                elif key in earlier:
                    continue
                elif key in later:
                    problems.append((("depends_on", at), f"'{key}' is a later stage; depends_on may only name earlier "
                                     "stages, which keeps the stage order free of cycles", False))
                else:
                    problems.append((("depends_on", at), f"no stage has the key '{key}' (earlier stages: "
                                     f"{', '.join(earlier) or 'none'})", False))
        if "gates" not in failed and data.get("gates") in (None, []) and not context.get("have_baseline", True):
            problems.append((("gates",), "the stage has no gates and the pipeline has no baseline_checks: "
                             "every stage must be verified by at least one command", True))
        key = data.get("key")
        if index is not None and isinstance(key, str) and key in written[:index]:
            problems.append((("key",), f"duplicate stage key '{key}' (also stages[{written.index(key)}])", True))
        return problems

    def definition(self) -> dict:
        """The normalized stage (every key present, the title defaults to the key)."""
        return {
            "key": self.key,
            "title": self.title or self.key,
            "requirement": self.requirement,
            "scope": list(self.scope),
            "docs": list(self.docs),
            "depends_on": list(self.depends_on),
            "gates": gate_definitions(self.gates),
            "repair_allowance": self.repair_allowance,
            "human_gate": self.human_gate,
        }


# --------------------------------------------------------------------------------------
# Profiles and roles (the extra_args allow-list: engine/agents/cli_options.py)


_ScenarioRef = Annotated[
    Optional[Annotated[_union(StrictStr, dict, "dict"), AfterValidator(_strip_ref)]],
    Say(type="must be a path to a scenario file or an inline mapping, got {kind}"),
]


class Profile(_Level):
    """One agent profile. Its key in ``profiles`` is its name (read from the context of
    :meth:`Pipeline.check`); a scripted profile's scenario file is read, checked and inlined
    when the profile is otherwise valid (the context's ``base_dir`` and ``read_yaml``)."""

    what: ClassVar[str] = "a profile"

    name: Text = ""
    adapter: Annotated[Literal[ADAPTERS], Say(required=f"is required (one of {', '.join(ADAPTERS)})", choices=ADAPTERS)]
    model: NullableText = None
    max_turns: Annotated[StrictInt, Field(ge=1, le=1000), NoneIsDefault] = DEFAULT_MAX_TURNS
    executable: Annotated[NullableText, AfterValidator(_executable)] = None
    extra_args: Annotated[list[Argument], NoneIsDefault, _ARGUMENTS] = []
    env: Annotated[dict[Annotated[StrictStr, AfterValidator(_profile_env_name)], StrictStr], NoneIsDefault,
                   Say(type="must be a mapping of environment variables to strings, got {kind}", per_entry=True)] = {}
    base_url: Annotated[NullableText, AfterValidator(_url)] = None
    api_key_env: Annotated[NullableText, AfterValidator(_key_env_name)] = None
    network_allow: Hosts = []
    scenario: _ScenarioRef = None
    scenario_path: NullableText = None
    scripted_endpoint: _ScenarioRef = None
    scripted_endpoint_path: NullableText = None
    description: Text = ""

    @classmethod
    def _rules(cls, data, values, failed, context):
        problems = []
        key = _place(data, "raw_profiles", context)
        if isinstance(key, str):
            try:
                check_slug(key, "profile name")
            except PydanticCustomError as exc:
                problems.append(((), exc.context["problem"], False))
            name = values.get("name")
            if "name" not in failed and name and name != key:
                problems.append((("name",), f"'{name}' differs from the profile's key '{key}' (omit name, or make them equal)", False))
        adapter, scenario = values.get("adapter"), values.get("scenario")
        if adapter == "scripted" and not scenario and "scenario" not in failed:
            problems.append((("scenario",), "a scripted profile needs a scenario (a path to a scenario file, e.g. "
                             "scenarios/example.yaml, or an inline mapping)", True))
        if adapter in CLI_ADAPTERS and scenario:
            problems.append((("scenario",), f"only scripted profiles take a scenario; this profile's adapter is '{adapter}'", True))
        for name, value in (values.get("env") or {}).items():
            if gateways.GATEWAY_URL_NAMES.search(name):  # a gateway URL too (engine/agents/gateways.py): as base_url
                try:
                    _url(value)
                except PydanticCustomError as exc:
                    problems.append((("env", name), exc.context["problem"], True))
            elif "://" in str(value) and "@" in urllib.parse.urlsplit(str(value).strip()).netloc:
                problems.append((("env", name), "holds a URL with a user part before '@' (user@host, "
                                 "user:password@host): credentials never go in a definition", True))
        if values.get("base_url") and adapter not in CLI_ADAPTERS:
            problems.append((("base_url",), f"only {', '.join(CLI_ADAPTERS)} profiles talk to a model endpoint", True))
        if values.get("api_key_env") and adapter not in CLI_ADAPTERS:
            problems.append((("api_key_env",), f"only {', '.join(CLI_ADAPTERS)} profiles send an API key", True))
        elif values.get("api_key_env") and not {"base_url", "env"} & set(failed):
            problems += [((field,), why, True) for field, why in gateways.of_profile(values)[1] if field == "api_key_env"]
        if values.get("scripted_endpoint") and adapter not in CLI_ADAPTERS:
            problems.append((("scripted_endpoint",), f"only {', '.join(CLI_ADAPTERS)} profiles talk to a model endpoint", True))
        if values.get("scenario_path") and not isinstance(scenario, dict):
            problems.append((("scenario_path",), "is only kept beside an inline scenario mapping; give the file path as 'scenario'", True))
        if adapter in _PERMISSION_ARGS and "extra_args" not in failed:
            plays = tuple(role for role, names in (context.get("raw_roles") or {}).items()
                          if key is not None and (names == key or (isinstance(names, list) and key in names)))
            problems += [(("extra_args", index), problem, True)
                         for index, problem in _refused_args(adapter, values.get("extra_args") or [], plays)]
        return problems

    def _finish(self, context):
        problems = []
        if self.adapter == "scripted":
            if isinstance(self.scenario, str):
                self.scenario_path = self.scenario
                self.scenario, problems = _scenario_file(self.scenario, context)
            else:
                try:
                    self.scenario = Scenario.check(self.scenario, context.get("scenario_stage_keys"))
                except ValidationError as exc:
                    problems = [(("scenario", *e["loc"]), e["ctx"]["problem"]) for e in exc.errors()]
            if problems:
                return problems
        if self.scripted_endpoint is not None:
            if isinstance(self.scripted_endpoint, str):
                self.scripted_endpoint_path = self.scripted_endpoint
                self.scripted_endpoint, problems = _endpoint_file(self.scripted_endpoint, context)
            else:
                self.scripted_endpoint, problems = _endpoint(self.scripted_endpoint, ("scripted_endpoint",))
        return problems

    def definition(self, key: str) -> dict:
        """The normalized profile named ``key``."""
        return {
            "name": key,
            "adapter": self.adapter,
            "model": self.model,
            "max_turns": self.max_turns,
            "executable": self.executable,
            "extra_args": list(self.extra_args),
            "env": dict(self.env),
            "base_url": self.base_url,
            "api_key_env": self.api_key_env,
            "network_allow": list(self.network_allow),
            "scenario": self.scenario,
            "scenario_path": self.scenario_path,
            "scripted_endpoint": self.scripted_endpoint,
            "scripted_endpoint_path": self.scripted_endpoint_path,
            "description": self.description,
        }


def _beside_pipeline(ref: str, base_dir, what: str) -> tuple[Path | None, str]:
    """``(the file, "")`` for a file a pipeline file names beside itself, or ``(None, why not)``:
    only a pipeline loaded from a file (``base_dir``, load_pipelines) names files, each a relative
    path inside that file's folder. A definition saved in the web editor or sent to the API names
    none, and no path leads elsewhere (``/``, ``..``, a link out): a pipeline author must not read
    the server's files into a definition or an error message."""
    if base_dir is None:
        return None, (f"the {what} file '{ref}' cannot be resolved here (no pipeline file directory): only a pipeline file loaded with "
                      "load_pipelines names files (beside it); give the scenario inline as a mapping")
    folder = Path(base_dir).resolve()
    target = (folder / ref).resolve()
    if os.path.isabs(ref) or not target.is_relative_to(folder):
        return None, (f"the {what} file '{ref}' is not inside the pipeline file's folder ({folder}): name it "
                      "relative to that folder, without leaving it")
    if not target.is_file():
        why = "is not a file" if target.exists() else "does not exist"
        return None, f"{what} file '{ref}' {why} (looked for {target})"
    return target, ""


def _scenario_file(ref: str, context: dict):
    """Read and check a scenario file named relative to the pipeline file's directory:
    ``(scenario or None, problems)``; problems inside the file name it (``SOURCE``)."""
    target, problem = _beside_pipeline(ref, context.get("base_dir"), "scenario")
    if problem:
        return None, [(("scenario",), problem)]
    inside = ("scenario", SOURCE + str(target))
    data, problems = context["read_yaml"](target)
    if problems:
        return None, [(inside + (field,), problem) for field, problem in problems]
    if data is None:
        return None, [(inside + ("(document)",), "the scenario file is empty; a scenario is a mapping with "
                       "'default' and/or 'stages'")]
    try:
        return Scenario.check(data, context.get("scenario_stage_keys")), []
    except ValidationError as exc:
        return None, [(inside + tuple(e["loc"]), e["ctx"]["problem"]) for e in exc.errors()]


def _endpoint(data, loc: tuple):
    """A scripted model endpoint's scenario: ``{default: TURNS, stages: {key: {operation: TURNS}}}``
    where TURNS is the endpoint's own scenario, checked by engine/scripted_endpoint.py
    (``normalize_scenario``). Returns ``(a deep copy or None, problems)``."""

    if not isinstance(data, dict):
        return None, [(loc, f"must be a mapping with 'default' and/or 'stages', got {kind(data)}")]
    unknown = sorted(set(data) - {"default", "stages"})
    if unknown:
        return None, [(loc, f"unknown keys {unknown}; allowed: default, stages")]
    problems = []
    for where, turns in [("default", data.get("default"))] + [
            (f"stages.{k}.{op}", t) for k, ops in (data.get("stages") or {}).items() for op, t in (ops or {}).items()]:
        if turns is None:
            continue
        if where != "default" and where.rsplit(".", 1)[1] not in OPERATIONS:
            problems.append((loc + (where,), f"unknown operation; operations are {', '.join(OPERATIONS)}"))
            continue
        try:
            normalize_scenario(turns)
        except ScenarioError as exc:
            problems.append((loc + (where,), str(exc)))
    return (None if problems else copy.deepcopy(data)), problems


def _endpoint_file(ref: str, context: dict):
    """Read a scripted endpoint scenario file named relative to the pipeline file's directory."""
    if "\x00" in ref:
        return None, [(("scripted_endpoint",), "must not contain NUL characters")]
    target, problem = _beside_pipeline(ref, context.get("base_dir"), "scripted endpoint")
    if problem:
        return None, [(("scripted_endpoint",), problem)]
    inside = ("scripted_endpoint", SOURCE + str(target))
    data, problems = context["read_yaml"](target)
    if problems:
        return None, [(inside + (field,), problem) for field, problem in problems]
    return _endpoint(data, inside)


def _named_profile(value, info: ValidationInfo):
    """A role's profile must be defined (checked only when the pipeline defines profiles:
    otherwise that is the problem, reported at ``profiles``). None (a role left out) passes."""
    if value is None:
        return value
    profiles = (info.context or {}).get("profile_names") or []
    names = value if isinstance(value, list) else [value]
    for name in names:
        if profiles and name not in profiles:
            _fail(f"no profile named '{name}'; profiles defined: {', '.join(profiles)}")
    return value


def _reviewers(value):
    """One profile name, or a list of distinct names (several reviewers, all must pass), or None
    (no review: written ``reviewer: null``)."""
    if value is None:
        return value
    if isinstance(value, list):
        if not value:
            _fail("is an empty list: name at least one profile that reviews, or write null for no review")
        if len(set(value)) != len(value):
            _fail("names a profile twice; each reviewer is a different profile")
        return value
    if not value.strip():
        _fail("is blank: name the profile that reviews (read-only), a list of profiles, or write null for no review")
    return value


class Roles(_Level):
    """Which profile plays each role (names defined in ``profiles``)."""

    what: ClassVar[str] = "roles: implementer, reviewer, documenter"

    implementer: Annotated[StrictStr, AfterValidator(_required_text), AfterValidator(_named_profile),
                           Say(required="is required (the profile that implements and repairs)")]
    # reviewer and documenter may be null (written out: an absent key is still an error, so a typo
    # never turns a review off): the stage's review or documentation step is then not run
    reviewer: Annotated[Optional[Lines], AfterValidator(_reviewers), AfterValidator(_named_profile),
                        Say(required="is required (the profile that reviews, read-only; or a list of profiles, "
                                     "all of which must pass; or null for no review)",
                            type="must be a string, a list of strings or null (no review), got {kind}",
                            first_only=True)]
    documenter: Annotated[Optional[StrictStr], AfterValidator(_optional_required_text),
                          AfterValidator(_named_profile),
                          Say(required="is required (the profile that updates the documentation; or null for no "
                                       "documentation step)",
                              type="must be a string (a profile name) or null (no documentation step), got {kind}")]

    def definition(self) -> dict:
        reviewer = self.reviewer[0] if isinstance(self.reviewer, list) and len(self.reviewer) == 1 else self.reviewer
        return {"implementer": self.implementer, "reviewer": reviewer, "documenter": self.documenter}


_Tokens = Optional[Annotated[StrictInt, Field(ge=1)]]
_Dollars = Annotated[Optional[_seconds(gt=0)], Say(unit="USD")]


class SpendCaps(_Level):
    """The model spend of one stage, or of one attempt, checked by its model gateway before each call
    (engine/model_gateway/meter.py); absent means uncapped at that level."""

    what: ClassVar[str] = "spend caps: max_tokens, max_cost_usd"

    max_tokens: _Tokens = None
    max_cost_usd: _Dollars = None


class Budgets(_Level):
    """Run-wide limits, and the model spend of each stage and attempt; absent means unlimited."""

    what: ClassVar[str] = "budgets"

    max_active_seconds: Annotated[Optional[_seconds(gt=0)], Say(unit="seconds")] = None
    max_attempts: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    max_tokens: _Tokens = None
    max_cost_usd: _Dollars = None
    stage: Annotated[SpendCaps, NoneIsDefault] = Field(default_factory=SpendCaps)
    attempt: Annotated[SpendCaps, NoneIsDefault] = Field(default_factory=SpendCaps)


def _under_operator(name: str):
    """A pipeline's limit: at most the operator's (engine/limits.py ``operator_limits``): a pipeline lowers it."""
    def check(value: Optional[int]) -> Optional[int]:
        ours = getattr(limits.operator_limits(), name)
        if value is not None and value > ours:
            _fail(f"{value} is above the operator's limit of {ours} ({limits.SETTINGS[name]}): a pipeline may "
                  "lower a limit, never raise it")
        return value
    return AfterValidator(check)


class AttemptLimits(_Level):
    """Each attempt's and gate's limits, lowered from the operator's (engine/limits.py); absent: the operator's."""

    what: ClassVar[str] = "limits"

    max_processes: Annotated[Optional[Annotated[StrictInt, Field(ge=1)]], _under_operator("max_processes")] = None
    max_memory_mb: Annotated[Optional[Annotated[StrictInt, Field(ge=16)]], _under_operator("max_memory_mb")] = None
    max_write_mb: Annotated[Optional[Annotated[StrictInt, Field(ge=1)]], _under_operator("max_write_mb")] = None
    max_output_mb: Annotated[Optional[Annotated[StrictInt, Field(ge=1)]], _under_operator("max_output_mb")] = None


_DeadlineField = Annotated[Deadline, NoneIsDefault, Say(unit="seconds")]


class Deadlines(_Level):
    """Per-operation process deadlines in seconds."""

    what: ClassVar[str] = "deadlines in seconds"

    implement: _DeadlineField = DEFAULT_DEADLINES["implement"]
    review: _DeadlineField = DEFAULT_DEADLINES["review"]
    repair: _DeadlineField = DEFAULT_DEADLINES["repair"]
    document: _DeadlineField = DEFAULT_DEADLINES["document"]
    gate: _DeadlineField = DEFAULT_DEADLINES["gate"]


class Stall(_Level):
    """When an attempt's model gateway stops it as a loop (engine/model_gateway/meter.py ``LoopWatch``)."""

    what: ClassVar[str] = "stall detection: repeated_calls, idle_turns, idle_minutes"

    repeated_calls: Optional[Annotated[StrictInt, Field(ge=2)]] = DEFAULT_REPEATED_CALLS
    idle_turns: Optional[Annotated[StrictInt, Field(ge=2)]] = DEFAULT_IDLE_TURNS
    idle_minutes: Annotated[Optional[_seconds(gt=0)], Say(unit="minutes")] = DEFAULT_IDLE_MINUTES


# --------------------------------------------------------------------------------------
# The setup step (engine/steps/setup.py, engine/environments.py)

#: The setup step's deadline when it names none, in seconds.
DEFAULT_SETUP_DEADLINE = 1800.0


def _keep_item(value: str) -> str:
    """A worktree folder the setup makes and the environment keeps (``node_modules``): a repository
    path, never the repository's git metadata."""
    value = _file_item(value.rstrip("/") if isinstance(value, str) and value.strip("/") else value)
    if any(part.lower() == ".git" for part in value.split("/")):
        _fail("names git metadata; keep names folders the setup makes (such as node_modules)")
    return value


class Setup(_Level):
    """The setup step: commands run once per environment (per repository and cache key) before the
    first stage, with the operator's package registries as their only network, writing the
    environment that every agent and gate then sees read-only."""

    what: ClassVar[str] = "setup: commands, cache_key, keep, deadline"

    commands: Annotated[list[Annotated[StrictStr, AfterValidator(_command)]], Field(min_length=1),
                        Say(required="is required (the shell commands that install the repository's dependencies)",
                            type="must be a list of shell commands, got {kind}",
                            empty="must list at least one command", item="must be a command string, got {kind}")]
    cache_key: Annotated[list[FilePath], NoneIsDefault, AfterValidator(_unique), _PATHS] = []
    keep: Annotated[list[Annotated[StrictStr, AfterValidator(_keep_item)]], NoneIsDefault, AfterValidator(_unique),
                    _PATHS] = []
    deadline: Annotated[Optional[Deadline], Say(unit="seconds")] = None

    def definition(self) -> dict:
        return {"commands": list(self.commands), "cache_key": list(self.cache_key), "keep": list(self.keep),
                "deadline": self.deadline or DEFAULT_SETUP_DEADLINE}


# --------------------------------------------------------------------------------------
# The pipeline


def _format_version(value: int) -> int:
    if value != FORMAT_VERSION:
        _fail(f"unsupported format version {value}; this engine reads format {FORMAT_VERSION}")
    return value


class Pipeline(_Level):
    """A pipeline document (the top level). Fields are declared in the order the
    "allowed keys" message lists them; problems are reported in ``report_order``."""

    report_order: ClassVar[tuple] = (
        "format", "name", "description", "master_plan", "spec_index", "protected_paths",
        "documentation_paths", "exclude", "setup", "baseline_checks", "stages", "profiles", "roles",
        "budgets", "deadlines", "limits", "stall",
    )

    format: Annotated[StrictInt, NoneIsDefault, AfterValidator(_format_version)] = FORMAT_VERSION
    name: Annotated[StrictStr, AfterValidator(_slug("pipeline name", required=True)),
                    Say(required="is required (a short name, e.g. 'textstats')")]
    description: Text = ""
    master_plan: Optional[Annotated[StrictStr, AfterValidator(_path_field("the master plan's repository-relative path"))]] = None
    spec_index: Optional[Annotated[StrictStr, AfterValidator(
        _path_field("the specification index's repository-relative path"))]] = DEFAULT_SPEC_INDEX
    protected_paths: Patterns = []
    documentation_paths: Patterns = list(DEFAULT_DOCUMENTATION_PATHS)
    exclude: Annotated[list[ExcludePattern], NoneIsDefault, AfterValidator(_unique), _PATTERNS] = []
    setup: Optional[Setup] = None
    baseline_checks: Gates = []
    budgets: Annotated[Budgets, NoneIsDefault] = Field(default_factory=Budgets)
    deadlines: Annotated[Deadlines, NoneIsDefault] = Field(default_factory=Deadlines)
    limits: Annotated[AttemptLimits, NoneIsDefault] = Field(default_factory=AttemptLimits)
    stall: Annotated[Stall, NoneIsDefault] = Field(default_factory=Stall)
    roles: Annotated[Roles, Say(required="is required: name the profile for each of implementer, reviewer, documenter")]
    profiles: Annotated[dict[StrictStr, Profile], Field(min_length=1),
                        Say(required="is required: define at least one agent profile",
                            type="must be a mapping of profile names to profiles, got {kind}",
                            empty="must define at least one agent profile",
                            key="profile names must be strings, got {kind}", per_entry=True, key_at_field=True)]
    stages: Annotated[list[Stage], Field(min_length=1),
                      Say(required="is required: list at least one stage", type="must be a list of stages, got {kind}",
                          empty="must list at least one stage")]

    @classmethod
    def _not_a_mapping(cls, value) -> str:
        if value is None:
            return "the document is empty; a pipeline is a mapping with name, roles, profiles and stages"
        return f"the top level must be a mapping with name, roles, profiles and stages, got {kind(value)}"

    @classmethod
    def check(cls, data, *, base_dir=None, read_yaml=None) -> "Pipeline":
        """Validate a parsed pipeline document.

        The rules that span levels read a context taken from the document as written: the
        stage keys (unique, ``depends_on``, a scenario's stages), the profile names (roles),
        whether there are baseline checks (a stage without gates). ``base_dir`` resolves the
        scenario files of scripted profiles, read with ``read_yaml(path) -> (data,
        [(field, problem)])``.

        Returns the validated model; raises ValidationError (worded errors whose ``loc`` is
        the field path, see the module docstring).
        """
        if isinstance(data, dict):
            data = dict(data)
            # each stage and profile its own object, so that each finds its place in the context
            if isinstance(data.get("stages"), list):
                data["stages"] = [dict(s) if isinstance(s, dict) else s for s in data["stages"]]
            if isinstance(data.get("profiles"), dict):
                data["profiles"] = {k: dict(p) if isinstance(p, dict) else p for k, p in data["profiles"].items()}
        stages = data.get("stages") if isinstance(data, dict) and isinstance(data.get("stages"), list) else []
        profiles = data.get("profiles") if isinstance(data, dict) and isinstance(data.get("profiles"), dict) else {}
        written = [s.get("key") if isinstance(s, dict) else None for s in stages]
        context = {
            "raw_stages": stages,
            "written_stage_keys": written,
            "scenario_stage_keys": [k for k in written if isinstance(k, str)],
            "raw_profiles": profiles,
            "raw_roles": data.get("roles") if isinstance(data, dict) and isinstance(data.get("roles"), dict) else {},
            "profile_names": [k for k in profiles if isinstance(k, str)],
            "have_baseline": bool(data.get("baseline_checks")) if isinstance(data, dict) else False,
            "base_dir": base_dir,
            "read_yaml": read_yaml,
        }
        return cls.model_validate(data, context=context)

    def definition(self) -> dict:
        """The normalized definition (docs/pipeline-format.md, "The normalized definition")."""
        return {
            "format": self.format,
            "name": self.name,
            "description": self.description,
            "master_plan": self.master_plan,
            "spec_index": self.spec_index,
            "protected_paths": list(self.protected_paths),
            "documentation_paths": list(self.documentation_paths),
            "exclude": list(self.exclude),
            "setup": self.setup.definition() if self.setup is not None else None,
            "baseline_checks": gate_definitions(self.baseline_checks),
            "budgets": self.budgets.model_dump(),
            "deadlines": self.deadlines.model_dump(),
            "limits": self.limits.model_dump(),
            "stall": self.stall.model_dump(),
            "roles": self.roles.definition(),
            "profiles": {key: profile.definition(key) for key, profile in self.profiles.items()},
            "stages": [stage.definition() for stage in self.stages],
        }
