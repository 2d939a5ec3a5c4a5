"""``python manage.py demo``: the main job, end to end, on the embedded defaults.

Creates a small real repository with real pytest tests, loads pipelines/example.yaml, starts a
separate Celery worker process, creates and starts a run, follows it live, checks the result
(two checkpoint commits, the second stage started from the first one's, the original checkout
unchanged) and says where to look in the Control Panel.
"""
import os
import shlex
import signal
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from engine import answers, operations
from engine.demo import git, make_demo_repo
from engine.pipeline.format import load_file
from engine.processes.worker_process import start_worker, stop_worker
from engine.text import hints

from ._base import EngineCommand

BASE_DIR = Path(settings.BASE_DIR)


class Command(EngineCommand):
    help = "Run the example pipeline on a fresh demo repository through a separate Celery worker."

    def add_arguments(self, parser):
        parser.add_argument("--pipeline-file", default=str(BASE_DIR / "pipelines" / "example.yaml"))
        parser.add_argument("--no-worker", action="store_true", help="use a worker you started yourself")
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the run")
        parser.add_argument("--profile", action="append", default=None, metavar="ROLE=PROFILE",
                            help="profile override (default: claude-code with a Claude login, else claude-scripted)")

    def handle(self, *args, **options):
        out = self.stdout.write
        demo_dir = Path(settings.VAR_DIR) / "demo"
        demo_dir.mkdir(parents=True, exist_ok=True)
        repo = make_demo_repo(str(demo_dir / f"textstats-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"))
        before = {"head": git(repo["path"], "rev-parse", "HEAD"), "status": git(repo["path"], "status", "--porcelain")}
        out(f"1. demo repository: {repo['path']} (commit {repo['commit'][:12]}, tag v0, one untracked file)")
        call_command("load_pipelines", options["pipeline_file"], stdout=self.stdout)
        pipeline_name = load_file(options["pipeline_file"])["name"]
        override = self.choose_profiles(options["profile"], pipeline_name)
        worker = None
        # a SIGTERM ends the demo like Ctrl-C does: through the finally below, which stops the worker
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        if not options["no_worker"]:
            log_path = demo_dir / f"worker-{os.getpid()}.log"
            out(f"2. starting a Celery worker process with beat (reconciliation) embedded (log: {log_path})")
            worker = start_worker(str(log_path), beat=True)
        run = None
        try:
            run = operations.create_run(pipeline_name, repo["path"], "v0", override)
            if run.simulated:
                out(f"   NOTE: this run is SIMULATED ({run.simulated_reason}): no model decides anything in it.")
            out(f"3. run {run.pk} created (pending); starting it")
            operations.request_start(run, requested_by=os.environ.get("USER", "demo"), source="demo")
            call_command("run_status", str(run.pk), follow=True, timeout=options["timeout"], stdout=self.stdout)
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
        finally:
            if worker is not None:
                stop_worker(worker)
        if interrupted:
            if run is None:
                raise CommandError("interrupted before the run was created; the demo's worker was stopped.")
            run.refresh_from_db()
            raise CommandError(f"interrupted: the demo's worker was stopped; run {run.pk} is {run.status}. A run "
                               f"left running is found by reconciliation (make beat) and stopped for review.")
        self.verify(run, repo, before)

    def choose_profiles(self, given, pipeline_name: str):
        """The given overrides; else the real model when the ``claude-code`` profile passes the
        pre-flight check create_run makes (engine/operations.py ``preflight_problems``: a credential
        variable or a ``claude`` login); else the real claude CLI against the scripted model endpoint
        (simulated, and said loudly)."""
        out = self.stdout.write
        if given:
            return dict(item.split("=", 1) for item in given)
        roles = ("implementer", "reviewer", "documenter")
        pipeline = operations.get_pipeline(pipeline_name)
        lacking = operations.preflight_problems(pipeline.definition, ["claude-code"]).get("claude-code")
        if not lacking:
            out("   Claude credentials found: the real claude CLI works with a real model.")
            return {role: "claude-code" for role in roles}
        lines = [f"The claude-code profile cannot run unattended here ({lacking[0].label()}, or log in",
                 "with `claude`): the REAL claude CLI runs, but its model is a SCRIPTED endpoint on 127.0.0.1.",
                 "The run is labelled SIMULATED."]
        width = max(len(line) for line in lines)
        out("   " + "*" * (width + 4))
        for line in lines:
            out(f"   * {line.ljust(width)} *")
        out("   " + "*" * (width + 4))
        return {role: "claude-scripted" for role in roles}

    def verify(self, run, repo, before):
        out = self.stdout.write
        data = operations.run_status(run)
        after = {"head": git(repo["path"], "rev-parse", "HEAD"), "status": git(repo["path"], "status", "--porcelain")}
        problems = []
        if data["status"] != "succeeded":
            problems.append(f"the run ended {data['status']} ({data['stop_reason']}: {data['stop_message']})")
        checkpoints = [s["checkpoint"] for s in data["stages"]]
        if all(checkpoints):
            commits = git(repo["path"], "rev-list", f"{data['commit']}..{data['branch']}").split()
            if len(commits) != 2:
                problems.append(f"expected 2 checkpoint commits on {data['branch']}, found {len(commits)}")
            if data["stages"][1]["base_commit"] != checkpoints[0]:
                problems.append("the second stage did not start from the first stage's checkpoint")
        if after != before:
            problems.append("the original checkout changed")
        out("")
        out(f"Run {data['id']}: {data['status']}" + (" [SIMULATED]" if data["simulated"] else ""))
        for stage in data["stages"]:
            out(f"  stage {stage['key']}: {stage['status']}, started from {(stage['base_commit'] or '-')[:12]}, "
                f"checkpoint {(stage['checkpoint'] or '-')[:12]}")
        out(f"  branch {data['branch']} in {data['worktree']}")
        out(f"  used: {answers.totals_sentence(data['totals'])}")
        out(f"  original checkout {repo['path']}: unchanged (HEAD and git status as before)"
            if after == before else "  original checkout CHANGED")
        out(f"  not included (uncommitted in the checkout): {', '.join(c['path'] for c in data['not_included'])}")
        out("")
        out("Where to look:")
        out(f"  {hints.manage('run_status ' + str(data['id']))}            (add --json for the full record; same "
            f"CP_VAR_DIR and DATABASE_URL as the demo)")
        out(f"  git -C {shlex.quote(repo['path'])} log --format='%h %s' {data['branch']}")
        out(f"  Control Panel: {hints.manage('createsuperuser')}, then make web, and open")
        out(f"  http://{settings.CP_WEB_ADDRESS}/admin/engine/run/{data['id']}/detail/")
        if problems:
            raise CommandError("the demo did not do what it should: " + "; ".join(problems))
