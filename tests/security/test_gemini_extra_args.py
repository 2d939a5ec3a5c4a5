"""A hostile pipeline author's (or an injected edit's) extra_args cannot loosen a Gemini CLI role:
gemini 0.61.0 parses options with yargs, which also takes them in camelCase, negated, with
underscores and as grouped short flags, and has hidden options that replay a file as the model
(engine/agents/cli_options.py ``_spellings``, ``_GEMINI_FAKE_MODEL``)."""
import pytest

from engine.pipeline.format import PipelineFormatError, validate

from ..support.runs import full


@pytest.mark.parametrize("args", [["--skipTrust"], ["--skip_trust"], ["--adminPolicy", "allow.toml"],
                                  ["--allowedMcpServerNames", "evil"], ["-sy"], ["-ys"], ["--approvalMode=yolo"],
                                  ["--no-yolo"], ["--includeDirectories", "/"], ["--fake-responses", "f.json"],
                                  ["--fakeResponses=f.json"], ["--record-responses", "r.json"], ["--y"], ["---yolo"],
                                  ["---approval-mode=yolo"], ["--s"], ["--e", "x"], ["--m", "x"], ["mcp", "list"],
                                  ["extensions", "install", "x"]])
def test_a_gemini_option_that_loosens_a_role_is_refused_however_it_is_spelled(args):
    data = full()
    data["profiles"]["claude"].update({"adapter": "gemini-cli", "base_url": None, "extra_args": args})
    with pytest.raises(PipelineFormatError) as info:
        validate(data)
    said = str(info.value)
    assert "profiles.claude.extra_args[0]" in said and ("refused" in said or "set by the adapter" in said), said


def test_a_harmless_gemini_option_is_kept():
    data = full()
    data["profiles"]["claude"].update({"adapter": "gemini-cli", "base_url": None, "extra_args": ["--debug"]})
    assert validate(data)["profiles"]["claude"]["extra_args"] == ["--debug"]
