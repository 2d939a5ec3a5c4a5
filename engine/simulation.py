"""Whether a profile is simulated: one answer for the models, the engine and the pages
(engine/answers.py re-exports it). No import of the project's own, so engine/models.py can use it."""
from __future__ import annotations


def simulation(adapter: str, profile: dict | None = None) -> str:
    """Why a profile is simulated: ``"scripted test adapter"`` (adapter ``scripted``),
    ``"scripted model endpoint"`` (a real CLI against its ``scripted_endpoint``), or ``""`` when
    a real model decides. ``profile`` is the profile's definition (docs/pipeline-format.md)."""
    if adapter == "scripted":
        return "scripted test adapter"
    if (profile or {}).get("scripted_endpoint"):
        return "scripted model endpoint"
    return ""
