"""Run a command and print its wall time and CPU time (user and system, its own and that of every
process it waited for: pytest-xdist's workers, the agents and gates the tests start), then exit
with its exit status. Used by `make test-fast` (the Makefile)::

    python scripts/timed.py python -m pytest -q -n 2
"""
import resource
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python scripts/timed.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    started = time.monotonic()
    status = subprocess.call(argv)
    wall = time.monotonic() - started
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"time: {wall:.1f} s wall, {used.ru_utime + used.ru_stime:.1f} s CPU "
          f"({used.ru_utime:.1f} s user, {used.ru_stime:.1f} s system)")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
