"""What an attempt may still spend, checked before each model call leaves the gateway (no Django imports).

A ``Meter`` is made for one attempt from the pipeline's ``budgets`` (docs/pipeline-format.md
"budgets": ``max_tokens``/``max_cost_usd`` for the run, and the same two under ``stage`` and
``attempt``) and what the run and the stage had spent before the attempt (the ledger's sums,
engine/steps/attempts.py). The gateway asks ``admit(model)`` before it forwards a call and tells
``spent(model, usage, cost)`` after it; the caps cannot fail open:

* a call is refused when a level has reached its cap, or when the call would cross it: a model
  call sends the conversation so far, so the next call of an attempt reads at least the input the
  previous one read (``last_input``), counted at its cheapest (the provider's cache price);
* a dollar cap with a model that has no price (engine/model_gateway/prices.py) refuses the call,
  unless a token cap bounds the same spend (a cap in tokens at any level);
* a call whose usage the answer did not say (a cut stream, a format the gateway does not read)
  counts what was said; ``unknown_calls`` keeps how many such calls there were, for the ledger.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field

from . import prices
from .usage import total

LEVELS = ("attempt", "stage", "run")


@dataclass
class Spent:
    tokens: int = 0
    cost_usd: float = 0.0
    #: calls whose cost is unknown (an unpriced model, or usage the answer did not say)
    unpriced_calls: int = 0

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "cost_usd": round(self.cost_usd, 8), "unpriced_calls": self.unpriced_calls}


def caps_of(budgets: dict | None) -> dict:
    """``{level: {"max_tokens", "max_cost_usd"}}`` of a pipeline's ``budgets`` (absent: None, no cap)."""
    budgets = budgets or {}
    return {"run": {"max_tokens": budgets.get("max_tokens"), "max_cost_usd": budgets.get("max_cost_usd")},
            "stage": {key: (budgets.get("stage") or {}).get(key) for key in ("max_tokens", "max_cost_usd")},
            "attempt": {key: (budgets.get("attempt") or {}).get(key) for key in ("max_tokens", "max_cost_usd")}}


@dataclass
class Meter:
    caps: dict = field(default_factory=lambda: caps_of(None))
    #: what the run and the stage had spent before this attempt: {"run": Spent, "stage": Spent}
    before: dict = field(default_factory=dict)
    attempt: Spent = field(default_factory=Spent)
    last_input: int = 0
    #: why the meter refused a call (the first refusal), or ''
    refused: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def level(self, name: str) -> Spent:
        """What ``name`` has spent so far, this attempt included."""
        if name == "attempt":
            return self.attempt
        prior = self.before.get(name) or Spent()
        return Spent(prior.tokens + self.attempt.tokens, prior.cost_usd + self.attempt.cost_usd,
                     prior.unpriced_calls + self.attempt.unpriced_calls)

    def token_capped(self) -> bool:
        return any(self.caps[name].get("max_tokens") is not None for name in LEVELS)

    def capped(self) -> bool:
        """Whether any level has a cap."""
        return any(value is not None for caps in self.caps.values() for value in caps.values())

    def admit(self, model: str, least_input: int = 0) -> str:
        """'' when a call of ``model`` may leave, else the sentence that says which cap it would cross.
        ``least_input``: what the call's own size says it reads at least (tokens)."""
        with self._lock:
            least = max(self.last_input, least_input)
            for name in LEVELS:
                cap = self.caps[name]
                spent = self.level(name)
                limit = cap.get("max_tokens")
                if limit is not None and (spent.tokens >= limit or spent.tokens + least > limit):
                    return self._refuse(
                        f"the {name}'s token budget ({name_of(name, 'max_tokens')}: {limit}) would be crossed: "
                        f"{spent.tokens} tokens spent, and the next call reads at least {least}")
                limit = cap.get("max_cost_usd")
                if limit is None:
                    continue
                if prices.price_of(model) is None and not self.token_capped():
                    return self._refuse(
                        f"the {name}'s dollar budget ({name_of(name, 'max_cost_usd')}: ${limit:g}) cannot be kept: "
                        f"the model {model or '(not named)'} has no price in engine/model_gateway/prices.json (version "
                        f"{prices.VERSION}); cap its tokens (budgets max_tokens) or add its price")
                if spent.unpriced_calls and not self.token_capped():
                    return self._refuse(
                        f"the {name}'s dollar budget ({name_of(name, 'max_cost_usd')}: ${limit:g}) cannot be kept: "
                        f"{spent.unpriced_calls} earlier call(s) have no known cost; cap its tokens (budgets max_tokens)")
                dollars = prices.cost(model, {"cached_tokens": least, "input_tokens": 0}) or 0.0
                if spent.cost_usd >= limit or spent.cost_usd + dollars > limit:
                    return self._refuse(
                        f"the {name}'s dollar budget ({name_of(name, 'max_cost_usd')}: ${limit:g}) would be crossed: "
                        f"${spent.cost_usd:.4f} spent, and the next call costs at least ${dollars:.4f}")
            return ""

    def _refuse(self, why: str) -> str:
        self.refused = self.refused or why
        return why

    def spent(self, usage: dict, cost: float | None) -> None:
        """Count one answered call."""
        with self._lock:
            self.attempt.tokens += total(usage)
            if cost is None:
                self.attempt.unpriced_calls += 1
            else:
                self.attempt.cost_usd += cost
            inputs = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cached_tokens", "cache_creation_tokens"))
            self.last_input = max(self.last_input, inputs)

    def summary(self) -> dict:
        with self._lock:
            return {name: {**self.level(name).as_dict(), **{k: v for k, v in self.caps[name].items()}}
                    for name in LEVELS}


def name_of(level: str, key: str) -> str:
    """The pipeline field of a cap: ``budgets.max_tokens``, ``budgets.stage.max_cost_usd``..."""
    return f"budgets.{key}" if level == "run" else f"budgets.{level}.{key}"


def spend_of(gateway: dict | None, usage: dict | None, simulated: bool = False) -> dict:
    """What one ended attempt spent (``Attempt.spend``, computed once at its end): as its model gateway
    metered it (``gateway``: ``Attempt.gateway``); for an attempt without one (a CLI's own login, the
    scripted test adapter), its CLI's reported ``usage``, with one call of unknown cost when it reported
    tokens without a cost (a simulated one's cost is never unknown money).
    ``{"tokens", "cost_usd", "unpriced_calls"}``."""
    metered = ((gateway or {}).get("meter") or {}).get("attempt")
    if metered:
        return {"tokens": int(metered.get("tokens") or 0), "cost_usd": float(metered.get("cost_usd") or 0),
                "unpriced_calls": int(metered.get("unpriced_calls") or 0)}
    usage = usage or {}
    tokens = sum(int(usage.get(key) or 0) for key in ("input_tokens", "output_tokens", "cached_tokens",
                                                        "cache_creation_tokens"))
    cost = usage.get("cost_usd")
    return {"tokens": tokens, "cost_usd": float(cost or 0),
            "unpriced_calls": 1 if cost is None and tokens and not simulated else 0}


#: Model turns in a row asking for the same tool call with the same input that stop an attempt ``stalled``
#: (the pipeline's ``stall.repeated_calls``, docs/pipeline-format.md).
DEFAULT_REPEATED_CALLS = 5


@dataclass
class LoopWatch:
    """Watches the tool calls of an attempt's model turns, as its gateway sees the answers: ``repeated``
    turns in a row asking for exactly the same calls (names and inputs) are a loop (None: never)."""

    repeated: int | None = DEFAULT_REPEATED_CALLS
    last: list = field(default_factory=list)
    streak: int = 0

    def answered(self, calls: list[tuple[str, str]]) -> str:
        """Note one answer's calls; '' or the sentence that names the loop. An answer without a tool call
        (a side call, a final text) leaves the streak as it is."""
        if not calls or not self.repeated:
            return ""
        self.streak = self.streak + 1 if calls == self.last else 1
        self.last = calls
        if self.streak < self.repeated:
            return ""
        shown = "; ".join(f"{name} {given[:300]}" for name, given in calls[:3])
        return (f"the model asked {self.streak} turns in a row for the same tool call with the same input "
                f"({shown}), a loop (stall.repeated_calls: {self.repeated})")


#: Model calls in a row, and minutes, without progress (no tool result the model had not seen before and no
#: file of the worktree changed) that stop an attempt ``stalled`` (``stall.idle_turns``, ``stall.idle_minutes``).
DEFAULT_IDLE_TURNS = 20
DEFAULT_IDLE_MINUTES = 15.0
#: Files of the worktree a progress check looks at, at most (their paths, sizes and modification times).
FINGERPRINT_FILES = 50_000


def worktree_fingerprint(workspace: str) -> str:
    """A digest of the worktree's files as they stand (paths, sizes, modification times; ``.git`` left out,
    at most FINGERPRINT_FILES): it changes when any file is written, added or removed."""
    digest = hashlib.sha256()
    seen = 0
    for top, folders, files in os.walk(workspace):
        folders[:] = sorted(name for name in folders if name != ".git")
        for name in sorted(files):
            try:
                found = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            digest.update(f"{top}/{name}\0{found.st_size}\0{found.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
            seen += 1
            if seen >= FINGERPRINT_FILES:
                return digest.hexdigest()
    return digest.hexdigest()


@dataclass
class IdleWatch:
    """Watches an attempt for progress, as its gateway sees each model call: a tool result the model had not
    been sent before, or a change of the worktree's files. ``turns`` calls in a row, or ``minutes``, without
    either are a stall (None: never). The worktree is looked at only on a call without a new result."""

    workspace: str = ""
    turns: int | None = DEFAULT_IDLE_TURNS
    minutes: float | None = DEFAULT_IDLE_MINUTES
    seen: set = field(default_factory=set)
    idle: int = 0
    since: float = field(default_factory=time.monotonic)
    fingerprint: str = ""

    def called(self, results: list[str], now: float | None = None) -> str:
        """Note one model call carrying ``results`` (the tool results' texts it sends); '' or the stall."""
        now = time.monotonic() if now is None else now
        fresh = [text for text in results if hashlib.sha256(text.encode()).hexdigest() not in self.seen]
        self.seen.update(hashlib.sha256(text.encode()).hexdigest() for text in results)
        progress = bool(fresh)
        if not progress and self.workspace:
            found = worktree_fingerprint(self.workspace)
            progress, self.fingerprint = bool(self.fingerprint) and found != self.fingerprint, found
        if progress:
            self.idle, self.since = 0, now
            return ""
        self.idle += 1
        if self.turns and self.idle >= self.turns:
            return (f"{self.idle} model calls in a row brought no new tool result and changed no file "
                    f"(stall.idle_turns: {self.turns})")
        if self.minutes and now - self.since >= self.minutes * 60:
            return (f"{(now - self.since) / 60:.0f} minutes brought no new tool result and changed no file "
                    f"(stall.idle_minutes: {self.minutes:g})")
        return ""
