"""The run's budgets (``definition.pipeline.budgets``): what an attempt spent, and whether a step may still be
taken (docs/pipeline-format.md "budgets"). The model gateway keeps the spend caps live within an attempt
(engine/model_gateway/meter.py); these checks run between steps (engine/runner.py) and say whether a
person may still recover a run (engine/answers.py ``exhausted_budget``).
"""
from __future__ import annotations

from .model_gateway import spend_of
from .models import Attempt, Run

#: Steps that start an agent attempt (count against the run's max_attempts budget).
AGENT_STEPS = frozenset({"implement", "review", "repair", "document"})


def spent_by(attempt: Attempt) -> dict:
    """What an attempt spent against the budgets: ``Attempt.spend``, recorded at its end; for an attempt
    ended before it was recorded, its reported usage (engine/model_gateway/meter.py ``spend_of``)."""
    return attempt.spend or spend_of(None, attempt.usage, attempt.simulated)


def budget_problem(run: Run, step, attempts: list | None = None) -> str | None:
    """A sentence when taking ``step`` would pass one of the run's budgets, else None.

    Budgets (``definition.pipeline.budgets``; None is unlimited): ``max_active_seconds``
    against the persisted active time (agents and gates; waiting for a person does not
    count), ``max_attempts`` against the run's agent attempts, ``max_tokens`` and ``max_cost_usd``
    against what the attempts' model gateways metered (engine/model_gateway/meter.py ``spend_of``;
    an attempt without one counts its CLI's reported usage; an unknown cost counts 0 here: the
    gateway refuses a call whose cost it cannot know under a dollar cap), and a run its model
    gateway stopped at a cap (``budget_reached``) takes no agent step again: it needs a new run. ``attempts`` (every Attempt row of the run) spares the queries when
    the caller has them (a page that reads many runs at once).
    """
    if step.kind == "finish":
        return None
    budgets = run.definition["pipeline"].get("budgets") or {}
    limit = budgets.get("max_active_seconds")
    if limit is not None and run.active_seconds >= limit:
        return (f"The run has used {run.active_seconds:.0f} s of active time, its budget is {limit:.0f} s "
                f"(budgets.max_active_seconds).")
    limit = budgets.get("max_attempts")
    if limit is not None and step.kind in AGENT_STEPS:
        used = len(attempts) if attempts is not None else run.attempts.count()
        if used >= limit:
            return f"The run has made {used} agent attempts, its budget is {limit} (budgets.max_attempts)."
    if step.kind in AGENT_STEPS and (budgets.get("max_cost_usd") is not None or budgets.get("max_tokens") is not None):
        spends = [spent_by(a) for a in (attempts if attempts is not None
                                         else run.attempts.only("spend", "usage", "simulated"))]
        spends.append((run.carried or {}).get("spent") or {"tokens": 0, "cost_usd": 0.0})  # the runs it continues
        limit = budgets.get("max_tokens")
        spent = sum(found["tokens"] for found in spends)
        if limit is not None and spent >= limit:
            return f"The run's model calls have used {spent} tokens, its budget is {limit} (budgets.max_tokens)."
        limit = budgets.get("max_cost_usd")
        spent = sum(found["cost_usd"] for found in spends)
        if limit is not None and spent >= limit:
            return (f"The run's model calls have cost ${spent:.4f}, its budget is ${limit:.2f} "
                    f"(budgets.max_cost_usd).")
    if run.stop_reason == "budget_reached" and step.kind in AGENT_STEPS:
        return f"Its model gateway stopped an attempt at a cap: {run.stop_message}"
    return None
