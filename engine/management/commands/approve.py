"""``python manage.py approve RUN_ID --decision ID --artifact REF [--reviewer NAME]``."""
import getpass

from engine import operations

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Approve a human gate: the pending approval decision of a run waiting for approval, for the files "
            "you looked at (their manifest digest, shown by run_status). A stale, repeated or mismatched "
            "decision is refused, and so is a stage whose checks are missing or failed.")

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--decision", required=True, help="id of the pending approval decision")
        parser.add_argument("--artifact", required=True,
                            help="manifest digest of the files approved (at least its first 12 hex digits)")
        parser.add_argument("--reviewer", default=None, help="your name (default: the login name)")

    def handle(self, *args, **options):
        decision = operations.approve(options["run_id"], options["decision"], options["artifact"],
                                      reviewer=options["reviewer"] or getpass.getuser())
        sim = " [simulated]" if decision.run.simulated else ""
        self.stdout.write(f"run {decision.run_id}{sim}: decision {decision.pk} approved for files "
                          f"{decision.artifact[:12]}; queued for its checkpoint")
