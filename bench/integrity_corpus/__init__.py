"""The cases of bench/integrity.py: ``corpus()``, the cheats then the honest changes, in the order printed."""

from __future__ import annotations

from . import honest, protection, records
from .base import BASE, Case

__all__ = ["BASE", "Case", "corpus"]


def corpus() -> list[Case]:
    return protection.cheats() + records.cheats() + honest.honest()
