"""The pipeline format: what a pipeline author writes, and what the engine freezes into a run.
``format.py`` reads YAML (strict: duplicate keys refused) into one normalized definition, or a
``PipelineFormatError`` naming each field and its problem; ``schema/`` holds the pydantic models it
checks against (docs/pipeline-format.md). No Django."""
