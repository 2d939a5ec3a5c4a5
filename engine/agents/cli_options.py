"""Which command-line options a profile's ``extra_args`` may pass to each agent CLI: an allow-list.

A pipeline author writes ``extra_args`` and is less trusted than the operator (README.md, "Who
decides what"): an option that widens a role (an MCP server, a plugin folder, a permission mode)
would let a pipeline run what it likes inside the agent's sandbox. So each CLI's options are
listed only after someone read what they do (``EXTRA_ARGS``); the options the engine sets per
role (``_PERMISSION_ARGS``) or owns (``_ENGINE_ARGS``) are named as such in a refusal, and
everything else is refused. engine/pipeline_schema/profiles.py checks a definition with ``_refused_args``
when it is loaded or saved; engine/operations.py again at run creation (``extra_args_problems``).
docs/pipeline-format.md ("extra_args") prints the table. No Django imports.
"""
from __future__ import annotations

import re

#: The roles (engine/pipeline_schema/common.py ROLES).
_EVERY_ROLE = ("implementer", "reviewer", "documenter")

# Command-line options an adapter sets itself. Permission and sandbox options decide what a
# role may do (reviewers read-only, writers inside their scope), so a profile cannot add
# them: the engine chooses them per role (docs/agents.md). The others carry the prompt,
# model and output the adapter parses. Checked against Claude Code 2.1.197 and Codex CLI
# 0.171.0 `--help` (tests/test_claude_adapter.py and tests/test_codex_adapter.py run the real binaries).
_PERMISSION_ARGS = {
    "claude-code": (
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
    ),
    "codex": (
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
    ),
    # gemini 0.61.0 `gemini --help` (engine/agents/gemini.py): approval, sandbox, policy, trust and what adds tools
    "gemini-cli": (
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
    ),
    # pi 0.73.1 `pi --help` (engine/agents/pi.py): the tool allowlist, and what loads code or tools
    "pi": (
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
    ),
}
_ENGINE_ARGS = {
    "claude-code": {
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
    },
    "codex": {
        "-m": "use the profile's model field",
        "--model": "use the profile's model field",
        "--json": "the engine parses the output format it asks for",
        "-o": "the engine reads the final message itself",
        "--output-last-message": "the engine reads the final message itself",
    },
    "gemini-cli": {
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
    },
    "pi": {
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
    },
}
# Codex `-c key=value` overrides that touch permissions.
_CODEX_PERMISSION_CONFIG = ("sandbox", "approval")


#: Gemini CLI 0.61.0's subcommands (`gemini --help`, "Commands"): a bare word in extra_args that
#: names one would run it (`gemini mcp list`) instead of the agent.
_GEMINI_COMMANDS = ("mcp", "extensions", "extension", "skills", "skill", "hooks", "hook", "gemma")
#: Gemini CLI options that would let something other than the model answer (0.61.0's hidden
#: test options): a file in the worktree could play the model in a run not labelled simulated.
_GEMINI_FAKE_MODEL = ("--fake-responses", "--fake-responses-non-strict", "--record-responses")


def _spellings(adapter: str, option: str) -> list[str]:
    """The option names ``option`` stands for on ``adapter``'s command line. Gemini CLI 0.61.0
    parses with yargs, which also takes an option in camelCase (``--skipTrust``), negated
    (``--no-sandbox``), with underscores, with three dashes (``---yolo``), a short alias after two
    (``--y``) and short flags grouped (``-sy``): each is turned back into the names
    the lists above hold. The other CLIs match names exactly (clap, commander, pi's own parser)."""
    if adapter != "gemini-cli" or not option.startswith("-"):
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


#: The options a profile's ``extra_args`` may pass, per CLI: ``option: (value, roles)`` where
#: ``value`` is None for a flag, else a pattern its value must match whole (given as ``--opt=V``
#: or as the next argument), and ``roles`` the roles a profile using it may play. Everything else
#: is refused: an option is listed only after someone read what it does (each below neither widens
#: what a role may touch nor sends anything elsewhere), so a new release's new option is refused
#: until it is reviewed. docs/pipeline-format.md prints this table.
_WORD = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_MODEL = r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}"
EXTRA_ARGS: dict[str, dict[str, tuple[str | None, tuple[str, ...], str]]] = {
    "claude-code": {
        "--verbose": (None, _EVERY_ROLE, ""),
        "--append-system-prompt": (r"(?s).{1,4000}", _EVERY_ROLE, "a text of at most 4000 characters"),
        "--fallback-model": (_MODEL, _EVERY_ROLE, "a model name"),
        "--effort": (_WORD, _EVERY_ROLE, "a level such as high"),
        "--max-budget-usd": (r"[0-9]{1,6}(\.[0-9]{1,4})?", _EVERY_ROLE, "an amount such as 2.50"),
    },
    "codex": {  # -c KEY=VALUE, only these keys (others set providers, MCP servers, the shell or the sandbox)
        "-c": (r"(model_reasoning_effort|model_reasoning_summary|model_verbosity|hide_agent_reasoning)="
               r"\"?" + _WORD + r"\"?", _EVERY_ROLE, "model_reasoning_effort=, model_reasoning_summary=, "
               "model_verbosity= or hide_agent_reasoning= with a word (no other codex setting)"),
    },
    "gemini-cli": {
        "--debug": (None, _EVERY_ROLE, ""),
        "-d": (None, _EVERY_ROLE, ""),
        "--screen-reader": (None, _EVERY_ROLE, ""),
    },
    "pi": {
        "--thinking": (r"off|minimal|low|medium|high|xhigh", _EVERY_ROLE, "off, minimal, low, medium, high or xhigh"),
        "--verbose": (None, _EVERY_ROLE, ""),
    },
}


def extra_args_problems(adapter: str, args: list, roles: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """``[(index, problem)]`` of a profile's ``extra_args`` for ``roles`` (empty: allowed); no
    problem for an adapter without a command line (``scripted``). engine/operations.py asks again
    at run creation, for a definition saved before a rule changed."""
    return _refused_args(adapter, list(args), tuple(roles)) if adapter in _PERMISSION_ARGS else []


def _allowed_list(adapter: str) -> str:
    return ", ".join(f"{option}{'' if value is None else ' VALUE'}" for option, (value, _, _) in EXTRA_ARGS[adapter].items())


def _option_refusal(adapter: str, arg: str, given: str, option: str, allowed) -> str | None:
    """Why ``arg`` (its name ``given``, read as ``option``) is refused outright, or None when it is
    an option of EXTRA_ARGS (whose value and roles are checked next)."""
    if adapter == "gemini-cli" and given in _GEMINI_COMMANDS:
        return f"'{given}' is refused: it is a gemini subcommand, which would run instead of the agent"
    if adapter == "gemini-cli" and given.startswith("-") and not given.startswith("--") and len(given) > 2:
        # yargs reads every letter of -dy (-d and -y): a group is never read as its first letter only
        return f"'{given}' is refused: short flags grouped together are not taken; give each option on its own"
    if adapter == "gemini-cli" and option in _GEMINI_FAKE_MODEL:
        return (f"'{given}' is refused: the model's answers come from its provider or the profile's "
                "scripted_endpoint, never from a file")
    if option in _PERMISSION_ARGS[adapter]:
        return (f"'{given}' is refused: the engine chooses permission and sandbox options for each role "
                "(reviewers read-only, writers inside their scope)")
    if option in _ENGINE_ARGS[adapter]:
        return f"'{given}' is set by the adapter: {_ENGINE_ARGS[adapter][option]}"
    if not given.startswith("-"):
        return (f"'{arg}' is refused: a bare word would be read as the prompt or a subcommand "
                f"(allowed for {adapter}: {_allowed_list(adapter)})")
    if allowed is None:
        return (f"'{given}' is not an option the engine allows for {adapter}: an option is refused until it "
                f"is reviewed and listed (allowed: {_allowed_list(adapter)}; docs/pipeline-format.md, extra_args)")
    return None


def _refused_args(adapter: str, args: list, roles: tuple[str, ...] = ()) -> list:
    """Problems with extra_args, ``(index, problem)``: an option the engine sets for a role or
    owns (named as such), any option not in EXTRA_ARGS, a value that does not match, an option
    not allowed for one of ``roles`` (those the profile plays), or a bare word (it would be read
    as the prompt or a subcommand). A problem is named at the option, not at its value."""
    problems = []
    index = 0
    while index < len(args):
        arg = str(args[index])
        given, has_value, value = arg.partition("=")[0], "=" in arg, arg.partition("=")[2]
        option = next((name for name in _spellings(adapter, given) if name in _PERMISSION_ARGS[adapter] or name in
                       _ENGINE_ARGS[adapter] or name in _GEMINI_FAKE_MODEL or name in EXTRA_ARGS[adapter]), given)
        allowed = EXTRA_ARGS[adapter].get(option) if option == given or adapter == "gemini-cli" else None
        start = index
        refusal = _option_refusal(adapter, arg, given, option, allowed)
        if refusal is not None:
            problems.append((start, refusal))
            if given.startswith("-") and not has_value and index + 1 < len(args) \
                    and not str(args[index + 1]).startswith("-"):
                index += 1  # the refused option's value: named once, with its option
            index += 1
            continue
        pattern, option_roles, what = allowed
        if pattern is not None and not has_value and index + 1 < len(args):
            index += 1
            value, has_value = str(args[index]), True
        if pattern is not None and not (has_value and re.fullmatch(pattern, value)):
            if option == "-c" and value.strip().strip('"').lower().startswith(_CODEX_PERMISSION_CONFIG):
                problems.append((start, f"'{option} {value}' is refused: sandbox and approval settings are chosen "
                                 "by the engine for each role"))
            else:
                problems.append((start, f"'{given}' is refused with " + (repr(value) if has_value else "no value")
                                 + f": it takes {what}"))
        elif pattern is None and has_value:
            problems.append((start, f"'{given}' takes no value"))
        problems += [(start, f"'{given}' is not allowed for the {role} role (it may be used by: "
                      f"{', '.join(option_roles)})") for role in roles if role not in option_roles]
        index += 1
    return problems
