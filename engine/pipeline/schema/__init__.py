"""The one schema of pipeline files and scripted scenarios, as pydantic models (a package: ``common``
the constants and wording, ``fields`` the value rules, ``base`` the level, ``scenario``, ``stages``,
``profiles``, ``pipeline``).

Every level of a pipeline document (docs/pipeline-format.md, pipelines/example.yaml) is a
model here: :class:`Pipeline`, :class:`Stage`, :class:`Gate`, :class:`Profile`,
:class:`Roles`, :class:`Budgets`, :class:`Deadlines`, and for the scripted test adapter's
scenarios :class:`Scenario`, :class:`Operations`, :class:`Step` and :class:`Usage`. The models
are strict (no conversion: ``"40"`` is not a number, ``yes`` is not a string) and refuse
unknown keys (``extra="forbid"``); the rules of this project (names, repository-relative
paths, gitignore patterns through engine/checks/globs.py, hosts, URLs, refused adapter arguments,
stage order, roles naming profiles) are validators on the models.

pydantic's own errors (a ``loc`` and a ``type``) are worded as the engine words them:
each level translates the errors of its own fields (see :class:`Say` and
``_Level._speak``) and orders them as a reader walks the file: problems of the level
itself, unknown keys, then the fields in order, then the rules that span fields. What
leaves a model is always an error of type ``pipeline_format`` whose ``ctx["problem"]`` is
the final text and whose ``loc`` is the field path; engine/pipeline/format.py turns that
into ``(file, field, problem)`` tuples and builds the normalized definition.

Use :meth:`Pipeline.check` (a whole pipeline, with the context its cross-level rules need)
and :meth:`Scenario.check`; both raise :class:`pydantic.ValidationError`.
"""
from .common import (
    ADAPTERS,
    CLI_ADAPTERS,
    DEFAULT_DEADLINES,
    DEFAULT_DOCUMENTATION_PATHS,
    DEFAULT_MAX_TURNS,
    DEFAULT_REPAIR_ALLOWANCE,
    DEFAULT_SPEC_INDEX,
    ERROR_TYPE,
    FORMAT_VERSION,
    MAX_DEADLINE_SECONDS,
    OPERATIONS,
    ROLES,
    SOURCE,
    TAG,
    NoneIsDefault,
    Say,
    key_path,
    kind,
    type_hint,
    unknown_key_problem,
)
from .fields import (
    ENGINE_ENV,
    ENGINE_ENV_PREFIXES,
    RESERVED_KEY_ENV,
    RESERVED_KEY_ENV_PREFIXES,
    Argument,
    Deadline,
    ExcludePattern,
    FilePath,
    Host,
    Hosts,
    Lines,
    NullableText,
    Pattern,
    Patterns,
    Text,
    check_relative,
    check_slug,
)
from .pipeline import DEFAULT_SETUP_DEADLINE, Pipeline, Setup
from .profiles import AttemptLimits, Budgets, Deadlines, Profile, Roles, SpendCaps, Stall
from .scenario import Operations, Scenario, Step, Steps, Usage
from .stages import Gate, Gates, Stage, gate_definitions

__all__ = ["ADAPTERS", "Argument", "AttemptLimits", "Budgets", "CLI_ADAPTERS", "DEFAULT_DEADLINES", "DEFAULT_DOCUMENTATION_PATHS", "DEFAULT_MAX_TURNS", "DEFAULT_REPAIR_ALLOWANCE", "DEFAULT_SETUP_DEADLINE", "DEFAULT_SPEC_INDEX", "Deadline", "Deadlines", "ENGINE_ENV", "ENGINE_ENV_PREFIXES", "ERROR_TYPE", "ExcludePattern", "FORMAT_VERSION", "FilePath", "Gate", "Gates", "Host", "Hosts", "Lines", "MAX_DEADLINE_SECONDS", "NoneIsDefault", "NullableText", "OPERATIONS", "Operations", "Pattern", "Patterns", "Pipeline", "Profile", "RESERVED_KEY_ENV", "RESERVED_KEY_ENV_PREFIXES", "ROLES", "Roles", "SOURCE", "Say", "Scenario", "Setup", "SpendCaps", "Stage", "Stall", "Step", "Steps", "TAG", "Text", "Usage", "check_relative", "check_slug", "gate_definitions", "key_path", "kind", "type_hint", "unknown_key_problem"]
