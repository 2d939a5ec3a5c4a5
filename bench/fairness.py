"""Fairness: ten runs started at once on one worker; the first started is not starved by the others.

Issue 19: "10 runs started at once on one worker all finished between 28.9 and 31.5 s: steps
interleave across runs, so the first run started takes 12x its solo time." Targets: the first run
started finishes within 2x its solo time, and the total stays within 1.2x of today's.

Run from the repository root::

    .venv/bin/python bench/fairness.py                 # SQLite + the filesystem broker
    .venv/bin/python bench/fairness.py --postgres postgres://postgres@127.0.0.1:5432/postgres \
        --redis redis://127.0.0.1:6379/12

*Measured:* a 200-file repository and a one-stage scripted pipeline (bench/enginebench.py: the
implementer writes one file, gate ``true``, reviewer and documenter scripted, so each run has six
steps and three attempts). One real worker with two pool processes (what ``make worker`` starts on
this two-core machine kind). First the *solo* time: three runs one after another, median, each timed
from its create-and-start call to the moment its row says succeeded. Then ``--runs`` runs created
and started one after another as fast as the API allows; the *first* is the first started, timed
the same way, and the *total* is from the first start to the last finish.

*Baseline (today's):* the same batch on a worker started with ``CP_STEP_CHAIN_SECONDS=0``: every
step of every run goes through the queue, so steps interleave across runs, which is how every
worker scheduled before issue 19 (engine/runner.py ``advance_chain``).

*Reported:* solo, first and total of both batches, each run's finish time, and the two ratios.
PASS when first <= 2x solo and total <= 1.2x the baseline's total; FAIL otherwise, or when a run
does not succeed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import enginebench as eb  # noqa: E402

FIRST_TARGET, TOTAL_TARGET = 2.0, 1.2


def batch(pipeline, repo: Path, runs: int) -> tuple[float, float, list[float], list[str]]:
    """``(first run's seconds, total seconds, each run's finish since the first start, problems)``."""
    started, ids = [], []
    for _ in range(runs):
        started.append(time.perf_counter())
        ids.append(eb.start_run(pipeline, repo).pk)
    done = eb.wait_all(ids)
    finishes = [done[pk] - started[0] for pk in ids]
    return done[ids[0]] - started[0], max(done.values()) - started[0], finishes, eb.check_succeeded(ids)


def solo(pipeline, repo: Path, runs: int = 3) -> float:
    """Median seconds of ``runs`` runs one at a time (after one untimed warm-up)."""
    times = []
    for n in range(runs + 1):
        began = time.perf_counter()
        run = eb.start_run(pipeline, repo)
        finished = eb.wait_all([run.pk])[run.pk]
        if n:
            times.append(finished - began)
    return eb.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs started at once")
    parser.add_argument("--files", type=int, default=200, help="files in the repository")
    eb.add_arguments(parser)
    args = parser.parse_args()
    system = eb.System(args, "bench-fairness-")
    problems: list[str] = []
    try:
        system.start()
        print(f"fairness: {eb.load()}; database {'PostgreSQL' if args.postgres else 'SQLite'}, broker "
              f"{'Redis' if args.redis else 'filesystem'}; {args.runs} runs at once, one worker of two pool processes")
        repo = eb.make_repo(system.tmp / "repo", args.files)
        pipeline = eb.save_pipeline(eb.pipeline_doc("bench-fairness", review=True))
        results = {}
        for label, env in (("chained (CP_STEP_CHAIN_SECONDS default)", {}),
                           ("baseline: every step through the queue (CP_STEP_CHAIN_SECONDS=0)",
                            {"CP_STEP_CHAIN_SECONDS": "0"})):
            worker = system.worker(concurrency=2, env=env)
            alone = solo(pipeline, repo)
            first, total, finishes, failed = batch(pipeline, repo, args.runs)
            problems += failed
            results[label] = (alone, first, total)
            print(f"\n{label}:\n  solo {alone:.2f} s; first started finished after {first:.2f} s "
                  f"({first / alone:.1f}x solo); all {args.runs} after {total:.2f} s")
            print("  finish of each run, in the order they were started (s): "
                  + " ".join(f"{f:.1f}" for f in finishes))
            from engine.processes.worker_process import stop_worker

            stop_worker(worker)
            system.workers.remove(worker)
        (alone, first, total), (old_alone, old_first, old_total) = results.values()
        print(f"\nfirst started: {first / alone:.2f}x its solo time (target <= {FIRST_TARGET}x; the baseline's "
              f"{old_first / old_alone:.2f}x its own); total: {total / old_total:.2f}x the baseline's (target <= {TOTAL_TARGET}x)")
    finally:
        system.close()
    failures = []
    if first / alone > FIRST_TARGET:
        failures.append(f"the first run took {first / alone:.2f}x its solo time")
    if total / old_total > TOTAL_TARGET:
        failures.append(f"the total is {total / old_total:.2f}x the baseline's")
    return eb.verdict("fairness", problems, failures, f"first {first / alone:.2f}x solo (<= {FIRST_TARGET}x), total "
                      f"{total / old_total:.2f}x the baseline's (<= {TOTAL_TARGET}x)")


if __name__ == "__main__":
    sys.exit(main())
