"""docs/architecture.md stays true: every file it names exists and every function or class it names next to a
module is defined there; every heading of the specification has its row."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
#: the headings of the product owner's specification (the rows of the map's last table)
SPEC_HEADINGS = (
    "Create A Run", "Isolate The Workspace", "Queue The Start Request", "Connect A Real Agent",
    "Enforce Role Permissions", "Supply One Stage's Context", "Record Each Attempt", "Enforce Process Deadlines",
    "Run The Gates", "Request An Independent Review", "Protect The Checks", "Identify The Tested Files",
    "Make A Bounded Repair", "Update The Documentation", "Checkpoint The Stage", "Approve A Human Gate",
    "Recheck A Corrected Result", "Recover An Interruption", "End An Unsuccessful Run",
    "Verify Execution And Recovery")
PATH = r"(?:engine|controlpanel|tests|bench|docs|templates|scripts)/[^`\s,;()]*"


def test_every_file_the_map_names_exists():
    named = set(re.findall(rf"`({PATH})`", MAP)) | set(re.findall(rf"(?<![`\w/])({PATH}\.(?:md|py))", MAP))
    assert len(named) > 40, named
    missing = [path for path in sorted(named) if not list(ROOT.glob(path.rstrip("/")))]
    assert missing == [], missing


def test_every_name_the_map_gives_in_a_module_is_defined_there():
    pairs = re.findall(rf"`({PATH}\.py)` ((?:`\w+`(?:, )?)+)", MAP)
    assert len(pairs) > 10, pairs
    wrong = []
    for path, names in pairs:
        text = (ROOT / path).read_text(encoding="utf-8")
        for name in re.findall(r"`(\w+)`", names):
            if not re.search(rf"^\s*(?:def|class) {name}\b|^{name}\s*[:=]", text, re.M):
                wrong.append(f"{path} {name}")
    assert wrong == [], wrong


def test_every_spec_heading_has_its_row():
    rows = {line.split("|")[1].strip() for line in MAP.splitlines() if line.startswith("| ")}
    assert set(SPEC_HEADINGS) - rows == set()
