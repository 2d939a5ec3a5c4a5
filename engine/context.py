"""Assembles one stage's prompt from the frozen definition and files inside the worktree.

Every path is resolved inside the worktree: an absolute path, a ``..`` escape or a symlink
pointing out of it is refused (ContextError ``path_escapes_workspace``), and a missing
required file stops the stage before any agent starts (``missing_file``). Plain values in,
a string out; no Django models here.
"""
from __future__ import annotations

import os

#: Repository instruction files read for agents when present, in this order.
INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md")
#: Bytes of one included file beyond which it is cut (the agent can read the rest itself).
MAX_FILE_BYTES = 64 * 1024


class ContextError(Exception):
    """A stage's context cannot be assembled: ``code`` and a sentence naming the path."""

    def __init__(self, code: str, message: str, path: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path


def resolve_inside(worktree: str, rel: str) -> str:
    """Absolute real path of ``rel`` inside ``worktree``; ContextError when it escapes it."""
    root = os.path.realpath(worktree)
    if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise ContextError("path_escapes_workspace", f"The path {rel!r} is not inside the workspace.", rel)
    path = os.path.realpath(os.path.join(root, rel))
    if not (path == root or path.startswith(root + os.sep)):
        raise ContextError("path_escapes_workspace",
                           f"The path {rel!r} leads out of the workspace (through a symlink).", rel)
    return path


def read_inside(worktree: str, rel: str, *, required: bool) -> str | None:
    """Text of a file inside the worktree (cut at MAX_FILE_BYTES); None when optional and missing."""
    path = resolve_inside(worktree, rel)
    if not os.path.isfile(path):
        if required:
            raise ContextError("missing_file", f"The required file {rel!r} does not exist in the workspace.", rel)
        return None
    with open(path, "rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    text = data[:MAX_FILE_BYTES].decode("utf-8", errors="replace")
    if len(data) > MAX_FILE_BYTES:
        text += f"\n[... cut at {MAX_FILE_BYTES} bytes; read the file for the rest]\n"
    return text


def assemble_prompt(*, pipeline: dict, stage: dict, worktree: str, operation: str,
                    dependencies: list[dict]) -> str:
    """The prompt of one agent session for ``stage`` (a frozen stage definition).

    ``dependencies``: accepted output of the stages this one depends on, each
    ``{"key", "checkpoint", "summary"}`` (summary: the patch's file list and the final message).
    Raises ContextError for a missing required file or a path outside the worktree.
    """
    parts = [
        f"# Stage '{stage['key']}' of pipeline '{pipeline['name']}' ({operation})",
        "",
        "You are working in a git worktree made for this run. Work only inside it, and only on the files "
        "this stage's scope allows. The engine runs the gates itself after you finish; your own claim "
        "that tests pass is not evidence.",
        "",
        f"Workspace: {worktree}",
        f"Scope (files you may change): {', '.join(stage['scope'])}",
        "",
        "## Requirement",
        stage["requirement"].strip(),
        "",
        "## Gates the engine will run",
    ]
    gates = list(pipeline.get("baseline_checks") or []) + list(stage.get("gates") or [])
    parts += [f"- {gate['name']}: `{gate['command']}`" for gate in gates] or ["- (none)"]
    if pipeline.get("master_plan"):
        parts += ["", f"## Master plan ({pipeline['master_plan']})",
                  read_inside(worktree, pipeline["master_plan"], required=True).strip()]
    for name in INSTRUCTION_FILES:
        text = read_inside(worktree, name, required=False)
        if text is not None:
            parts += ["", f"## Repository instructions ({name})", text.strip()]
    if pipeline.get("spec_index"):
        text = read_inside(worktree, pipeline["spec_index"], required=False)
        if text is not None:
            parts += ["", f"## Specification index ({pipeline['spec_index']})", text.strip()]
    for rel in stage.get("docs") or []:
        parts += ["", f"## Document {rel}", read_inside(worktree, rel, required=True).strip()]
    if dependencies:
        parts += ["", "## Accepted output of the stages this one depends on"]
        for dep in dependencies:
            parts += [f"### Stage '{dep['key']}' (checkpoint {dep['checkpoint']})", dep["summary"].strip()]
    return "\n".join(parts) + "\n"
