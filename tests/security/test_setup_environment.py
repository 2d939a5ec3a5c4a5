"""The shared setup environment (engine/environments.py, engine/steps/setup.py) attacked: a hostile
agent tries to poison it for the runs that share it, an agent's commit tries to poison it for another
lineage's runs, and a hostile pipeline author tries to hide the repository's files behind it or to
reach the worker's secrets and services from the setup."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from django.conf import settings

from engine import environments, operations
from engine.models import Check, Run

from ..conftest import git
from ..support.runs import drive
from .attacks import claude_attack_pipeline, needs_claude, tool_results
from ..support.fixtures import WORKER_SECRETS

pytestmark = pytest.mark.django_db(transaction=True)

SETUP = {"commands": ['python -m venv --without-pip "$CP_ENV"',
                      "mkdir -p node_modules/.bin && printf '#!/bin/sh\\necho honest-runner\\n' > "
                      "node_modules/.bin/runner && chmod +x node_modules/.bin/runner"],
         "keep": ["node_modules"]}

#: What a poisoner tries: replace the test runner the gates use, plant a sitecustomize in the shared
#: venv, and, when the mount is read-only, unmount or remount it.
POISON = ["printf '#!/bin/sh\\nexit 0\\n' > node_modules/.bin/runner; echo runner-$?",
          'echo "import os; os._exit(0)" > "$CP_ENV/lib/python3.11/site-packages/sitecustomize.py"; echo site-$?',
          'umount node_modules 2>&1; mount -o remount,rw "$CP_ENV" 2>&1; rmdir node_modules 2>&1; echo tried']

CHECK_ENV = ('test "$(runner)" = honest-runner && ! ls "$CP_ENV"/lib/python3*/site-packages/sitecustomize.py '
             '2>/dev/null && python -c "print(42)" | grep -qx 42')


@needs_claude
@pytest.mark.slow
def test_an_agent_cannot_poison_the_shared_environment_for_a_run_started_at_the_same_time(make_pipeline, repo, sent):
    stage = {"key": "answer", "requirement": "r", "scope": ["app/**"], "repair_allowance": 0,
             "gates": [{"name": "env-intact", "command": CHECK_ENV}]}
    hostile = claude_attack_pipeline(make_pipeline, POISON, stages=[stage], setup=SETUP)
    runs = [operations.create_run(hostile, str(repo), "main") for _ in range(2)]
    for run in runs:
        operations.request_start(run, requested_by="security-test", source="test")
    # both runs' steps at once, each in its own thread (the steps' own locks and the key's lock decide)
    pending = {run.pk: [item for item in sent if item[0] == run.pk] for run in runs}
    sent.clear()

    def take(run_id):
        mine = pending[run_id]
        while mine:
            drive_one = [mine.pop(0)]
            drive(run_id, drive_one, limit=1)
            mine.extend(item for item in list(sent) if item[0] == run_id)
            for item in [item for item in sent if item[0] == run_id]:
                sent.remove(item)
    threads = [threading.Thread(target=take, args=(run.pk,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    done = [Run.objects.get(pk=run.pk) for run in runs]
    for run in done:
        assert run.status == "succeeded", (run.status, run.stop_message)
        said = tool_results(run)
        assert "runner-0" not in said and "site-0" not in said, said  # each write refused
        assert "Read-only file system" in said or "runner-1" in said, said
    checks = [Check.objects.get(run=run, kind="setup") for run in done]
    assert sorted(bool(c.setup["reused"]) for c in checks) == [False, True]  # made once, taken once
    assert done[0].environment["key"] == done[1].environment["key"]
    env = environments.of_run(done[0])
    assert Path(env.keep_dir("node_modules"), ".bin", "runner").read_text() == "#!/bin/sh\necho honest-runner\n"
    assert not list(Path(env.env_dir).glob("lib/python3*/site-packages/sitecustomize.py"))


@pytest.mark.slow
def test_an_environment_made_at_an_agents_commit_never_serves_another_lineage(make_pipeline, repo, sent):
    """The setup runs repository code (a package's install script): what it made from a commit an agent
    wrote must not reach the gates of runs whose commit does not contain that commit."""
    setup = {"commands": ['python -m venv --without-pip "$CP_ENV"', 'cp marker.txt "$CP_ENV/marker"'],
             "cache_key": ["requirements.txt"]}
    (repo / "marker.txt").write_text("honest\n")
    (repo / "requirements.txt").write_text("# nothing\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "marker")
    git(repo, "checkout", "-qb", "agent-work")
    (repo / "marker.txt").write_text("poisoned\n")  # what an agent's commit changed (not a cache_key file)
    git(repo, "commit", "-qam", "an agent's change")
    git(repo, "checkout", "-q", "main")
    stage = {"key": "answer", "requirement": "r", "scope": ["app/**"], "repair_allowance": 0,
             "gates": [{"name": "marker", "command": 'cat "$CP_ENV/marker"'}]}
    pipeline = make_pipeline(stages=[stage], setup=setup)

    def start_at(rev):
        run = operations.create_run(pipeline, str(repo), rev)
        operations.request_start(run, requested_by="security-test", source="test")
        return drive(run.pk, sent)

    poisoned = start_at("agent-work")
    honest = start_at("main")
    assert poisoned.status == honest.status == "succeeded", (poisoned.stop_message, honest.stop_message)
    assert poisoned.environment["key"] != honest.environment["key"]
    assert not Check.objects.get(run=honest, kind="setup").setup["reused"]
    assert Path(environments.of_run(honest).env_dir, "marker").read_text() == "honest\n"
    # a descendant of main takes main's environment (the same lineage)
    git(repo, "commit", "-q", "--allow-empty", "-m", "later")
    later = start_at("main")
    assert Check.objects.get(run=later, kind="setup").setup["reused"]
    assert later.environment["key"] == honest.environment["key"]


@pytest.mark.slow
def test_a_pipeline_cannot_keep_a_folder_the_repository_tracks(make_pipeline, repo, sent):
    """keep: [tests] would show the setup's own tests where the agreed ones are: refused, nothing run."""
    setup = {"commands": ["mkdir -p tests && echo 'def test_fake(): pass' > tests/test_core.py"], "keep": ["tests"]}
    run = start_and_drive_plain(make_pipeline(setup=setup), repo, sent)
    assert run.status == "waiting_review" and run.stop_reason == "setup_failed", run.stop_message
    assert "keep names folders the repository tracks" in run.stop_message and "tests" in run.stop_message
    assert Check.objects.get(run=run, kind="setup").failure_kind == "setup_refused"
    assert not run.attempts.exists()


def start_and_drive_plain(pipeline, repo, sent):
    run = operations.create_run(pipeline, str(repo), "main")
    operations.request_start(run, requested_by="security-test", source="test")
    return drive(run.pk, sent)


@pytest.mark.slow
def test_the_setup_sees_none_of_the_workers_secrets_files_or_services(make_pipeline, repo, sent, monkeypatch):
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    probe = ('env > "$CP_ENV/setup-env"; ls -a "$(dirname "$CP_ENV")" > "$CP_ENV/listing"; '
             f'if test -e {Path(settings.VAR_DIR)}/runs || test -e {Path(settings.VAR_DIR)}/worktrees; '
             'then echo VAR-SEEN > "$CP_ENV/var"; fi; '
             'python - > "$CP_ENV/services" <<EOF\nimport socket\nfor port in (5432, 6379, 8000):\n'
             '    s = socket.socket()\n    s.settimeout(2)\n    print(port, s.connect_ex(("127.0.0.1", port)))\nEOF')
    run = start_and_drive_plain(make_pipeline(setup={"commands": ['python -m venv --without-pip "$CP_ENV"', probe]},
                                              stages=[{"key": "answer", "requirement": "r", "scope": ["app/**"],
                                                       "gates": [{"name": "ok", "command": "true"}]}]),
                                repo, sent)
    assert run.status == "succeeded", run.stop_message
    folder = Path(environments.of_run(run).env_dir)
    seen = (folder / "setup-env").read_text()
    for name, value in WORKER_SECRETS.items():
        assert name not in seen and value not in seen, name
    assert not (folder / "var").exists()
    assert all(line.split()[1] != "0" for line in (folder / "services").read_text().splitlines())  # none answered


def _commit(repo, files: dict, message: str) -> str:
    for name, text in files.items():
        path = Path(repo) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            path.unlink()
        else:
            path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD").strip()


NEUTER = ("mkdir -p {folder} && printf 'import pytest\\n\\n@pytest.hookimpl(tryfirst=True)\\n"
          "def pytest_runtest_call(item):\\n    item.runtest = lambda: None\\n' > {folder}/conftest.py")


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["tests/zz", "lib2"])
def test_a_pipeline_cannot_keep_a_folder_that_changes_how_the_tests_run(make_pipeline, repo, sent, folder):
    """From a fresh try: keep: [tests/zz] (untracked, inside the protected tests/) or keep: [lib2] at the root,
    where the setup writes a conftest.py that makes every test do nothing: the agreed tests would pass whatever
    the code does, and the protected-file checks never see the kept folder. Refused, nothing kept."""
    setup = {"commands": [NEUTER.format(folder=folder)], "keep": [folder]}
    run = start_and_drive_plain(make_pipeline(setup=setup), repo, sent)
    assert run.status == "waiting_review" and run.stop_reason == "setup_failed", (run.status, run.stop_message)
    assert Check.objects.get(run=run, kind="setup").failure_kind == "setup_refused"
    assert not run.attempts.exists() and not environments.is_made(run)


#: From fresh tries of issue 20: what a kept folder could hold that the tests would run in place of the
#: repository's own code: name -> (the kept folder, the setup's command).
SHADOWS = {
    # app/core/ beside the repository's app/core.py: `from app import core` takes the package
    "package": ("app/core", "mkdir -p app/core && printf 'def answer():\\n    return 42\\n' > app/core/__init__.py"),
    # bytecode Python runs in place of app/core.py (an unchecked hash: never compared with the source)
    "bytecode": ("app/__pycache__", "mkdir -p /tmp/fake/app && printf 'def answer():\\n    return 42\\n' > /tmp/fake/app/core.py"
                 " && python -c \"import py_compile; py_compile.compile('/tmp/fake/app/core.py', "
                 "cfile='app/__pycache__/core.cpython-311.pyc', "
                 "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\""),
    # an archive Python imports from when a repository's pythonpath names it
    "archive": ("vendor", "mkdir -p vendor && python -c \"import zipfile; zipfile.ZipFile('vendor/deps.zip', 'w')"
                          ".writestr('app/core.py', 'def answer():\\n    return 42\\n')\""),
    # a link to code the setup put elsewhere (the walk never follows it)
    "link": ("vendor", 'mkdir -p "$CP_ENV/fake/app" vendor && ln -s "$CP_ENV/fake/app" vendor/app'),
    # a conftest.py among the packages: pytest collects node_modules when a repository's norecursedirs says so
    "packages-conftest": ("node_modules", "mkdir -p node_modules/x && printf 'import app.core\\n' > node_modules/x/conftest.py"),
}


@pytest.mark.slow
@pytest.mark.parametrize("shadow", sorted(SHADOWS))
def test_a_pipeline_cannot_keep_python_code_that_an_import_takes_for_the_repositorys(make_pipeline, repo, sent, shadow):
    """keep: [app/core] holding a package app/core/, keep: [app/__pycache__] holding bytecode of app/core.py, and
    the rest of SHADOWS: the agreed test's `from app import core` could run the setup's answer() whatever the agent
    committed. The setup's commands run (exit 0), then what they kept is refused: nothing kept, no agent
    started, and the check says the commands ran."""
    folder, command = SHADOWS[shadow]
    setup = {"commands": [command], "keep": [folder]}
    run = start_and_drive_plain(make_pipeline(setup=setup), repo, sent)
    assert run.status == "waiting_review" and run.stop_reason == "setup_failed", (run.status, run.stop_message)
    check = Check.objects.get(run=run, kind="setup")
    assert (check.failure_kind, check.exit_code) == ("setup_refused", 0)
    assert not run.attempts.exists() and not environments.is_made(run)
    log = (Path(settings.VAR_DIR) / check.log_path).read_text()
    assert "Python code an import could take in place of the repository's own" in log and folder in log
    assert "exited 0, but what they kept was refused" in run.stop_message, run.stop_message


@pytest.mark.slow
def test_a_tracked_keep_folder_is_refused_even_when_an_environment_is_made(make_pipeline, repo, sent):
    """From a fresh try: an environment made at a commit without tests/extra, then a run at a descendant that
    tracks it: the kept folder would hide the tracked one. The refusal is judged at each run's commit."""
    setup = {"commands": ["mkdir -p extra && echo made > extra/file"], "keep": ["extra"]}
    pipeline = make_pipeline(setup=setup)
    first = start_and_drive_plain(pipeline, repo, sent)
    assert environments.is_made(first), first.stop_message
    _commit(repo, {"extra/real.txt": "the repository's own\n"}, "track extra")
    second = start_and_drive_plain(pipeline, repo, sent)
    assert second.stop_reason == "setup_failed" and "tracks" in second.stop_message, second.stop_message
    assert Check.objects.get(run=second, kind="setup").failure_kind == "setup_refused"


@pytest.mark.slow
def test_a_kept_folder_through_a_link_makes_nothing_outside_the_worktree(make_pipeline, repo, sent, tmp_path):
    """From a fresh try: the repository tracks lib -> an outside folder, and keep: [lib/node_modules]; the
    worker made the folder where the link pointed. Now a link on the way is refused before anything is made."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (Path(repo) / "lib").symlink_to(outside)
    git(repo, "add", "lib")
    git(repo, "commit", "-qm", "a link")
    run = start_and_drive_plain(make_pipeline(setup={"commands": ["true"], "keep": ["lib/node_modules"]}), repo, sent)
    assert run.stop_reason == "setup_failed" and "is a file or a link" in run.stop_message, run.stop_message
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_a_cache_key_file_the_commit_lacks_is_refused(make_pipeline, repo, sent):
    """From a fresh try: cache_key: [requirement.txt] (a typo) keyed the environment on nothing, and a changed
    requirements.txt reused a stale one."""
    run = start_and_drive_plain(make_pipeline(setup={"commands": ["true"], "cache_key": ["requirement.txt"]}),
                                repo, sent)
    assert run.stop_reason == "setup_failed" and "requirement.txt" in run.stop_message, run.stop_message
