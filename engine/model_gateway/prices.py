"""The price of a model call, from the versioned table in engine/model_gateway/prices.json (no Django imports).

The table says where its prices come from and when it was compiled; ``VERSION`` is recorded with
every priced call so that a cost can always be traced to the table that made it. A model that is
not in the table has no known price: ``cost`` returns None (shown as "unknown", never as 0), and a
dollar cap refuses to start an attempt of such a model (engine/model_gateway/meter.py) unless the
pipeline caps its tokens instead.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("prices.json")
#: A request whose input (cached included) passes this many tokens is priced at ``over_200k`` where given.
LONG_CONTEXT_TOKENS = 200_000


@lru_cache(maxsize=1)
def table() -> dict:
    return json.loads(TABLE_PATH.read_text(encoding="utf-8"))


VERSION = table()["version"]


def price_of(model: str) -> dict | None:
    """The table's line for ``model``: its exact name, else the longest listed name it starts with,
    followed by ``-`` and a date or version (``claude-sonnet-4-5-20250929``); a provider prefix
    (``anthropic/``, ``models/``) is dropped. None when not listed."""
    name = str(model or "").strip().lower()
    name = name.rsplit("/", 1)[-1]
    models = table()["models"]
    if name in models:
        return models[name]
    best = ""
    for listed in models:
        if name.startswith(listed + "-") and len(listed) > len(best) and re.fullmatch(
                r"-(?:\d{4}-?\d{2}-?\d{2}|\d{8}|latest|preview[\w.-]*|\d{3})", name[len(listed):]):
            best = listed
    return models[best] if best else None


def cost(model: str, usage: dict) -> float | None:
    """US dollars of one call of ``model`` with ``usage`` (engine/model_gateway/usage.py's keys), or None
    when the model has no price or the call's usage is unknown."""
    line = price_of(model)
    if line is None or usage.get("input_tokens") is None and usage.get("output_tokens") is None:
        return None
    inputs = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cached_tokens", "cache_creation_tokens"))
    if inputs > LONG_CONTEXT_TOKENS and "over_200k" in line:
        line = line["over_200k"]
    dollars = (int(usage.get("input_tokens") or 0) * line["input"] + int(usage.get("cached_tokens") or 0) * line["cached"]
               + int(usage.get("cache_creation_tokens") or 0) * line["cache_write"]
               + int(usage.get("output_tokens") or 0) * line["output"])
    return round(dollars / 1_000_000, 8)
