"""``python manage.py recover RUN_ID --decision ID --note TEXT --action retry|verify``."""
import getpass

from engine import operations

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Resume a run waiting for review: retry (a new attempt, numbered after the last) or verify "
            "(run the gates on the existing result). Needs the pending decision's id and a note.")

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--decision", required=True, help="id of the pending review decision")
        parser.add_argument("--note", required=True, help="why, in a sentence")
        parser.add_argument("--action", required=True, choices=["retry", "verify"])
        parser.add_argument("--reviewer", default=None, help="your name (default: the login name)")

    def handle(self, *args, **options):
        decision = operations.recover(options["run_id"], options["decision"], options["note"], options["action"],
                                      reviewer=options["reviewer"] or getpass.getuser())
        sim = " [simulated]" if decision.run.simulated else ""
        self.stdout.write(f"run {decision.run_id}{sim}: decision {decision.pk} recorded ({options['action']}); "
                          f"queued, waiting for a worker")
