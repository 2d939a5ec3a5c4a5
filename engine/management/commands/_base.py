"""Shared behaviour of the Run Engine's management commands: refusals exit non-zero, cleanly, and
nothing an agent wrote reaches the terminal as a control character (engine/text/terminal.py)."""
import json

from django.core.management.base import BaseCommand, CommandError

from engine.operations import OperationError
from engine.text.terminal import SafeStream


class EngineCommand(BaseCommand):
    """A command whose OperationError becomes a one-line error naming the field, with exit status 1.

    Its ``stdout`` and ``stderr`` are ``SafeOutput``: each write is one line whose control
    characters are shown escaped (a command writes line by line; ``print_json`` writes JSON whole)."""

    stdout = SafeStream()
    stderr = SafeStream()

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except OperationError as exc:
            field = f" [{exc.field}]" if exc.field else ""
            raise CommandError(f"{exc.code}{field}: {exc.message}") from None

    def print_json(self, data) -> None:
        # ensure_ascii: every control and non-ASCII character of a string is a \u escape
        self.stdout.raw(json.dumps(data, indent=2, sort_keys=False, ensure_ascii=True))
