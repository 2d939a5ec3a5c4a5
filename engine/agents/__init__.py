"""Coding-agent adapters: one per CLI, plus the scripted test adapter (simulated runs only)."""
from .base import Adapter, AgentRequest, AgentResult
from .claude import ClaudeCodeAdapter
from .codex import CodexAdapter
from .gemini import GeminiCliAdapter
from .pi import PiAdapter
from .scripted import ScriptedAdapter


def adapters() -> dict[str, type[Adapter]]:
    """The adapters this Run Engine can run, by name."""
    return {ScriptedAdapter.name: ScriptedAdapter, ClaudeCodeAdapter.name: ClaudeCodeAdapter, CodexAdapter.name: CodexAdapter,
            PiAdapter.name: PiAdapter, GeminiCliAdapter.name: GeminiCliAdapter}


def get_adapter(name: str) -> Adapter:
    """A new adapter registered under ``name``; KeyError names the known ones."""
    known = adapters()
    if name not in known:
        raise KeyError(f"no adapter named {name!r} in this Run Engine (known: {', '.join(sorted(known))})")
    return known[name]()


__all__ = ["Adapter", "AgentRequest", "AgentResult", "adapters", "get_adapter"]
