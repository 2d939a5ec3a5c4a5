"""A person's comments on a diff waiting at a human gate (spec: Approve A Human Gate): read from the
text a person types (``parse_comment``), checked against the diff's changed files and their lines
(``checked``, ``line_counts``), stored with the decision and given to the repair attempt.
``engine/operations.py`` ``request_changes`` is the verb that takes them; its ``OperationError``
``invalid_comments`` [comments] carries ``CommentError``'s sentence.
"""
from __future__ import annotations

import json
import re

from . import workspace
from .models import Decision, Manifest, Run, StageRun
from .redaction import redact_text
from .steps.paths import var_path


class CommentError(ValueError):
    """A comment that cannot go with a request for changes: the sentence names it and what is wrong."""


#: At most this many comments on the diff go with one request for changes, each at most COMMENT_CHARS.
MAX_COMMENTS, COMMENT_CHARS = 100, 2000

#: A comment typed as one line: ``path:line: text`` or ``path: text`` (a path has no space or colon,
#: and a dot or a slash: "Note: ..." is a general comment).
_COMMENT_LINE = re.compile(r"^(?P<file>[^\s:]*[./][^\s:]*):(?:(?P<line>\d+):)?\s*(?P<text>\S.*)$", re.DOTALL)


#: The same with the path in double quotes, for a path with a space or a colon (the page writes it so).
_QUOTED_COMMENT_LINE = re.compile(r'^"(?P<file>[^"\n]+)":(?:(?P<line>\d+):)?\s*(?P<text>\S.*)$', re.DOTALL)


def parse_comment(text: str) -> dict:
    """``{"file", "line", "text"}`` of a comment typed as text (the command's ``--comment``, a line of
    the page's form): ``path:line: text``, ``path: text`` (``"a path:with spaces.py":3: text`` when the path has
    a space or a colon), or anything else as a general comment (file and line None). ``checked`` checks the
    result."""
    found = _QUOTED_COMMENT_LINE.match(text.strip()) or _COMMENT_LINE.match(text.strip())
    if found is None:
        return {"file": None, "line": None, "text": text.strip()}
    return {"file": found.group("file"), "line": int(found.group("line")) if found.group("line") else None,
            "text": found.group("text").strip()}


def changed_paths(run: Run, stage: StageRun, digest: str) -> set[str]:
    """The paths the manifest ``digest`` of ``stage`` lists as changed (added, modified, deleted)."""
    manifest = Manifest.objects.filter(run=run, stage=stage, digest=digest).order_by("-id").first()
    if manifest is None:
        return set()
    try:
        data = json.loads(var_path(manifest.path).read_text(encoding="utf-8"))  # on its host's disk too
    except (OSError, ValueError):
        return set()
    return {change["path"] for change in data.get("changes") or []}


def line_counts(run: Run, decision_id, comments) -> dict[str, int | None]:
    """``{path: its lines}`` of the changed files ``comments`` name, in the files of the approval decision
    ``decision_id``, read from git before ``request_changes`` (engine/operations.py) locks the run (git never
    runs while a row lock is held). A decision's files never change: when the locked run finds it still pending
    for its stage's current files, these are those files' counts ({} when there is no such decision: the lock
    refuses it)."""
    decision = run.decisions.filter(pk=decision_id if str(decision_id).isdigit() else -1,
                                    kind=Decision.Kind.APPROVAL).first()
    if decision is None or decision.stage is None or not isinstance(comments, list):
        return {}
    changed = changed_paths(run, decision.stage, decision.artifact)
    named = {comment.get("file") for comment in comments[:MAX_COMMENTS]
             if isinstance(comment, dict) and isinstance(comment.get("file"), str)}
    return {path: line_count(run, decision.artifact, path) for path in named if path in changed}


def line_count(run: Run, tree: str, path: str) -> int | None:
    """Lines of ``path`` in the files ``tree`` (a manifest digest: a git tree id); None when the
    path is not a file there (deleted by the change: a line then names its old text)."""
    # the repository's object store holds the worktree's trees: readable where the worktree is not (another host)
    shown = workspace.git(["cat-file", "blob", f"{tree}:{path}"], run.repo_path, check=False)
    if shown.returncode != 0:
        return None
    return shown.stdout.count(b"\n") + (0 if shown.stdout.endswith(b"\n") or not shown.stdout else 1)


def checked(comments, changed: set[str], lines_of=lambda path: None) -> list[dict]:
    """``comments`` as stored (``[{"file", "line", "text"}]``, texts redacted); ``CommentError`` naming the
    first bad one (not a mapping, no text, a file not in the diff, a line that is not a positive whole number
    or past the file's end, ``lines_of(path)`` giving its lines or None)."""
    if comments in (None, ""):
        return []
    if not isinstance(comments, list):
        raise CommentError("comments must be a list of {file, line, text}.")
    if len(comments) > MAX_COMMENTS:
        raise CommentError(f"At most {MAX_COMMENTS} comments go with one request.")
    kept = []
    for number, comment in enumerate(comments, 1):
        if not isinstance(comment, dict) or set(comment) - {"file", "line", "text"}:
            raise CommentError(f"Comment {number} must be a mapping with file, line and text only.")
        text = comment.get("text")
        if not isinstance(text, str) or not text.strip() or len(text) > COMMENT_CHARS:
            raise CommentError(f"Comment {number} needs a text of 1 to {COMMENT_CHARS} characters.")
        file = comment.get("file")
        if file is not None and (not isinstance(file, str) or file not in changed):
            shown = ", ".join(sorted(changed)[:10]) or "none"
            raise CommentError(f"Comment {number} is on {file!r}, which is not a file of the diff waiting for "
                               f"approval (its files: {shown}).")
        line = comment.get("line")
        if line is not None and (isinstance(line, bool) or not isinstance(line, int) or line < 1):
            raise CommentError(f"Comment {number}: line must be a positive whole number or null.")
        if line is not None and file is None:
            raise CommentError(f"Comment {number} names a line but no file.")
        if line is not None:
            count = lines_of(file)
            if count is not None and line > count:
                raise CommentError(f"Comment {number} is on line {line} of {file}, which has {count} line(s) in "
                                   f"the files waiting for approval.")
        kept.append({"file": file, "line": line, "text": redact_text(text.strip())[0]})
    return kept


#: Lines shown before and after a commented line in the repair attempt's prompt.
AROUND = 3


def code_around(run: Run, tree: str, path: str, line: int, around: int = AROUND) -> list[str]:
    """The lines ``line - around`` to ``line + around`` of ``path`` in the files ``tree`` (a manifest digest),
    each ``NNNN| text`` with the commented line marked ``>``, fenced; [] when the file is not there."""
    shown = workspace.git(["cat-file", "blob", f"{tree}:{path}"], run.repo_path, check=False)
    if shown.returncode != 0 or b"\0" in shown.stdout[:8000]:
        return []
    rows = shown.stdout.decode("utf-8", errors="replace").split("\n")  # git's lines: "\n" ends one, nothing else
    if rows and rows[-1] == "":
        rows.pop()
    first, last = max(1, line - around), min(len(rows), line + around)
    body = [f"{'>' if number == line else ' '}{number:5d}| {_printable(rows[number - 1])}"
            for number in range(first, last + 1)]
    fence = "`" * max(3, 1 + max((len(run_) for text in body for run_ in re.findall(r"`+", text)), default=0))
    return [fence, *body, fence] if body else []


def _printable(text: str) -> str:
    r"""A line of a file for a prompt: control characters and other line breaks (a form feed, U+2028) shown as
    ``\xNN`` or ``\uNNNN`` escapes, so one line of the file stays one line of the prompt."""
    return "".join(ch if ch == "\t" or (ch.isprintable() and ch not in "\u2028\u2029")
                   else (f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}") for ch in text.rstrip("\r"))


def against(run: Run, old_tree: str, new_tree: str, comments: list[dict]) -> list[dict]:
    """Each comment of a request for changes on the files ``old_tree``, said against the files the repair
    made (``new_tree``): ``{"where", "text", "state", "said"}``, ``state`` one of ``changed`` (the repair
    changed the commented line or a line within AROUND of it), ``unchanged``, ``file_changed`` (a comment on
    a file without a line, and the file changed), ``gone`` (the file is not in the new files) or ``general``.
    What git says the repair changed, never what the agent says it did."""
    paths = sorted({c["file"] for c in comments if isinstance(c, dict) and isinstance(c.get("file"), str)})
    touched: dict[str, list[tuple[int, int]]] = {}
    if paths:
        shown = workspace.git(["diff", "--no-ext-diff", "--no-textconv", "-U0", old_tree, new_tree, "--", *paths],
                              run.repo_path, check=False)
        current = ""
        for row in shown.stdout.decode("utf-8", errors="replace").splitlines():
            if row.startswith("--- "):
                named = row[4:]
                current = named[2:] if named.startswith("a/") else named
            hunk = re.match(r"^@@ -(\d+)(?:,(\d+))? ", row)
            if hunk and current:
                start, count = int(hunk.group(1)), int(hunk.group(2) if hunk.group(2) is not None else 1)
                touched.setdefault(current, []).append((start, start + max(count, 1) - 1))
    rows = []
    for comment in comments:
        file, line = comment.get("file"), comment.get("line")
        where = (f"{file}:{line}" if line else file) if file else "(general)"
        if not file:
            state, said = "general", "a general comment"
        elif workspace.git(["cat-file", "-e", f"{new_tree}:{file}"], run.repo_path, check=False).returncode != 0:
            state, said = "gone", "the file is not in the new files"
        elif line is None:
            state, said = ("file_changed", "the repair changed this file") if file in touched else (
                "unchanged", "the repair did not change this file")
        elif any(start - AROUND <= line <= end + AROUND for start, end in touched.get(file, [])):
            state, said = "changed", f"the repair changed line {line} or lines near it"
        else:
            state, said = "unchanged", f"the repair did not change line {line} or the lines near it"
        rows.append({"where": where, "text": comment.get("text") or "", "state": state, "said": said})
    return rows
