"""``python manage.py rerun RUN_ID [--latest-pipeline] [--start]``: a new run from an ended one."""
import getpass

from engine import operations

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Re-run an ended (succeeded or failed) run: a new pending run of the same pipeline version (or the "
            "latest with --latest-pipeline), repository, revision, commit and profile choices, linked to the old "
            "one; --start also requests its start. Prints the new run's record as JSON.")

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--latest-pipeline", action="store_true",
                            help="use the saved pipeline's latest version instead of the run's own frozen one")
        parser.add_argument("--start", action="store_true", help="also request its start (the new run is queued)")
        parser.add_argument("--by", default=None, help="your name (default: the login name)")

    def handle(self, *args, **options):
        run = operations.rerun(options["run_id"], latest_pipeline=options["latest_pipeline"], start=options["start"],
                               requested_by=options["by"] or getpass.getuser(), source="cli")
        self.print_json(operations.run_status(run))
