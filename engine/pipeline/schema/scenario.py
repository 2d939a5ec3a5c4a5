"""The scripted test adapter's scenarios: ``Scenario``, ``Operations``, ``Step``, ``Usage``."""
import copy
from typing import Annotated, Any, ClassVar, Optional

from pydantic import (
    AfterValidator,
    Field,
    StrictInt,
    StrictStr,
    ValidationInfo,
)

from .base import _Level
from .common import OPERATIONS, NoneIsDefault, Say, _fail, kind
from .fields import _PATHS, Argument, FilePath, Lines, _seconds, _unstripped_text_or_none

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
