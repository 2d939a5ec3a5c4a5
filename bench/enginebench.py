"""What the engine benchmarks share: a scratch system (its own var directory, database and broker),
repositories of N files, a one-stage scripted pipeline, a real Celery worker, and timed runs.

Used by bench/stage_overhead.py, bench/fairness.py and bench/worker_memory.py. Everything lives in a
temporary directory under ``$TMPDIR``. The database is a fresh SQLite file there, or with
``--postgres URL`` (a server URL such as ``postgres://postgres@127.0.0.1:5432/postgres``) a fresh
database ``cp_bench_<pid>`` made on that server and dropped at the end; the broker is the
filesystem broker there, or with ``--redis URL`` that Redis database (its runs queue purged first).
The worker is the real one (engine/processes/worker_process.py ``start_worker``: ``celery -A controlpanel
worker`` with the flags every worker starts with), started with the same environment as this process.

Every run these benchmarks make uses the scripted test adapter, so it is labelled simulated.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent

GIT_ENV = {"GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid", "GIT_COMMITTER_NAME": "Bench",
           "GIT_COMMITTER_EMAIL": "bench@example.invalid", "GIT_TERMINAL_PROMPT": "0"}

#: The trivial edit every benchmark run's scripted implementer makes (one file changed).
EDIT = {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 42\n'}


def add_arguments(parser) -> None:
    """The options every engine benchmark takes: ``--postgres``, ``--redis``, ``--keep``."""
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL server URL: a fresh database is made on it "
                        "(default: SQLite in the temporary directory)")
    parser.add_argument("--redis", metavar="URL", help="a Redis URL for the broker (default: the filesystem broker)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and say where it is")


def git(cwd, *args: str) -> str:
    """Run git in ``cwd`` (the benchmark's identity, no user configuration); returns stdout."""
    env = {**os.environ, **GIT_ENV, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_repo(path: Path, files: int) -> Path:
    """A git repository of ``files`` files (small Python modules in folders of 100) and one commit on
    main; ``app/core.py`` is the file the scripted implementer edits."""
    (path / "app").mkdir(parents=True)
    (path / "app" / "__init__.py").write_text("")
    (path / "app" / "core.py").write_text('"""Core."""\n')
    for n in range(max(0, files - 2)):
        folder = path / "pkg" / f"m{n // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{n % 100:02d}.py").write_text(f'"""Module {n}."""\n\nVALUE = {n}\n\n\ndef value():\n'
                                                     f'    return VALUE\n')
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", f"{files} files")
    return path


def pipeline_doc(name: str = "bench", review: bool = False, gate: str = "true") -> dict:
    """A one-stage pipeline: the scripted implementer makes ``EDIT``, gate ``gate``; with ``review``
    a scripted reviewer (passing) and documenter (changing nothing) as well, else those roles are
    not configured (``null``, docs/pipeline-format.md)."""
    scenario = {"stages": {"answer": {"implement": [{"write": EDIT}]}}}
    roles = {"implementer": "scripted", "reviewer": None, "documenter": None}
    if review:
        scenario["stages"]["answer"]["review"] = [{"verdict": {"verdict": "pass", "findings": []},
                                                   "final_message": "pass"}]
        roles = {"implementer": "scripted", "reviewer": "scripted", "documenter": "scripted"}
    return {"name": name, "stages": [{"key": "answer", "requirement": "Make app.core.answer() return 42.",
                                      "scope": ["app/**"], "gates": [{"name": "gate", "command": gate}]}],
            "roles": roles, "profiles": {"scripted": {"adapter": "scripted", "scenario": scenario}}}


class System:
    """A scratch Control Panel + Run Engine: ``start()`` sets the environment up and Django, ``worker()``
    launches a real worker, ``close()`` stops it and removes everything (unless ``keep``)."""

    def __init__(self, args, prefix: str):
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix))
        self.keep, self.postgres, self.redis = args.keep, args.postgres, args.redis
        self.db_name = f"cp_bench_{os.getpid()}"
        self.workers: list[subprocess.Popen] = []

    def database_url(self) -> str:
        if not self.postgres:
            return "sqlite:///" + str(self.tmp / "db.sqlite3")
        parts = urlsplit(self.postgres)
        return urlunsplit((parts.scheme, parts.netloc, "/" + self.db_name, parts.query, parts.fragment))

    def start(self) -> None:
        """Environment (CP_VAR_DIR, DATABASE_URL, CELERY_BROKER_URL), a fresh database, Django set up and migrated."""
        if self.postgres:
            self._psql(f'CREATE DATABASE "{self.db_name}"')
        os.environ.update({"CP_VAR_DIR": str(self.tmp / "var"), "DJANGO_SETTINGS_MODULE": "controlpanel.settings",
                           "DATABASE_URL": self.database_url(), "CP_QUEUE": f"bench-{os.getpid()}"})
        if self.redis:
            os.environ["CELERY_BROKER_URL"] = self.redis
        else:
            os.environ.pop("CELERY_BROKER_URL", None)
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def _psql(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.postgres, autocommit=True) as conn:
            conn.execute(sql)

    def worker(self, concurrency: int = 1, env: dict | None = None) -> subprocess.Popen:
        """A real worker of ``concurrency`` pool processes, its log in the temporary directory."""
        from engine.processes.worker_process import start_worker

        full = {**os.environ, **(env or {})}
        full["PATH"] = os.path.dirname(os.path.abspath(sys.executable)) + os.pathsep + full.get("PATH", "")
        log = self.tmp / f"worker-{len(self.workers) + 1}.log"
        proc = start_worker(str(log), env=full, concurrency=concurrency)
        self.workers.append(proc)
        return proc

    def close(self) -> None:
        from engine.processes.worker_process import stop_worker

        for proc in self.workers:
            stop_worker(proc)
        try:
            from django.db import connections

            connections.close_all()
        except Exception:
            pass
        if self.postgres:
            self._psql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        if self.keep:
            print(f"kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def save_pipeline(doc: dict):
    """Validate and save ``doc``; returns the Pipeline."""
    from engine import operations
    from engine.pipeline.format import validate

    pipeline, _ = operations.save_pipeline(validate(doc, "<bench>"))
    return pipeline


def start_run(pipeline, repo: Path):
    """Create and start a run of ``pipeline`` on ``repo``'s main; returns it (queued)."""
    from engine import operations

    return operations.create_run(pipeline, str(repo), "main", start=True, requested_by="bench")


DONE = ("succeeded", "failed", "waiting_review", "waiting_approval", "cancelled")


def wait_all(run_ids: list[int], timeout: float = 600.0, poll: float = 0.01) -> dict[int, float]:
    """Poll until every run is finished (``DONE``); returns ``{run_id: time.perf_counter() when seen
    finished}``. Raises RuntimeError naming the runs still open after ``timeout`` seconds."""
    from engine.models import Run

    seen: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(run_ids):
        if time.monotonic() > deadline:
            open_runs = {r.pk: r.status for r in Run.objects.filter(pk__in=set(run_ids) - set(seen))}
            raise RuntimeError(f"runs still open after {timeout:.0f} s: {open_runs}")
        for pk, status in Run.objects.filter(pk__in=set(run_ids) - set(seen)).values_list("pk", "status"):
            if status in DONE:
                seen[pk] = time.perf_counter()
        time.sleep(poll)
    return seen


def check_succeeded(run_ids: list[int]) -> list[str]:
    """A line for each run that did not succeed (its status, stop reason and message)."""
    from engine.models import Run

    return [f"run {r.pk}: {r.status} {r.stop_reason}: {r.stop_message}"
            for r in Run.objects.filter(pk__in=run_ids).exclude(status="succeeded")]


def event_times(run_id: int) -> list[tuple[str, float]]:
    """The run's events as ``(kind, seconds since its start request)``, in order."""
    from engine.models import RunEvent

    events = list(RunEvent.objects.filter(run_id=run_id).order_by("at", "id").values_list("kind", "at"))
    if not events:
        return []
    t0 = events[0][1]
    return [(kind, (at - t0).total_seconds()) for kind, at in events]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def load() -> str:
    """The machine's load averages (1, 5, 15 minutes) and core count, for the report."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def verdict(name: str, problems: list[str], failures: list[str], passed: str) -> int:
    """Print the benchmark's last line and return its exit status: ``FAIL: NAME: ...`` (1) when a run
    did not succeed (``problems``, the first three said) or a target was missed (``failures``, each a
    sentence), else ``PASS: NAME: passed`` (0)."""
    said = ([f"{len(problems)} runs did not succeed: " + "; ".join(problems[:3])] if problems else []) + failures
    if said:
        print(f"FAIL: {name}: " + "; ".join(said))
        return 1
    print(f"PASS: {name}: {passed}")
    return 0

