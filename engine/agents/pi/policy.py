"""What the engine lets pi be given and reach (plain data, read through engine/agents/registry.py): the
providers it runs with their credential variables and hosts, its file-writing tools and the options a
profile's ``extra_args`` may pass (engine/agents/cli_options.py applies them). Checked on ``pi`` 0.73.1
(tests/test_pi_adapter.py runs the real binary's ``--help``)."""
from __future__ import annotations

from ..cli_options import EVERY_ROLE

#: The providers this adapter runs (the ``provider/`` prefix of the profile's model, default
#: DEFAULT_PROVIDER): the variables pi reads for each (pi-ai 0.73.1 ``env-api-keys.js``, most usual
#: first), the hosts its built-in models use (``models.generated.js``) and their base URL.
PROVIDERS = {
    "anthropic": {"keys": ("ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN"), "hosts": ("api.anthropic.com",),
                  "base": "https://api.anthropic.com"},
    "openai": {"keys": ("OPENAI_API_KEY",), "hosts": ("api.openai.com",), "base": "https://api.openai.com/v1"},
    "google": {"keys": ("GEMINI_API_KEY",), "hosts": ("generativelanguage.googleapis.com",),
               "base": "https://generativelanguage.googleapis.com/v1beta"},
}
DEFAULT_PROVIDER = "anthropic"
#: Every credential variable of PROVIDERS, most usual first: passed to its agents only, never to
#: gates; a profile's gateway key goes under the first.
CREDENTIALS = tuple(dict.fromkeys(key for info in PROVIDERS.values() for key in info["keys"]))
#: Every host of PROVIDERS (an attempt reaches its own provider's only: ``hosts_for``).
PROVIDER_HOSTS = tuple(dict.fromkeys(host for info in PROVIDERS.values() for host in info["hosts"]))
#: Its file-writing tools (0.73.1), the names its refusals are recorded under.
WRITE_TOOLS = frozenset({"write", "edit"})
#: Its shell tools' names, as its stream and its provider's wire give them: the transcript keeps their command
#: lines and words them "Runs `command`" (engine/text/transcript.py).
SHELL_TOOLS = ("bash",)
#: Its tools as the model gateway's record of the wire names them (engine/model_gateway/conversation.py
#: ``TOOLS``), each worded as Claude Code's tool of the same meaning, with the input keys renamed.
TOOL_WORDS = {"bash": ("Bash", {"command": "command"}), "read": ("Read", {"path": "file_path"}),
              "write": ("Write", {"path": "file_path"}), "edit": ("Edit", {"path": "file_path"})}
#: How it tells its model a command's exit status in a tool result, before the number
#: (engine/model_gateway/conversation.py reads the status from it).
EXIT_SAID = r"Command exited with code"  # 0.73.1

#: Variables the adapter sets for each attempt (its agent folder and offline mode): a profile's ``env`` may not set them
#: (engine/pipeline/schema/fields.py ENGINE_ENV).
ENGINE_ENV = ("PI_CODING_AGENT_DIR", "PI_OFFLINE")

#: ``pi --help``'s tool allowlist and what loads code or tools: the engine chooses them per role.
PERMISSION_ARGS = (
    "--tools",
    "-t",
    "--no-tools",
    "-nt",
    "--no-builtin-tools",
    "-nbt",
    "--extension",
    "-e",
    "--skill",
    "--prompt-template",
    "--api-key",  # a key in the argument array (and so in the process list): keys come from the environment
)
#: Options the adapter sets itself, and why.
ENGINE_ARGS = {
    "-p": "the prompt is passed by the engine",
    "--print": "the prompt is passed by the engine",
    "--mode": "the engine parses the output format it asks for",
    "--model": "use the profile's model field (provider/model-id)",
    "--models": "use the profile's model field (provider/model-id)",
    "--provider": "give the provider as the prefix of the profile's model field (provider/model-id)",
    "--session": "each attempt starts a fresh session",
    "--session-dir": "each attempt starts a fresh session",
    "--fork": "each attempt starts a fresh session",
    "--resume": "each attempt starts a fresh session",
    "-r": "each attempt starts a fresh session",
    "--continue": "each attempt starts a fresh session",
    "-c": "each attempt starts a fresh session",
    "--export": "the engine runs the agent, not an export",
    "--list-models": "the engine runs the agent, not a listing",
}
#: The options a profile may pass.
EXTRA_ARGS = {
    "--thinking": (r"off|minimal|low|medium|high|xhigh", EVERY_ROLE, "off, minimal, low, medium, high or xhigh"),
    "--verbose": (None, EVERY_ROLE, ""),
}


def provider_of(profile: dict) -> str:
    """The provider a profile's model names (``model: openai/gpt-5``; no prefix: DEFAULT_PROVIDER)."""
    model = str(profile.get("model") or "")
    return model.partition("/")[0] if "/" in model else DEFAULT_PROVIDER


def hosts_for(profile: dict) -> tuple[str, ...]:
    """The hosts one attempt of ``profile`` may reach: its own provider's (not the other providers'
    APIs, a channel out for what the agent read); none for a provider this adapter does not run."""
    return PROVIDERS.get(provider_of(profile), {}).get("hosts", ())
