"""``python manage.py recheck RUN_ID --note TEXT``."""
import getpass

from engine import operations

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Verify the waiting stage of a run again after a correction: its pending decisions are superseded, "
            "its gates and reviews run again (no counter is reset), and a human gate asks for a new approval.")

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--note", required=True, help="what was corrected, in a sentence")
        parser.add_argument("--by", default=None, help="your name (default: the login name)")

    def handle(self, *args, **options):
        stage = operations.recheck(options["run_id"], options["note"], requested_by=options["by"] or getpass.getuser())
        sim = " [simulated]" if stage.run.simulated else ""
        self.stdout.write(f"run {stage.run_id}{sim}: stage '{stage.key}' will be verified again; queued, waiting "
                          f"for a worker")
