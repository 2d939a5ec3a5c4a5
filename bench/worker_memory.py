"""Worker memory: the Run Engine worker's resident memory over 20 runs on a 20,000-file repository.

Issue 19: "The pool child grows ~25 MB over 6 runs on a 20,000-file repository." Target: RSS growth
over 20 runs < 10 MB.

Run from the repository root::

    .venv/bin/python bench/worker_memory.py                      # 20 runs, 20,000 files
    .venv/bin/python bench/worker_memory.py --runs 5 --files 2000  # a quick try

*Measured:* one real worker with one pool process (bench/enginebench.py), a fresh repository of
``--files`` files and a one-stage scripted pipeline (the implementer writes one file, gate ``true``,
reviewer and documenter not configured). Two untimed warm-up runs first (the first of each kind
of step imports modules, fills Django's and git's caches); then ``--runs`` runs one after another.
After each run, with the worker idle, the RSS (psutil ``memory_info().rss``) of the worker's main
process and of its pool process (its direct children) is read.

*Baseline:* the RSS after the warm-up runs, in the same worker.

*Reported:* the RSS after each run, the growth of the pool process and of the main process from
the baseline to the end, and the growth over the second half of the runs (memory that still grows
once caches are full would keep growing there). PASS when the pool process and the main process
each grew less than 10 MB (10^6 bytes); FAIL otherwise, or when a run does not succeed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import enginebench as eb  # noqa: E402

TARGET_MB = 10.0


def rss(main: psutil.Process) -> tuple[float, float]:
    """``(main process MB, pool processes MB)`` of the idle worker."""
    children = [c for c in main.children() if "python" in (c.name() or "") or "celery" in " ".join(c.cmdline())]
    return main.memory_info().rss / 1e6, sum(c.memory_info().rss for c in children) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2)
    eb.add_arguments(parser)
    args = parser.parse_args()
    system = eb.System(args, "bench-worker-memory-")
    problems, figures = [], []
    try:
        system.start()
        print(f"worker memory: {eb.load()}; database {'PostgreSQL' if args.postgres else 'SQLite'}, broker "
              f"{'Redis' if args.redis else 'filesystem'}; {args.runs} runs on {args.files} files")
        repo = eb.make_repo(system.tmp / "repo", args.files)
        pipeline = eb.save_pipeline(eb.pipeline_doc("bench-memory"))
        worker = psutil.Process(system.worker(concurrency=1).pid)
        for n in range(args.warmup + args.runs):
            began = time.perf_counter()
            run = eb.start_run(pipeline, repo)
            eb.wait_all([run.pk])
            problems += eb.check_succeeded([run.pk])
            time.sleep(0.5)  # the pool process back to idle: its task returned
            main_mb, pool_mb = rss(worker)
            label = "warm-up" if n < args.warmup else f"run {n - args.warmup + 1:2d}"
            print(f"  {label}: {time.perf_counter() - began:5.1f} s; RSS main {main_mb:6.1f} MB, pool {pool_mb:6.1f} MB")
            if n >= args.warmup - 1:
                figures.append((main_mb, pool_mb))
    finally:
        system.close()
    (main0, pool0), (main1, pool1) = figures[0], figures[-1]
    half = figures[len(figures) // 2]
    print(f"\ngrowth after the warm-up: pool {pool1 - pool0:+.1f} MB, main {main1 - main0:+.1f} MB "
          f"(second half of the runs: pool {pool1 - half[1]:+.1f} MB, main {main1 - half[0]:+.1f} MB)")
    failures = []
    if pool1 - pool0 >= TARGET_MB:
        failures.append(f"the pool process grew {pool1 - pool0:.1f} MB")
    if main1 - main0 >= TARGET_MB:
        failures.append(f"the main process grew {main1 - main0:.1f} MB")
    return eb.verdict("worker memory", problems, failures, f"growth over {args.runs} runs < {TARGET_MB:.0f} MB (pool "
                      f"{pool1 - pool0:+.1f} MB, main {main1 - main0:+.1f} MB)")


if __name__ == "__main__":
    sys.exit(main())
