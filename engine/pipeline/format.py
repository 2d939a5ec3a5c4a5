"""The pipeline file format: YAML in, one normalized plain dict out, or a refusal.

A pipeline file (see docs/pipeline-format.md, and pipelines/example.yaml) names the stages
a run takes, the gates that verify each stage, and the agent profiles that do the work.
This module turns such a file into a *normalized definition*: a plain dict in which every
key is present and every default is filled, so that the rest of the engine (models,
operations, the frozen snapshot of a run) never has to guess. A file with any problem is
refused whole: every problem found is collected and raised together in one
:class:`PipelineFormatError`, each named as ``(file, field, problem)``.

The schema is engine/pipeline/schema/: pydantic models, one per level of the document
(pipeline, stage, gate, profile, roles, budgets, deadlines, scenario, operations, step,
usage), which check structure, types, required and unknown keys and the project's rules,
and word every problem. This module is the facade around it: it reads YAML strictly (a key
written twice is refused), turns the models' errors into ``(file, field, problem)``
tuples, builds the normalized definition and refuses credentials in it. It imports no
Django.

Public API: :func:`load_file`, :func:`validate`, :func:`validate_scenario`,
:class:`PipelineFormatError`, and the constants below.
"""
import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from .schema import (
    ADAPTERS,
    DEFAULT_DEADLINES,
    DEFAULT_DOCUMENTATION_PATHS,
    DEFAULT_MAX_TURNS,
    DEFAULT_REPAIR_ALLOWANCE,
    DEFAULT_SPEC_INDEX,
    FORMAT_VERSION,
    MAX_DEADLINE_SECONDS,
    OPERATIONS,
    ROLES,
    SOURCE,
    Pipeline,
    Scenario,
    key_path,
)
from ..redaction import redact_text, secret_env_values

__all__ = [
    "ADAPTERS",
    "DEFAULT_DEADLINES",
    "DEFAULT_DOCUMENTATION_PATHS",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_REPAIR_ALLOWANCE",
    "DEFAULT_SPEC_INDEX",
    "FORMAT_VERSION",
    "MAX_DEADLINE_SECONDS",
    "OPERATIONS",
    "ROLES",
    "PipelineFormatError",
    "load_file",
    "validate",
    "validate_scenario",
]


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


def _problems(source: str, exc: ValidationError, data=None) -> list[tuple[str, str, str]]:
    """``(file, field, problem)`` of the schema's worded errors (engine/pipeline/schema/):
    a ``loc`` is the field path, restarted in another file after a ``SOURCE`` part. A number
    in a ``loc`` is a list index (``[1]``) unless the document (``data``) has a mapping there
    or a ``[key]`` part follows: then it is a key (``.1``)."""
    result = []
    for error in exc.errors():
        file, path, node = source, "", data
        loc = error["loc"]
        for at, part in enumerate(loc):
            if isinstance(part, int) and not isinstance(node, dict) and loc[at + 1:at + 2] != ("[key]",):
                path += f"[{part}]"
            elif isinstance(part, int):
                path = key_path(path, part)  # a mapping's key that is a number
            elif part.startswith(SOURCE):
                file, path, node = part[len(SOURCE):], "", None
                continue
            elif part == "[key]":
                continue
            elif part.startswith("(") and part.endswith(")"):
                path = part
            else:
                path = key_path(path, part)
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                node = None
        result.append((file, path or "(document)", error["ctx"]["problem"]))
    return result


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


def _read_yaml(path: Path):
    """Parse one YAML file: ``(data, [])``, or ``(None, [(field, problem)])`` with field
    ``(file)`` (unreadable) or ``(yaml)`` (a syntax error or a key written twice)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None, [("(file)", "is not UTF-8 text")]
    except OSError as exc:
        return None, [("(file)", f"cannot be read: {exc.strerror or exc}")]
    try:
        return yaml.load(text, Loader=_StrictLoader), []  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            problem = f"{problem} ({exc.context})"
        return None, [("(yaml)", f"{where}{problem}")]
    except yaml.YAMLError as exc:
        return None, [("(yaml)", str(exc))]


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
    source = os.fspath(path)
    data, problems = _read_yaml(Path(source))
    if problems:
        raise PipelineFormatError([(source, field, problem) for field, problem in problems])
    return _validate(data, source, base_dir=Path(source).resolve().parent)


def _secret_env(path: str, value: str) -> bool:
    """True for a profile ``env`` entry whose name says it is a secret (PASSWORD, TOKEN, ...)."""

    parts = path.split(".")
    if len(parts) < 4 or parts[0] != "profiles" or parts[2] != "env":
        return False
    return bool(secret_env_values({parts[3]: value}))


#: Profile keys holding a simulation's script: made-up keys there are test material, not credentials.
_SIMULATION_KEYS = ("scenario", "scripted_endpoint")


def _refuse_credentials(value, path: str, errors: list, source: str, credentials: bool = True) -> None:
    """Report every string of the definition that the database cannot store (a NUL character) or
    that looks like a credential (engine.redaction's patterns, a secret-named profile ``env``): a
    pipeline is saved and frozen into every run, so a pasted key would be stored three times
    (docs/field-cases.md C14). Scenarios and scripted endpoints are checked for NUL only."""

    if isinstance(value, dict):
        for key, item in value.items():
            simulation = key in _SIMULATION_KEYS and path.startswith("profiles.")
            _refuse_credentials(item, key_path(path, key), errors, source, credentials and not simulation)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_credentials(item, f"{path}[{index}]", errors, source, credentials)
    elif isinstance(value, str) and "\x00" in value:
        errors.append((source, path or "(document)", "contains a NUL character (\\x00), which the database cannot store in a definition; "
                         "write binary test data with another byte"))
    elif isinstance(value, str) and credentials and (redact_text(value)[1] or _secret_env(path, value)):
        errors.append((source, path or "(document)", "holds what looks like a credential (an API key, a token, a private key or a password "
                         "in a URL); credentials never go into a pipeline: the agent gets them from the "
                         "worker's environment"))


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
             "roles": {"implementer": str, "reviewer": str | [str] | None, "documenter": str | None},
             "profiles": {name: {"name", "adapter", "model", "max_turns", "executable",
                                 "extra_args", "env", "base_url", "api_key_env", "network_allow", "scenario", "scenario_path",
                                 "description"}},
             "stages": [{"key", "title", "requirement", "scope", "docs", "depends_on",
                         "gates", "repair_allowance", "human_gate"}]}

        where gate = ``{"name": str, "command": str, "deadline": float | None}`` plus
        ``"network_allow": [host]`` when the gate names hosts it may reach (else it has no network).

    Raises:
        PipelineFormatError: listing every problem as (source, field, problem).
    """
    if base_dir is None and not source.startswith("<") and os.path.isfile(source):
        base_dir = Path(source).resolve().parent
    return _validate(data, source, base_dir=Path(base_dir) if base_dir is not None else None)


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
    try:
        return Scenario.check(data, stage_keys)
    except ValidationError as exc:
        raise PipelineFormatError(_problems(source, exc, data)) from None


def _validate(data, source: str, base_dir: Path | None) -> dict:
    try:
        pipeline = Pipeline.check(data, base_dir=base_dir, read_yaml=_read_yaml)
    except ValidationError as exc:
        raise PipelineFormatError(_problems(source, exc, data)) from None
    result = pipeline.definition()
    errors: list = []
    _refuse_credentials(result, "", errors, source)
    if errors:
        raise PipelineFormatError(errors)
    return result
