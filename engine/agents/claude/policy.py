"""What the engine lets Claude Code be given and reach (plain data, read through engine/agents/registry.py):
its credential variables, its provider's hosts, its file-writing tools and the options a profile's
``extra_args`` may pass (engine/agents/cli_options.py applies them). Checked on ``claude`` 2.1.197
(tests/test_claude_adapter.py runs the real binary's ``--help``)."""
from __future__ import annotations

from ..cli_options import EVERY_ROLE, MODEL, WORD

#: The variables Claude Code reads a key or token from (its documentation on authentication), most
#: usual first: passed to its agents only, never to gates; a profile's gateway key goes under the first.
CREDENTIALS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
#: The hosts its attempts may reach by default (any port of the name): the Messages API.
PROVIDER_HOSTS = ("api.anthropic.com",)
#: The variable of its environment that points it at another Messages API address (a gateway): its host joins
#: the attempt's allow-list (engine/agents/network.py GATEWAY_ENV).
GATEWAY_ENV = ("ANTHROPIC_BASE_URL",)
#: Its file-writing tools (2.1.197), the names its refusals are recorded under.
WRITE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})
#: Its shell tools' names, as its stream and its provider's wire give them: the transcript keeps their command
#: lines and words them "Runs `command`" (engine/text/transcript.py).
SHELL_TOOLS = ("Bash",)
#: Its tools as the model gateway's record of the wire names them (engine/model_gateway/conversation.py
#: ``TOOLS``), each worded as Claude Code's tool of the same meaning, with the input keys renamed.
TOOL_WORDS: dict = {}  # its own names are the words
#: How it tells its model a command's exit status in a tool result, before the number
#: (engine/model_gateway/conversation.py reads the status from it).
EXIT_SAID = r"Exit code:?"  # with is_error

#: Variables the adapter sets for each attempt (its configuration folder): a profile's ``env`` may not set them
#: (engine/pipeline/schema/fields.py ENGINE_ENV).
ENGINE_ENV = ("CLAUDE_CONFIG_DIR",)

#: Permission and sandbox options: the engine chooses them per role (a profile cannot add them).
PERMISSION_ARGS = (
    "--dangerously-skip-permissions",
    "--allow-dangerously-skip-permissions",
    "--permission-mode",
    "--allowedTools",
    "--allowed-tools",
    "--disallowedTools",
    "--disallowed-tools",
    "--tools",
    "--add-dir",
    "--settings",
    "--setting-sources",
)
#: Options the adapter sets itself, and why.
ENGINE_ARGS = {
    "-p": "the prompt is passed by the engine",
    "--print": "the prompt is passed by the engine",
    "--output-format": "the engine parses the output format it asks for",
    "--input-format": "the prompt is passed by the engine",
    "--max-turns": "use the profile's max_turns field",
    "--model": "use the profile's model field",
    "--session-id": "each attempt starts a fresh session",
    "--resume": "each attempt starts a fresh session",
    "-r": "each attempt starts a fresh session",
    "--continue": "each attempt starts a fresh session",
    "-c": "each attempt starts a fresh session",
}
#: The options a profile may pass (engine/agents/cli_options.py ``EXTRA_ARGS`` says the shape).
EXTRA_ARGS = {
    "--verbose": (None, EVERY_ROLE, ""),
    "--append-system-prompt": (r"(?s).{1,4000}", EVERY_ROLE, "a text of at most 4000 characters"),
    "--fallback-model": (MODEL, EVERY_ROLE, "a model name"),
    "--effort": (WORD, EVERY_ROLE, "a level such as high"),
    "--max-budget-usd": (r"[0-9]{1,6}(\.[0-9]{1,4})?", EVERY_ROLE, "an amount such as 2.50"),
}
