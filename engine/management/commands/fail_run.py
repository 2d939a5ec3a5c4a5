"""``python manage.py fail_run RUN_ID --reason TEXT``."""
import getpass

from engine import hosts, operations

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
        evidence = run.stop_evidence or {}
        if "reaped" not in evidence:  # it was pending, queued or waiting: no step was in progress
            stopped = "no step was in progress"
        else:
            stopped = f"{evidence['reaped']} process(es) reaped first"
            if evidence.get("unconfirmed"):
                stopped += (f"; attempts {evidence['unconfirmed']} ran on host {run.host}, whose worker stops them "
                            "at its next heartbeat")
        worktree = f"{run.worktree} on host {run.host}" if run.host and run.host != hosts.this_host() else run.worktree
        self.stdout.write(f"run {run.pk}{sim}: failed (failed_by_operator); {stopped}. "
                          f"Evidence kept in {hosts.records_place(run)} and the worktree {worktree}")
