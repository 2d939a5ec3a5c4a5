"""Chaos soak: runs over two hosts while workers are killed, Redis restarts and PostgreSQL drops connections.

Issue 20: "50 runs over two hosts with scripted agents, random ``kill -9`` of workers, a Redis restart
and a PostgreSQL connection drop during the soak; prints runs succeeded, interrupted-and-recovered,
lost (must be 0), duplicate executions (0), and the wall time."

Run from the repository root (PostgreSQL must be running; redis-server must be on PATH)::

    .venv/bin/python bench/soak.py                      # 50 runs
    .venv/bin/python bench/soak.py --runs 10 --seed 7   # a quick one

*The system:* a fresh database on ``--postgres`` (default the local server, dropped at the end:
bench/enginebench.py ``System``); a private ``redis-server`` on a free loopback port as the broker
(tests/redis_server.py: no other Redis is touched, and a restart loses every message, as a broker
without persistence does); two hosts on this machine, each a real worker of two pool processes with
its own ``CP_HOST_NAME`` and ``CP_VAR_DIR`` (its "disk"), both reaching the repository's folder
(``CP_HOST_REPOS``); one real ``celery beat`` (host name ``soak-beat``: it runs no step). Every process
gets heartbeats and staleness of seconds (``FAST``).

*The runs:* ``--runs`` runs of a one-stage scripted pipeline (the implementer takes
``--attempt-seconds`` then writes one file; gate ``true``; no reviewer or documenter), created and
started at once on one repository. Every run uses the scripted test adapter: simulated.

*The chaos* (seeded, ``--seed``): every 2 to 5 s a host's worker is killed with ``kill -9`` (its
whole process group: the main process, its pool and their agents) and started again 1 to 4 s later,
as a supervisor would; the second kill and every fourth after it keep it down past ``CP_HOST_STALE``, so that the host is
lost (its running runs are marked interrupted from elsewhere, and wait for it to come back); once a third of the runs ended, the Redis server is stopped and started
again (empty); once two thirds ended, every PostgreSQL connection to the soak's database is
terminated (``pg_terminate_backend``), the soak's own included.

*Recovery, as a person would do it:* a run that stopped ``interrupted`` (its worker died mid-step)
is recovered with ``retry`` once its host has confirmed the old processes gone (until then
``recover`` refuses: ``host_unconfirmed``); it counts as interrupted-and-recovered.

*Reported:* runs succeeded; runs interrupted and recovered (and the interruptions); lost: runs that
did not succeed by the end (``--deadline`` seconds), each with its status and stop reason; duplicate
executions: two attempts of one stage open at the same time, or more than one checkpoint commit of a
stage on a run's branch; steps off their host: attempts that ran on another host than their run's;
the chaos done; the wall time. PASS when lost, duplicates and steps off their host are 0, and the
Redis restart and the connection drop both happened.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import enginebench as eb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.redis_server import INSTALL_HINT, RedisServer, redis_binary  # noqa: E402

#: The engine's timings in every process of the soak (seconds).
FAST = {"CP_HEARTBEAT_INTERVAL": "0.5", "CP_HEARTBEAT_STALE": "3", "CP_WORKER_BEAT": "0.5", "CP_WORKER_STALE": "3",
        "CP_HOST_STALE": "8", "CP_RECONCILE_PERIOD": "1", "CP_QUEUED_STALE": "3", "CP_VISIBILITY_TIMEOUT": "30",
        "CP_BROKER_RESTORE_INTERVAL": "5"}


class Host:
    """One host of the soak: a worker (two pool processes) with its own name and var directory."""

    def __init__(self, system: eb.System, name: str, shared: Path):
        self.system, self.name = system, name
        self.var = system.tmp / name / "var"
        self.var.mkdir(parents=True)
        self.env = {"CP_HOST_NAME": name, "CP_VAR_DIR": str(self.var), "CP_HOST_REPOS": str(shared)}
        self.proc: subprocess.Popen | None = None
        self.kills = 0

    def start(self) -> None:
        self.proc = self.system.worker(concurrency=2, env=self.env)

    def kill(self) -> None:
        """``kill -9`` of the worker's process group: main process, pool processes, their agents."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.system.workers.remove(self.proc)
            self.kills += 1


class Chaos(threading.Thread):
    """Kills and restarts the hosts' workers at random until ``stop``; restarts Redis and drops the
    database's connections when asked (``redis_due`` / ``postgres_due``, set by the main loop)."""

    def __init__(self, hosts: list[Host], redis: RedisServer, system: eb.System, rng: random.Random):
        super().__init__(name="chaos", daemon=True)
        self.hosts, self.redis, self.system, self.rng = hosts, redis, system, rng
        self.stop_event = threading.Event()
        self.redis_due, self.postgres_due = threading.Event(), threading.Event()
        self.log: list[str] = []
        self.errors: list[str] = []
        self.kills = self.outages = 0
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        line = f"{time.monotonic() - self.t0:6.1f} s  {text}"
        self.log.append(line)
        print("  chaos: " + line, flush=True)

    def services(self) -> None:
        """The Redis restart and the connection drop, each once when due, whatever the kills are doing."""
        redis_done = postgres_done = False
        while not self.stop_event.wait(0.2) and not (redis_done and postgres_done):
            try:
                if self.redis_due.is_set() and not redis_done:
                    redis_done = True
                    self.redis.stop()
                    self.say(f"Redis stopped (port {self.redis.port})")
                    time.sleep(self.rng.uniform(1, 3))
                    self.redis.start()
                    self.say("Redis started again, empty")
                if self.postgres_due.is_set() and not postgres_done:
                    postgres_done = True
                    dropped = drop_connections(self.system)
                    self.say(f"PostgreSQL: {dropped} connection(s) to {self.system.db_name} terminated")
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.say(f"chaos step failed: {type(exc).__name__}: {exc}")

    def run(self) -> None:
        threading.Thread(target=self.services, name="chaos-services", daemon=True).start()
        while not self.stop_event.wait(self.rng.uniform(2, 5)):
            try:
                host = self.rng.choice(self.hosts)
                host.kill()
                self.kills += 1
                # the second kill, then every fourth, keeps the host down past CP_HOST_STALE: the host is lost
                long = self.kills % 4 == 2
                down = float(FAST["CP_HOST_STALE"]) + 4 if long else self.rng.uniform(1, 4)
                self.outages += long
                self.say(f"kill -9 of {host.name}'s worker" + (f" (down {down:.0f} s: the host is lost)" if long else ""))
                time.sleep(down)
                host.start()
                self.say(f"{host.name}'s worker started again")
            except Exception as exc:  # the soak reports it; the chaos goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.say(f"chaos step failed: {type(exc).__name__}: {exc}")


def drop_connections(system: eb.System) -> int:
    """Terminate every connection to the soak's database (``pg_terminate_backend``); returns how many."""
    import psycopg

    with psycopg.connect(system.postgres, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                            "AND pid <> pg_backend_pid()", (system.db_name,)).fetchall()
    return sum(1 for (ok,) in rows if ok)


def start_beat(system: eb.System) -> subprocess.Popen:
    log = open(system.tmp / "beat.log", "ab")
    env = {**os.environ, "CP_HOST_NAME": "soak-beat", "CP_VAR_DIR": str(system.tmp / "beat-var")}
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlpanel", "beat", "-l", "info", "-s",
                             str(system.tmp / "beat.schedule"), "--max-interval", "1"], cwd=str(ROOT), env=env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return proc


def recover_interrupted(run_ids: list[int], recovered: dict[int, int], problems: list[str]) -> None:
    """Recover (retry) each run that stopped ``interrupted``, as a person would; ``recovered`` counts per run."""
    from engine import operations
    from engine.models import Run

    for run in Run.objects.filter(pk__in=run_ids, status="waiting_review", stop_reason="interrupted"):
        decision = run.decisions.filter(state="pending").order_by("-id").first()
        if decision is None:
            continue
        try:
            operations.recover(run, decision.pk, "soak: recovered after its worker was killed", "retry",
                               reviewer="soak")
            recovered[run.pk] = recovered.get(run.pk, 0) + 1
        except operations.OperationError as exc:
            if exc.code not in ("host_unconfirmed", "not_waiting_review", "stale_decision"):
                problems.append(f"run {run.pk}: recover refused: {exc.code}: {exc}")


def off_host(run_ids: list[int]) -> list[str]:
    """Attempts that ran on another host than their run's (none may: a run's steps stay on its host)."""
    from engine.models import Attempt

    return [f"run {a.run_id}: attempt {a.number} ran on {a.host}, the run is pinned to {a.run.host}"
            for a in Attempt.objects.filter(run_id__in=run_ids).select_related("run") if a.host != a.run.host]


def duplicates(run_ids: list[int]) -> list[str]:
    """Two attempts of one stage open at the same time, or more than one checkpoint commit of one stage."""
    from engine import workspace
    from engine.models import Attempt, Run

    found = []
    by_stage: dict[int, list] = {}
    for attempt in Attempt.objects.filter(run_id__in=run_ids).exclude(started_at=None).order_by("started_at"):
        by_stage.setdefault(attempt.stage_id, []).append(attempt)
    for attempts in by_stage.values():
        for earlier, later in zip(attempts, attempts[1:]):
            if earlier.ended_at is None or earlier.ended_at > later.started_at:
                found.append(f"run {later.run_id}: attempts {earlier.number} and {later.number} of one stage were "
                             f"open at once")
    for run in Run.objects.filter(pk__in=run_ids).exclude(branch=""):
        # the repository the agents' worktrees share: read through the engine's hardened git
        listed = workspace.git(["rev-list", "--count", f"{run.commit}..{run.branch}", "--"], run.repo_path, check=False)
        if listed.returncode != 0:
            continue  # no branch: the run never checked out
        count = int(listed.stdout.decode().strip())
        stages = run.stages.count()
        if count > stages:
            found.append(f"run {run.pk}: {count} commits on its branch for {stages} stage(s)")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " It makes a fresh database on --postgres (dropped at the end) and "
        "starts a private redis-server on a free loopback port, which it restarts: no other database or Redis is "
        "touched. The module's docstring says what is measured.")
    parser.add_argument("--runs", type=int, default=50, help="runs started at once (default 50)")
    parser.add_argument("--attempt-seconds", type=float, default=2.0, help="how long each implement attempt takes")
    parser.add_argument("--seed", type=int, default=20, help="seed of the chaos (which worker is killed, when)")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds the runs have to end")
    parser.add_argument("--postgres", metavar="URL", default="postgres://postgres@127.0.0.1:5432/postgres",
                        help="a PostgreSQL server URL: a fresh database is made on it and dropped at the end")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (the database is dropped)")
    args = parser.parse_args()
    if redis_binary() is None:
        print(f"FAIL: soak: {INSTALL_HINT}")
        return 1
    args.redis = None  # set below: System reads it at start()
    system = eb.System(args, "bench-soak-")
    redis = RedisServer(system.tmp).start()
    system.redis = redis.url
    os.environ.update(FAST)
    rng = random.Random(args.seed)
    beat = chaos = None
    lost: list[str] = []
    dupes: list[str] = []
    strays: list[str] = []
    wall = 0.0
    problems: list[str] = []
    recovered: dict[int, int] = {}
    try:
        system.start()
        from django.db import connections
        from django.db.utils import InterfaceError, OperationalError

        from engine.models import Run

        shared = system.tmp / "shared"
        repo = eb.make_repo(shared / "repo", 50)
        hosts = [Host(system, f"soak-host-{label}", shared) for label in ("a", "b")]
        for host in hosts:
            host.start()
        beat = start_beat(system)
        print(f"soak: {eb.load()}; PostgreSQL {system.db_name}, Redis {redis.url}; {args.runs} runs over "
              f"{', '.join(h.name for h in hosts)} (two pool processes each), seed {args.seed}", flush=True)
        doc = eb.pipeline_doc("bench-soak")
        doc["profiles"]["scripted"]["scenario"]["stages"]["answer"]["implement"] = [
            {"write": eb.EDIT, "sleep": args.attempt_seconds}]
        pipeline = eb.save_pipeline(doc)
        began = time.monotonic()
        ids = [eb.start_run(pipeline, repo).pk for _ in range(args.runs)]
        chaos = Chaos(hosts, redis, system, rng)
        chaos.start()
        deadline = began + args.deadline
        ended = 0
        while time.monotonic() < deadline:
            try:
                recover_interrupted(ids, recovered, problems)
                ended = Run.objects.filter(pk__in=ids, status="succeeded").count()
                if ended >= args.runs / 3:
                    chaos.redis_due.set()
                if ended >= 2 * args.runs / 3:
                    chaos.postgres_due.set()
                if ended == args.runs:
                    break
            except (OperationalError, InterfaceError) as exc:  # the connection drop reaches this process too
                print(f"  soak: database connection lost ({type(exc).__name__}); reconnecting", flush=True)
                connections.close_all()
            time.sleep(0.5)
        wall = time.monotonic() - began
        chaos.stop_event.set()
        chaos.join(timeout=30)
        connections.close_all()
        runs = list(Run.objects.filter(pk__in=ids))
        lost = [f"run {r.pk}: {r.status} {r.stop_reason}: {r.stop_message[:200]}" for r in runs
                if r.status != "succeeded"]
        dupes = duplicates(ids)
        strays = off_host(ids)
        interruptions = sum(recovered.values())
        from engine.models import Attempt, RunEvent

        attempts = Attempt.objects.filter(run_id__in=ids).count()
        host_lost = sum("has had no heartbeat" in r.stop_message for r in runs) + RunEvent.objects.filter(
            run_id__in=ids, kind="host_confirmed").count()
        pinned = {r.host for r in runs}
        print(f"\nruns succeeded               {sum(r.status == 'succeeded' for r in runs)} of {args.runs}")
        print(f"interrupted and recovered    {len(recovered)} run(s), {interruptions} interruption(s); "
              f"{host_lost} confirmed by their host after it was lost")
        print(f"lost                         {len(lost)}" + "".join(f"\n  {line}" for line in lost))
        print(f"duplicate executions         {len(dupes)}   ({attempts} attempts and {len(runs)} branches looked at)"
              + "".join(f"\n  {line}" for line in dupes))
        print(f"steps off their host         {len(strays)}   (runs pinned to {', '.join(sorted(pinned))})"
              + "".join(f"\n  {line}" for line in strays))
        print(f"chaos                        {sum(h.kills for h in hosts)} worker kill(s), {chaos.outages} of them "
              f"past CP_HOST_STALE "
              f"({', '.join(f'{h.name} {h.kills}' for h in hosts)}); Redis restarted "
              f"{redis.starts - 1} time(s); PostgreSQL connections dropped "
              f"{sum('PostgreSQL' in line for line in chaos.log)} time(s)")
        print(f"wall time                    {wall:.1f} s")
        problems += chaos.errors
        if redis.starts < 2 or not any("PostgreSQL" in line for line in chaos.log):
            problems.append("the soak ended before the Redis restart and the PostgreSQL drop were both done "
                            "(raise --runs or --attempt-seconds)")
    finally:
        if chaos is not None:
            chaos.stop_event.set()
        if beat is not None and beat.poll() is None:
            beat.terminate()
            beat.wait(timeout=30)
        system.close()
        redis.kill()
    verdicts = []
    if lost:
        verdicts.append(f"{len(lost)} run(s) lost")
    if dupes:
        verdicts.append(f"{len(dupes)} duplicate execution(s)")
    if strays:
        verdicts.append(f"{len(strays)} attempt(s) off their run's host")
    if problems:
        verdicts.append("; ".join(problems))
    if verdicts:
        print("FAIL: soak: " + "; ".join(verdicts))
        return 1
    print(f"PASS: soak: {args.runs} runs, 0 lost, 0 duplicate executions, {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
