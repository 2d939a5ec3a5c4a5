"""The pipeline file format: YAML in, one normalized plain dict out, or a refusal.

A pipeline file (see docs/pipeline-format.md, and pipelines/example.yaml) names the stages
a run takes, the gates that verify each stage, and the agent profiles that do the work.
This module turns such a file into a *normalized definition*: a plain dict in which every
key is present and every default is filled, so that the rest of the engine (models,
operations, the frozen snapshot of a run) never has to guess. A file with any problem is
refused whole: every problem found is collected and raised together in one
:class:`PipelineFormatError`, each named as ``(file, field, problem)``.

Field validation uses Django forms, one form class per level of the document (pipeline,
stage, gate, profile, roles, budgets, deadlines, scenario step, usage). The forms only check
values; walking the nested structure, refusing unknown keys and the rules that span levels
(stage order, role names, scenario stage keys) happen in the functions below. This module
imports no Django models: it needs configured Django settings only because Django forms do
(any Django process has them; a bare script gets minimal settings, see ``_ensure_settings``).

Public API: :func:`load_file`, :func:`validate`, :func:`validate_scenario`,
:class:`PipelineFormatError`, and the constants below.
"""
from __future__ import annotations

import copy
import difflib
import ipaddress
import math
import os
import re
import urllib.parse
from pathlib import Path

import yaml
from django import forms
from django.core.exceptions import ValidationError

from . import globs
from .agents.netproxy import is_internal_host, split_host_port

__all__ = [
    "ADAPTERS",
    "DEFAULT_DEADLINES",
    "FORMAT_VERSION",
    "OPERATIONS",
    "ROLES",
    "PipelineFormatError",
    "load_file",
    "validate",
    "validate_scenario",
]

#: The only format version this module reads (top-level key ``format``).
FORMAT_VERSION = 1
#: Adapter names a profile may use. ``scripted`` is the test adapter (simulated runs).
ADAPTERS = ("claude-code", "codex", "scripted")
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

_SLUG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB_CHARS = set("*?[")

# Command-line options an adapter sets itself. Permission and sandbox options decide what a
# role may do (reviewers read-only, writers inside their scope), so a profile cannot add
# them: the engine chooses them per role (docs/agents.md). The others carry the prompt,
# model and output the adapter parses. Checked against Claude Code 2.1.197 and Codex CLI
# 0.171.0 `--help` (tests/test_claude_adapter.py and tests/test_codex_adapter.py run the real binaries).
_PERMISSION_ARGS = {
    "claude-code": (
        "--dangerously-skip-permissions",
        "--allow-dangerously-skip-permissions",
        "--permission-mode",
        "--allowedTools",
        "--allowed-tools",
        "--disallowedTools",
        "--disallowed-tools",
        "--tools",
        "--add-dir",
        "--settings",
        "--setting-sources",
    ),
    "codex": (
        "-s",
        "--sandbox",
        "--dangerously-bypass-approvals-and-sandbox",
        "--yolo",
        "--full-auto",
        "-p",  # --profile: a config profile can set sandbox and approval
        "--profile",
        "-a",
        "--ask-for-approval",
        "--add-dir",
        "-C",
        "--cd",
    ),
}
_ENGINE_ARGS = {
    "claude-code": {
        "-p": "the prompt is passed by the engine",
        "--print": "the prompt is passed by the engine",
        "--output-format": "the engine parses the output format it asks for",
        "--input-format": "the prompt is passed by the engine",
        "--max-turns": "use the profile's max_turns field",
        "--model": "use the profile's model field",
        "--session-id": "each attempt starts a fresh session",
        "--resume": "each attempt starts a fresh session",
        "-r": "each attempt starts a fresh session",
        "--continue": "each attempt starts a fresh session",
        "-c": "each attempt starts a fresh session",
    },
    "codex": {
        "-m": "use the profile's model field",
        "--model": "use the profile's model field",
        "--json": "the engine parses the output format it asks for",
        "-o": "the engine reads the final message itself",
        "--output-last-message": "the engine reads the final message itself",
    },
}
# Codex `-c key=value` overrides that touch permissions.
_CODEX_PERMISSION_CONFIG = ("sandbox", "approval")


class PipelineFormatError(Exception):
    """A pipeline (or scenario) document was refused.

    Attributes:
        errors: every problem found, as ``(file, field, problem)`` tuples of strings.
            ``file`` is the path given to :func:`load_file` (or the ``source`` given to
            :func:`validate`); for a problem inside a scenario file it is that file.
            ``field`` is a dotted path such as ``stages[1].gates[0].command`` or
            ``profiles.scripted.adapter``; ``(yaml)`` for a YAML syntax error, ``(file)``
            when the file cannot be read and ``(document)`` for the top level itself.

    ``str(error)`` is one line per problem: ``<file>: <field>: <problem>``.
    """

    def __init__(self, errors):
        self.errors: list[tuple[str, str, str]] = [tuple(e) for e in errors]
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{file}: {field}: {problem}" for file, field, problem in self.errors)


# --------------------------------------------------------------------------------------
# Small helpers


def _ensure_settings() -> None:
    """Give Django minimal settings when nothing configured it (a bare script).

    Django forms need settings (form renderer, translations). In any Django process
    (manage.py, the worker, pytest-django) they are configured already and this does
    nothing.
    """
    from django.conf import settings

    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        settings.configure(USE_I18N=False)


def _kind(value) -> str:
    """Describe a YAML value's type for a message ("a string", "a list", ...)."""
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


def _key_path(prefix: str, key) -> str:
    """``prefix.key`` (or ``prefix["key"]`` when the key would be ambiguous in a path)."""
    key = str(key)
    part = key if re.fullmatch(r"[A-Za-z0-9_.\-/*?]+", key) else '"' + key.replace('"', '\\"') + '"'
    if not prefix:
        return part
    return f"{prefix}.{part}" if part[0] != '"' else f"{prefix}[{part}]"


def _unknown_key_problem(key: str, allowed) -> str:
    allowed = list(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown key '{key}'{hint}; allowed keys: {', '.join(allowed)}"


class _Problem(ValidationError):
    """A ValidationError that belongs to a part of its field (``at`` is e.g. ``[2]``)."""

    def __init__(self, message: str, at: str = ""):
        super().__init__(message, code="invalid")
        self.at = at


class _Report:
    """Collects ``(file, field, problem)`` tuples; children share the list."""

    def __init__(self, source: str, errors: list | None = None):
        self.source = source
        self.errors: list[tuple[str, str, str]] = [] if errors is None else errors

    def add(self, field: str, problem: str) -> None:
        self.errors.append((self.source, field or "(document)", problem))

    def for_source(self, source: str) -> "_Report":
        return _Report(source, self.errors)


# --------------------------------------------------------------------------------------
# Form fields that take YAML values (not HTML form strings) and refuse wrong types


def _type_hint(value) -> str:
    if isinstance(value, bool):
        return " (YAML reads unquoted yes/no/true/false/on/off as booleans: quote it)"
    if isinstance(value, (int, float)):
        return " (quote it)"
    return ""


class TextField(forms.CharField):
    """A string; nothing else is converted. ``nullable`` makes an absent value None."""

    def __init__(self, *, required=False, nullable=False, strip=True, required_message=None, **kwargs):
        messages = {"required": required_message or "is required"}
        messages.update(kwargs.pop("error_messages", {}))
        messages.setdefault("max_length", "must be at most %(limit_value)d characters long")
        super().__init__(
            required=required,
            strip=strip,
            empty_value=None if nullable else "",
            error_messages=messages,
            **kwargs,
        )

    def to_python(self, value):
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"must be a string, got {_kind(value)}{_type_hint(value)}")
        if isinstance(value, str) and "\x00" in value:
            raise ValidationError("must not contain NUL characters")
        return super().to_python(value)


def _check_slug(value: str, what: str = "a name") -> str:
    if len(value) > 100:
        raise ValidationError(f"is {len(value)} characters long; a {what} has at most 100")
    if not _SLUG_RE.fullmatch(value):
        raise ValidationError(
            f"{value!r} is not a valid {what}: use 1-100 letters, digits, '-', '_' or '.', "
            "starting with a letter or digit"
        )
    return value


class SlugField(TextField):
    """A name: 1-100 of ``A-Z a-z 0-9 - _ .``, starting with a letter or digit."""

    def __init__(self, *, what="name", **kwargs):
        self.what = what
        super().__init__(**kwargs)

    def validate(self, value):
        super().validate(value)
        if value:
            _check_slug(value, self.what)


def _check_relative(value, *, pattern: bool, what: str) -> str:
    """Validate one repository-relative path or glob; return it with any leading ``./``.

    Raises ValidationError when the value is not a one-line string, is absolute
    (``/...``, ``~...``, ``C:...``), uses backslashes, contains a ``..`` segment, or
    (for ``pattern=False``) contains glob characters.
    """
    if not isinstance(value, str):
        raise ValidationError(f"must be a string ({what}), got {_kind(value)}{_type_hint(value)}")
    value = value.strip()
    if not value:
        raise ValidationError(f"must not be empty ({what})")
    if "\x00" in value or "\n" in value or "\r" in value:
        raise ValidationError(f"must be a single line ({what})")
    if value.startswith("/") or value.startswith("~") or re.match(r"[A-Za-z]:", value):
        raise ValidationError(f"{value!r} must be relative to the repository root (no leading '/' or '~')")
    if "\\" in value:
        raise ValidationError(f"{value!r} must use '/' as the separator, not '\\'")
    if ".." in value.split("/"):
        raise ValidationError(f"{value!r} must not contain '..' segments (it must stay inside the repository)")
    while value.startswith("./"):
        value = value[2:].lstrip("/")
    if not value or value == ".":
        raise ValidationError(f"must name something inside the repository ({what})")
    if not pattern and _GLOB_CHARS & set(value):
        raise ValidationError(f"{value!r} must be a file path, not a pattern")
    return value


class RelativePathField(TextField):
    """A repository-relative file path (``pattern=False``) or glob (``pattern=True``)."""

    def __init__(self, *, pattern=False, what="a repository-relative path", **kwargs):
        self.pattern = pattern
        self.what = what
        super().__init__(**kwargs)

    def to_python(self, value):
        value = super().to_python(value)
        if value in (None, ""):
            return value
        return _check_relative(value, pattern=self.pattern, what=self.what)


class IntField(forms.IntegerField):
    """A whole number written as a YAML integer (no strings, booleans or fractions)."""

    def __init__(self, *, required=False, min_value=None, max_value=None, **kwargs):
        messages = {
            "required": "is required",
            "min_value": "must be at least %(limit_value)s",
            "max_value": "must be at most %(limit_value)s",
        }
        super().__init__(
            required=required, min_value=min_value, max_value=max_value, error_messages=messages, **kwargs
        )

    def to_python(self, value):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(f"must be a whole number, got {_kind(value)}")
        return value


class NumberField(forms.FloatField):
    """A finite number (int or float in YAML) returned as float.

    ``positive`` requires > 0; ``min_value``/``max_value`` are inclusive bounds.
    """

    def __init__(self, *, required=False, positive=False, min_value=None, max_value=None, unit="", **kwargs):
        self.positive = positive
        self.unit = unit
        messages = {
            "required": "is required",
            "invalid": "must be a finite number",
            "min_value": "must be at least %(limit_value)s" + (f" {unit}" if unit else ""),
            "max_value": "must be at most %(limit_value)s" + (f" {unit}" if unit else ""),
        }
        super().__init__(
            required=required, min_value=min_value, max_value=max_value, error_messages=messages, **kwargs
        )

    def to_python(self, value):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValidationError(f"must be a number{' of ' + self.unit if self.unit else ''}, got {_kind(value)}")
        return float(value)

    def validate(self, value):
        super().validate(value)
        if value is not None and math.isfinite(value) and self.positive and value <= 0:
            raise ValidationError(f"must be greater than 0{' ' + self.unit if self.unit else ''}, got {value:g}")


class BoolField(forms.Field):
    """``true`` or ``false``; None when absent."""

    def to_python(self, value):
        if value is None or isinstance(value, bool):
            return value
        raise ValidationError(f"must be true or false, got {_kind(value)}")


class StrictChoiceField(forms.ChoiceField):
    """One of fixed string choices, named in the message when refused."""

    def __init__(self, *, choices, **kwargs):
        names = ", ".join(c for c in choices)
        super().__init__(
            choices=[(c, c) for c in choices],
            error_messages={
                "required": f"is required (one of {names})",
                "invalid_choice": f"%(value)r is not one of {names}",
            },
            **kwargs,
        )

    def to_python(self, value):
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"must be one of {', '.join(str(c) for c, _ in self.choices)}, got {_kind(value)}")
        return super().to_python(value)


class ListField(forms.Field):
    """A YAML list whose items are each checked by ``item(value) -> cleaned``.

    A problem with one item is reported at ``<field>[<index>]``. ``unique`` refuses an
    item listed twice. Absent (or null) means the empty list.
    """

    def __init__(self, item, *, noun="item", unique=False, required_message=None, **kwargs):
        self.item = item
        self.noun = noun
        self.unique = unique
        kwargs.setdefault("required", False)
        super().__init__(error_messages={"required": required_message or f"must list at least one {noun}"}, **kwargs)

    def to_python(self, value):
        if value is None:
            return []
        if not isinstance(value, list):
            raise ValidationError(f"must be a list of {self.noun}s, got {_kind(value)}")
        cleaned, problems, seen = [], [], {}
        for index, raw in enumerate(value):
            try:
                item = self.item(raw)
            except ValidationError as exc:
                problems.append(_Problem(" ".join(exc.messages), at=f"[{index}]"))
                continue
            if self.unique and item in seen:
                problems.append(_Problem(f"{item!r} is listed twice (also [{seen[item]}])", at=f"[{index}]"))
                continue
            seen.setdefault(item, index)
            cleaned.append(item)
        if problems:
            raise ValidationError(problems)
        return cleaned


class MappingField(forms.Field):
    """A YAML mapping; ``key(k)`` and ``value(v)`` check each entry (None: anything).

    A problem with one entry is reported at ``<field>.<key>``.
    """

    def __init__(self, *, key=None, value=None, noun="entries", **kwargs):
        self.key_check = key
        self.value_check = value
        self.noun = noun
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_python(self, value):
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValidationError(f"must be a mapping of {self.noun}, got {_kind(value)}")
        cleaned, problems = {}, []
        for raw_key, raw_value in value.items():
            at = _key_path("", raw_key)
            at = "." + at if not at.startswith('"') else f"[{at}]"
            try:
                if not isinstance(raw_key, str):
                    raise ValidationError(f"keys must be strings, got {_kind(raw_key)}")
                new_key = self.key_check(raw_key) if self.key_check else raw_key
                new_value = self.value_check(raw_value) if self.value_check else copy.deepcopy(raw_value)
            except ValidationError as exc:
                problems.append(_Problem(" ".join(exc.messages), at=at))
                continue
            cleaned[new_key] = new_value
        if problems:
            raise ValidationError(problems)
        return cleaned


class ScenarioRefField(forms.Field):
    """A scripted profile's scenario: a path (string) to a YAML file, or an inline mapping."""

    def to_python(self, value):
        if value is None or isinstance(value, dict):
            return value
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return None
            return value
        raise ValidationError(f"must be a path to a scenario file or an inline mapping, got {_kind(value)}")


class PrintField(forms.Field):
    """A string or a list of strings (lines an agent prints)."""

    def to_python(self, value):
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            for index, line in enumerate(value):
                if not isinstance(line, str):
                    raise _Problem(f"must be a string, got {_kind(line)}{_type_hint(line)}", at=f"[{index}]")
            return list(value)
        raise ValidationError(f"must be a string or a list of strings, got {_kind(value)}")


# Item checks for ListField / MappingField


def _string_item(value) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"must be a string, got {_kind(value)}{_type_hint(value)}")
    return value


def _nonempty_string_item(value) -> str:
    value = _string_item(value)
    if not value:
        raise ValidationError("must not be empty")
    return value


def _slug_item(what):
    def check(value):
        if not isinstance(value, str):
            raise ValidationError(f"must be a {what}, got {_kind(value)}{_type_hint(value)}")
        return _check_slug(value.strip(), what)

    return check


def _pattern(value, *, negation: bool) -> str:
    """One gitignore pattern of a path list (engine/globs.py states the dialect), checked by
    compiling it as the engine matches it. A leading ``./`` anchors it at the repository root,
    as ``/`` does."""
    if not isinstance(value, str):
        raise ValidationError(f"must be a string (a gitignore pattern), got {_kind(value)}{_type_hint(value)}")
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
        raise ValidationError(str(exc)) from None


def _glob_item(value) -> str:
    return _pattern(value, negation=True)


def _file_item(value) -> str:
    return _check_relative(value, pattern=False, what="a repository-relative file path")


def _exclude_item(value) -> str:
    try:
        return _pattern(value, negation=False)
    except ValidationError as exc:
        if "negation" in str(exc.messages[0]):
            raise ValidationError(f"{value!r}: negation ('!') is not supported; exclude patterns only "
                                  f"add to the engine's exclusions") from None
        raise


_HOST_RE = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?)*")


def _host_item(value) -> str:
    """A network allow-list entry: ``host``, ``*.suffix``, ``host:port``, ``1.2.3.4:port`` or ``[::1]:port``."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"must be a host name, optionally with :port, got {_kind(value)}{_type_hint(value)}")
    text = value.strip().lower()
    try:
        host, _port = split_host_port(text)
    except ValueError as exc:
        raise ValidationError(f"{value!r}: {exc}") from None
    if _port is None and is_internal_host(host):
        raise ValidationError(f"{value!r} is a loopback or private address: name its port ({host}:PORT), so that "
                              f"the agent reaches that one service and no other")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_RE.fullmatch(host):
            raise ValidationError(f"{value!r} is not a host name (letters, digits, '-' and '.', or '*.' before a "
                                  f"domain), an IP address, or either with ':port'") from None
    return text


def _url_value(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"must be an http:// or https:// URL, got {_kind(value)}{_type_hint(value)}")
    parts = urllib.parse.urlsplit(value.strip())
    try:
        parts.port
    except ValueError:
        raise ValidationError(f"{value!r} has a port that is not a number from 1 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(f"{value!r} is not an http:// or https:// URL with a host")
    return value.strip()


def _env_name(value: str) -> str:
    if not _ENV_NAME_RE.fullmatch(value):
        raise ValidationError(f"{value!r} is not a valid environment variable name")
    return value


def _env_value(value) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"must be a string, got {_kind(value)}{_type_hint(value)}")
    return value


def _write_content(value) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"file content must be a string, got {_kind(value)}{_type_hint(value)}")
    return value


# --------------------------------------------------------------------------------------
# Forms: one per level of the document


class _LevelForm(forms.Form):
    """Base of the per-level forms.

    ``nested`` names keys of this level that are validated outside the form (sub-levels);
    ``defaults`` gives the value used when a key is absent or null, except for the keys in
    ``null_means_none``, where an explicit null stays None.
    """

    nested: tuple[str, ...] = ()
    defaults: dict = {}
    null_means_none: tuple[str, ...] = ()

    def __init__(self, data, **context):
        self.context = context
        super().__init__(data=data)


class PipelineForm(_LevelForm):
    """Top-level scalar fields of a pipeline."""

    format = IntField()
    name = SlugField(required=True, what="pipeline name", required_message="is required (a short name, e.g. 'textstats')")
    description = TextField()
    master_plan = RelativePathField(nullable=True, what="the master plan's repository-relative path")
    spec_index = RelativePathField(nullable=True, what="the specification index's repository-relative path")
    protected_paths = ListField(_glob_item, noun="pattern", unique=True)
    documentation_paths = ListField(_glob_item, noun="pattern", unique=True)
    exclude = ListField(_exclude_item, noun="pattern", unique=True)

    nested = ("baseline_checks", "budgets", "deadlines", "roles", "profiles", "stages")
    defaults = {
        "format": FORMAT_VERSION,
        "spec_index": DEFAULT_SPEC_INDEX,
        "documentation_paths": list(DEFAULT_DOCUMENTATION_PATHS),
    }
    null_means_none = ("spec_index", "master_plan")

    def clean_format(self):
        value = self.cleaned_data.get("format")
        if value is not None and value != FORMAT_VERSION:
            raise ValidationError(f"unsupported format version {value}; this engine reads format {FORMAT_VERSION}")
        return value


class GateForm(_LevelForm):
    """One gate written as a mapping: a named shell command, optionally with a deadline."""

    name = SlugField(what="gate name")
    command = TextField(required=True, required_message="is required (the shell command whose exit status decides the gate)")
    deadline = NumberField(positive=True, max_value=MAX_DEADLINE_SECONDS, unit="seconds")
    network_allow = ListField(_host_item, noun="host", unique=True)


class StageForm(_LevelForm):
    """Scalar fields of one stage. Context: ``earlier`` (keys of the stages before it,
    in order) and ``all_keys`` (every stage key written in the file)."""

    key = SlugField(required=True, what="stage key", required_message="is required (a short unique name, e.g. 'word-count')")
    title = TextField()
    requirement = TextField(required=True, required_message="is required (what the stage must achieve, in words the agent reads)")
    scope = ListField(
        _glob_item,
        noun="pattern",
        unique=True,
        required=True,
        required_message="is required: list at least one glob of the files this stage may change (e.g. 'src/**')",
    )
    docs = ListField(_file_item, noun="path", unique=True)
    depends_on = ListField(_slug_item("stage key"), noun="stage key", unique=True)
    repair_allowance = IntField(min_value=0)
    human_gate = BoolField(required=False)

    nested = ("gates",)
    defaults = {"repair_allowance": DEFAULT_REPAIR_ALLOWANCE, "human_gate": False}

    def clean_depends_on(self):
        keys = self.cleaned_data.get("depends_on") or []
        earlier = list(self.context.get("earlier", ()))
        all_keys = list(self.context.get("all_keys", ()))
        own = self.data.get("key")
        problems = []
        for index, key in enumerate(keys):
            if key == own:
                problems.append(_Problem(f"'{key}' is this stage itself; a stage cannot depend on itself", f"[{index}]"))
            elif key in earlier:
                continue
            elif key in all_keys:
                problems.append(
                    _Problem(
                        f"'{key}' is a later stage; depends_on may only name earlier stages, "
                        "which keeps the stage order free of cycles",
                        f"[{index}]",
                    )
                )
            else:
                names = ", ".join(earlier) or "none"
                problems.append(_Problem(f"no stage has the key '{key}' (earlier stages: {names})", f"[{index}]"))
        if problems:
            raise ValidationError(problems)
        return keys


class ProfileForm(_LevelForm):
    """One agent profile. Context: ``key`` (the profile's name in ``profiles``)."""

    name = TextField()
    adapter = StrictChoiceField(choices=ADAPTERS, required=True)
    model = TextField(nullable=True)
    max_turns = IntField(min_value=1, max_value=1000)
    executable = TextField(nullable=True)
    extra_args = ListField(_nonempty_string_item, noun="argument")
    env = MappingField(key=_env_name, value=_env_value, noun="environment variables to strings")
    base_url = TextField(nullable=True)
    network_allow = ListField(_host_item, noun="host", unique=True)
    scenario = ScenarioRefField(required=False)
    scenario_path = TextField(nullable=True)
    scripted_endpoint = ScenarioRefField(required=False)
    scripted_endpoint_path = TextField(nullable=True)
    description = TextField()

    defaults = {"max_turns": DEFAULT_MAX_TURNS}

    def clean_base_url(self):
        return _url_value(self.cleaned_data.get("base_url"))

    def clean_name(self):
        name = self.cleaned_data.get("name")
        key = self.context.get("key")
        if name and name != key:
            raise ValidationError(f"'{name}' differs from the profile's key '{key}' (omit name, or make them equal)")
        return key

    def clean(self):
        data = super().clean()
        adapter = data.get("adapter")
        scenario = data.get("scenario")
        if adapter == "scripted" and not scenario and "scenario" not in self.errors:
            self.add_error(
                "scenario",
                "a scripted profile needs a scenario (a path to a scenario file, e.g. scenarios/example.yaml, "
                "or an inline mapping)",
            )
        if adapter in ("claude-code", "codex") and scenario:
            self.add_error("scenario", f"only scripted profiles take a scenario; this profile's adapter is '{adapter}'")
        if data.get("scripted_endpoint") and adapter not in ("claude-code", "codex"):
            self.add_error("scripted_endpoint", "only claude-code and codex profiles talk to a model endpoint")
        if data.get("scenario_path") and not isinstance(scenario, dict):
            self.add_error("scenario_path", "is only kept beside an inline scenario mapping; give the file path as 'scenario'")
        if adapter in _PERMISSION_ARGS and "extra_args" not in self.errors:
            problems = _refused_args(adapter, data.get("extra_args") or [])
            if problems:
                self.add_error("extra_args", ValidationError(problems))
        return data


def _refused_args(adapter: str, args: list[str]) -> list[_Problem]:
    """Problems with extra_args that would weaken role boundaries or clash with the adapter."""
    problems = []
    for index, arg in enumerate(args):
        option = arg.split("=", 1)[0]
        if option in _PERMISSION_ARGS[adapter]:
            problems.append(
                _Problem(
                    f"'{option}' is refused: the engine chooses permission and sandbox options for each role "
                    "(reviewers read-only, writers inside their scope)",
                    f"[{index}]",
                )
            )
        elif option in _ENGINE_ARGS[adapter]:
            problems.append(_Problem(f"'{option}' is set by the adapter: {_ENGINE_ARGS[adapter][option]}", f"[{index}]"))
        elif adapter == "codex" and option in ("-c", "--config"):
            value = arg.split("=", 1)[1] if "=" in arg else (args[index + 1] if index + 1 < len(args) else "")
            if value.strip().lower().startswith(_CODEX_PERMISSION_CONFIG):
                problems.append(
                    _Problem(
                        f"'{option} {value}' is refused: sandbox and approval settings are chosen by the engine for each role",
                        f"[{index}]",
                    )
                )
    return problems


class RolesForm(_LevelForm):
    """Which profile plays each role. Context: ``profiles`` (the profile names defined)."""

    implementer = TextField(required=True, required_message="is required (the profile that implements and repairs)")
    reviewer = PrintField(required=True, error_messages={
        "required": "is required (the profile that reviews, read-only; or a list of profiles, all of which must pass)"})
    documenter = TextField(required=True, required_message="is required (the profile that updates the documentation)")

    def _profile(self, role):
        name = self.cleaned_data.get(role)
        profiles = list(self.context.get("profiles", ()))
        if name and self.context.get("check_names", True) and name not in profiles:
            raise ValidationError(f"no profile named '{name}'; profiles defined: {', '.join(profiles) or 'none'}")
        return name

    def clean_implementer(self):
        return self._profile("implementer")

    def clean_reviewer(self):
        """One profile name, or a list of distinct names (several reviewers, all must pass)."""
        value = self.cleaned_data.get("reviewer")
        if isinstance(value, list):
            if not value:
                raise ValidationError("must name at least one profile")
            if len(set(value)) != len(value):
                raise ValidationError("names a profile twice; each reviewer is a different profile")
            profiles = list(self.context.get("profiles", ()))
            for name in value:
                if self.context.get("check_names", True) and name not in profiles:
                    raise ValidationError(f"no profile named '{name}'; profiles defined: {', '.join(profiles) or 'none'}")
            return value if len(value) > 1 else value[0]
        if isinstance(value, str) and not value.strip():
            raise ValidationError("is required (the profile that reviews, read-only)")
        return self._profile("reviewer")

    def clean_documenter(self):
        return self._profile("documenter")


class BudgetsForm(_LevelForm):
    """Run-wide limits; absent means unlimited."""

    max_active_seconds = NumberField(positive=True, unit="seconds")
    max_attempts = IntField(min_value=1)
    max_cost_usd = NumberField(positive=True, unit="USD")


class DeadlinesForm(_LevelForm):
    """Per-operation process deadlines in seconds."""

    implement = NumberField(positive=True, max_value=MAX_DEADLINE_SECONDS, unit="seconds")
    review = NumberField(positive=True, max_value=MAX_DEADLINE_SECONDS, unit="seconds")
    repair = NumberField(positive=True, max_value=MAX_DEADLINE_SECONDS, unit="seconds")
    document = NumberField(positive=True, max_value=MAX_DEADLINE_SECONDS, unit="seconds")
    gate = NumberField(positive=True, max_value=MAX_DEADLINE_SECONDS, unit="seconds")

    defaults = dict(DEFAULT_DEADLINES)


class ScenarioStepForm(_LevelForm):
    """One step of a scripted scenario: what the test adapter does for one attempt."""

    write = MappingField(key=_file_item, value=_write_content, noun="paths to file contents")
    delete = ListField(_file_item, noun="path")
    print = PrintField(required=False)
    sleep = NumberField(min_value=0, unit="seconds")
    exit = IntField(min_value=0, max_value=255)
    run = ListField(_nonempty_string_item, noun="argument")
    verdict = MappingField(noun="verdict fields")
    final_message = TextField(nullable=True, strip=False)

    nested = ("usage",)

    def clean_run(self):
        value = self.cleaned_data.get("run")
        if "run" in self.data and self.data["run"] is not None and not value:
            raise ValidationError("must list the command and its arguments (argv), e.g. ['sh', '-c', 'sleep 600']")
        return value


class UsageForm(_LevelForm):
    """Usage a scripted step reports (tokens and cost)."""

    input_tokens = IntField(min_value=0)
    output_tokens = IntField(min_value=0)
    cached_tokens = IntField(min_value=0)
    reasoning_tokens = IntField(min_value=0)
    cost_usd = NumberField(min_value=0, unit="USD")


# --------------------------------------------------------------------------------------
# Walking the document


def _run_form(form_class, data, path: str, report: _Report, what: str, **context):
    """Validate one mapping level with ``form_class``.

    Refuses a non-mapping and unknown keys, fills ``defaults`` for absent keys, reports
    every form error at ``path.field[part]``. Returns the cleaned scalar fields, or None
    when anything at this level was refused (nested keys are left to the caller).
    """
    if not isinstance(data, dict):
        report.add(path, f"must be a mapping ({what}), got {_kind(data)}")
        return None
    ok = True
    allowed = list(form_class.base_fields) + list(form_class.nested)
    for key in data:
        if not isinstance(key, str):
            report.add(path, f"keys must be strings, got {_kind(key)}")
            ok = False
        elif key not in allowed:
            report.add(_key_path(path, key), _unknown_key_problem(key, allowed))
            ok = False
    values = {k: v for k, v in data.items() if k in form_class.base_fields}
    for key, default in form_class.defaults.items():
        if key not in values or (values[key] is None and key not in form_class.null_means_none):
            values[key] = copy.deepcopy(default)
    form = form_class(values, **context)
    if not form.is_valid():
        for field, errors in form.errors.as_data().items():
            for error in errors:
                at = getattr(error, "at", "")
                field_path = path if field == forms.forms.NON_FIELD_ERRORS else _key_path(path, field)
                report.add(field_path + at, " ".join(error.messages))
        return None
    return form.cleaned_data if ok else None


def _validate_gates(value, path: str, report: _Report) -> list | None:
    """Validate a list of gates (strings or mappings); None if any was refused."""
    if value is None:
        return []
    if not isinstance(value, list):
        report.add(path, f"must be a list of gates (commands, or mappings with name, command, deadline), got {_kind(value)}")
        return None
    gates, ok, seen = [], True, {}
    for index, raw in enumerate(value):
        item_path = f"{path}[{index}]"
        default_name = f"gate-{index + 1}"
        gate = None
        if isinstance(raw, str):
            name = default_name
            if not raw.strip():
                report.add(item_path, "is an empty command")
            else:
                gate = {"name": name, "command": raw.strip(), "deadline": None}
        elif isinstance(raw, dict):
            name = raw.get("name") if raw.get("name") is not None else default_name
            name = name.strip() if isinstance(name, str) else name
            cleaned = _run_form(GateForm, raw, item_path, report, "a gate")
            if cleaned is not None:
                gate = {"name": cleaned["name"] or default_name, "command": cleaned["command"], "deadline": cleaned["deadline"]}
                if cleaned.get("network_allow"):  # no network at all unless the gate names its hosts
                    gate["network_allow"] = cleaned["network_allow"]
        else:
            name = None
            report.add(item_path, f"must be a command string or a mapping with name, command, deadline; got {_kind(raw)}")
        if isinstance(name, str) and name in seen:
            where = f"{item_path}.name" if isinstance(raw, dict) and "name" in raw else item_path
            report.add(where, f"duplicate gate name '{name}' in this list (also [{seen[name]}])")
            gate = None
        elif isinstance(name, str):
            seen[name] = index
        if gate is None:
            ok = False
            continue
        gates.append(gate)
    return gates if ok else None


def _validate_stages(value, report: _Report, have_baseline: bool) -> list | None:
    """Validate the stage list: fields, unique keys, earlier-only depends_on, gates."""
    if value is None:
        report.add("stages", "is required: list at least one stage")
        return None
    if not isinstance(value, list):
        report.add("stages", f"must be a list of stages, got {_kind(value)}")
        return None
    if not value:
        report.add("stages", "must list at least one stage")
        return None
    written_keys = [raw.get("key") if isinstance(raw, dict) else None for raw in value]
    all_keys = [k for k in written_keys if isinstance(k, str)]
    stages, ok, seen = [], True, {}
    for index, raw in enumerate(value):
        path = f"stages[{index}]"
        earlier = [k for k in written_keys[:index] if isinstance(k, str)]
        cleaned = _run_form(StageForm, raw, path, report, "a stage", earlier=earlier, all_keys=all_keys)
        gates = _validate_gates(raw.get("gates") if isinstance(raw, dict) else None, f"{path}.gates", report)
        if isinstance(raw, dict) and gates is not None and not gates and not have_baseline:
            report.add(
                f"{path}.gates",
                "the stage has no gates and the pipeline has no baseline_checks: "
                "every stage must be verified by at least one command",
            )
            ok = False
        key = written_keys[index]
        if isinstance(key, str) and key in seen:
            report.add(f"{path}.key", f"duplicate stage key '{key}' (also stages[{seen[key]}])")
            ok = False
        elif isinstance(key, str):
            seen[key] = index
        if cleaned is None or gates is None:
            ok = False
            continue
        stages.append(
            {
                "key": cleaned["key"],
                "title": cleaned["title"] or cleaned["key"],
                "requirement": cleaned["requirement"],
                "scope": cleaned["scope"],
                "docs": cleaned["docs"],
                "depends_on": cleaned["depends_on"],
                "gates": gates,
                "repair_allowance": cleaned["repair_allowance"],
                "human_gate": cleaned["human_gate"],
            }
        )
    return stages if ok else None


def _validate_profiles(value, report: _Report, base_dir: Path | None, stage_keys: list[str]) -> dict | None:
    """Validate the profiles mapping, loading and checking scripted scenarios."""
    if value is None:
        report.add("profiles", "is required: define at least one agent profile")
        return None
    if not isinstance(value, dict):
        report.add("profiles", f"must be a mapping of profile names to profiles, got {_kind(value)}")
        return None
    if not value:
        report.add("profiles", "must define at least one agent profile")
        return None
    profiles, ok = {}, True
    for key, raw in value.items():
        path = _key_path("profiles", key)
        if not isinstance(key, str):
            report.add("profiles", f"profile names must be strings, got {_kind(key)}")
            ok = False
            continue
        try:
            _check_slug(key, "profile name")
        except ValidationError as exc:
            report.add(path, " ".join(exc.messages))
            ok = False
        cleaned = _run_form(ProfileForm, raw, path, report, "a profile", key=key)
        if cleaned is None:
            ok = False
            continue
        scenario, scenario_path = cleaned["scenario"], cleaned["scenario_path"]
        if cleaned["adapter"] == "scripted":
            if isinstance(scenario, str):
                scenario_path = scenario
                scenario = _load_scenario_file(scenario, f"{path}.scenario", report, base_dir, stage_keys)
            else:
                scenario = _validate_scenario(scenario, report, f"{path}.scenario", stage_keys)
            if scenario is None:
                ok = False
                continue
        endpoint, endpoint_path = cleaned["scripted_endpoint"], cleaned["scripted_endpoint_path"]
        if endpoint is not None:
            if isinstance(endpoint, str):
                endpoint_path = endpoint
                endpoint = _load_endpoint_file(endpoint, f"{path}.scripted_endpoint", report, base_dir)
            else:
                endpoint = _validate_endpoint(endpoint, report, f"{path}.scripted_endpoint")
            if endpoint is None:
                ok = False
                continue
        profiles[key] = {
            "name": key,
            "adapter": cleaned["adapter"],
            "model": cleaned["model"],
            "max_turns": cleaned["max_turns"],
            "executable": cleaned["executable"],
            "extra_args": cleaned["extra_args"],
            "env": cleaned["env"],
            "base_url": cleaned["base_url"],
            "network_allow": cleaned["network_allow"],
            "scenario": scenario,
            "scenario_path": scenario_path,
            "scripted_endpoint": endpoint,
            "scripted_endpoint_path": endpoint_path,
            "description": cleaned["description"],
        }
    return profiles if ok else None


def _validate_endpoint(data, report: _Report, field: str) -> dict | None:
    """A scripted model endpoint's scenario: ``{default: TURNS, stages: {key: {operation: TURNS}}}``
    where TURNS is the endpoint's own scenario (engine.scripted_endpoint.normalize_scenario)."""
    from .scripted_endpoint import ScenarioError, normalize_scenario

    if not isinstance(data, dict):
        report.add(field, f"must be a mapping with 'default' and/or 'stages', got {_kind(data)}")
        return None
    unknown = sorted(set(data) - {"default", "stages"})
    if unknown:
        report.add(field, f"unknown keys {unknown}; allowed: default, stages")
        return None
    ok = True
    for where, turns in [("default", data.get("default"))] + [
            (f"stages.{k}.{op}", t) for k, ops in (data.get("stages") or {}).items() for op, t in (ops or {}).items()]:
        if turns is None:
            continue
        if where != "default" and where.rsplit(".", 1)[1] not in OPERATIONS:
            report.add(f"{field}.{where}", f"unknown operation; operations are {', '.join(OPERATIONS)}")
            ok = False
            continue
        try:
            normalize_scenario(turns)
        except ScenarioError as exc:
            report.add(f"{field}.{where}", str(exc))
            ok = False
    return copy.deepcopy(data) if ok else None


def _load_endpoint_file(ref: str, field: str, report: _Report, base_dir: Path | None) -> dict | None:
    """Read a scripted endpoint scenario file named relative to the pipeline file's directory."""
    if base_dir is None:
        report.add(field, f"the file '{ref}' cannot be resolved here (no pipeline file directory)")
        return None
    target = (base_dir / ref).resolve()
    if not target.is_file():
        report.add(field, f"scripted endpoint file '{ref}' does not exist (looked for {target})")
        return None
    data = _read_yaml(target, report.for_source(str(target)))
    if data is None:
        return None
    return _validate_endpoint(data, report.for_source(str(target)), "")


def _load_scenario_file(ref: str, field: str, report: _Report, base_dir: Path | None, stage_keys) -> dict | None:
    """Read a scenario file named relative to the pipeline file's directory."""
    if base_dir is None and not os.path.isabs(ref):
        report.add(
            field,
            f"the scenario file '{ref}' cannot be resolved here (no pipeline file directory): "
            "load the pipeline with load_file, or give the scenario inline as a mapping",
        )
        return None
    target = Path(ref) if os.path.isabs(ref) else Path(base_dir) / ref
    if not target.is_file():
        why = "is not a file" if target.exists() else "does not exist"
        report.add(field, f"scenario file '{ref}' {why} (looked for {target})")
        return None
    scenario_report = report.for_source(str(target))
    data = _read_yaml(target, scenario_report)
    if data is _UNREADABLE:
        return None
    if data is None:
        scenario_report.add("(document)", "the scenario file is empty; a scenario is a mapping with 'default' and/or 'stages'")
        return None
    return _validate_scenario(data, scenario_report, "", stage_keys)


def _validate_steps(value, path: str, report: _Report) -> bool:
    if not isinstance(value, list):
        report.add(path, f"must be a list of steps (one per attempt), got {_kind(value)}")
        return False
    if not value:
        report.add(path, "must list at least one step")
        return False
    ok = True
    for index, step in enumerate(value):
        step_path = f"{path}[{index}]"
        if _run_form(ScenarioStepForm, step, step_path, report, "a step") is None:
            ok = False
        if isinstance(step, dict) and step.get("usage") is not None:
            if _run_form(UsageForm, step["usage"], f"{step_path}.usage", report, "usage") is None:
                ok = False
    return ok


def _validate_scenario(data, report: _Report, path: str, stage_keys) -> dict | None:
    """Validate a scenario document's shape; return a deep copy as written, or None."""
    if not isinstance(data, dict):
        report.add(path, f"a scenario must be a mapping with 'default' and/or 'stages', got {_kind(data)}")
        return None
    ok = True
    allowed = ("description", "default", "stages")
    for key in data:
        if key not in allowed:
            report.add(_key_path(path, key), _unknown_key_problem(str(key), allowed))
            ok = False
    if "description" in data and not isinstance(data["description"], str):
        report.add(_key_path(path, "description"), f"must be a string, got {_kind(data['description'])}")
        ok = False
    if data.get("default") is not None:
        ok = _validate_steps(data["default"], _key_path(path, "default"), report) and ok
    stages = data.get("stages")
    if stages is not None:
        stages_path = _key_path(path, "stages")
        if not isinstance(stages, dict):
            report.add(stages_path, f"must be a mapping of stage keys to operations, got {_kind(stages)}")
            ok = False
        else:
            for stage_key, operations in stages.items():
                stage_path = _key_path(stages_path, stage_key)
                if stage_keys is not None and stage_key not in stage_keys:
                    report.add(
                        stage_path,
                        f"names no stage of this pipeline; its stages are: {', '.join(stage_keys) or 'none'}",
                    )
                    ok = False
                if not isinstance(operations, dict):
                    report.add(stage_path, f"must be a mapping of operations ({', '.join(OPERATIONS)}) to steps, got {_kind(operations)}")
                    ok = False
                    continue
                for operation, steps in operations.items():
                    op_path = _key_path(stage_path, operation)
                    if operation not in OPERATIONS:
                        report.add(op_path, f"unknown operation '{operation}'; operations are: {', '.join(OPERATIONS)}")
                        ok = False
                        continue
                    ok = _validate_steps(steps, op_path, report) and ok
    return copy.deepcopy(data) if ok else None


# --------------------------------------------------------------------------------------
# YAML reading


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice in one mapping (PyYAML would
    silently keep the last one). Keys brought in by a merge (``<<``) may be overridden."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
        except TypeError:  # unhashable: the default constructor reports it
            continue
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

_UNREADABLE = object()


def _read_yaml(path: Path, report: _Report):
    """Parse one YAML file; on failure report ``(file)`` or ``(yaml)`` and return _UNREADABLE."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        report.add("(file)", "is not UTF-8 text")
        return _UNREADABLE
    except OSError as exc:
        report.add("(file)", f"cannot be read: {exc.strerror or exc}")
        return _UNREADABLE
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            problem = f"{problem} ({exc.context})"
        report.add("(yaml)", f"{where}{problem}")
        return _UNREADABLE
    except yaml.YAMLError as exc:
        report.add("(yaml)", str(exc))
        return _UNREADABLE


# --------------------------------------------------------------------------------------
# Public functions


def load_file(path) -> dict:
    """Read a pipeline YAML file and return its normalized definition.

    Args:
        path: the pipeline file (str or os.PathLike). Scenario files that scripted
            profiles name by a relative path are resolved against this file's directory,
            read, checked and inlined as the profile's ``scenario`` (``scenario_path``
            keeps the path as written).

    Returns:
        The normalized definition (see :func:`validate`).

    Raises:
        PipelineFormatError: with every problem found: an unreadable file (field
            ``(file)``), a YAML syntax error or a key written twice (field ``(yaml)``,
            problem starting ``line L, column C:``), an empty file or a non-mapping top
            level (field ``(document)``), and every rule violation of :func:`validate`.
    """
    _ensure_settings()
    source = os.fspath(path)
    report = _Report(source)
    data = _read_yaml(Path(source), report)
    if data is _UNREADABLE:
        raise PipelineFormatError(report.errors)
    return _validate(data, report, base_dir=Path(source).resolve().parent)


def _secret_env(path: str, value: str) -> bool:
    """True for a profile ``env`` entry whose name says it is a secret (PASSWORD, TOKEN, ...)."""
    from .redaction import secret_env_values

    parts = path.split(".")
    if len(parts) < 4 or parts[0] != "profiles" or parts[2] != "env":
        return False
    return bool(secret_env_values({parts[3]: value}))


#: Profile keys holding a simulation's script: made-up keys there are test material, not credentials.
_SIMULATION_KEYS = ("scenario", "scripted_endpoint")


def _refuse_credentials(value, path: str, report: _Report, credentials: bool = True) -> None:
    """Report every string of the definition that the database cannot store (a NUL character) or
    that looks like a credential (engine.redaction's patterns, a secret-named profile ``env``): a
    pipeline is saved and frozen into every run, so a pasted key would be stored three times
    (docs/field-cases.md C14). Scenarios and scripted endpoints are checked for NUL only."""
    from .redaction import redact_text

    if isinstance(value, dict):
        for key, item in value.items():
            simulation = key in _SIMULATION_KEYS and path.startswith("profiles.")
            _refuse_credentials(item, _key_path(path, key), report, credentials and not simulation)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_credentials(item, f"{path}[{index}]", report, credentials)
    elif isinstance(value, str) and "\x00" in value:
        report.add(path, "contains a NUL character (\\x00), which the database cannot store in a definition; "
                         "write binary test data with another byte")
    elif isinstance(value, str) and credentials and (redact_text(value)[1] or _secret_env(path, value)):
        report.add(path, "holds what looks like a credential (an API key, a token, a private key or a password "
                         "in a URL); credentials never go into a pipeline: the agent gets them from the "
                         "worker's environment")


def validate(data: object, source: str = "<input>", *, base_dir: str | os.PathLike | None = None) -> dict:
    """Validate an already-parsed pipeline document and return its normalized definition.

    Args:
        data: what yaml.safe_load returned (or an already normalized definition: the
            result of this function validates to itself).
        source: the name used as ``file`` in error tuples.
        base_dir: directory against which scenario paths of scripted profiles are
            resolved. When None, the directory of ``source`` is used if ``source`` is an
            existing file; otherwise a scenario must be given inline as a mapping.

    Returns:
        A new dict, every key present (durations in seconds as float, costs in USD)::

            {"format": 1, "name": str, "description": str,
             "master_plan": str | None, "spec_index": str | None,
             "protected_paths": [pattern], "documentation_paths": [pattern], "exclude": [pattern],
             "baseline_checks": [gate],
             "budgets": {"max_active_seconds": float | None, "max_attempts": int | None,
                         "max_cost_usd": float | None},
             "deadlines": {"implement": float, "review": float, "repair": float,
                           "document": float, "gate": float},
             "roles": {"implementer": str, "reviewer": str | [str], "documenter": str},
             "profiles": {name: {"name", "adapter", "model", "max_turns", "executable",
                                 "extra_args", "env", "base_url", "network_allow", "scenario", "scenario_path",
                                 "description"}},
             "stages": [{"key", "title", "requirement", "scope", "docs", "depends_on",
                         "gates", "repair_allowance", "human_gate"}]}

        where gate = ``{"name": str, "command": str, "deadline": float | None}`` plus
        ``"network_allow": [host]`` when the gate names hosts it may reach (else it has no network).

    Raises:
        PipelineFormatError: listing every problem as (source, field, problem).
    """
    _ensure_settings()
    if base_dir is None and not source.startswith("<") and os.path.isfile(source):
        base_dir = Path(source).resolve().parent
    return _validate(data, _Report(source), base_dir=Path(base_dir) if base_dir is not None else None)


def validate_scenario(data: object, source: str = "<scenario>", stage_keys=None) -> dict:
    """Check the shape of a scripted test adapter's scenario document.

    Args:
        data: the parsed scenario (a mapping with optional ``description``, ``default``:
            [step] and ``stages``: {stage_key: {operation: [step]}}).
        source: the name used as ``file`` in error tuples.
        stage_keys: when given, the stage keys the scenario may name.

    Returns:
        A deep copy of ``data`` as written (steps are not rewritten).

    Raises:
        PipelineFormatError: listing every problem (unknown keys, bad operation names,
            bad step values, stage keys not in ``stage_keys``).
    """
    _ensure_settings()
    report = _Report(source)
    result = _validate_scenario(data, report, "", list(stage_keys) if stage_keys is not None else None)
    if report.errors or result is None:
        raise PipelineFormatError(report.errors)
    return result


def _validate(data, report: _Report, base_dir: Path | None) -> dict:
    if data is None:
        report.add("(document)", "the document is empty; a pipeline is a mapping with name, roles, profiles and stages")
        raise PipelineFormatError(report.errors)
    if not isinstance(data, dict):
        report.add("(document)", f"the top level must be a mapping with name, roles, profiles and stages, got {_kind(data)}")
        raise PipelineFormatError(report.errors)

    top = _run_form(PipelineForm, data, "", report, "a pipeline")
    baseline = _validate_gates(data.get("baseline_checks"), "baseline_checks", report)
    have_baseline = bool(data.get("baseline_checks"))
    stages = _validate_stages(data.get("stages"), report, have_baseline)
    raw_stages = data.get("stages") if isinstance(data.get("stages"), list) else []
    stage_keys = [s["key"] for s in raw_stages if isinstance(s, dict) and isinstance(s.get("key"), str)]
    profiles = _validate_profiles(data.get("profiles"), report, base_dir, stage_keys)
    raw_profiles = data.get("profiles") if isinstance(data.get("profiles"), dict) else {}
    profile_names = [k for k in raw_profiles if isinstance(k, str)]

    roles_data = data.get("roles")
    if roles_data is None:
        report.add("roles", "is required: name the profile for each of implementer, reviewer, documenter")
        roles = None
    else:
        # Without usable profiles the roles cannot be checked against them: that problem is
        # already reported at 'profiles', so only the roles' own shape is checked then.
        roles = _run_form(RolesForm, roles_data, "roles", report, "roles: implementer, reviewer, documenter",
                          profiles=profile_names, check_names=bool(profile_names))
    budgets = _run_form(BudgetsForm, data.get("budgets") if data.get("budgets") is not None else {}, "budgets", report, "budgets")
    deadlines = _run_form(DeadlinesForm, data.get("deadlines") if data.get("deadlines") is not None else {}, "deadlines", report, "deadlines in seconds")

    if report.errors:
        raise PipelineFormatError(report.errors)
    result = {
        "format": top["format"],
        "name": top["name"],
        "description": top["description"],
        "master_plan": top["master_plan"],
        "spec_index": top["spec_index"],
        "protected_paths": top["protected_paths"],
        "documentation_paths": top["documentation_paths"],
        "exclude": top["exclude"],
        "baseline_checks": baseline,
        "budgets": dict(budgets),
        "deadlines": dict(deadlines),
        "roles": dict(roles),
        "profiles": profiles,
        "stages": stages,
    }
    _refuse_credentials(result, "", report)
    if report.errors:
        raise PipelineFormatError(report.errors)
    return result
