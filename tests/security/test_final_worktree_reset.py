"""The final verification runs its checks in the run's own worktree, reset to the final checkpoint
before each one (engine/workspace.py ``reset_to_commit``, engine/steps/final.py). A check runs the
agent's code, so what one check leaves must neither reach the next check nor make git run anything:
a planted repository whose configuration names a filter, a tracked file rewritten with its size and
modification time kept, a folder made read-only so that git cannot clean it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from engine import operations
from engine.models import Check

from ..conftest import make_repo
from ..support.runs import drive

pytestmark = pytest.mark.django_db(transaction=True)

CHECK_ONE = "import app\nassert app.value() == 1, app.value()\nprint('check_one ok')\n"


def final_run(make_pipeline, tmp_path, sent, attack: str, checks: list[dict], config: tuple = ()):
    """A one-stage run whose agent writes ``app.py`` with ``attack`` run at import during the final
    verification only (``CP_STAGE`` is ``final`` there), and whose gates are ``checks``; ``config``:
    ``(key, value)`` pairs set in the user's repository."""
    repo = make_repo(tmp_path / "origin", {"app.py": "def value():\n    return 1\n", "docs/PLAN.md": "# Plan\n",
                                           "check_one.py": CHECK_ONE})
    for key, value in config:
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    code = ("import os, pathlib, subprocess\n\ndef value():\n    return 1\n\n"
            "if os.environ.get('CP_STAGE') == 'final' and not pathlib.Path('attacked').exists():\n"
            + "".join("    " + line + "\n" for line in attack.splitlines())
            + "    pathlib.Path('attacked').write_text('x')\n")
    stages = [{"key": "one", "requirement": "r", "scope": ["app.py"], "gates": checks}]
    scenario = {"stages": {"one": {"implement": [{"write": {"app.py": code}}]}}}
    pipeline = make_pipeline(stages=stages, scenario=scenario)
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="t", source="test")
    return drive(run.pk, sent), repo


def log_of(check: Check) -> str:
    return (Path(settings.VAR_DIR) / check.log_path).read_text(errors="replace")


def test_a_repository_planted_by_a_final_check_is_removed_before_git_reads_the_worktree(make_pipeline, tmp_path,
                                                                                        sent):
    marker = tmp_path / "FILTER-RAN"
    attack = ("os.makedirs('pkg/.git', exist_ok=True)\n"
              "subprocess.run(['git', 'init', '-q', 'pkg'])\n"
              f"open('pkg/.git/config', 'a').write('[filter \"evil\"]\\n\\tclean = touch {marker}\\n"
              f"\\tsmudge = touch {marker}\\n[core]\\n\\tfsmonitor = touch {marker}\\n')\n"
              "open('pkg/.gitattributes', 'w').write('* filter=evil\\n')\n"
              "open('pkg/data.txt', 'w').write('x')\n"
              "open('.gitattributes', 'w').write('* filter=evil\\n')\n")
    checks = [{"name": "attack", "command": "python -c 'import app'"},
              {"name": "clean", "command": "test ! -e pkg && test ! -e attacked && test ! -e .gitattributes"}]
    run, _ = final_run(make_pipeline, tmp_path, sent, attack, checks)
    assert run.status == "succeeded", run.stop_message
    final = {c.name: c for c in Check.objects.filter(run=run, kind="final")}
    assert final["attack"].passed and final["clean"].passed, log_of(final["clean"])
    assert final["clean"].cwd == run.worktree
    assert not marker.exists(), "git ran what a planted repository's configuration names"
    assert not (Path(run.worktree) / "pkg").exists()


def test_a_tracked_file_rewritten_with_its_size_and_time_kept_is_put_back(make_pipeline, tmp_path, sent):
    """git's stat data of the file matches but its change time does not: the next check tests the committed file."""
    attack = ("st = os.stat('check_one.py')\n"
              "text = open('check_one.py').read()\n"
              "fake = \"print('check_one ok')\".ljust(len(text) - 1) + '\\n'\n"
              "assert len(fake) == len(text)\n"
              "try:\n"
              "    open('check_one.py', 'w').write(fake)\n"
              "    os.utime('check_one.py', ns=(st.st_atime_ns, st.st_mtime_ns))\n"
              "except OSError:\n"
              "    pass\n"
              "open('app.py', 'w').write('def value():\\n    return 999\\n')\n"
              "os.utime('app.py', ns=(os.stat('check_one.py').st_atime_ns, os.stat('check_one.py').st_mtime_ns))\n")
    checks = [{"name": "attack", "command": "python -c 'import app'"},
              {"name": "one", "command": "python check_one.py"}]
    run, _ = final_run(make_pipeline, tmp_path, sent, attack, checks)
    final = {c.name: c for c in Check.objects.filter(run=run, kind="final")}
    assert final["one"].passed, log_of(final["one"])  # app.py is the committed one again: value() == 1
    assert "check_one ok" in log_of(final["one"])
    assert run.status == "succeeded", run.stop_message


def test_a_folder_a_check_made_read_only_does_not_reach_the_next_check(make_pipeline, tmp_path, sent):
    """Where git cannot clean (a non-root worker), the next check goes to a fresh checkout; as root
    git cleans it. Either way the next check sees only the committed files."""
    attack = ("os.makedirs('stuck', exist_ok=True)\n"
              "open('stuck/helper.py', 'w').write('x')\n"
              "os.chmod('stuck', 0o555)\n")
    checks = [{"name": "attack", "command": "python -c 'import app'"},
              {"name": "clean", "command": "test ! -e stuck && test ! -e attacked"}]
    try:
        run, _ = final_run(make_pipeline, tmp_path, sent, attack, checks)
        final = {c.name: c for c in Check.objects.filter(run=run, kind="final")}
        assert final["clean"].passed, log_of(final["clean"])
        assert final["attack"].cwd == run.worktree
        if os.geteuid() != 0:
            assert final["clean"].cwd != run.worktree
        assert run.status == "succeeded", run.stop_message
    finally:
        for stuck in Path(settings.VAR_DIR).rglob("stuck"):
            stuck.chmod(0o755)


def test_when_the_worktree_cannot_be_made_exact_each_check_runs_on_a_fresh_checkout(make_pipeline, tmp_path, sent,
                                                                                    monkeypatch):
    from engine import workspace

    monkeypatch.setattr(workspace, "reset_to_commit", lambda *args, **kwargs: False)
    attack = "open('planted.txt', 'w').write('x')\n"
    checks = [{"name": "attack", "command": "python -c 'import app'"},
              {"name": "clean", "command": "test ! -e planted.txt && test ! -e attacked"}]
    run, _ = final_run(make_pipeline, tmp_path, sent, attack, checks)
    final = {c.name: c for c in Check.objects.filter(run=run, kind="final")}
    assert final["clean"].passed, log_of(final["clean"])
    assert all(c.cwd != run.worktree and Path(c.cwd).name.startswith("final-") for c in final.values())
    assert not any(Path(c.cwd).exists() for c in final.values())  # removed after the checks
    assert run.status == "succeeded", run.stop_message


SAME_SIZE_AND_TIME = ("st = os.stat('app.py')\n"
                      "text = open('app.py').read()\n"
                      "fake = text.replace('return 1', 'return 7', 1)\n"
                      "assert len(fake) == len(text)\n"
                      "open('app.py', 'w').write(fake)\n"
                      "os.utime('app.py', ns=(st.st_atime_ns, st.st_mtime_ns))\n")


@pytest.mark.parametrize("config", [(), (("core.trustctime", "false"),), (("core.checkStat", "minimal"),)],
                         ids=["default", "trustctime-false", "checkstat-minimal"])
def test_the_repositorys_stat_settings_cannot_make_a_rewritten_file_look_committed(make_pipeline, tmp_path, sent,
                                                                                    config):
    """A check rewrites the committed app.py keeping its size and modification time; the user's
    repository tells git to trust stat data without the change time: the engine's git compares it anyway."""
    checks = [{"name": "attack", "command": "python -c 'import app'"},
              {"name": "show", "command": "python -c 'import app; print(\"VALUE\", app.value()); "
                                          "assert app.value() == 1'"}]
    run, _ = final_run(make_pipeline, tmp_path, sent, SAME_SIZE_AND_TIME, checks, config)
    final = {c.name: c for c in Check.objects.filter(run=run, kind="final")}
    assert final["show"].passed, log_of(final["show"])
    assert run.status == "succeeded", run.stop_message


def test_fifos_and_sockets_a_check_leaves_do_not_reach_the_next(make_pipeline, tmp_path, sent):
    """git neither cleans nor sees a FIFO or a socket: the reset removes them (a FIFO named
    conftest.py would hang pytest in the next check)."""
    attack = ("import socket\nos.mkfifo('leftover')\nos.mkfifo('conftest.py')\n"
              "s = socket.socket(socket.AF_UNIX)\ns.bind('sock')\n")
    checks = [{"name": "attack", "command": "python -c 'import app'"},
              {"name": "clean", "command": "ls -la; test ! -e leftover && test ! -e conftest.py && test ! -e sock"}]
    run, _ = final_run(make_pipeline, tmp_path, sent, attack, checks)
    final = {c.name: c for c in Check.objects.filter(run=run, kind="final")}
    assert final["clean"].passed, log_of(final["clean"])
    assert final["clean"].cwd == run.worktree


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to run the reset as another user (setpriv)")
def test_a_worker_not_root_resets_a_read_only_folder_instead_of_crashing(tmp_path_factory):
    """As a user that a read-only folder stops (root is not stopped by it), ``reset_to_commit``
    empties it and answers True, and ``remove_tree`` removes such a folder whole."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cp-ro-"))
    try:
        os.chmod(base, 0o755)
        repo = make_repo(base / "origin", {"app.py": "x = 1\n"})
        worktree = base / "wt"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "-b", "w", str(worktree)], check=True)
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        for stuck in (worktree / "stuck", base / "gone" / "stuck"):
            stuck.mkdir(parents=True)
            (stuck / "helper.py").write_text("x = 2\n")
            stuck.chmod(0o555)
        (worktree / "app.py").write_text("x = 7\n")
        subprocess.run(["chown", "-R", "65534:65534", str(base)], check=True)
        script = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); from engine import workspace; "
                  "ok = workspace.reset_to_commit(sys.argv[2], sys.argv[3]); workspace.remove_tree(sys.argv[4]); "
                  "exact = workspace.worktree_tree(sys.argv[2]) == workspace.git(['rev-parse', sys.argv[3] + "
                  "'^{tree}'], sys.argv[2]).stdout.decode().strip(); "
                  "print(json.dumps([ok, exact, os.path.exists(os.path.join(sys.argv[2], 'stuck')), "
                  "os.path.exists(sys.argv[4])]))")
        env = {"PATH": os.environ["PATH"], "HOME": str(base), "LANG": "C.UTF-8"}
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                              script, str(Path(settings.BASE_DIR)), str(worktree), commit, str(base / "gone")],
                             capture_output=True, text=True, env=env, timeout=120,
                             cwd=str(base))
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip() == "[true, true, false, false]", out.stdout + out.stderr[-2000:]
        assert (worktree / "app.py").read_text() == "x = 1\n"
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)
