"""``python manage.py continue_run RUN_ID --budgets YAML [--no-start]``: continue a run its budget stopped."""
import getpass

import yaml
from django.core.management.base import CommandError

from engine import operations

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Continue a run its budget stopped (budget_reached, budget_exhausted) as a new run with raised budgets, "
            "from its last checkpoint (the stages that passed are carried over), linked to it; the old run fails, "
            "saying which run continues it. Prints the new run's record as JSON.")

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--budgets", required=True, help=(
            "the raised budgets as YAML or JSON, e.g. '{max_tokens: 4000000, attempt: {max_cost_usd: 5}}': every cap "
            "at least the run's, one higher (docs/pipeline-format.md \"budgets\")"))
        parser.add_argument("--no-start", action="store_true", help="leave the new run pending (default: queue it)")
        parser.add_argument("--by", default=None, help="your name (default: the login name)")

    def handle(self, *args, **options):
        try:
            budgets = yaml.safe_load(options["budgets"])
        except yaml.YAMLError as exc:
            raise CommandError(f"--budgets is not YAML: {str(exc).splitlines()[0]}") from None
        run = operations.continue_run(options["run_id"], budgets, start=not options["no_start"],
                                      requested_by=options["by"] or getpass.getuser(), source="cli")
        self.print_json(operations.run_status(run))
