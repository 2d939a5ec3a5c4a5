"""Shared behaviour of the Run Engine's management commands: refusals exit non-zero, cleanly."""
import json

from django.core.management.base import BaseCommand, CommandError

from engine.operations import OperationError


class EngineCommand(BaseCommand):
    """A command whose OperationError becomes a one-line error naming the field, with exit status 1."""

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except OperationError as exc:
            field = f" [{exc.field}]" if exc.field else ""
            raise CommandError(f"{exc.code}{field}: {exc.message}") from None

    def print_json(self, data) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=False))
