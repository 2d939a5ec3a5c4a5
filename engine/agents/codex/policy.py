"""What the engine lets the Codex CLI be given and reach (plain data, read through engine/agents/registry.py):
its credential variables, its provider's hosts, its file-writing tools and the options a profile's
``extra_args`` may pass (engine/agents/cli_options.py applies them). Checked on ``codex`` 0.171.0
(tests/test_codex_adapter.py runs the real binary's ``--help``)."""
from __future__ import annotations

from ..cli_options import EVERY_ROLE, WORD

#: The variables ``codex exec`` reads a key from (its documentation on authentication), most usual
#: first: passed to its agents only, never to gates; a profile's gateway key goes under the first.
CREDENTIALS = ("CODEX_API_KEY", "OPENAI_API_KEY")
#: The hosts its attempts may reach by default (any port of the name): the Responses API, and
#: ChatGPT's backend and login host for a ChatGPT sign-in.
PROVIDER_HOSTS = ("api.openai.com", "chatgpt.com", "auth.openai.com")
#: The variable of its environment that points it at another OpenAI API address (a gateway): its host joins
#: the attempt's allow-list (engine/agents/network.py GATEWAY_ENV).
GATEWAY_ENV = ("OPENAI_BASE_URL",)
#: The bubblewrap its package ships (0.171.0), under the repository: every sandbox uses it
#: (engine/agents/sandbox.py ``bundled_bwrap``), so every machine runs the same version.
BUNDLED_BWRAP = "tools/agents/node_modules/@openai/codex-linux-x64/vendor/*/codex-resources/bwrap"
#: Its file-writing tool (0.171.0), the name its refusals are recorded under.
WRITE_TOOLS = frozenset({"apply_patch"})
#: Its shell tools' names, as its stream and its provider's wire give them: the transcript keeps their command
#: lines and words them "Runs `command`" (engine/text/transcript.py).
SHELL_TOOLS = ("shell", "exec_command", "local_shell")
#: Its tools as the model gateway's record of the wire names them (engine/model_gateway/conversation.py
#: ``TOOLS``), each worded as Claude Code's tool of the same meaning, with the input keys renamed.
TOOL_WORDS = {"exec_command": ("Bash", {"cmd": "command"}), "shell": ("Bash", {"command": "command"})}
#: How it tells its model a command's exit status in a tool result, before the number
#: (engine/model_gateway/conversation.py reads the status from it).
EXIT_SAID = r"Process exited with code"  # 0.171.0

#: Variables the adapter sets for each attempt (its configuration folder): a profile's ``env`` may not set them
#: (engine/pipeline/schema/fields.py ENGINE_ENV).
ENGINE_ENV = ("CODEX_HOME",)

#: Permission and sandbox options: the engine chooses them per role (a profile cannot add them).
PERMISSION_ARGS = (
    "-s",
    "--sandbox",
    "--dangerously-bypass-approvals-and-sandbox",
    "--yolo",
    "--full-auto",
    "-p",  # --profile: a config profile can set sandbox and approval
    "--profile",
    "-a",
    "--ask-for-approval",
    "--add-dir",
    "-C",
    "--cd",
)
#: Options the adapter sets itself, and why.
ENGINE_ARGS = {
    "-m": "use the profile's model field",
    "--model": "use the profile's model field",
    "--json": "the engine parses the output format it asks for",
    "-o": "the engine reads the final message itself",
    "--output-last-message": "the engine reads the final message itself",
}
#: The options a profile may pass: ``-c KEY=VALUE`` with only these keys (others set providers, MCP
#: servers, the shell or the sandbox).
EXTRA_ARGS = {
    "-c": (r"(model_reasoning_effort|model_reasoning_summary|model_verbosity|hide_agent_reasoning)="
           r"\"?" + WORD + r"\"?", EVERY_ROLE, "model_reasoning_effort=, model_reasoning_summary=, "
           "model_verbosity= or hide_agent_reasoning= with a word (no other codex setting)"),
}
#: ``-c`` keys that set permissions (refused with their reason: ``value_refusal``).
PERMISSION_CONFIG = ("sandbox", "approval")


def value_refusal(option: str, value: str) -> str | None:
    """Why a value that does not match its pattern is refused, when it is for what it sets."""
    if option == "-c" and value.strip().strip('"').lower().startswith(PERMISSION_CONFIG):
        return f"'{option} {value}' is refused: sandbox and approval settings are chosen by the engine for each role"
    return None
