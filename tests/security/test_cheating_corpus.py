"""The standing cheating corpus: bench/integrity.py must catch every cheat and stop no honest run.

The benchmark runs its cases (at least 100 cheats and 40 honest changes, issue 19) in a process of
its own (its own var directory and database), as a person runs it (without the "works unguarded" column: a plain clone's gate per cheat, for
the reader, not the verdict); this test keeps it green in `make test` and checks that bench/README.md
lists every case.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.longest
def test_the_integrity_benchmark_catches_every_cheat_and_stops_no_honest_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CP_VAR_DIR", "DJANGO_SETTINGS_MODULE")}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "bench/integrity.py", "--no-unguarded"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=2400)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    caught = re.search(r"cheats caught: (\d+)/(\d+) \(100%\)", out)
    assert caught and caught[1] == caught[2] and int(caught[2]) >= 100, out[-2000:]
    stopped = re.search(r"honest runs stopped: 0/(\d+)", out)
    assert stopped and int(stopped[1]) >= 40, out[-2000:]
    names = re.findall(r"^(\S+)\s+(cheat|honest)\s", out, flags=re.M)
    readme = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([A-Za-z0-9-]+)` \| (?:cheat|honest) \|", readme, flags=re.M))
    assert {name for name, _ in names} == listed
    assert "MISSED" not in out and "STOPPED" not in out
