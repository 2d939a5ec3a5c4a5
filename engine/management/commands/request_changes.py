"""``python manage.py request_changes RUN_ID --decision ID --artifact REF --note TEXT [--comment ...] [--reviewer NAME]``."""
import getpass

from engine import operations

from ._base import EngineCommand

class Command(EngineCommand):
    help = ("Request changes at a human gate: send the files waiting for approval back to a repair session with "
            "your note (and comments on the diff). It uses one repair of the stage's allowance; the gates, the "
            "review and the documentation run on the new files and a new decision is asked for. With the "
            "allowance used up the run waits for review.")

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--decision", required=True, help="id of the pending approval decision")
        parser.add_argument("--artifact", required=True,
                            help="manifest digest of the files you looked at (at least its first 12 hex digits)")
        parser.add_argument("--note", required=True, help="what must change (the agent reads it)")
        parser.add_argument("--comment", action="append", default=[], metavar="PATH:LINE: TEXT",
                            help="a comment on a file (and line) of the diff; repeat for more")
        parser.add_argument("--reviewer", default=None, help="your name (default: the login name)")

    def handle(self, *args, **options):
        decision = operations.request_changes(options["run_id"], options["decision"], options["artifact"],
                                              reviewer=options["reviewer"] or getpass.getuser(),
                                              note=options["note"],
                                              comments=[operations.parse_comment(c) for c in options["comment"]])
        run = operations.get_run(decision.run_id)
        sim = " [simulated]" if run.simulated else ""
        if run.status == "waiting_review":
            self.stdout.write(f"run {run.pk}{sim}: changes requested on decision {decision.pk}, but the repair "
                              f"allowance is used up: waiting for review ({run.stop_reason})")
        else:
            self.stdout.write(f"run {run.pk}{sim}: changes requested on decision {decision.pk}; queued for a repair "
                              f"session, then its gates, review and documentation, then a new decision")
