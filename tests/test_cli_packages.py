"""The contract every agent CLI's package keeps (engine/agents/registry.py), the same test over the four.

A CLI's package (engine/agents/<cli>/) holds all the engine knows of it: ``adapter.py``, ``stream.py``
and ``policy.py``. The engine's own tables (credential variables, provider hosts, the extra_args
allow-list, the file-writing tools, the pinned executables, the conversation formats) are read from
the packages, the pinned binary offers every flag each role's boundary needs, and no module outside a
package names its CLI (``test_no_module_outside_its_package_names_a_cli``: the acceptance of issue 21 as
a test).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import boundary
from engine.model_gateway import conversation
from engine.text import transcript
from engine.agents import adapters, cli_options, executables, network, registry
from engine.pipeline.schema import CLI_ADAPTERS, ENGINE_ENV, ENGINE_ENV_PREFIXES, ROLES
from engine.steps.document import WRITE_TOOLS

ROOT = Path(__file__).resolve().parent.parent
CLIS = sorted(registry.CLIS)

#: Modules outside the packages that may name a CLI, and why: what they name is not the CLI.
NAMED_ELSEWHERE = {
    # the provider APIs' wire formats (Anthropic Messages, OpenAI Responses, Google's Gemini API), which
    # every CLI of that provider speaks; "gemini" there is the API's name, kept in stored call records
    # (conversation.py also says that the transcript words every CLI's tools as Claude Code's; the CLIs' own
    # tool names and exit-status wording are in their policies: TOOL_WORDS, EXIT_SAID)
    "engine/model_gateway/conversation.py": "provider wire formats, and the transcript's words",
    "engine/model_gateway/usage.py": "provider wire formats",
    "engine/model_gateway/requests.py": "provider wire formats",
    "engine/model_gateway/prices.py": "a model family's name (claude-sonnet-4-5) in an example",
    # the price table: the providers' model families (claude-opus-4-5, gpt-5-codex, gemini-2.5-pro) and their
    # pricing pages, whichever CLI calls them
    "engine/model_gateway/prices.json": "model families' names and their providers' pricing pages",
    # the scripted model endpoint plays the three provider APIs for the real CLIs in simulated runs; its
    # docstring says which CLI version each answer was checked against
    "engine/scripted_endpoint.py": "a test double of the provider APIs",
    # repository instruction files (CLAUDE.md, GEMINI.md) are given to every agent, whatever its CLI
    "engine/context.py": "repository instruction file names",
    # `make demo` runs the real claude CLI by design (README.md, "make demo")
    "engine/management/commands/demo.py": "the demo's chosen CLI",
}


@pytest.mark.parametrize("adapter", CLIS)
def test_each_cli_package_has_its_three_parts(adapter):
    package = registry.CLIS[adapter]
    cls = registry.adapter_module(adapter).ADAPTER
    assert adapters()[adapter] is cls and cls.name == adapter
    assert cls.executable_name == package and cls.transcript_format == package
    assert callable(registry.stream(package).entries)
    policy = registry.policy(adapter)
    assert policy.CREDENTIALS and all(re.fullmatch(r"[A-Z][A-Z0-9_]*", name) for name in policy.CREDENTIALS)
    assert policy.PROVIDER_HOSTS and all("." in host for host in policy.PROVIDER_HOSTS)
    assert policy.WRITE_TOOLS and isinstance(policy.WRITE_TOOLS, frozenset)
    assert policy.SHELL_TOOLS and set(policy.SHELL_TOOLS) <= set(transcript._SHELL_TOOLS)
    assert all(word in ("Bash", "Read", "Write", "Edit") for word, _ in policy.TOOL_WORDS.values())
    assert re.compile(policy.EXIT_SAID).pattern in conversation._EXIT_SAID.pattern
    for option, (pattern, roles, what) in policy.EXTRA_ARGS.items():
        assert option.startswith("-") and set(roles) <= set(ROLES) and (pattern is None or what), option
        assert option not in policy.PERMISSION_ARGS and option not in policy.ENGINE_ARGS, option


@pytest.mark.parametrize("adapter", CLIS)
def test_the_engine_s_tables_are_read_from_the_package(adapter):
    package, policy = registry.CLIS[adapter], registry.policy(adapter)
    assert adapter in CLI_ADAPTERS and package in executables.PINNED and package in transcript.FORMATS
    assert boundary.CREDENTIALS[adapter] == tuple(policy.CREDENTIALS)
    assert boundary.KEY_TARGETS[adapter] == policy.CREDENTIALS[0]
    assert network.PROVIDER_HOSTS[adapter] == tuple(policy.PROVIDER_HOSTS)
    assert set(getattr(policy, "GATEWAY_ENV", ())) <= set(network.GATEWAY_ENV)
    assert set(network.provider_hosts({"adapter": adapter})) <= set(policy.PROVIDER_HOSTS)
    assert network.provider_hosts({"adapter": adapter})
    assert policy.WRITE_TOOLS <= WRITE_TOOLS
    assert set(getattr(policy, "ENGINE_ENV", ())) <= set(ENGINE_ENV)
    assert set(getattr(policy, "ENGINE_ENV_PREFIXES", ())) <= set(ENGINE_ENV_PREFIXES)
    # what the worker's environment gives an attempt: only this CLI's variables, never another's
    given = {name: f"value-of-{name}" for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "CODEX_API_KEY",
                                                   "GEMINI_API_KEY", "GOOGLE_API_KEY", "UNRELATED_TOKEN")}
    assert set(boundary.credential_env(adapter, given)) <= set(policy.CREDENTIALS)


@pytest.mark.parametrize("adapter", CLIS)
def test_a_profile_cannot_pass_what_the_engine_chooses_and_may_pass_what_is_listed(adapter):
    policy = registry.policy(adapter)
    for option in (*policy.PERMISSION_ARGS, *policy.ENGINE_ARGS):
        problems = cli_options.extra_args_problems(adapter, [option])
        assert problems and problems[0][0] == 0 and option in problems[0][1], (option, problems)
    assert cli_options.extra_args_problems(adapter, ["--not-an-option-of-any-cli"])
    assert cli_options.extra_args_problems(adapter, ["a-bare-word"])
    for option, (pattern, roles, _) in policy.EXTRA_ARGS.items():
        if pattern is None:
            assert cli_options.extra_args_problems(adapter, [option], roles) == [], option
    assert cli_options.extra_args_table(adapter) == policy.EXTRA_ARGS


@pytest.mark.parametrize("adapter", CLIS)
def test_the_conversation_reads_only_its_own_events(adapter):
    normalizer = transcript.Normalizer(registry.CLIS[adapter], "/w")
    assert normalizer.reader is registry.stream(registry.CLIS[adapter])
    assert normalizer.line(b'{"type": "an-event-no-cli-sends"}') == []
    assert normalizer.line(b"plain text the CLI printed") == [{"kind": "output", "text": "plain text the CLI printed"}]
    assert normalizer.line(b"") == []


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("adapter", CLIS)
def test_the_pinned_cli_offers_every_flag_its_roles_boundary_needs(adapter, role):
    """The real binary of tools/agents (``make agents``): its help text names every flag the role's
    boundary depends on, its --version answers, and its operating-system sandbox can be made here."""
    cls = adapters()[adapter]
    assert cls.required_help(cls(), role), "a role whose boundary depends on no flag of the CLI"
    profile = {"adapter": adapter, "model": "anthropic/m" if adapter == "pi" else "m"}
    assert cls().check(profile, role) == []


#: What the name scan reads: the engine's and the Control Panel's code, scripts, styles, data and templates.
SCANNED = (("engine", "*.py"), ("engine", "*.sh"), ("engine", "*.json"), ("controlpanel", "*.py"),
           ("controlpanel", "*.js"), ("controlpanel", "*.css"), ("templates", "*.html"))


def named_clis(text: str) -> list[str]:
    """The CLI names in ``text``, whole words in any case, where ``_`` and ``-`` end a word (``CODEX_HOME``,
    ``claude_home`` and ``gemini-cli`` name one too), a letter or digit does not (``pipeline``, ``api``)."""
    names = "|".join(registry.CLIS.values())
    return re.findall(r"(?<![A-Za-z0-9])(" + names + r")(?![A-Za-z0-9])", text, re.IGNORECASE)


def test_the_name_scan_finds_a_cli_named_every_way():
    """The scan below can fail: each way a module could name a CLI is found, and ordinary words are not."""
    for text in ("CODEX_HOME", "x = 'claude_home'", "/* gemini */", "<!-- pi -->", "gemini-cli", "Claude."):
        assert named_clis(text), text
    for text in ("pipeline", "api", "epic", "claudette", "codexes", "geminis", "spinner", "pi2"):
        assert not named_clis(text), text


def test_no_module_outside_its_package_names_a_cli():
    """``grep`` for a CLI's name (its package's name, whole word, any case: ``named_clis``) in engine/,
    controlpanel/ and templates/ (``SCANNED``), outside engine/agents/<cli>/ and the registry, finds nothing in
    comments, docstrings or code but in NAMED_ELSEWHERE (where the name is a provider API's, a file's or the
    demo's, not the CLI's)."""
    packages = {f"engine/agents/{package}/" for package in registry.CLIS.values()}
    found = []
    for path in sorted(path for folder, pattern in SCANNED for path in ROOT.joinpath(folder).rglob(pattern)):
        rel = path.relative_to(ROOT).as_posix()
        if any(rel.startswith(package) for package in packages) or rel == "engine/agents/registry.py" \
                or rel in NAMED_ELSEWHERE or "/migrations/" in rel:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if named_clis(line):
                found.append(f"{rel}:{number}: {line.strip()[:120]}")
    assert found == [], "a CLI named outside its package:\n" + "\n".join(found)
    for rel in NAMED_ELSEWHERE:
        assert ROOT.joinpath(rel).is_file(), f"NAMED_ELSEWHERE lists {rel}, which is gone"
