"""What the engine lets Gemini CLI be given and reach (plain data, read through engine/agents/registry.py):
its credential variables, its provider's hosts, its file-writing tools and the options a profile's
``extra_args`` may pass (engine/agents/cli_options.py applies them, with ``spellings`` and ``refusal``
below). Checked on ``gemini`` 0.61.0 (tests/test_gemini_adapter.py runs the real binary's ``--help``)."""
from __future__ import annotations

import re

from ..cli_options import EVERY_ROLE

#: The variables Gemini CLI reads a key from, most usual first: passed to its agents only, never to
#: gates; a profile's gateway key goes under the first.
CREDENTIALS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
#: The hosts its attempts may reach by default (any port of the name): the Gemini API.
PROVIDER_HOSTS = ("generativelanguage.googleapis.com",)
#: The variable of its environment that points it at another Gemini API address (a gateway): its host joins
#: the attempt's allow-list (engine/agents/network.py GATEWAY_ENV).
GATEWAY_ENV = ("GOOGLE_GEMINI_BASE_URL",)
#: Its file-writing tools (0.61.0), the names its refusals are recorded under.
WRITE_TOOLS = frozenset({"write_file", "replace"})
#: Its shell tools' names, as its stream and its provider's wire give them: the transcript keeps their command
#: lines and words them "Runs `command`" (engine/text/transcript.py).
SHELL_TOOLS = ("run_shell_command",)
#: Its tools as the model gateway's record of the wire names them (engine/model_gateway/conversation.py
#: ``TOOLS``), each worded as Claude Code's tool of the same meaning, with the input keys renamed.
TOOL_WORDS = {"run_shell_command": ("Bash", {"command": "command"}),
              "read_file": ("Read", {"absolute_path": "file_path", "file_path": "file_path"}),
              "write_file": ("Write", {"file_path": "file_path"}), "replace": ("Edit", {"file_path": "file_path"})}
#: How it tells its model a command's exit status in a tool result, before the number
#: (engine/model_gateway/conversation.py reads the status from it).
EXIT_SAID = r"Exit Code:"  # 0.61.0, only when it is not 0

#: Variables the adapter sets for each attempt (its sandbox, its Google sign-in and its settings and
#: trust): a profile's ``env`` may not set them
#: (engine/pipeline/schema/fields.py ENGINE_ENV).
ENGINE_ENV = ("GEMINI_SANDBOX", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA",
              "GOOGLE_APPLICATION_CREDENTIALS")
ENGINE_ENV_PREFIXES = ("GEMINI_CLI_",)

#: ``gemini --help``'s approval, sandbox, policy and trust options and what adds tools: the engine
#: chooses them per role (a profile cannot add them).
PERMISSION_ARGS = (
    "-y",
    "--yolo",
    "--approval-mode",
    "-s",
    "--sandbox",
    "--policy",
    "--admin-policy",
    "--allowed-tools",
    "--allowed-mcp-server-names",
    "-e",
    "--extensions",
    "--include-directories",
    "--skip-trust",
    "-w",
    "--worktree",
    "--acp",
    "--experimental-acp",
    "--raw-output",
    "--accept-raw-output-risk",
)
#: Options the adapter sets itself, and why.
ENGINE_ARGS = {
    "-p": "the prompt is passed by the engine",
    "--prompt": "the prompt is passed by the engine",
    "-i": "the prompt is passed by the engine",
    "--prompt-interactive": "the prompt is passed by the engine",
    "-o": "the engine parses the output format it asks for",
    "--output-format": "the engine parses the output format it asks for",
    "-m": "use the profile's model field",
    "--model": "use the profile's model field",
    "-r": "each attempt starts a fresh session",
    "--resume": "each attempt starts a fresh session",
    "--session-id": "each attempt starts a fresh session",
    "--session-file": "each attempt starts a fresh session",
    "--list-sessions": "each attempt starts a fresh session",
    "--delete-session": "each attempt starts a fresh session",
    "-l": "the attempt runs the agent, not a listing",
    "--list-extensions": "the attempt runs the agent, not a listing",
}
#: The options a profile may pass.
EXTRA_ARGS = {
    "--debug": (None, EVERY_ROLE, ""),
    "-d": (None, EVERY_ROLE, ""),
    "--screen-reader": (None, EVERY_ROLE, ""),
}
#: Its subcommands (`gemini --help`, "Commands"): a bare word in extra_args that names one would run
#: it (`gemini mcp list`) instead of the agent.
COMMANDS = ("mcp", "extensions", "extension", "skills", "skill", "hooks", "hook", "gemma")
#: Options that would let something other than the model answer (0.61.0's hidden test options): a
#: file in the worktree could play the model in a run not labelled simulated.
FAKE_MODEL = ("--fake-responses", "--fake-responses-non-strict", "--record-responses")
#: Names refused outright by ``refusal`` that the option names are read against.
REFUSED_ARGS = FAKE_MODEL


def spellings(option: str) -> list[str]:
    """The option names ``option`` stands for: Gemini CLI parses with yargs, which also takes an
    option in camelCase (``--skipTrust``), negated (``--no-sandbox``), with underscores, with three
    dashes (``---yolo``), a short alias after two (``--y``) and short flags grouped (``-sy``): each is
    turned back into the names the lists above hold."""
    if not option.startswith("-"):
        return [option]
    if option.startswith("---"):  # yargs reads ---yolo as --yolo
        option = "--" + option.lstrip("-")
    if not option.startswith("--"):
        return [f"-{letter}" for letter in option[1:]] if len(option) > 2 else [option]
    if len(option) == 3:  # yargs reads --y as the short alias -y
        return [option[1:]]
    name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", option[2:]).lower().replace("_", "-")
    names = [f"--{name}"]
    if name.startswith("no-"):
        names.append(f"--{name[3:]}")
    return names


def refusal(given: str, option: str) -> str | None:
    """Why ``given`` (read as ``option``) is refused before the lists are looked at, or None."""
    if given in COMMANDS:
        return f"'{given}' is refused: it is a gemini subcommand, which would run instead of the agent"
    if given.startswith("-") and not given.startswith("--") and len(given) > 2:
        # yargs reads every letter of -dy (-d and -y): a group is never read as its first letter only
        return f"'{given}' is refused: short flags grouped together are not taken; give each option on its own"
    if option in FAKE_MODEL:
        return (f"'{given}' is refused: the model's answers come from its provider or the profile's "
                "scripted_endpoint, never from a file")
    return None
