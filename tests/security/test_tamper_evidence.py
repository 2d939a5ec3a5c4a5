"""A refused change is looked at, never trusted (engine/steps/agreed.py ``dropped``): when an agent's
files change how the tests run, the run stops before any gate, and the engine lists with pytest's
--collect-only, on a fresh checkout of those files, which agreed tests they would take away. That
collection runs the agent's conftest, as a gate would: in the gates' sandbox, on the checkout only.
A hostile conftest must not reach the run's worktree, the repository or the engine's var folder
from there, and the run stops whatever it prints."""
from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.models import Check

from ..support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = {"key": "answer", "requirement": "Make app.core.answer() return 42.", "scope": ["app/**", "tests/**"],
         "gates": [{"name": "unit", "command": "python -m pytest -q"}], "repair_allowance": 0}
#: written by the agent in its worktree: a conftest that, when collected, writes into the worktree it came
#: from, the user's repository and the engine's var folder (their paths baked in)
HOSTILE = """
import pathlib
said = []
for target in {targets!r}:
    try:
        pathlib.Path(target, "planted-by-conftest.txt").write_text("x")
        said.append("WROTE " + target)
    except OSError as exc:
        said.append("REFUSED " + target + " " + type(exc).__name__)
raise RuntimeError(" | ".join(said))  # what it did, in pytest's log (a collection's output is captured)
"""


def test_a_hostile_conftest_collected_for_the_evidence_reaches_only_its_checkout(make_pipeline, repo, sent):
    pipeline = make_pipeline(stages=[STAGE], scenario={"stages": {"answer": {"implement": [{"run": [
        "sh", "-c", 'python3 -c "import sys; open(\'conftest.py\', \'w\').write(sys.argv[1].format(targets=['
        '__import__(\'os\').getcwd(), sys.argv[2], sys.argv[3]]))" "$0" "$1" "$2"',
        HOSTILE, str(repo), str(settings.VAR_DIR)]}]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="test", source="test")
    run = drive(run.pk, sent)
    assert (run.status, run.stop_reason) == ("waiting_review", "protected_files_changed"), run.stop_message
    assert not Check.objects.filter(run=run).exists()
    for folder in (run.worktree, str(repo), str(settings.VAR_DIR)):
        if Path(folder, "planted-by-conftest.txt").exists():
            pytest.fail(f"the conftest collected for the evidence wrote into {folder}", pytrace=False)
    logs = sorted(Path(settings.VAR_DIR, "runs", str(run.pk)).rglob("collected-unit.log"))
    if not logs:
        pytest.fail("the agent's files were not collected: no collected-unit.log", pytrace=False)
    text = logs[0].read_text()
    # it ran (its words are in the log); a write that "worked" landed in the sandbox's own empty folders on
    # the way to a path it shows (the repository's .git), gone with the sandbox: the host's folders above
    # hold nothing, and the worktree and the var folder are not even there
    if "RuntimeError: " not in text or f"REFUSED {run.worktree}" not in text or \
            f"REFUSED {settings.VAR_DIR}" not in text:
        pytest.fail(f"the hostile conftest's own words, in the collection's log: {text}", pytrace=False)
    assert not list(Path(settings.VAR_DIR).rglob("planted-by-conftest.txt")), text
    assert not list(Path(settings.VAR_DIR).rglob("planted-by-conftest.txt")), text
