"""A hostile agent reads the worker's environment and the host's files, and a reviewer leaves
files for the roles after it (issue: "Environment", "Filesystem")."""
from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from engine import boundary, operations

from ..conftest import ANSWER_STEP, PASS_REVIEW, make_repo
from ..support.runs import drive
from .attacks import QUICK_STAGE, claude_attack_pipeline, needs_claude, start_and_drive, tool_results
from ..support.fixtures import WORKER_SECRETS

pytestmark = pytest.mark.django_db(transaction=True)


@needs_claude
@pytest.mark.slow
def test_the_agent_and_the_gates_see_none_of_the_workers_variables(make_pipeline, repo, sent, monkeypatch):
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    stage = {**QUICK_STAGE, "gates": [{"name": "unit", "command": 'env > "$CP_DATA_DIR/gate-env"'}]}
    run = start_and_drive(claude_attack_pipeline(make_pipeline, ["env | sort; echo ENV-DUMPED"], stages=[stage]),
                          repo, sent)
    output = tool_results(run)
    assert "ENV-DUMPED" in output and "PATH=" in output  # the dump ran and printed
    gate_env = (Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}" / "data" / "gate-env").read_text()
    for name, value in WORKER_SECRETS.items():
        assert name not in output and value not in output, name
        assert name not in gate_env and value not in gate_env, name
    # what they do get: the documented allow-list and the run's own variables
    names = {line.split("=", 1)[0] for line in gate_env.splitlines() if "=" in line}
    allowed = set(boundary.ENV_NAMES) | {"HOME", "TMPDIR", "PWD", "SHLVL", "_", "OLDPWD", "CP_PROCESS_MARKER",
                                         "GIT_TERMINAL_PROMPT", "GIT_ASKPASS", "PYTHONDONTWRITEBYTECODE",
                                         "PYTHONPATH", "PYTEST_PLUGINS"}  # the engine's pytest reporter
    assert "gate-reporter-" in gate_env.split("PYTHONPATH=", 1)[1].split("\n", 1)[0]
    stray = {name for name in names - allowed if not name.startswith(("CP_", "LC_"))}
    assert stray == set(), stray


@needs_claude
@pytest.mark.slow
def test_the_agent_reads_nothing_of_the_host_but_its_own_folders(make_pipeline, repo, sent, tmp_path):
    secret = f"host-secret-{uuid.uuid4().hex}"
    other = make_repo(tmp_path / "other-install", {"README.md": "another installation\n"})
    (other / "var").mkdir()
    (other / "var" / "controlpanel.sqlite3").write_text(secret)
    (other / ".env").write_text(f"DJANGO_SECRET_KEY={secret}\n")
    in_home = Path(os.path.expanduser("~")) / f".cp-security-probe-{uuid.uuid4().hex[:8]}"
    in_home.write_text(secret)
    var = Path(settings.VAR_DIR)
    (var / "runs" / "999-other").mkdir(parents=True, exist_ok=True)
    (var / "runs" / "999-other" / "control.json").write_text(secret)
    try:
        reads = [f"cat {other}/var/controlpanel.sqlite3", f"cat {other}/.env", f"cat {in_home}",
                 f"cat {var}/runs/999-other/control.json", f"ls -a {tmp_path}", f"ls -a {var} {var}/runs",
                 "ls -a /root /home /var /run /srv 2>&1", f"grep -rl {secret} /tmp /root /home /var /run /etc /opt 2>/dev/null"]
        command = "; ".join(f"echo '>>> read {n}'; {r} 2>&1" for n, r in enumerate(reads)) + "; echo READS-DONE"
        run = start_and_drive(claude_attack_pipeline(make_pipeline, [command]), repo, sent)
        output = tool_results(run)
        assert "READS-DONE" in output
        assert secret not in output
        sections = dict(re.findall(r">>> read (\d+)\n(.*?)(?=\n>>> read |\nREADS-DONE)", output, re.S))
        for n in range(4):  # every cat: nothing there
            assert "No such file or directory" in sections[str(n)], sections[str(n)]
        listing = sections["4"] + sections["5"] + sections["6"]
        assert "other-install" not in listing and "999-other" not in listing and ".cp-security-probe" not in listing
        assert sections["7"].count(secret) == 0
    finally:
        in_home.unlink(missing_ok=True)


def test_a_reviewer_writes_nothing_another_role_reads(make_pipeline, repo, sent):
    """The reviewer's TMPDIR and data folder are its own (inside its HOME, gone with it); the
    run's shared ones, which the implementer and the gates use, get nothing of it."""
    leave = 'echo r > "$TMPDIR/from-reviewer"; echo r > "$CP_DATA_DIR/from-reviewer"; echo wrote "$TMPDIR"'
    review = {**PASS_REVIEW, "run": ["sh", "-c", leave]}
    check = ('test ! -e "$TMPDIR/from-reviewer" && test ! -e "$CP_DATA_DIR/from-reviewer"')
    stages = [{**QUICK_STAGE, "gates": [{"name": "unit", "command": check}]}]
    pipeline = make_pipeline(stages=stages, reviews=False,
                             scenario={"stages": {"answer": {"implement": [ANSWER_STEP], "review": [review]}}})
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    scratch = Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}"
    assert not (scratch / "tmp" / "from-reviewer").exists() and not (scratch / "data" / "from-reviewer").exists()
    # and the final verification's gates (after the review) found none either: the run succeeded


def test_what_one_gates_code_leaves_in_its_home_never_reaches_the_next_gate(make_pipeline, repo, sent):
    """Each check has a fresh HOME, removed after it (a tester planted a ``.pth`` in the user site
    folder of a shared gate HOME that made every later pytest exit 0, the final verification's too);
    the final verification also has its own TMPDIR and data folder."""
    # in the worktree's verification the plant also leaves a file in the run's TMPDIR; the final
    # verification's checks must see neither that nor any HOME of another check
    plant = ('mkdir -p "$HOME/planted" && echo x > "$HOME/planted/mark" && echo "$HOME" >> "$CP_DATA_DIR/homes"; '
             'if [ "$CP_STAGE" != final ]; then echo x > "$TMPDIR/from-a-gate"; fi')
    look = 'test ! -e "$HOME/planted/mark" && { [ "$CP_STAGE" != final ] || test ! -e "$TMPDIR/from-a-gate"; }'

    stage = {**QUICK_STAGE, "gates": [{"name": "plant", "command": plant}, {"name": "look", "command": look}]}
    run = operations.create_run(make_pipeline(stages=[stage]), str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    run = drive(run.pk, sent)
    assert run.status == "succeeded", run.stop_message
    checks = {(c.kind, c.name): c for c in run.checks.all()}
    for (kind, name), check in checks.items():
        assert check.passed, (kind, name, (Path(settings.VAR_DIR) / check.log_path).read_text())
    scratch = Path(settings.VAR_DIR) / "scratch" / f"run-{run.pk}"
    assert not list(scratch.glob("gate-home-*"))  # every check's HOME was removed
    assert not list(scratch.glob("gate-reporter-*"))  # and the folder of its test reporter
    homes = (scratch / "data" / "homes").read_text().split()  # the worktree's gate wrote it; final had its own
    assert len(homes) == 1 and "gate-home-" in homes[0]
    assert (scratch / "tmp" / "from-a-gate").exists()  # the run's own TMPDIR kept it: final never saw it
