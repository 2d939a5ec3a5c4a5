"""Benchmark: what the engine's pytest reporter (engine/checks/test_reports) costs a real test suite.

Issue text: "The more-itertools-size suite (600+ tests) keeps its gate time within 1.1x of plain
pytest with the reporter loaded (bench/, side by side)."

Run from the repository root (``make samples`` fetches the suite into tools/repos/)::

    .venv/bin/python bench/test_record.py            # 7 rounds
    .venv/bin/python bench/test_record.py --rounds 3

The suite is more-itertools 10.5.0 from its sdist (scripts/samples/pins.txt: 663 tests and 2,332
subtests), copied into a temporary folder under ``$TMPDIR``. Each round runs
``python -m pytest -q -p no:cacheprovider`` there twice, side by side in random order: plain, and
with the reporter loaded exactly as a gate loads it (``test_reports.prepare``: its module in a
folder of its own, ``PYTEST_PLUGINS``, the record file). The record is read and judged as a gate's
is (``test_reports.read``, ``judge``): it must say every test passed and the session finished.

Measured per run: the CPU seconds of the pytest process (user + system, ``RUSAGE_CHILDREN``), and
its wall time. The figure held against the target is the ratio of the medians of CPU seconds
(wall time, noisier on a shared machine, is printed beside it).

Target: CPU ratio <= 1.1. Prints PASS or FAIL and exits 0 or 1 (also FAIL when a run did not pass or
the record does not agree with it).
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SUITE = ROOT / "tools" / "repos" / "more-itertools-10.5.0"
COMMAND = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def one_run(folder: Path, home: Path, with_reporter: bool) -> tuple[float, float, int, dict | None]:
    """``(cpu seconds, wall seconds, exit status, the record's summary)`` of one run of the suite."""
    from engine.checks import test_reports

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    reporter = test_reports.prepare(home, home) if with_reporter else None
    if reporter is not None:
        env = reporter.env(env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(COMMAND, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=600)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = None
    if reporter is not None:
        summary = test_reports.read(reporter.record)
        reporter.record.unlink(missing_ok=True)
        reporter.remove()
    return cpu, wall, done.returncode, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not SUITE.is_dir():
        print(f"FAIL: {SUITE.relative_to(ROOT)} is missing: run `make samples` first")
        return 1
    from engine.checks import test_reports

    work = Path(tempfile.mkdtemp(prefix="bench-test-record-"))
    try:
        folder = work / "suite"
        shutil.copytree(SUITE, folder)
        home = work / "home"
        home.mkdir()
        one_run(folder, home, False)  # warm the file cache once, not counted
        plain: list[tuple[float, float]] = []
        recorded: list[tuple[float, float]] = []
        problems = []
        for round_no in range(1, args.rounds + 1):
            order = [False, True]
            random.shuffle(order)
            for with_reporter in order:
                cpu, wall, status, summary = one_run(folder, home, with_reporter)
                if status != 0:
                    problems.append(f"round {round_no}: pytest exited {status}" + (" with the reporter" if with_reporter
                                                                                   else ""))
                if with_reporter:
                    failure, why = test_reports.judge("python -m pytest", status, summary)
                    if summary is None or failure or summary["finished"] != 1 or summary["counts"]["failed"]:
                        problems.append(f"round {round_no}: the record does not agree ({failure or why or summary})")
                    elif round_no == 1:
                        print(f"the record: {test_reports.sentence(summary)}")
                    recorded.append((cpu, wall))
                else:
                    plain.append((cpu, wall))
            print(f"round {round_no}: plain {plain[-1][0]:.2f} s CPU ({plain[-1][1]:.2f} s wall), with the reporter "
                  f"{recorded[-1][0]:.2f} s CPU ({recorded[-1][1]:.2f} s wall)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu_ratio = statistics.median(c for c, _ in recorded) / statistics.median(c for c, _ in plain)
    wall_ratio = statistics.median(w for _, w in recorded) / statistics.median(w for _, w in plain)
    print(f"median CPU seconds: plain {statistics.median(c for c, _ in plain):.2f}, with the reporter "
          f"{statistics.median(c for c, _ in recorded):.2f}: ratio {cpu_ratio:.3f} (target <= 1.1); wall ratio "
          f"{wall_ratio:.3f}")
    if problems or cpu_ratio > 1.1:
        print("FAIL: " + "; ".join(problems + ([f"CPU ratio {cpu_ratio:.3f} > 1.1"] if cpu_ratio > 1.1 else [])))
        return 1
    print(f"PASS: the reporter costs the more-itertools suite a CPU ratio of {cpu_ratio:.3f} (<= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
