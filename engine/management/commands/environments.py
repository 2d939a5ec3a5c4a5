"""``python manage.py environments [--evict] [--older-than DAYS]``: this host's setup environments."""
import datetime

from engine import environments

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("List this host's setup environments (engine/environments.py: one per repository and cache key, "
            "shared read-only by the runs that use it), or remove those no run took for a while (--evict; an "
            "unfinished run's environment is never removed).")

    def add_arguments(self, parser):
        parser.add_argument("--evict", action="store_true",
                            help="remove the environments no run took for --older-than days")
        parser.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                            help="days without a run (default: CP_ENVIRONMENT_MAX_AGE_DAYS)")

    def handle(self, *args, **options):
        if options["evict"]:
            removed = environments.evict(options["older_than"])
            self.stdout.write(f"removed {len(removed)} environment folder(s)")
            for folder in removed:
                self.stdout.write(f"  {folder}")
            return
        found = environments.listing()
        if not found:
            self.stdout.write(f"no setup environments under {environments.root()}")
        for record in found:
            used = record.get("used_at")
            when = datetime.datetime.fromtimestamp(used).isoformat(timespec="seconds") if used else "?"
            made_by = record.get("made_by") or {}
            size = record.get("size_bytes")
            self.stdout.write(f"{environments.short(record.get('key'))}  {record.get('repository', '?')}  made by run "
                              f"{made_by.get('run', '?')}  last used {when}  "
                              f"{f'{size / 1e6:.1f} MB' if isinstance(size, int) else '? MB'}")
