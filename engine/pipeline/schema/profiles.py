"""Profiles and roles (the extra_args allow-list: engine/agents/cli_options.py), budgets, limits, deadlines
and the stall watch."""
import copy
import os
import urllib.parse
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional

from pydantic import (
    AfterValidator,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from ...processes import limits
from ...agents import gateways
from ...agents.cli_options import _refused_args, has_options
from ...model_gateway.meter import DEFAULT_IDLE_MINUTES, DEFAULT_IDLE_TURNS, DEFAULT_REPEATED_CALLS
from ...scripted_endpoint import ScenarioError, normalize_scenario
from .base import _Level
from .common import (
    ADAPTERS,
    CLI_ADAPTERS,
    DEFAULT_DEADLINES,
    DEFAULT_MAX_TURNS,
    OPERATIONS,
    SOURCE,
    NoneIsDefault,
    Say,
    _fail,
    kind,
)
from .fields import (
    _ARGUMENTS,
    Argument,
    Deadline,
    Hosts,
    Lines,
    NullableText,
    Text,
    _executable,
    _key_env_name,
    _optional_required_text,
    _profile_env_name,
    _required_text,
    _seconds,
    _strip_ref,
    _union,
    _url,
    check_slug,
)
from .scenario import Scenario
from .stages import _place

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
        if has_options(adapter) and "extra_args" not in failed:
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
    """A pipeline's limit: at most the operator's (engine/processes/limits.py ``operator_limits``): a pipeline lowers it."""
    def check(value: Optional[int]) -> Optional[int]:
        ours = getattr(limits.operator_limits(), name)
        if value is not None and value > ours:
            _fail(f"{value} is above the operator's limit of {ours} ({limits.SETTINGS[name]}): a pipeline may "
                  "lower a limit, never raise it")
        return value
    return AfterValidator(check)


class AttemptLimits(_Level):
    """Each attempt's and gate's limits, lowered from the operator's (engine/processes/limits.py); absent: the operator's."""

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
