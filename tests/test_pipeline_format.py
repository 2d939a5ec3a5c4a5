"""Tests of engine.pipeline.format: the example pipeline, every rule, YAML errors, scenarios,
and the demo template against the example scenario's implementations. No database needed."""
import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engine.checks import globs
from engine.pipeline.format import (
    DEFAULT_DEADLINES,
    PipelineFormatError,
    load_file,
    validate,
    validate_scenario,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "pipelines" / "example.yaml"
TEMPLATE = ROOT / "engine" / "demo_template"


def minimal():
    """The smallest valid pipeline, as parsed YAML."""
    return {
        "name": "mini",
        "roles": {"implementer": "claude", "reviewer": "claude", "documenter": "claude"},
        "profiles": {"claude": {"adapter": "claude-code"}},
        "stages": [
            {"key": "one", "requirement": "Do one.", "scope": ["src/**"], "gates": ["pytest -q"]},
        ],
    }


def two_stages():
    data = minimal()
    data["stages"].append({"key": "two", "requirement": "Do two.", "scope": ["src/**"], "gates": ["pytest -q"]})
    return data


def problems(data, **kwargs):
    """[(field, problem)] of a refused document (fails the test if it was accepted)."""
    with pytest.raises(PipelineFormatError) as info:
        validate(data, **kwargs)
    return [(field, problem) for _, field, problem in info.value.errors]


def assert_problem(found, field, word):
    at_field = [problem for f, problem in found if f == field]
    assert at_field, f"no problem reported at {field!r}; got {found}"
    assert any(word.lower() in p.lower() for p in at_field), f"{word!r} not in the problems at {field!r}: {at_field}"


def matches_any(path, patterns):
    """As the engine matches scope and protected paths (engine/checks/globs.py)."""
    return globs.matches(path, patterns)


# ----------------------------------------------------------------------------------------
# The example pipeline


@pytest.fixture(scope="module")
def example():
    return load_file(str(EXAMPLE))


def test_it_loads_the_example_with_every_key(example):
    assert list(example) == [
        "format", "name", "description", "master_plan", "spec_index", "protected_paths",
        "documentation_paths", "exclude", "setup", "baseline_checks", "budgets", "deadlines", "limits", "stall",
        "roles", "profiles", "stages",
    ]
    assert example["setup"] is None  # the example's tests need nothing installed
    assert example["stall"] == {"repeated_calls": 5, "idle_turns": 20, "idle_minutes": 15.0}  # the defaults
    # no limits in the file: the operator's apply (engine/processes/limits.py)
    assert example["limits"] == {"max_processes": None, "max_memory_mb": None, "max_write_mb": None,
                                 "max_output_mb": None}
    assert example["format"] == 1
    assert example["name"] == "textstats-example"
    assert example["master_plan"] == "docs/PLAN.md"
    assert example["spec_index"] == "docs/INDEX.md"
    assert {"tests/test_*.py", "/pytest.ini"} <= set(example["protected_paths"])
    assert example["documentation_paths"] == ["docs/**"]
    assert example["roles"] == {"implementer": "claude-code", "reviewer": "claude-code", "documenter": "claude-code"}
    assert set(example["budgets"]) == {"max_active_seconds", "max_attempts", "max_tokens", "max_cost_usd", "stage",
                                       "attempt"}
    levels = [example["budgets"], example["budgets"]["stage"], example["budgets"]["attempt"]]
    assert all(v is not None and (isinstance(v, dict) or v > 0) for level in levels for v in level.values())
    assert set(example["deadlines"]) == set(DEFAULT_DEADLINES)
    assert all(isinstance(v, float) and v > 0 for v in example["deadlines"].values())


def test_it_normalizes_the_example_stages(example):
    word, top = example["stages"]
    assert word["key"] == "word-count" and top["key"] == "top-words"
    assert top["depends_on"] == ["word-count"]
    assert word["gates"] == [
        {"name": "word-count-tests", "command": "python -m pytest -q tests/test_word_count.py", "deadline": None}
    ]
    assert [g["command"] for g in top["gates"]] == ["python -m pytest -q tests/test_top_words.py", "python -m pytest -q"]
    for stage in (word, top):
        assert set(stage) == {"key", "title", "requirement", "scope", "docs", "depends_on", "gates",
                              "repair_allowance", "human_gate"}
        assert set(stage["scope"]) == {"textstats/**", "tests/**", "docs/**"}
        assert stage["requirement"].strip()
        assert stage["repair_allowance"] == 2 and stage["human_gate"] is False


def test_it_fills_profile_defaults_and_inlines_the_scenario(example):
    profiles = example["profiles"]
    assert set(profiles) == {"claude-code", "codex", "claude-scripted", "scripted"}
    for name, profile in profiles.items():
        assert set(profile) == {"name", "adapter", "model", "max_turns", "executable", "extra_args", "env",
                                "base_url", "api_key_env", "network_allow", "scenario", "scenario_path", "scripted_endpoint", "scripted_endpoint_path", "description"}
        assert profile["name"] == name
    assert profiles["claude-code"]["adapter"] == "claude-code" and profiles["claude-code"]["max_turns"] == 40
    assert profiles["codex"]["adapter"] == "codex" and profiles["codex"]["max_turns"] == 40  # default filled
    assert profiles["codex"]["scenario"] is None and profiles["codex"]["extra_args"] == [] and profiles["codex"]["env"] == {}
    scripted = profiles["scripted"]
    assert scripted["adapter"] == "scripted"
    assert scripted["scenario_path"] == "scenarios/example.yaml"
    on_disk = yaml.safe_load((EXAMPLE.parent / "scenarios" / "example.yaml").read_text())
    assert scripted["scenario"] == on_disk
    assert set(scripted["scenario"]["stages"]) == {"word-count", "top-words"}


def test_the_example_scenario_behaves_like_a_well_behaved_agent(example):
    scenario = example["profiles"]["scripted"]["scenario"]
    steps = [step for ops in scenario["stages"].values() for lst in ops.values() for step in lst]
    steps += scenario["default"]
    for step in steps:
        assert step.get("exit", 0) == 0
        assert 0.5 <= step["sleep"] <= 2
        assert len(step["print"]) >= 2
        assert step["usage"]["input_tokens"] > 0 and step["usage"]["output_tokens"] > 0
    for ops in scenario["stages"].values():
        assert ops["review"][0]["verdict"] == {"verdict": "pass", "findings": []}
        assert "textstats/core.py" in ops["implement"][0]["write"]
        assert ops["repair"][0]["write"] == ops["implement"][0]["write"]
    assert "SCRIPTED_CHANGE.md" in scenario["default"][0]["write"]


def test_the_example_scenario_writes_only_where_each_role_may(example):
    scenario = example["profiles"]["scripted"]["scenario"]
    for stage in example["stages"]:
        ops = scenario["stages"][stage["key"]]
        for operation in ("implement", "repair"):
            for step in ops[operation]:
                for path in step.get("write", {}):
                    assert matches_any(path, stage["scope"]), path
                    assert not matches_any(path, example["protected_paths"]), path
        for step in ops["document"]:
            assert step["write"], "the documentation step should update the docs"
            for path in step["write"]:
                assert matches_any(path, example["documentation_paths"]), path
        assert all(not step.get("write") for step in ops["review"])


def test_a_normalized_definition_validates_to_itself(example):
    assert validate(copy.deepcopy(example)) == example


def test_it_fills_defaults_of_a_minimal_pipeline():
    result = validate(minimal())
    assert result["format"] == 1 and result["description"] == ""
    assert result["master_plan"] is None and result["spec_index"] == "docs/INDEX.md"
    assert result["protected_paths"] == [] and result["exclude"] == [] and result["baseline_checks"] == []
    assert result["documentation_paths"] == ["docs/**"]
    assert result["budgets"] == {"max_active_seconds": None, "max_attempts": None, "max_tokens": None,
                                 "max_cost_usd": None, "stage": {"max_tokens": None, "max_cost_usd": None},
                                 "attempt": {"max_tokens": None, "max_cost_usd": None}}
    assert result["deadlines"] == {"implement": 1800.0, "review": 600.0, "repair": 1800.0, "document": 900.0, "gate": 900.0}
    stage = result["stages"][0]
    assert stage == {"key": "one", "title": "one", "requirement": "Do one.", "scope": ["src/**"], "docs": [],
                     "depends_on": [], "gates": [{"name": "gate-1", "command": "pytest -q", "deadline": None}],
                     "repair_allowance": 2, "human_gate": False}
    assert result["profiles"]["claude"] == {
        "name": "claude", "adapter": "claude-code", "model": None, "max_turns": 40, "executable": None,
        "extra_args": [], "env": {}, "base_url": None, "api_key_env": None, "network_allow": [], "scenario": None, "scenario_path": None,
        "scripted_endpoint": None, "scripted_endpoint_path": None,
        "description": "",
    }


def test_an_explicit_null_spec_index_means_none_and_null_lists_mean_defaults():
    data = minimal()
    data.update(spec_index=None, documentation_paths=None, exclude=None, budgets=None, deadlines=None)
    result = validate(data)
    assert result["spec_index"] is None
    assert result["documentation_paths"] == ["docs/**"]
    assert result["deadlines"]["gate"] == 900.0


def test_gates_as_strings_and_mappings():
    data = minimal()
    data["stages"][0]["gates"] = ["make lint", {"command": "pytest -q", "deadline": 30}, {"name": "e2e", "command": " ./e2e.sh "}]
    gates = validate(data)["stages"][0]["gates"]
    assert gates == [
        {"name": "gate-1", "command": "make lint", "deadline": None},
        {"name": "gate-2", "command": "pytest -q", "deadline": 30.0},
        {"name": "e2e", "command": "./e2e.sh", "deadline": None},
    ]


def test_a_stage_without_gates_is_accepted_when_the_pipeline_has_baseline_checks():
    data = minimal()
    data["stages"][0].pop("gates")
    data["baseline_checks"] = ["pytest -q"]
    result = validate(data)
    assert result["stages"][0]["gates"] == []
    assert result["baseline_checks"] == [{"name": "gate-1", "command": "pytest -q", "deadline": None}]


def test_a_leading_dot_slash_is_dropped_from_paths():
    data = minimal()
    data["master_plan"] = "./docs/PLAN.md"
    data["stages"][0]["scope"] = ["./src/**"]
    result = validate(data)
    assert result["master_plan"] == "docs/PLAN.md" and result["stages"][0]["scope"] == ["src/**"]
    # "./README.md" names the file at the root: it stays anchored there once "./" is dropped
    data["stages"][0]["scope"] = ["./README.md", "!./docs/x.md"]
    assert validate(data)["stages"][0]["scope"] == ["/README.md", "!docs/x.md"]


# ----------------------------------------------------------------------------------------
# Every rule: a failing input, the exact field and a word of the problem


def _set(path, value):
    """A mutation that sets data[path...] = value (path: keys and indexes)."""

    def mutate(data):
        target = data
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return mutate


def _delete(path):
    def mutate(data):
        target = data
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return mutate


def _scripted(scenario):
    def mutate(data):
        data["profiles"]["sim"] = {"adapter": "scripted", "scenario": scenario}

    return mutate


RULES = [
    # required fields
    ("name missing", _delete(["name"]), "name", "required"),
    ("stages missing", _delete(["stages"]), "stages", "required"),
    ("stages empty", _set(["stages"], []), "stages", "at least one stage"),
    ("stages not a list", _set(["stages"], {"one": {}}), "stages", "list"),
    ("stage not a mapping", _set(["stages", 0], "one"), "stages[0]", "mapping"),
    ("stage key missing", _delete(["stages", 0, "key"]), "stages[0].key", "required"),
    ("requirement missing", _delete(["stages", 0, "requirement"]), "stages[0].requirement", "required"),
    ("requirement blank", _set(["stages", 0, "requirement"], "   "), "stages[0].requirement", "required"),
    ("requirement not a string", _set(["stages", 0, "requirement"], ["a"]), "stages[0].requirement", "string"),
    ("scope missing", _delete(["stages", 0, "scope"]), "stages[0].scope", "required"),
    ("scope empty", _set(["stages", 0, "scope"], []), "stages[0].scope", "required"),
    ("scope a string", _set(["stages", 0, "scope"], "src/**"), "stages[0].scope", "list"),
    ("gate command missing", _set(["stages", 0, "gates"], [{"name": "t"}]), "stages[0].gates[0].command", "required"),
    ("gate command empty string", _set(["stages", 0, "gates"], ["  "]), "stages[0].gates[0]", "empty"),
    ("gate of wrong type", _set(["stages", 0, "gates"], [42]), "stages[0].gates[0]", "command string"),
    ("roles missing", _delete(["roles"]), "roles", "required"),
    ("role missing", _delete(["roles", "documenter"]), "roles.documenter", "required"),
    ("profiles missing", _delete(["profiles"]), "profiles", "required"),
    ("profiles empty", _set(["profiles"], {}), "profiles", "at least one"),
    ("adapter missing", _set(["profiles", "claude"], {"model": "x"}), "profiles.claude.adapter", "required"),
    # unknown keys (typo protection), with the allowed keys named
    ("unknown top-level key", _set(["stagse"], []), "stagse", "did you mean 'stages'"),
    ("unknown stage key", _set(["stages", 0, "gatez"], []), "stages[0].gatez", "allowed keys"),
    ("unknown gate key", _set(["stages", 0, "gates"], [{"command": "x", "timeout": 3}]), "stages[0].gates[0].timeout", "unknown key"),
    ("unknown profile key", _set(["profiles", "claude", "modle"], "x"), "profiles.claude.modle", "did you mean 'model'"),
    ("unknown role", _set(["roles", "tester"], "claude"), "roles.tester", "unknown key"),
    ("unknown budget key", _set(["budgets"], {"max_time": 5}), "budgets.max_time", "allowed keys: max_active_seconds"),
    ("unknown deadline key", _set(["deadlines"], {"reviews": 5}), "deadlines.reviews", "did you mean 'review'"),
    # stage keys and order
    ("duplicate stage key", lambda d: d["stages"].append(copy.deepcopy(d["stages"][0])), "stages[1].key", "duplicate"),
    ("depends_on a later stage", lambda d: (d.update(two_stages()), d["stages"][0].update(depends_on=["two"])),
     "stages[0].depends_on[0]", "cycles"),
    ("depends_on an unknown stage", _set(["stages", 0, "depends_on"], ["zero"]), "stages[0].depends_on[0]", "no stage"),
    ("depends_on itself", _set(["stages", 0, "depends_on"], ["one"]), "stages[0].depends_on[0]", "itself"),
    ("depends_on twice", lambda d: (d.update(two_stages()), d["stages"][1].update(depends_on=["one", "one"])),
     "stages[1].depends_on[1]", "twice"),
    ("invalid stage key", _set(["stages", 0, "key"], "one two"), "stages[0].key", "not a valid stage key"),
    ("invalid pipeline name", _set(["name"], "-x"), "name", "letter or digit"),
    ("name too long", _set(["name"], "x" * 101), "name", "at most 100"),
    ("invalid profile name", lambda d: d["profiles"].update({"my profile": {"adapter": "codex"}}),
     'profiles["my profile"]', "not a valid profile name"),
    ("profile name differs from its key", _set(["profiles", "claude", "name"], "other"), "profiles.claude.name", "differs"),
    # roles name defined profiles
    ("role names an undefined profile", _set(["roles", "reviewer"], "gpt"), "roles.reviewer", "no profile named 'gpt'"),
    # adapters and scenarios
    ("unknown adapter", _set(["profiles", "claude", "adapter"], "gemini"), "profiles.claude.adapter", "not one of claude-code, codex, gemini-cli, pi, scripted"),
    ("scripted profile without scenario", lambda d: d["profiles"].update(sim={"adapter": "scripted"}),
     "profiles.sim.scenario", "needs a scenario"),
    ("scenario on a non-scripted profile", _set(["profiles", "claude", "scenario"], {"default": [{}]}),
     "profiles.claude.scenario", "only scripted"),
    ("scenario of a wrong type", lambda d: d["profiles"].update(sim={"adapter": "scripted", "scenario": 3}),
     "profiles.sim.scenario", "path to a scenario file or an inline mapping"),
    # paths must be relative, without '..'
    ("absolute master_plan", _set(["master_plan"], "/etc/plan.md"), "master_plan", "relative"),
    ("master_plan with ..", _set(["master_plan"], "docs/../../plan.md"), "master_plan", "'..'"),
    ("master_plan as a pattern", _set(["master_plan"], "docs/*.md"), "master_plan", "not a pattern"),
    ("spec_index with ..", _set(["spec_index"], "../INDEX.md"), "spec_index", "'..'"),
    ("spec_index under home", _set(["spec_index"], "~/INDEX.md"), "spec_index", "relative"),
    ("docs with ..", _set(["stages", 0, "docs"], ["README.md", "../secrets.md"]), "stages[0].docs[1]", "'..'"),
    ("absolute scope glob", _set(["stages", 0, "scope"], ["src/**", "//etc/**"]), "stages[0].scope[1]", "relative"),
    ("scope with backslashes", _set(["stages", 0, "scope"], ["src\\app.py"]), "stages[0].scope[0]", "'/'"),
    ("protected glob with ..", _set(["protected_paths"], ["../tests/**"]), "protected_paths[0]", "'..'"),
    ("absolute documentation path", _set(["documentation_paths"], ["//docs/**"]), "documentation_paths[0]", "relative"),
    ("exclude pattern with ..", _set(["exclude"], ["build/../../x"]), "exclude[0]", "'..'"),
    ("exclude negation", _set(["exclude"], ["!.env"]), "exclude[0]", "negation"),
    ("duplicate scope glob", _set(["stages", 0, "scope"], ["src/**", "src/**"]), "stages[0].scope[1]", "twice"),
    # positive deadlines and budgets
    ("zero deadline", _set(["deadlines"], {"review": 0}), "deadlines.review", "greater than 0"),
    ("negative deadline", _set(["deadlines"], {"gate": -5}), "deadlines.gate", "greater than 0"),
    ("deadline in milliseconds", _set(["deadlines"], {"implement": 1800000}), "deadlines.implement", "at most"),
    ("deadline as a string", _set(["deadlines"], {"implement": "30m"}), "deadlines.implement", "number"),
    ("infinite deadline", _set(["deadlines"], {"implement": float("inf")}), "deadlines.implement", "finite"),
    ("gate deadline zero", _set(["stages", 0, "gates"], [{"command": "x", "deadline": 0}]), "stages[0].gates[0].deadline", "greater than 0"),
    ("negative cost budget", _set(["budgets"], {"max_cost_usd": -1}), "budgets.max_cost_usd", "greater than 0"),
    ("zero active time budget", _set(["budgets"], {"max_active_seconds": 0}), "budgets.max_active_seconds", "greater than 0"),
    ("zero attempts budget", _set(["budgets"], {"max_attempts": 0}), "budgets.max_attempts", "at least 1"),
    ("fractional attempts budget", _set(["budgets"], {"max_attempts": 2.5}), "budgets.max_attempts", "whole number"),
    ("budgets not a mapping", _set(["budgets"], [1]), "budgets", "mapping"),
    # every stage verified
    ("stage without gates or baseline", _delete(["stages", 0, "gates"]), "stages[0].gates", "baseline_checks"),
    ("stage with empty gates and no baseline", _set(["stages", 0, "gates"], []), "stages[0].gates", "at least one command"),
    # gate names unique per list
    ("duplicate gate names", _set(["stages", 0, "gates"], [{"name": "t", "command": "a"}, {"name": "t", "command": "b"}]),
     "stages[0].gates[1].name", "duplicate"),
    ("named gate colliding with a generated name", _set(["stages", 0, "gates"], ["a", {"name": "gate-1", "command": "b"}]),
     "stages[0].gates[1].name", "duplicate"),
    ("duplicate baseline names", _set(["baseline_checks"], [{"name": "t", "command": "a"}, {"name": "t", "command": "b"}]),
     "baseline_checks[1].name", "duplicate"),
    ("invalid gate name", _set(["stages", 0, "gates"], [{"name": "unit tests", "command": "a"}]), "stages[0].gates[0].name", "not a valid gate name"),
    # max_turns 1..1000
    ("max_turns zero", _set(["profiles", "claude", "max_turns"], 0), "profiles.claude.max_turns", "at least 1"),
    ("max_turns too large", _set(["profiles", "claude", "max_turns"], 1001), "profiles.claude.max_turns", "at most 1000"),
    ("max_turns quoted", _set(["profiles", "claude", "max_turns"], "40"), "profiles.claude.max_turns", "whole number"),
    ("max_turns boolean", _set(["profiles", "claude", "max_turns"], True), "profiles.claude.max_turns", "whole number"),
    # other values
    ("unsupported format", _set(["format"], 2), "format", "unsupported"),
    ("negative repair allowance", _set(["stages", 0, "repair_allowance"], -1), "stages[0].repair_allowance", "at least 0"),
    ("human_gate not a boolean", _set(["stages", 0, "human_gate"], "yes"), "stages[0].human_gate", "true or false"),
    ("stage key read as a boolean", _set(["stages", 0, "key"], False), "stages[0].key", "quote it"),
    ("permission flag in extra_args", _set(["profiles", "claude", "extra_args"], ["--verbose", "--permission-mode=bypassPermissions"]),
     "profiles.claude.extra_args[1]", "refused"),
    ("bypass flag in extra_args", _set(["profiles", "claude", "extra_args"], ["--dangerously-skip-permissions"]),
     "profiles.claude.extra_args[0]", "refused"),
    ("model flag in extra_args", _set(["profiles", "claude", "extra_args"], ["--model", "x"]), "profiles.claude.extra_args[0]", "model field"),
    ("codex sandbox override", lambda d: d["profiles"].update(cx={"adapter": "codex", "extra_args": ["-c", "sandbox_mode=danger-full-access"]}),
     "profiles.cx.extra_args[0]", "refused"),
    ("extra_args not a list", _set(["profiles", "claude", "extra_args"], "--verbose"), "profiles.claude.extra_args", "list"),
    ("env name invalid", _set(["profiles", "claude", "env"], {"1BAD": "x"}), "profiles.claude.env.1BAD", "environment variable name"),
    ("env value not a string", _set(["profiles", "claude", "env"], {"RETRIES": 3}), "profiles.claude.env.RETRIES", "quote it"),
]


@pytest.mark.parametrize("mutate, field, word", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_it_refuses(mutate, field, word):
    data = minimal()
    mutate(data)
    assert_problem(problems(data), field, word)


def test_it_names_the_allowed_keys_of_an_unknown_key():
    found = problems({**minimal(), "stage": []})
    assert_problem(found, "stage", "allowed keys: format, name, description")


def test_it_collects_every_problem_not_just_the_first():
    data = two_stages()
    data["name"] = "bad name"
    data["stages"][0]["scope"] = ["//abs"]
    data["stages"][1]["gates"] = [{"name": "t"}]
    data["profiles"]["claude"]["max_turns"] = 0
    data["roles"]["reviewer"] = "nobody"
    data["deadlines"] = {"gate": -1}
    with pytest.raises(PipelineFormatError) as info:
        validate(data, source="pipelines/bad.yaml")
    fields = [field for _, field, _ in info.value.errors]
    assert fields == ["name", "stages[0].scope[0]", "stages[1].gates[0].command", "profiles.claude.max_turns",
                      "roles.reviewer", "deadlines.gate"]
    assert all(file == "pipelines/bad.yaml" for file, _, _ in info.value.errors)
    lines = str(info.value).splitlines()
    assert len(lines) == 6
    assert lines[2] == "pipelines/bad.yaml: stages[1].gates[0].command: " + info.value.errors[2][2]
    assert all(re.match(r"pipelines/bad\.yaml: \S+: .+", line) for line in lines)


def test_it_refuses_a_non_mapping_document():
    assert_problem(problems([1, 2]), "(document)", "mapping")
    assert_problem(problems(None), "(document)", "empty")
    assert_problem(problems("name: x"), "(document)", "mapping")


# ----------------------------------------------------------------------------------------
# Scenarios


SCENARIO_RULES = [
    ("unknown step key", {"default": [{"writ": {}}]}, "default[0].writ", "did you mean 'write'"),
    ("unknown operation", {"stages": {"one": {"implment": [{}]}}}, "stages.one.implment", "unknown operation"),
    ("undefined stage", {"stages": {"nope": {"implement": [{}]}}}, "stages.nope", "names no stage"),
    ("unknown top key", {"defaults": [{}]}, "defaults", "did you mean 'default'"),
    ("steps not a list", {"default": {"exit": 0}}, "default", "list of steps"),
    ("steps empty", {"stages": {"one": {"review": []}}}, "stages.one.review", "at least one step"),
    ("step not a mapping", {"default": ["exit 0"]}, "default[0]", "mapping"),
    ("operations not a mapping", {"stages": {"one": [{}]}}, "stages.one", "mapping of operations"),
    ("exit out of range", {"default": [{"exit": 256}]}, "default[0].exit", "at most 255"),
    ("exit negative", {"default": [{"exit": -1}]}, "default[0].exit", "at least 0"),
    ("exit as a string", {"default": [{"exit": "1"}]}, "default[0].exit", "whole number"),
    ("sleep negative", {"default": [{"sleep": -1}]}, "default[0].sleep", "at least 0"),
    ("write outside the repository", {"default": [{"write": {"../x.py": "x"}}]}, "default[0].write.../x.py", "'..'"),
    ("write of a non-string", {"default": [{"write": {"a.py": 1}}]}, "default[0].write.a.py", "string"),
    ("write not a mapping", {"default": [{"write": ["a.py"]}]}, "default[0].write", "mapping"),
    ("delete absolute", {"default": [{"delete": ["/etc/passwd"]}]}, "default[0].delete[0]", "relative"),
    ("print of a number", {"default": [{"print": ["ok", 3]}]}, "default[0].print[1]", "string"),
    ("print of a mapping", {"default": [{"print": {"a": 1}}]}, "default[0].print", "string or a list"),
    ("run as a shell string", {"default": [{"run": "sleep 600"}]}, "default[0].run", "list"),
    ("run empty", {"default": [{"run": []}]}, "default[0].run", "argv"),
    ("usage unknown key", {"default": [{"usage": {"tokens": 3}}]}, "default[0].usage.tokens", "allowed keys: input_tokens"),
    ("usage negative", {"default": [{"usage": {"output_tokens": -3}}]}, "default[0].usage.output_tokens", "at least 0"),
    ("usage cost as a string", {"default": [{"usage": {"cost_usd": "$1"}}]}, "default[0].usage.cost_usd", "number"),
    ("verdict not a mapping", {"default": [{"verdict": "pass"}]}, "default[0].verdict", "mapping"),
    ("final_message not a string", {"default": [{"final_message": ["a"]}]}, "default[0].final_message", "string"),
    ("scenario not a mapping", ["exit 0"], "", "mapping"),
]


@pytest.mark.parametrize("scenario, field, word", [r[1:] for r in SCENARIO_RULES], ids=[r[0] for r in SCENARIO_RULES])
def test_it_refuses_an_inline_scenario(scenario, field, word):
    data = minimal()
    _scripted(scenario)(data)
    prefix = "profiles.sim.scenario"
    assert_problem(problems(data), f"{prefix}.{field}" if field else prefix, word)


def test_an_inline_scenario_is_kept_as_written():
    scenario = {
        "stages": {"one": {"implement": [{"write": {"src/a.py": "x = 1\n"}, "print": "hi"}, {"exit": 1}],
                           "review": [{"verdict": {"verdict": "maybe"}}]}},
        "default": [{"run": ["sh", "-c", "sleep 600 & echo started; wait"], "sleep": 0.5}],
    }
    data = minimal()
    _scripted(scenario)(data)
    profile = validate(data)["profiles"]["sim"]
    assert profile["scenario"] == scenario and profile["scenario"] is not scenario
    assert profile["scenario_path"] is None


def test_validate_scenario_checks_a_scenario_alone():
    assert validate_scenario({"default": [{"exit": 3}]}) == {"default": [{"exit": 3}]}
    with pytest.raises(PipelineFormatError) as info:
        validate_scenario({"stages": {"x": {"implement": [{}]}}}, source="s.yaml", stage_keys=["one"])
    assert info.value.errors == [("s.yaml", "stages.x", "names no stage of this pipeline; its stages are: one")]


def test_a_scenario_path_needs_a_pipeline_file():
    data = minimal()
    _scripted("scenarios/x.yaml")(data)
    assert_problem(problems(data), "profiles.sim.scenario", "cannot be resolved")


# ----------------------------------------------------------------------------------------
# Files: YAML errors, scenario files


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def file_problems(path):
    with pytest.raises(PipelineFormatError) as info:
        load_file(str(path))
    return info.value.errors


def test_it_names_the_line_and_column_of_a_yaml_syntax_error(tmp_path):
    path = write(tmp_path / "p.yaml", "name: x\nstages:\n  - key: one\n    requirement: [unclosed\n")
    errors = file_problems(path)
    assert len(errors) == 1
    file, field, problem = errors[0]
    assert (file, field) == (str(path), "(yaml)")
    assert re.match(r"line \d+, column \d+: ", problem), problem


def test_it_reports_the_exact_position_of_a_bad_mapping(tmp_path):
    path = write(tmp_path / "p.yaml", "name: x\ndescription: a: b\n")
    [(_, field, problem)] = file_problems(path)
    assert field == "(yaml)"
    assert problem.startswith("line 2, column 15: mapping values are not allowed here")


def test_it_refuses_a_key_written_twice(tmp_path):
    path = write(tmp_path / "p.yaml", "name: x\nstages: []\nname: y\n")
    [(_, field, problem)] = file_problems(path)
    assert field == "(yaml)" and "line 3, column 1" in problem and "duplicate key 'name'" in problem


def test_a_merged_key_may_be_overridden(tmp_path):
    text = """
name: x
roles: {implementer: c, reviewer: c, documenter: c}
profiles: {c: {adapter: claude-code}}
stages:
  - key: one
    requirement: r
    scope: [src/**]
    gates:
      - &unit {name: unit, command: pytest -q, deadline: 60}
      - <<: *unit
        name: all
"""
    gates = load_file(str(write(tmp_path / "p.yaml", text)))["stages"][0]["gates"]
    assert gates == [{"name": "unit", "command": "pytest -q", "deadline": 60.0},
                     {"name": "all", "command": "pytest -q", "deadline": 60.0}]


def test_it_refuses_an_empty_file_and_a_non_mapping_top_level(tmp_path):
    assert [e[1:] for e in file_problems(write(tmp_path / "e.yaml", "# nothing\n"))] == [
        ("(document)", "the document is empty; a pipeline is a mapping with name, roles, profiles and stages")
    ]
    [(_, field, problem)] = file_problems(write(tmp_path / "l.yaml", "- a\n- b\n"))
    assert field == "(document)" and "mapping" in problem and "a list" in problem


def test_it_refuses_a_missing_file(tmp_path):
    [(file, field, problem)] = file_problems(tmp_path / "nope.yaml")
    assert file == str(tmp_path / "nope.yaml") and field == "(file)" and "cannot be read" in problem


def _pipeline_with_scenario(tmp_path, scenario_ref):
    data = minimal()
    _scripted(scenario_ref)(data)
    return write(tmp_path / "pipelines" / "p.yaml", yaml.safe_dump(data, sort_keys=False))


def test_it_resolves_and_inlines_a_scenario_file_relative_to_the_pipeline(tmp_path, monkeypatch):
    write(tmp_path / "pipelines" / "scenarios" / "s.yaml", "stages:\n  one:\n    implement:\n      - exit: 3\n")
    path = _pipeline_with_scenario(tmp_path, "scenarios/s.yaml")
    monkeypatch.chdir(tmp_path)  # resolution must not depend on the working directory
    profile = load_file(str(path))["profiles"]["sim"]
    assert profile["scenario"] == {"stages": {"one": {"implement": [{"exit": 3}]}}}
    assert profile["scenario_path"] == "scenarios/s.yaml"


def test_it_names_the_field_of_a_missing_scenario_file(tmp_path):
    path = _pipeline_with_scenario(tmp_path, "scenarios/missing.yaml")
    [(file, field, problem)] = file_problems(path)
    assert (file, field) == (str(path), "profiles.sim.scenario")
    assert "scenarios/missing.yaml" in problem and "does not exist" in problem


def test_it_reports_problems_inside_a_scenario_file_against_that_file(tmp_path):
    scenario = write(tmp_path / "pipelines" / "s.yaml", "stages:\n  one:\n    implement:\n      - exit: 300\n  two:\n    review: [{}]\n")
    path = _pipeline_with_scenario(tmp_path, "s.yaml")
    errors = file_problems(path)
    assert [(f, field) for f, field, _ in errors] == [
        (str(scenario.resolve()), "stages.one.implement[0].exit"),
        (str(scenario.resolve()), "stages.two"),
    ]


def test_it_reports_a_yaml_error_in_a_scenario_file(tmp_path):
    scenario = write(tmp_path / "pipelines" / "s.yaml", "default:\n  - exit: 0\n   print: x\n")
    path = _pipeline_with_scenario(tmp_path, "s.yaml")
    [(file, field, problem)] = file_problems(path)
    assert file == str(scenario.resolve()) and field == "(yaml)" and problem.startswith("line 3, column")


def test_it_refuses_an_empty_scenario_file(tmp_path):
    write(tmp_path / "pipelines" / "s.yaml", "")
    [(file, field, problem)] = file_problems(_pipeline_with_scenario(tmp_path, "s.yaml"))
    assert field == "(document)" and "empty" in problem


def test_it_collects_problems_of_the_pipeline_and_its_scenario_together(tmp_path):
    write(tmp_path / "pipelines" / "s.yaml", "default:\n  - exit: 999\n")
    data = minimal()
    _scripted("s.yaml")(data)
    data["stages"][0]["scope"] = ["../x"]
    path = write(tmp_path / "pipelines" / "p.yaml", yaml.safe_dump(data))
    fields = [field for _, field, _ in file_problems(path)]
    assert fields == ["stages[0].scope[0]", "default[0].exit"]


# ----------------------------------------------------------------------------------------
# The demo template against the example scenario's implementations


def _pytest(repo, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTEST_ADDOPTS", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_demo_template_has_its_files():
    files = sorted(str(p.relative_to(TEMPLATE)) for p in TEMPLATE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert files == ["AGENTS.md", "README.md", "docs/INDEX.md", "docs/PLAN.md", "pytest.ini",
                     "tests/test_top_words.py", "tests/test_word_count.py", "textstats/__init__.py", "textstats/core.py"]
    core = (TEMPLATE / "textstats" / "core.py").read_text()
    assert "def " not in core  # a docstring and nothing else


def test_the_scenario_implementations_pass_the_demo_gates(tmp_path, example):
    repo = tmp_path / "textstats"
    shutil.copytree(TEMPLATE, repo, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for protected in ("tests/test_word_count.py", "tests/test_top_words.py", "pytest.ini"):
        assert matches_any(protected, example["protected_paths"])
    stages = example["profiles"]["scripted"]["scenario"]["stages"]
    word_gate = example["stages"][0]["gates"][0]["command"].split()
    top_gate = example["stages"][1]["gates"][0]["command"].split()
    assert word_gate[:4] == top_gate[:4] == ["python", "-m", "pytest", "-q"]

    # The template's core.py implements nothing: the gates really test something.
    result = _pytest(repo, *word_gate[4:])
    assert result.returncode != 0, result.stdout

    # Stage word-count: its gate passes, the next stage's does not yet.
    for path, content in stages["word-count"]["implement"][0]["write"].items():
        write(repo / path, content)
    result = _pytest(repo, *word_gate[4:])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 passed" in result.stdout
    result = _pytest(repo, *top_gate[4:])
    assert result.returncode != 0, result.stdout

    # Stage top-words: both of its gates, including the whole suite.
    for path, content in stages["top-words"]["implement"][0]["write"].items():
        write(repo / path, content)
    for gate in example["stages"][1]["gates"]:
        result = _pytest(repo, *gate["command"].split()[4:])
        assert result.returncode == 0, gate["command"] + "\n" + result.stdout + result.stderr
    result = _pytest(repo)
    assert "13 passed" in result.stdout
    assert not (repo / ".pytest_cache").exists()


def _with_endpoint(endpoint):
    doc = {"name": "ep", "stages": [{"key": "a", "requirement": "r", "scope": ["**"], "gates": ["true"]}],
           "roles": {"implementer": "c", "reviewer": "c", "documenter": "c"},
           "profiles": {"c": {"adapter": "claude-code", "scripted_endpoint": endpoint}}}
    return validate(doc, "ep.yaml")


def test_a_scripted_endpoint_is_validated_and_kept():
    turns = {"turns": [{"tool": "Write", "input": {"file_path": "{cwd}/x", "content": "y"}}, "done"]}
    definition = _with_endpoint({"stages": {"a": {"implement": turns}}})
    assert definition["profiles"]["c"]["scripted_endpoint"] == {"stages": {"a": {"implement": turns}}}
    assert validate(definition, "again") == definition


def test_a_bad_scripted_endpoint_names_the_field():
    with pytest.raises(PipelineFormatError) as info:
        _with_endpoint({"stages": {"a": {"implemnt": ["done"]}}})
    assert any(field == "profiles.c.scripted_endpoint.stages.a.implemnt" for _, field, _ in info.value.errors)
    with pytest.raises(PipelineFormatError) as info:
        _with_endpoint({"default": {"turns": [{"stauts": 401}]}})
    assert any(field.startswith("profiles.c.scripted_endpoint.default") for _, field, _ in info.value.errors)


def test_a_problem_inside_a_scripted_endpoint_file_names_its_field_from_the_files_top(tmp_path):
    """`<file>: <field>: <problem>` with the field path from the endpoint file's top (an earlier
    version printed it with a stray leading dot: `.stages.a.implement`)."""
    (tmp_path / "x.yaml").write_text("stages:\n  a:\n    implement:\n      turns:\n        - {tool: Write, bogus: 1}\n"
                                     "        - done\n", encoding="utf-8")
    (tmp_path / "p.yaml").write_text(
        "name: ep\nstages:\n  - {key: a, requirement: r, scope: ['**'], gates: ['true']}\n"
        "roles: {implementer: c, reviewer: c, documenter: c}\n"
        "profiles:\n  c: {adapter: claude-code, scripted_endpoint: x.yaml}\n", encoding="utf-8")
    with pytest.raises(PipelineFormatError) as info:
        load_file(tmp_path / "p.yaml")
    assert any(source.endswith("x.yaml") and field == "stages.a.implement" and "turn 0" in problem
               for source, field, problem in info.value.errors), info.value.errors


def test_setup_is_checked_field_by_field_and_its_kept_folders_normalized():
    data = minimal()
    data["setup"] = {"commands": ["npm ci", " "], "keep": ["sub/.git", "node_modules/", "../up"], "extra": 1}
    found = problems(data)
    assert_problem(found, "setup.commands[1]", "empty command")
    assert_problem(found, "setup.keep[0]", "git metadata")
    assert_problem(found, "setup.keep[2]", "..")
    assert_problem(found, "setup.extra", "unknown key")
    data["setup"] = {"commands": ["npm ci"], "keep": ["node_modules/"], "cache_key": ["package-lock.json"]}
    assert validate(data)["setup"] == {"commands": ["npm ci"], "keep": ["node_modules"],
                                       "cache_key": ["package-lock.json"], "deadline": 1800.0}
