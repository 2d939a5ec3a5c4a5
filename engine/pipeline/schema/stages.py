"""Gates and stages: ``Gate``, ``Stage``, and the normalized gates of a validated list."""
from typing import Annotated, ClassVar, Optional

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    WrapValidator,
)

from .base import _Level
from .common import DEFAULT_REPAIR_ALLOWANCE, ERROR_TYPE, TAG, NoneIsDefault, Say, _errors, _fail, kind
from .fields import (
    _PATHS,
    _PATTERNS,
    Deadline,
    FilePath,
    Hosts,
    Pattern,
    Text,
    _required_text,
    _slug,
    _slug_item,
    _union,
    _unique,
)

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
