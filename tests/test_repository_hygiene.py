"""What the repository holds: no committed runtime artifact, no citation of a machine's path."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A citation of a document outside the repository: the project's shared folders, by any path
#: (relative or absolute), or their documents by name.
OUTSIDE = re.compile(r"(\.\./shared/|shared/(design|spec|cases)\b)|agent-cli-facts|field-cases\.md")
#: The field cases' document of the repository, named from the repository's root: the only
#: allowed way to name a field-cases.md (not ../docs/..., not a machine's absolute path).
FIELD_CASES = "docs/field-cases.md"
OWN_FIELD_CASES = re.compile(r"(?<![\w./-])docs/field-cases\.md")
#: A field case cited by its id ("C17"), and a test named after one (``def test_c17_...``).
CASE_ID = re.compile(r"\bC[0-9]{2}\b")
CASE_TEST = re.compile(r"\bdef test_c([0-9]{2})_")
#: Where field cases are cited: these folders and README.md.
CITING = ("engine/", "controlpanel/", "tests/", "docs/", "bench/", "scripts/")
TEXT = (".py", ".md", ".yaml", ".yml", ".html", ".txt", ".toml", ".sh")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def test_no_runtime_artifact_is_committed():
    files = tracked()
    assert not [p for p in files if p.startswith(("control/", "var/", "test-artifacts/")) or p.endswith(".pyc")]


def test_comments_and_docs_cite_files_inside_the_repository_only():
    found = []
    for path in tracked():
        if not path.endswith((".py", ".md", ".yaml", ".yml", ".html", ".txt", ".toml")) or path.startswith("bench/capture"):
            continue
        if path == "tests/test_repository_hygiene.py":
            continue
        for number, line in enumerate((ROOT / path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(OWN_FIELD_CASES.sub("", line)):
                found.append(f"{path}:{number}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def field_cases() -> set[str]:
    """The case ids docs/field-cases.md defines: its headings (``### C17 — ...``) and table rows."""
    text = (ROOT / FIELD_CASES).read_text(encoding="utf-8")
    return (set(re.findall(r"^#{2,4} (C[0-9]{2})\b", text, flags=re.M))
            | set(re.findall(r"^\| *(C[0-9]{2}) *\|", text, flags=re.M)))


def test_every_field_case_cited_is_defined_in_docs_field_cases():
    """Every case id cited (and every ``test_cNN_`` test) has its section in docs/field-cases.md,
    and a file citing one names docs/field-cases.md, so a reader can resolve the id."""
    defined = field_cases()
    assert len(defined) >= 10, defined  # the document's headings are found
    undefined, unresolved = [], []
    for path in tracked():
        if path == FIELD_CASES or not path.endswith(TEXT) or not (path.startswith(CITING) or path == "README.md"):
            continue
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        cites = False
        for number, line in enumerate(text.splitlines(), 1):
            ids = CASE_ID.findall(line)
            cites = cites or bool(ids)
            for case in sorted(set(ids + [f"C{digits}" for digits in CASE_TEST.findall(line)])):
                if case not in defined:
                    undefined.append(f"{path}:{number}: {case} is not in {FIELD_CASES}: {line.strip()[:100]}")
        if cites and not OWN_FIELD_CASES.search(text):
            unresolved.append(f"{path}: cites a field case but never names {FIELD_CASES}")
    assert not undefined + unresolved, "\n".join(undefined + unresolved)
