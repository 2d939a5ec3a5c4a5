"""The pydantic models of engine/pipeline/schema/ are the schema of pipeline files: every
level refuses an unknown key and a value of the wrong type, named by its field path, and the
models are strict and closed. No database needed."""
import copy

import pytest

from engine.pipeline import schema as pipeline_schema
from engine.pipeline.format import PipelineFormatError, validate, validate_scenario
from .support.runs import full

# the profile of ``full`` names https://example.org as its gateway: one the operator listed (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("example_gateway")


def _field(path):
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _get(data, path):
    for part in path:
        data = data[part]
    return data


def _errors(data):
    with pytest.raises(PipelineFormatError) as info:
        validate(data, source="full.yaml")
    return [(field, problem) for _, field, problem in info.value.errors]


def test_the_full_document_is_valid():
    validate(full())


#: Every level of the schema in full(): the top, then the nested mappings.
LEVELS = [
    (), ("baseline_checks", 1), ("budgets",), ("deadlines",), ("roles",), ("profiles", "claude"),
    ("profiles", "sim"), ("profiles", "sim", "scenario"), ("profiles", "sim", "scenario", "default", 0),
    ("profiles", "sim", "scenario", "default", 0, "usage"), ("profiles", "sim", "scenario", "stages", "one"),
    ("profiles", "sim", "scenario", "stages", "one", "implement", 0), ("stages", 0), ("stages", 0, "gates", 1),
]


@pytest.mark.parametrize("path", LEVELS, ids=[_field(p) or "(top)" for p in LEVELS])
def test_an_unknown_key_is_refused_at_every_level(path):
    data = full()
    _get(data, path)["surplus"] = 1
    field = _field(path + ("surplus",))
    found = _errors(data)
    assert [p for f, p in found if f == field and p.startswith("unknown ")], found


def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(node, list) and node and not all(isinstance(v, (dict, list)) for v in node):
        yield path  # a list of scalars: the list itself is the field
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, path + (index,))
    else:
        yield path


LEAVES = [p for p in _leaves(full()) if p[-1] not in ("verdict",) and "verdict" not in p]


@pytest.mark.parametrize("path", LEAVES, ids=[_field(p) for p in LEAVES])
def test_a_wrong_type_is_refused_at_every_field(path):
    data = full()
    value = _get(data, path)
    wrong = {"a": {"b": 1}} if not isinstance(value, dict) else [1]
    if isinstance(value, list):
        wrong = 3.5
    _get(data, path[:-1])[path[-1]] = wrong
    field = _field(path)
    found = _errors(data)
    assert any(f == field or f.startswith(field + "[") or f.startswith(field + ".") for f, _ in found), found


def test_scenario_levels_refuse_unknown_keys_with_their_path():
    with pytest.raises(PipelineFormatError) as info:
        validate_scenario({"default": [{"usage": {"tokens": 1}}], "stages": {"one": {"implement": [{"exit": "0"}]}}})
    assert [field for _, field, _ in info.value.errors] == ["default[0].usage.tokens", "stages.one.implement[0].exit"]


def test_every_level_is_a_strict_closed_pydantic_model():
    models = [pipeline_schema.Pipeline, pipeline_schema.Stage, pipeline_schema.Gate, pipeline_schema.Profile,
              pipeline_schema.Roles, pipeline_schema.Budgets, pipeline_schema.Deadlines, pipeline_schema.Scenario,
              pipeline_schema.Operations, pipeline_schema.Step, pipeline_schema.Usage]
    for model in models:
        assert model.model_config["strict"] is True and model.model_config["extra"] == "forbid", model
    # the allowed keys of the file format are the models' fields
    assert list(pipeline_schema.Stage.model_fields) == [
        "key", "title", "requirement", "scope", "docs", "depends_on", "repair_allowance", "human_gate", "gates"]


def test_the_models_give_the_normalized_definition():
    data = full()
    assert pipeline_schema.Pipeline.check(copy.deepcopy(data)).definition() == validate(data)
