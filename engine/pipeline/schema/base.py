"""The base of every level of a pipeline document (``_Level``): strict, no unknown keys, its errors worded
and ordered as a reader walks the file."""
from functools import cache
from typing import Annotated, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from .common import _PLAIN, ERROR_TYPE, TAG, _errors, _say, kind, unknown_key_problem

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
