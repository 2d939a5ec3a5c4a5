"""Assembles one stage's prompt from the frozen definition and files inside the worktree,
and writes the initial specification index of a repository that has none.

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


#: Folders never walked when looking for documentation.
_SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv", "venv", ".tox", ".pytest_cache"})
#: Bytes read from a document to find its title (its first Markdown heading).
_TITLE_BYTES = 4096
#: Documents listed at most in a generated index (a huge docs/ folder is cut, and says so).
MAX_INDEX_ENTRIES = 500


def _is_documentation(rel: str) -> bool:
    """README* and *.md at the top level (AGENTS.md and CLAUDE.md among them), and docs/**/*.md."""
    if "/" not in rel:
        return rel.upper().startswith("README") or rel.lower().endswith(".md")
    return rel.startswith("docs/") and rel.lower().endswith(".md")


def _documentation_files(root: str) -> list[str]:
    """Repository-relative paths of the documentation files in ``root`` (real files inside it only)."""
    found = []
    for name in os.listdir(root):
        if _is_documentation(name):
            found.append(name)
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs) and not os.path.islink(docs):
        for folder, dirs, files in os.walk(docs):  # followlinks=False: a linked folder is not entered
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            for name in files:
                rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                if _is_documentation(rel):
                    found.append(rel)
    kept = []
    for rel in sorted(set(found)):
        try:
            path = resolve_inside(root, rel)
        except ContextError:  # a symlink out of the worktree is not documentation of this repository
            continue
        if os.path.isfile(path):
            kept.append(rel)
    return kept


def _title(path: str) -> str:
    """The first Markdown heading of a file (``# Title`` -> ``Title``), or ''."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_TITLE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""
    for line in head.splitlines():
        line = line.strip()
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            return title[:120]
    return ""


def initial_spec_index(worktree: str, spec_index_rel: str) -> str:
    """The text of an initial specification index for a repository that has none at ``spec_index_rel``.

    It lists the repository's documentation files, sorted: ``README*`` and ``*.md`` at the top
    level (``AGENTS.md``, ``CLAUDE.md`` among them) and ``docs/**/*.md``, each with its first
    Markdown heading when it has one, under a header saying that the Run Engine generated it
    because the repository has no index at ``spec_index_rel``. Symlinks that lead out of the
    worktree are left out; ``spec_index_rel`` itself must stay inside it (ContextError
    ``path_escapes_workspace`` otherwise). Reads only; writes nothing.
    """
    root = os.path.realpath(worktree)
    resolve_inside(root, spec_index_rel)
    files = [rel for rel in _documentation_files(root) if rel != spec_index_rel]
    lines = [
        "# Specification index",
        "",
        f"Generated by the Run Engine because the repository has no specification index at "
        f"`{spec_index_rel}`. It lists the repository's documentation files (README*, *.md at the top "
        f"level, docs/**/*.md); read the ones your work needs. Add a maintained index at "
        f"`{spec_index_rel}` to replace this one.",
        "",
    ]
    if not files:
        lines.append("- (the repository has no documentation files)")
    for rel in files[:MAX_INDEX_ENTRIES]:
        title = _title(os.path.join(root, rel))
        lines.append(f"- `{rel}`" + (f": {title}" if title else ""))
    if len(files) > MAX_INDEX_ENTRIES:
        lines.append(f"- ... and {len(files) - MAX_INDEX_ENTRIES} more under docs/")
    return "\n".join(lines) + "\n"


def assemble_prompt(*, pipeline: dict, stage: dict, worktree: str, operation: str,
                    dependencies: list[dict], spec_index_text: str | None = None) -> str:
    """The prompt of one agent session for ``stage`` (a frozen stage definition).

    ``dependencies``: accepted output of the stages this one depends on, each
    ``{"key", "checkpoint", "summary"}`` (summary: the patch's file list and the final message).
    ``spec_index_text``: the specification index to give instead of reading the pipeline's
    ``spec_index`` file (the engine's initial index, ``initial_spec_index``, when the repository
    has none); None reads the file, if there is one.
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
    if spec_index_text is not None:
        where = f" ({pipeline['spec_index']})" if pipeline.get("spec_index") else ""
        parts += ["", f"## Specification index{where}", spec_index_text.strip()]
    elif pipeline.get("spec_index"):
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
