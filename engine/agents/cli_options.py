"""Which command-line options a profile's ``extra_args`` may pass to each agent CLI: an allow-list.

A pipeline author writes ``extra_args`` and is less trusted than the operator (README.md, "Who
decides what"): an option that widens a role (an MCP server, a plugin folder, a permission mode)
would let a pipeline run what it likes inside the agent's sandbox. So each CLI's options are
listed only after someone read what they do (its policy's ``EXTRA_ARGS``); the options the engine
sets per role (``PERMISSION_ARGS``) or owns (``ENGINE_ARGS``) are named as such in a refusal, and
everything else is refused. The tables are each CLI's (engine/agents/<cli>/policy.py, through
engine/agents/registry.py); a policy may add ``spellings(option)`` (a parser that reads one option
under several names), ``refusal(given, option)`` (what it refuses before the tables are looked at,
with ``REFUSED_ARGS``, the names that refusal knows) and ``value_refusal(option, value)`` (a value
refused for what it sets). engine/pipeline/schema/profiles.py checks a definition with ``_refused_args``
when it is loaded or saved; engine/operations.py again at run creation (``extra_args_problems``).
docs/pipeline-format.md ("extra_args") prints the table. No Django imports.
"""
from __future__ import annotations

import re

#: The roles (engine/pipeline/schema/common.py ROLES).
EVERY_ROLE = ("implementer", "reviewer", "documenter")
#: Value patterns the policies' EXTRA_ARGS use: a word, a model name.
WORD = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
MODEL = r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}"

# A policy's EXTRA_ARGS: the options a profile's ``extra_args`` may pass, ``option: (value, roles, what)``
# where ``value`` is None for a flag, else a pattern its value must match whole (given as ``--opt=V``
# or as the next argument), ``roles`` the roles a profile using it may play and ``what`` the words
# for its value. Everything else is refused: an option is listed only after someone read what it does
# (each neither widens what a role may touch nor sends anything elsewhere), so a new release's new
# option is refused until it is reviewed. Its PERMISSION_ARGS (permission and sandbox options decide
# what a role may do, reviewers read-only, writers inside their scope: the engine chooses them per role,
# docs/agents.md) and ENGINE_ARGS (those that carry the prompt, model and output the adapter parses)
# are named as such in a refusal. docs/pipeline-format.md prints the tables.


def _policy(adapter: str):
    from . import registry  # noqa: PLC0415 - the policies import this module's patterns

    return registry.policy(adapter)


def has_options(adapter: str) -> bool:
    """Whether ``adapter`` runs a CLI whose command line a profile's ``extra_args`` extend."""
    return _policy(adapter) is not None


def extra_args_table(adapter: str) -> dict:
    """``adapter``'s EXTRA_ARGS (``{}`` for one without a command line)."""
    found = _policy(adapter)
    return dict(found.EXTRA_ARGS) if found is not None else {}


def _spellings(policy, option: str) -> list[str]:
    """The option names ``option`` stands for on the CLI's command line (its policy's ``spellings``;
    the others match names exactly: clap, commander, one CLI's own parser)."""
    return policy.spellings(option) if hasattr(policy, "spellings") else [option]


def extra_args_problems(adapter: str, args: list, roles: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """``[(index, problem)]`` of a profile's ``extra_args`` for ``roles`` (empty: allowed); no
    problem for an adapter without a command line (``scripted``). engine/operations.py asks again
    at run creation, for a definition saved before a rule changed."""
    return _refused_args(adapter, list(args), tuple(roles)) if has_options(adapter) else []


def _allowed_list(policy) -> str:
    return ", ".join(f"{option}{'' if value is None else ' VALUE'}" for option, (value, _, _) in policy.EXTRA_ARGS.items())


def _option_refusal(adapter: str, arg: str, given: str, option: str, allowed) -> str | None:
    """Why ``arg`` (its name ``given``, read as ``option``) is refused outright, or None when it is
    an option of EXTRA_ARGS (whose value and roles are checked next)."""
    policy = _policy(adapter)
    said = policy.refusal(given, option) if hasattr(policy, "refusal") else None
    if said:
        return said
    if option in policy.PERMISSION_ARGS:
        return (f"'{given}' is refused: the engine chooses permission and sandbox options for each role "
                "(reviewers read-only, writers inside their scope)")
    if option in policy.ENGINE_ARGS:
        return f"'{given}' is set by the adapter: {policy.ENGINE_ARGS[option]}"
    if not given.startswith("-"):
        return (f"'{arg}' is refused: a bare word would be read as the prompt or a subcommand "
                f"(allowed for {adapter}: {_allowed_list(policy)})")
    if allowed is None:
        return (f"'{given}' is not an option the engine allows for {adapter}: an option is refused until it "
                f"is reviewed and listed (allowed: {_allowed_list(policy)}; docs/pipeline-format.md, extra_args)")
    return None


def _refused_args(adapter: str, args: list, roles: tuple[str, ...] = ()) -> list:
    """Problems with extra_args, ``(index, problem)``: an option the engine sets for a role or
    owns (named as such), any option not in EXTRA_ARGS, a value that does not match, an option
    not allowed for one of ``roles`` (those the profile plays), or a bare word (it would be read
    as the prompt or a subcommand). A problem is named at the option, not at its value."""
    policy = _policy(adapter)
    known = (*policy.PERMISSION_ARGS, *policy.ENGINE_ARGS, *getattr(policy, "REFUSED_ARGS", ()), *policy.EXTRA_ARGS)
    problems = []
    index = 0
    while index < len(args):
        arg = str(args[index])
        given, has_value, value = arg.partition("=")[0], "=" in arg, arg.partition("=")[2]
        option = next((name for name in _spellings(policy, given) if name in known), given)
        allowed = policy.EXTRA_ARGS.get(option) if option == given or hasattr(policy, "spellings") else None
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
            said = policy.value_refusal(option, value) if hasattr(policy, "value_refusal") else None
            if said:
                problems.append((start, said))
            else:
                problems.append((start, f"'{given}' is refused with " + (repr(value) if has_value else "no value")
                                 + f": it takes {what}"))
        elif pattern is None and has_value:
            problems.append((start, f"'{given}' takes no value"))
        problems += [(start, f"'{given}' is not allowed for the {role} role (it may be used by: "
                      f"{', '.join(option_roles)})") for role in roles if role not in option_roles]
        index += 1
    return problems
