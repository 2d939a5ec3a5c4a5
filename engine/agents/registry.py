"""The agent CLIs this Run Engine runs: one line each (``CLIS``). Adding a CLI touches its folder and
that line.

A CLI's package, ``engine/agents/<package>/``, holds everything the engine knows about it:
``adapter.py`` (its argument arrays, role flags, home and sandbox, and the attempt's result),
``stream.py`` (its output read from the same events into the facts of that result and into the
conversation's entries, engine/text/transcript.py) and ``policy.py`` (plain data: its credential
variables, provider hosts, file-writing tools and the options a profile's ``extra_args`` may pass).
The package's name is also its executable's name (tools/agents, ``make agents``) and its transcript
format's. This module imports the policies only (plain data), so
the modules the adapters themselves use can ask it at import time.
"""
from __future__ import annotations

from importlib import import_module
from types import ModuleType

#: adapter name (a profile's ``adapter``) -> its package under engine/agents/
CLIS = {"claude-code": "claude", "codex": "codex", "gemini-cli": "gemini", "pi": "pi"}


def policy(adapter: str) -> ModuleType | None:
    """``adapter``'s policy module (engine/agents/<package>/policy.py); None for the scripted test
    adapter or an unknown name."""
    package = CLIS.get(adapter)
    return import_module(f"engine.agents.{package}.policy") if package else None


def adapter_module(adapter: str) -> ModuleType:
    """``adapter``'s adapter module (engine/agents/<package>/adapter.py)."""
    return import_module(f"engine.agents.{CLIS[adapter]}.adapter")


def stream(fmt: str) -> ModuleType | None:
    """The stream module of the transcript format ``fmt`` (a package name); None for another."""
    return import_module(f"engine.agents.{fmt}.stream") if fmt in CLIS.values() else None


def credentials() -> dict[str, tuple[str, ...]]:
    """adapter -> its CLI's credential variables, most usual first (``scripted``: none)."""
    return {**{adapter: tuple(policy(adapter).CREDENTIALS) for adapter in CLIS}, "scripted": ()}


def provider_hosts() -> dict[str, tuple[str, ...]]:
    """adapter -> the provider hosts its attempts may reach by default (``scripted``: none)."""
    return {**{adapter: tuple(policy(adapter).PROVIDER_HOSTS) for adapter in CLIS}, "scripted": ()}


def hosts_for(profile: dict) -> tuple[str, ...]:
    """The provider hosts one attempt of ``profile`` may reach: its policy's ``hosts_for`` when it has one
    (a CLI of several providers), else its PROVIDER_HOSTS."""
    found = policy(str(profile.get("adapter") or ""))
    if found is None:
        return ()
    return found.hosts_for(profile) if hasattr(found, "hosts_for") else tuple(found.PROVIDER_HOSTS)


def bundled(name: str) -> list:
    """The values of the policies that set ``name`` (e.g. BUNDLED_BWRAP, a file a CLI's package ships)."""
    return [getattr(policy(adapter), name) for adapter in CLIS if hasattr(policy(adapter), name)]


def bundled_all(name: str) -> tuple[str, ...]:
    """The names of every policy's tuple ``name`` (e.g. ENGINE_ENV), in registry order, once each."""
    return tuple(dict.fromkeys(item for value in bundled(name) for item in value))


def write_tools() -> frozenset[str]:
    """The file-writing tools of every CLI, by the names their adapters record refusals under."""
    return frozenset().union(*(policy(adapter).WRITE_TOOLS for adapter in CLIS))


def tool_words() -> dict[str, tuple[str, dict]]:
    """Every CLI's tools as the model gateway's record names them (each policy's TOOL_WORDS), merged."""
    return {name: word for words in bundled("TOOL_WORDS") for name, word in words.items()}
