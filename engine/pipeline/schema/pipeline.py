"""The setup step (engine/steps/setup.py, engine/environments.py) and the whole pipeline: ``Pipeline``."""
from typing import Annotated, ClassVar, Optional

from pydantic import (
    AfterValidator,
    Field,
    StrictInt,
    StrictStr,
)

from .base import _Level
from .common import DEFAULT_DOCUMENTATION_PATHS, DEFAULT_SPEC_INDEX, FORMAT_VERSION, NoneIsDefault, Say, _fail, kind
from .fields import (
    _PATHS,
    _PATTERNS,
    Deadline,
    ExcludePattern,
    FilePath,
    Patterns,
    Text,
    _file_item,
    _path_field,
    _slug,
    _unique,
)
from .profiles import AttemptLimits, Budgets, Deadlines, Profile, Roles, Stall
from .stages import Gates, Stage, _command, gate_definitions

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
