"""The format's constants and its wording: how pydantic's errors are said (``Say``), as the engine words them."""
import difflib
import re
from dataclasses import dataclass
from typing import Optional

from pydantic import (
    BeforeValidator,
    ValidationError,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, PydanticUseDefault

from ...agents.registry import CLIS

#: The only format version this module reads (top-level key ``format``).
FORMAT_VERSION = 1
#: Adapters of real agent CLIs (engine/agents/registry.py): each talks to a model endpoint.
CLI_ADAPTERS = tuple(CLIS)
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
