"""``python manage.py fail_run RUN_ID --reason TEXT``."""
import getpass
from pathlib import Path

from django.conf import settings

from engine import operations

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Fail a run: its processes are stopped and reaped first, then the failure is recorded "
            "(failed_by_operator). Every record, log and the worktree are kept; a result that arrives later is "
            "stored as late and changes nothing. A reason is required.")

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--reason", required=True, help="why the run is failed, in a sentence")
        parser.add_argument("--by", default=None, help="your name (default: the login name)")

    def handle(self, *args, **options):
        run = operations.fail_run(options["run_id"], options["reason"], requested_by=options["by"] or getpass.getuser())
        sim = " [simulated]" if run.simulated else ""
        reaped = (run.stop_evidence or {}).get("reaped", 0)
        self.stdout.write(f"run {run.pk}{sim}: failed (failed_by_operator); {reaped} process(es) reaped first. "
                          f"Evidence kept in {Path(settings.VAR_DIR) / run.control_dir} and the worktree {run.worktree}")
