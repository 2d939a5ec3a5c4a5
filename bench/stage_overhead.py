"""Stage overhead: a one-stage run against the same git plumbing done by a shell script.

Issue 19's figure: "A one-stage run whose scripted implementer makes a trivial edit, gate `true`,
took 19.3x the same git plumbing done by a shell script ... on a 200-file repository ... and 4.1x
on 20,000 files." Targets: <= 3x at 200 files, <= 1.5x at 20,000.

Run from the repository root::

    .venv/bin/python bench/stage_overhead.py                        # 200 and 20,000 files, SQLite + file broker
    .venv/bin/python bench/stage_overhead.py --postgres postgres://postgres@127.0.0.1:5432/postgres \
        --redis redis://127.0.0.1:6379/12                            # PostgreSQL and Redis (the issue's figures)
    .venv/bin/python bench/stage_overhead.py --files 200 --runs 3   # a quick try

*Measured:* for each repository size, a fresh repository of that many files; one real worker
(concurrency 1) already started; one untimed run of each side, then ``--runs`` of each, the two sides in
turn, each after ``sync`` (the disk writes of a 20,000-file checkout otherwise land on whichever side
comes next). An engine run is timed from the create-and-start call to the moment its row says
succeeded (polled every 10 ms).
The pipeline has one stage: the scripted implementer writes one file, gate ``true``, reviewer and
documenter not configured (``--review`` adds a scripted reviewer and documenter, for comparison).

*Baseline:* the same git plumbing by ``sh`` on the same repository, each time on a new branch: ``git worktree add -b``, the edit, ``git add -A`` and ``git write-tree`` on a temporary index
(a copy of the worktree's), the gate (``true``), ``git commit-tree`` and ``git update-ref``. Medians.

*Reported:* both medians, their ratio, and the breakdown of the median run by its events (engine
``RunEvent`` rows: each event's time since the start request, and the time since the event before).
PASS when every size's ratio is within its target, FAIL otherwise (exit status 1); also FAIL when a
run does not succeed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import enginebench as eb  # noqa: E402

#: Ratio targets by repository size (files): issue 19.
TARGETS = {200: 3.0, 20_000: 1.5}

SCRIPT = r"""set -e
repo="$1"; wt="$2"; branch="$3"
git -C "$repo" worktree add -q -b "$branch" "$wt" main
printf '%s\n\n\ndef answer():\n    return 42\n' "'Core.'" > "$wt/app/core.py"
index="$wt.index"
cp "$(git -C "$wt" rev-parse --path-format=absolute --git-path index)" "$index"
GIT_INDEX_FILE="$index" git -C "$wt" add -A
tree=$(GIT_INDEX_FILE="$index" git -C "$wt" write-tree)
(cd "$wt" && true)
commit=$(git -C "$wt" commit-tree "$tree" -p HEAD -m checkpoint)
git -C "$wt" update-ref "refs/heads/$branch" "$commit"
rm -f "$index"
"""


def plumbing(script: Path, repo: Path, work: Path, n: int) -> float:
    """Seconds of one shell-script run (``SCRIPT``) on ``repo``, on branch ``bench-<n>``."""
    env = {**eb.GIT_ENV, "PATH": "/usr/bin:/bin", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    started = time.perf_counter()
    subprocess.run(["sh", str(script), str(repo), str(work / f"wt-{n}"), f"bench-{n}"], check=True, env=env)
    return time.perf_counter() - started


def engine_run(pipeline, repo: Path) -> tuple[float, int, list[str]]:
    """``(seconds from the create-and-start call to the row saying it ended, the run's id, problems)``."""
    started = time.perf_counter()
    run = eb.start_run(pipeline, repo)
    done = eb.wait_all([run.pk])[run.pk]
    return done - started, run.pk, eb.check_succeeded([run.pk])


def measure(pipeline, repo: Path, work: Path, runs: int) -> tuple[list[float], list[float], list[int], list[str]]:
    """``(engine seconds, shell seconds, the engine runs' ids, problems)``: ``runs`` of each, taken in
    turn (shell, engine, shell, ...) after one untimed warm-up of each (the page cache, the worker's
    imports), with ``sync`` before each one, so that neither side pays for the disk writes the other
    left behind (a 20,000-file checkout is ~100 MB written)."""
    script = work / "plumbing.sh"
    script.write_text(SCRIPT)
    engine, shell, ids, problems = [], [], [], []
    for n in range(runs + 1):
        os.sync()
        plain = plumbing(script, repo, work, n)
        os.sync()
        took, run_id, failed = engine_run(pipeline, repo)
        problems += failed
        if n:
            shell.append(plain)
            engine.append(took)
            ids.append(run_id)
    return engine, shell, ids, problems


def breakdown(run_id: int) -> list[str]:
    """Lines: each event of the run, its offset from the start request and the gap before it (ms)."""
    lines, before = [], 0.0
    for kind, at in eb.event_times(run_id):
        lines.append(f"    {at * 1000:8.0f} ms  (+{(at - before) * 1000:6.0f})  {kind}")
        before = at
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, nargs="+", default=sorted(TARGETS), help="repository sizes (files)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per size, engine and baseline each")
    parser.add_argument("--review", action="store_true", help="with a scripted reviewer and documenter")
    eb.add_arguments(parser)
    args = parser.parse_args()
    system = eb.System(args, "bench-stage-overhead-")
    verdicts = []
    try:
        system.start()
        print(f"stage overhead: {eb.load()}; database {'PostgreSQL' if args.postgres else 'SQLite'}, broker "
              f"{'Redis' if args.redis else 'filesystem'}; reviewer and documenter "
              f"{'scripted' if args.review else 'not configured'}")
        system.worker(concurrency=1)
        for files in args.files:
            repo = eb.make_repo(system.tmp / f"repo-{files}", files)
            work = system.tmp / f"plain-{files}"
            work.mkdir()
            pipeline = eb.save_pipeline(eb.pipeline_doc(f"bench-{files}", review=args.review))
            times, base, ids, problems = measure(pipeline, repo, work, args.runs)
            ratio = eb.median(times) / eb.median(base)
            target = TARGETS.get(files)
            print(f"\n{files} files: engine median {eb.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}); "
                  f"shell plumbing median {eb.median(base):.3f} s; ratio {ratio:.1f}x"
                  + (f" (target <= {target}x)" if target else " (no target for this size)"))
            middle = ids[sorted(range(len(times)), key=times.__getitem__)[len(times) // 2]]
            print(f"  the median run ({middle}), by its events:")
            print("\n".join(breakdown(middle)))
            for line in problems:
                print("  NOT SUCCEEDED: " + line)
            if problems:
                verdicts.append(f"{files} files: {len(problems)} runs did not succeed")
            elif target and ratio > target:
                verdicts.append(f"{files} files: {ratio:.1f}x > {target}x")
            shutil.rmtree(work, ignore_errors=True)
    finally:
        system.close()
    if verdicts:
        print("FAIL: stage overhead: " + "; ".join(verdicts))
        return 1
    print("PASS: stage overhead within " + ", ".join(f"{t}x at {f} files" for f, t in TARGETS.items() if f in args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
