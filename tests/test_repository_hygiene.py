"""What the repository holds: no committed runtime artifact, no citation of a machine's path."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A citation of a document outside the repository: the project's shared folders, by any path
#: (relative or absolute), or their documents by name.
OUTSIDE = re.compile(r"(\.\./shared/|shared/(design|spec|cases)/)|agent-cli-facts|field-cases\.md")


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
            if OUTSIDE.search(line):
                found.append(f"{path}:{number}: {line.strip()[:120]}")
    assert not found, "\n".join(found)
