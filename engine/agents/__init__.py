"""Coding-agent adapters: one package per agent CLI (engine/agents/registry.py lists them), plus the
scripted test adapter (simulated runs only)."""
from .base import Adapter, AgentRequest, AgentResult
from .registry import CLIS, adapter_module
from .scripted import ScriptedAdapter


def adapters() -> dict[str, type[Adapter]]:
    """The adapters this Run Engine can run, by name."""
    return {ScriptedAdapter.name: ScriptedAdapter, **{name: adapter_module(name).ADAPTER for name in CLIS}}


def get_adapter(name: str) -> Adapter:
    """A new adapter registered under ``name``; KeyError names the known ones."""
    known = adapters()
    if name not in known:
        raise KeyError(f"no adapter named {name!r} in this Run Engine (known: {', '.join(sorted(known))})")
    return known[name]()


__all__ = ["Adapter", "AgentRequest", "AgentResult", "adapters", "get_adapter"]
