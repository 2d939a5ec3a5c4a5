"""``python manage.py start_run RUN_ID``: durably request execution of a pending run."""
import getpass

from engine import operations
from engine.text import hints

from ._base import EngineCommand


class Command(EngineCommand):
    help = "Record a start request for a pending run and return at once; a second Start is refused."

    def add_arguments(self, parser):
        parser.add_argument("run_id")

    def handle(self, *args, **options):
        start = operations.request_start(options["run_id"], requested_by=getpass.getuser(), source="cli")
        run = start.run
        sim = " [simulated]" if run.simulated else ""
        self.stdout.write(f"run {run.pk}{sim}: start request recorded; queued, waiting for a worker "
                          f"({hints.manage(f'run_status {run.pk} --follow')})")
