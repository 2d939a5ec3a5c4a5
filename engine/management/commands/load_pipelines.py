"""``python manage.py load_pipelines FILE...``: create or update saved pipelines from YAML files."""
from django.core.management.base import CommandError

from engine import operations
from engine.pipeline.format import PipelineFormatError

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Validate pipeline YAML files and create or update the saved pipelines. A bad file is refused "
            "whole, naming the file, the field and the problem; then nothing is saved.")

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", metavar="FILE")

    def handle(self, *args, **options):
        try:
            results = operations.load_pipelines(options["files"])
        except PipelineFormatError as exc:
            # several problems: one line each (printed escaped, engine/text/terminal.py), the first again in the
            # error; a single one only in the error
            problems = [f"{file}: {field}: {problem}" for file, field, problem in exc.errors]
            for line in problems if len(problems) > 1 else ():
                self.stderr.write(line)
            more = f" (and {len(problems) - 1} more, listed above)" if len(problems) > 1 else ""
            raise CommandError(f"nothing was loaded: {problems[0] if problems else exc}{more}") from None
        for pipeline, outcome in results:
            self.stdout.write(f"{outcome}: pipeline {pipeline.name!r} (id {pipeline.pk}, v{pipeline.version}, "
                              f"{len(pipeline.definition['stages'])} stage{'s' if len(pipeline.definition['stages']) != 1 else ''})")
