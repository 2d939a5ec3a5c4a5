"""``python manage.py create_run --pipeline NAME --repo PATH --rev REV [--profile ROLE=PROFILE] [--start]``."""
import getpass

from engine import operations

from ._base import EngineCommand


class Command(EngineCommand):
    help = "Create a pending run of a saved pipeline on a repository revision; prints the run record as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--pipeline", required=True, help="saved pipeline name or id")
        parser.add_argument("--repo", required=True, help="path of the git repository (any folder inside it)")
        parser.add_argument("--rev", required=True, help="commit, branch or tag")
        parser.add_argument("--profile", action="append", default=[], metavar="ROLE=PROFILE",
                            help="use PROFILE for ROLE (implementer, reviewer, documenter); repeatable")
        parser.add_argument("--start", action="store_true",
                            help="also request its start (create and start in one step: the run is queued)")

    def handle(self, *args, **options):
        override = {}
        for item in options["profile"]:
            role, sep, profile = item.partition("=")
            if not sep or not role or not profile:
                raise operations.OperationError("bad_profile_override",
                                                f"--profile takes ROLE=PROFILE, not {item!r}.", "profile")
            override[role.strip()] = profile.strip()
        run = operations.create_run(options["pipeline"], options["repo"], options["rev"], override or None,
                                    start=options["start"], requested_by=getpass.getuser(), source="cli")
        self.print_json(operations.run_status(run))
