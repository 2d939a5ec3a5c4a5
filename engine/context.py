"""Assembles one stage's prompt from the frozen definition and files inside the worktree,
and writes the initial specification index of a repository that has none.

Every path is resolved inside the worktree: an absolute path, a ``..`` escape or a symlink
pointing out of it is refused (ContextError ``path_escapes_workspace``), and a missing
required file stops the stage before any agent starts (``missing_file``). Plain values in,
a string out; no Django models here.
"""
from __future__ import annotations

import os
import posixpath
import re

#: Repository instruction files given to every agent when present, in this order (docs/pipeline-format.md,
#: "What an agent's prompt holds"); ``instruction_files`` adds the nearest AGENTS.md of the stage's scope
#: after the root one, the files of .cursor/rules/ and CONTRIBUTING*.
INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md", "GEMINI.md", ".github/copilot-instructions.md")
#: How the prompt names the list it looked for (the same order).
INSTRUCTION_ORDER = ("AGENTS.md (the root one, then the nearest in the folders of the stage's scope), CLAUDE.md, "
                     "GEMINI.md, .github/copilot-instructions.md, .cursor/rules/*, CONTRIBUTING* (the root and .github/)")
#: Bytes of one included file beyond which it is cut (the agent can read the rest itself).
MAX_FILE_BYTES = 64 * 1024
#: An instruction file larger than this is named in the prompt, not included (bytes); so is every file
#: once the included ones reach MAX_INSTRUCTION_TOTAL bytes.
MAX_INSTRUCTION_BYTES = 64 * 1024
MAX_INSTRUCTION_TOTAL = 128 * 1024
#: At most this many files of one kind (.cursor/rules/*, AGENTS.md in the scope's folders) are looked at.
MAX_INSTRUCTION_FILES = 20


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
#: Bytes read from a document to find its title (``_title``).
_TITLE_BYTES = 4096
#: Documents listed at most in a generated index (a huge docs/ folder is cut, and says so).
MAX_INDEX_ENTRIES = 500


#: Extensions of documentation files, each read by its own title rules (``_title``).
DOC_EXTENSIONS = (".md", ".rst", ".txt", ".adoc")
#: Top-level files that are documentation whatever their extension (README, CHANGELOG.rst, ...).
_DOC_NAMES = ("README", "CHANGELOG", "HISTORY", "NEWS")


def _is_documentation(rel: str) -> bool:
    """Documentation, by its path: at the top level ``README*``, ``CHANGELOG*``, ``HISTORY*``,
    ``NEWS*`` (any extension but code and configuration) and every ``*.md``, ``*.rst``, ``*.adoc`` (not ``*.txt``: requirements.txt is no
    document); under ``docs/`` every ``*.md``, ``*.rst``, ``*.txt`` and ``*.adoc``."""
    lower = rel.lower()
    if "/" not in rel:
        return (rel.upper().startswith(_DOC_NAMES)
                and os.path.splitext(lower)[1] not in (".py", ".sh", ".json", ".toml", ".yaml", ".yml", ".cfg")) \
            or lower.endswith((".md", ".rst", ".adoc"))
    return rel.startswith("docs/") and lower.endswith(DOC_EXTENSIONS)


def is_note(rel: str) -> bool:
    """Whether a repository-relative path is a note of the knowledge base: a documentation file by
    ``_is_documentation``, or any ``.md``, ``.rst``, ``.txt`` or ``.adoc`` file (DOC_EXTENSIONS): the
    documenter writes only inside the pipeline's ``documentation_paths``, so what it changed with
    such an extension is a note there."""
    return _is_documentation(rel) or rel.lower().endswith(DOC_EXTENSIONS)


def unindexed_notes(worktree: str, index_rel: str, changed: list[str]) -> list[str]:
    """The notes of ``changed`` (repository-relative paths a documentation attempt added or
    modified; ``is_note``) that still exist and that the specification index ``index_rel`` does not
    name, in the order given. An index names a note by its repository path (``docs/auth.md``, or
    ``/docs/auth.md``) or by its path from the index's folder (``auth.md``, ``./auth.md`` beside
    ``docs/INDEX.md``; ``../auth.md`` is another folder's), anywhere
    in its text (a link target or plain text). The index itself is never missing from itself;
    a missing or unreadable index names nothing (ContextError when it leads out of the worktree)."""
    text = read_inside(worktree, index_rel, required=False) or ""
    base = posixpath.dirname(index_rel)
    missing = []
    for rel in changed:
        if rel == index_rel or not is_note(rel) or not os.path.isfile(resolve_inside(worktree, rel)):
            continue
        names = {rel, "/" + rel, posixpath.relpath(rel, base) if base else rel}
        if not any(_names_path(text, name) for name in names):
            missing.append(rel)
    return missing


def _names_path(text: str, path: str) -> bool:
    """Whether ``text`` holds ``path`` whole: not as the tail of a longer path (``xdocs/a.md``,
    ``other/a.md``; ``./a.md`` is fine) nor as the head of one (``a.md.bak``, ``a.mdx``)."""
    for found in re.finditer(re.escape(path), text):
        start, end = found.start(), found.end()
        before = text[start - 1] if start else " "
        after = text[end:end + 2]
        head_ok = not (before.isalnum() or before in "_-.") and (
            before != "/" or (text[max(0, start - 2):start] == "./" and text[max(0, start - 3):start] != "../"))
        tail_ok = not after[:1] or not (after[0].isalnum() or after[0] in "/_-"
                                        or (after[0] == "." and after[1:2].isalnum()))
        if head_ok and tail_ok:
            return True
    return False


def _documentation_files(root: str) -> list[str]:
    """Repository-relative paths of the documentation files in ``root`` (real files inside it only)."""
    found = []
    for name in os.listdir(root):
        if _is_documentation(name):
            found.append(name)
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs) and not os.path.islink(docs):
        for folder, dirs, files in os.walk(docs):  # followlinks=False: a linked folder is not entered
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("_build"))
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


#: Characters a reStructuredText section title may be underlined with (docutils' "adornment"
#: characters: any non-alphanumeric printable 7-bit ASCII; these are the ones in use).
_RST_ADORNMENT = set("=-~^\"'`#*+.:_!$%&,;<>?@|/")


def _markdown_title(lines: list[str]) -> str:
    """The first heading of Markdown text: an ATX heading (``# Title``) or a setext one (a line
    underlined with ``===`` or ``---``), outside fenced (```, ~~~) and indented code blocks, HTML
    comments and a leading YAML front matter block."""
    fence = ""
    in_comment = False
    previous = ""
    start = 0
    if lines and lines[0].strip() == "---":  # front matter: up to the next ---
        for i in range(1, len(lines)):
            if lines[i].strip() in ("---", "..."):
                start = i + 1
                break
    for raw in lines[start:]:
        line = raw.rstrip()
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and not stripped.lstrip(fence[0]).strip():
                fence = ""
            previous = ""
            continue
        if in_comment:
            in_comment = "-->" not in stripped
            previous = ""
            continue
        if stripped.startswith(("```", "~~~")):  # closed by a run of the same character at least as long
            fence = stripped[:len(stripped) - len(stripped.lstrip(stripped[0]))]
            previous = ""
            continue
        if stripped.startswith("<!--"):
            in_comment = "-->" not in stripped
            previous = ""
            continue
        if line.startswith(("    ", "\t")):  # an indented code block (or a continuation)
            previous = ""
            continue
        if stripped.startswith("#"):
            hashes = len(stripped) - len(stripped.lstrip("#"))
            rest = stripped[hashes:]
            if hashes <= 6 and (not rest or rest[0] in " \t"):
                return rest.strip().rstrip("#").strip()
        if previous and stripped and set(stripped) <= {"="} | {"-"} and len(set(stripped)) == 1:
            return previous
        previous = stripped if stripped and not stripped.startswith(("-", "*", "+", ">", "|")) else ""
    return ""


def _rst_title(lines: list[str]) -> str:
    """The first section title of reStructuredText: a line of text underlined (and maybe overlined)
    by one adornment character repeated at least as long as the text; directives and comments
    (``.. ``) and their indented bodies are skipped."""
    in_directive = False
    for i, raw in enumerate(lines[:-1]):
        line = raw.rstrip()
        if in_directive:
            if not line or line[0] in " \t":
                continue
            in_directive = False
        if line.startswith(".."):
            in_directive = True
            continue
        text, under = line.strip(), lines[i + 1].rstrip()
        if not text or line[0] in " \t" or set(text) <= _RST_ADORNMENT:
            continue
        if under and len(set(under)) == 1 and under[0] in _RST_ADORNMENT and len(under) >= len(text):
            return text
    return ""


def _asciidoc_title(lines: list[str]) -> str:
    """The document title of AsciiDoc (``= Title``), else its first section title (``== Title``),
    outside delimited blocks (``----``, ``....``, ``====``, ``////``)."""
    block = ""
    for raw in lines:
        line = raw.rstrip()
        if block:
            if line == block:
                block = ""
            continue
        if len(line) >= 4 and len(set(line)) == 1 and line[0] in "-.=/+*_":
            block = line
            continue
        if line.startswith("=") and not line.startswith("=" * 7):
            level = len(line) - len(line.lstrip("="))
            if line[level:level + 1] == " " and line[level:].strip():
                return line[level:].strip()
    return ""


def _title(path: str) -> str:
    """The title of a documentation file, read the way its format defines one: Markdown's first
    heading (``.md``), reStructuredText's first underlined section title (``.rst``, and ``.txt`` or
    no extension, which are often reST), AsciiDoc's ``= Title`` (``.adoc``); '' when it has none.
    Only the first 4 KiB are read; the title is cut at 120 characters."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_TITLE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = head.splitlines()
    ext = os.path.splitext(path)[1].lower()
    if ext in (".md", ".markdown"):
        title = _markdown_title(lines)
    elif ext == ".adoc":
        title = _asciidoc_title(lines)
    else:  # reST, or a README / CHANGELOG without extension that may be Markdown
        title = _rst_title(lines) or (_markdown_title(lines) if ext in ("", ".txt") else "")
    return title[:120]


def initial_spec_index(worktree: str, spec_index_rel: str) -> str:
    """The text of an initial specification index for a repository that has none at ``spec_index_rel``.

    It lists the repository's documentation files (``_is_documentation``: README*, CHANGELOG*,
    *.md, *.rst and *.adoc at the top level; *.md, *.rst, *.txt and *.adoc under docs/), sorted,
    each with its title when it has one (``_title``), under a header saying that the Run Engine generated it
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
        f"`{spec_index_rel}`. It lists the repository's documentation files (README*, CHANGELOG*, HISTORY*, NEWS*, *.md, "
        f"*.rst and *.adoc at the top level; *.md, *.rst, *.txt and *.adoc under docs/); read the ones "
        f"your work needs. Add a maintained index at "
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


def _scope_folders(scope: list[str]) -> list[str]:
    """The folders a stage's scope patterns are rooted in, in their order: the part of each pattern
    before its first wildcard, up to its last ``/`` (``app/**`` -> ``app``, ``src/pkg/*.py`` ->
    ``src/pkg``, ``README.md`` -> the root, '')."""
    folders = []
    for pattern in scope or []:
        fixed = pattern.replace("\\", "/")
        for i, char in enumerate(fixed):
            if char in "*?[{":
                fixed = fixed[:i]
                break
        folder = (fixed.rsplit("/", 1)[0] if "/" in fixed else "").strip("/")
        if folder not in folders:
            folders.append(folder)
    return folders


def _is_file_inside(root: str, rel: str) -> bool:
    """Whether ``rel`` is a file in the worktree; ContextError when it is a symlink out of it."""
    return os.path.isfile(resolve_inside(root, rel))


def instruction_files(worktree: str, scope: list[str]) -> list[str]:
    """The repository instruction files present in ``worktree``, as repository-relative paths in the
    order they are given to agents (INSTRUCTION_ORDER): ``AGENTS.md``; for each folder of the stage's
    ``scope`` (``_scope_folders``), the nearest ``AGENTS.md`` in it or above it (below the root), and
    those inside it (at most MAX_INSTRUCTION_FILES); ``CLAUDE.md``, ``GEMINI.md``,
    ``.github/copilot-instructions.md``; the files of ``.cursor/rules/`` (sorted, at most
    MAX_INSTRUCTION_FILES); ``CONTRIBUTING*`` at the root, then in ``.github/`` (at most
    MAX_INSTRUCTION_FILES in each).
    Raises ContextError (``path_escapes_workspace``) for one that is a symlink out of the worktree.
    """
    root = os.path.realpath(worktree)
    found: list[str] = []
    seen: set[str] = set()

    def add(rel: str) -> None:
        if rel not in seen and _is_file_inside(root, rel):
            seen.add(rel)
            found.append(rel)

    add("AGENTS.md")
    for folder in _scope_folders(scope):
        parts = [p for p in folder.split("/") if p]
        for depth in range(len(parts), 0, -1):  # the nearest one, from the folder up
            rel = "/".join(parts[:depth]) + "/AGENTS.md"
            if _is_file_inside(root, rel):
                add(rel)
                break
        base = os.path.join(root, *parts) if parts else ""
        if parts and os.path.isdir(base) and not os.path.islink(base):
            inside = []
            for current, dirs, files in os.walk(base):  # followlinks=False
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
                if "AGENTS.md" in files:
                    inside.append(os.path.relpath(os.path.join(current, "AGENTS.md"), root).replace(os.sep, "/"))
                if len(inside) >= MAX_INSTRUCTION_FILES:
                    break
            for rel in sorted(inside):
                add(rel)
    for rel in INSTRUCTION_FILES[1:]:
        add(rel)
    for rel in _folder_entries(root, ".cursor/rules"):
        add(rel)
    for folder in ("", ".github"):
        for rel in _folder_entries(root, folder, prefix="CONTRIBUTING"):
            add(rel)
    return found


def _folder_entries(root: str, folder: str, prefix: str = "") -> list[str]:
    """Repository-relative paths of the entries of ``folder`` (not a symlink) whose names start with
    ``prefix`` (any case), sorted, at most MAX_INSTRUCTION_FILES; [] when there is no such folder."""
    path = os.path.join(root, folder)
    if not os.path.isdir(path) or os.path.islink(path):
        return []
    names = sorted(name for name in os.listdir(path) if name.upper().startswith(prefix.upper()))
    return [f"{folder}/{name}" if folder else name for name in names[:MAX_INSTRUCTION_FILES]]


def _named(paths: list[str], most: int = MAX_INSTRUCTION_FILES) -> str:
    """``paths`` joined for a sentence, at most ``most`` of them, then how many more."""
    shown = ", ".join(paths[:most])
    return shown + (f" and {len(paths) - most} more" if len(paths) > most else "")


def _instructions(worktree: str, scope: list[str], changed: frozenset[str] = frozenset()) -> list[str]:
    """The prompt's "Repository instructions" section: what was looked for, what was found, which
    were too large (named, for the agent to read), which were left out because an agent of this run
    changed them (``changed``: paths changed since the stage's base commit; an agent's own text is not
    the repository's instructions), then each included file under its path. Empty files count as found
    and are not included."""
    root = os.path.realpath(worktree)
    found = instruction_files(worktree, scope)
    included: list[tuple[str, str]] = []
    too_large: list[str] = []
    planted = [rel for rel in found if rel in changed]
    total = 0
    for rel in found:
        if rel in changed:
            continue
        size = os.path.getsize(resolve_inside(root, rel))
        if size > MAX_INSTRUCTION_BYTES or total + size > MAX_INSTRUCTION_TOTAL:
            too_large.append(f"{rel} ({size:,} bytes)")
            continue
        total += size
        if size:
            included.append((rel, read_inside(worktree, rel, required=False) or ""))
    parts = ["", "## Repository instructions", f"Looked for, in this order: {INSTRUCTION_ORDER}.",
             f"Found: {_named(found, 3 * MAX_INSTRUCTION_FILES) if found else 'none'}."]
    if too_large:
        parts.append(f"Too large to include here (read them yourself): {_named(too_large)}.")
    if planted:
        parts.append(f"Left out because an agent of this run changed them: {_named(planted)}.")
    for rel, text in included:
        parts += ["", f"### {rel}", text.strip()]
    return parts


def assemble_prompt(*, pipeline: dict, stage: dict, worktree: str, operation: str,
                    dependencies: list[dict], spec_index_text: str | None = None,
                    changed: frozenset[str] = frozenset()) -> str:
    """The prompt of one agent session for ``stage`` (a frozen stage definition).

    ``dependencies``: accepted output of the stages this one depends on, each
    ``{"key", "checkpoint", "summary"}`` (summary: the patch's file list and the final message).
    ``spec_index_text``: the specification index to give instead of reading the pipeline's
    ``spec_index`` file (the engine's initial index, ``initial_spec_index``, when the repository
    has none); None reads the file, if there is one.
    ``changed``: the paths the worktree changed since the stage's base commit; instruction files among
    them are left out (``_instructions``).
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
    parts += _instructions(worktree, stage.get("scope") or [], changed)
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
