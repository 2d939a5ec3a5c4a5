"""Issue 20: real projects whose tests need their dependencies installed, with every agent CLI.

pipelines/qs.yaml (qs 6.16.0 from the npm registry: `npm ci` of its lock file, then its own tape
suite) and pipelines/freezegun.yaml (freezegun 1.5.5 from PyPI: a venv at $CP_ENV and pip install of
its pinned test requirements, then its own pytest suite) run their two stages with each of the
four real CLIs against the scripted model endpoint: the setup step installs from the loopback
package registry (tests/package_registry.py, the operator's mirror here) and nothing else, the first
run makes the environment and the next three take it, every agent's shell runs the library's own
test command with the environment's tools (the conversation shows its exit status 0), the gates run
the library's own suite, then review, documentation and checkpoints. What it showed:
docs/real-repositories.md.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from engine import operations
from engine.agents.cli_adapter import find_executable
from engine.model_gateway.conversation import conversation_path
from engine.models import Attempt, Check
from engine.pipeline.format import validate

from .conftest import git
from .package_registry import PackageRegistry
from .support.browser import fits_every_width, log_in, run_pages, standalone_tab, user
from .support.runs import drive

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "tools" / "registry"
#: adapter -> its executable (the order the runs take: the first makes the environment)
CLIS = {"claude-code": "claude", "codex": "codex", "gemini-cli": "gemini", "pi": "pi"}

#: CI runs it in its SQLite job only (.ci/suites): what it checks is the setup and the CLIs' shells, the
#: same on either database
pytestmark = [pytest.mark.slow, pytest.mark.pipeline, pytest.mark.django_db(transaction=True),
              pytest.mark.backend("sqlite")]


def shell(adapter: str, command: str) -> dict:
    """A call of the CLI's own shell tool."""
    return {"claude-code": {"tool": "Bash", "input": {"command": command, "description": "run it"}},
            "codex": {"tool": "exec_command", "input": {"cmd": command}},
            "gemini-cli": {"tool": "run_shell_command", "input": {"command": command}},
            "pi": {"tool": "bash", "input": {"command": command}}}[adapter]


def write(adapter: str, path: str, content: str) -> dict:
    """A call of the CLI's own tool that writes a file (codex: its shell)."""
    if adapter == "codex":
        return shell(adapter, f"mkdir -p $(dirname {path}) && cat > {path} <<'CPEOF'\n{content}CPEOF")
    return {"claude-code": {"tool": "Write", "input": {"file_path": "{cwd}/" + path, "content": content}},
            "gemini-cli": {"tool": "write_file", "input": {"file_path": "{cwd}/" + path, "content": content}},
            "pi": {"tool": "write", "input": {"path": path, "content": content}}}[adapter]


REVIEW = {"turns": [{"text": 'Reviewed.\n```json\n{"verdict": "pass", "summary": "meets the requirement; the '
                             'library\'s own tests pass", "findings": []}\n```'}]}
NOTHING = {"turns": [{"text": "The documentation is current; nothing to change."}]}


def scenario(adapter: str, project: dict) -> dict:
    """The scripted model's turns for every stage of ``project`` with ``adapter``'s tools."""
    stages = {}
    for index, stage in enumerate(project["stages"]):
        turns = [{"text": "Writing it.", "tools": [write(adapter, path, text) for path, text in stage["files"].items()]},
                 {"text": "Running the library's tests.", "tools": [shell(adapter, project["test_command"])]},
                 {"text": stage["done"]}]
        document = NOTHING
        if index == 0:
            document = {"turns": [{"text": "Writing the note and the index.",
                                   "tools": [write(adapter, path, text) for path, text in project["docs"].items()]},
                                  {"text": "Documented it and listed it in docs/INDEX.md."}]}
        stages[stage["key"]] = {"implement": {"turns": turns}, "review": REVIEW, "document": document}
    return {"stages": stages}


QS = {
    "sample": "qs-6.16.0", "pipeline": "qs.yaml", "test_command": "tape 'test/**/*.js' | tail -n 4",
    "stages": [
        {"key": "key-count", "done": "Added lib/keys.js (keyCount); qs's own tests pass.",
         "files": {"lib/keys.js": "'use strict';\n\nvar parse = require('./parse');\n\n"
                                  "module.exports = function keyCount(query) {\n"
                                  "    return Object.keys(parse(query)).length;\n};\n"}},
        {"key": "has-key", "done": "Added lib/has.js (hasKey) and test/has.js; the tests pass.",
         "files": {"lib/has.js": "'use strict';\n\nvar parse = require('./parse');\n\n"
                                 "module.exports = function hasKey(query, key) {\n"
                                 "    return Object.prototype.hasOwnProperty.call(parse(query), key);\n};\n",
                   "test/has.js": "'use strict';\n\nvar test = require('tape');\nvar hasKey = require('../lib/has');\n\n"
                                  "test('hasKey', function (t) {\n    t.equal(hasKey('a[b]=1', 'a'), true);\n"
                                  "    t.equal(hasKey('a=1', 'toString'), false);\n    t.end();\n});\n"}},
    ],
    "docs": {"docs/keys.md": "# keyCount\n\n`require('qs/lib/keys')(query)` is how many top-level keys qs's "
                             "parse() finds in the query string.\n",
             "docs/INDEX.md": "# Specification index\n\n- [keys.md](keys.md): keyCount, as implemented and "
                              "verified.\n- [../README.md](../README.md): what qs is.\n"},
}

FREEZEGUN = {
    "sample": "freezegun-1.5.5", "pipeline": "freezegun.yaml",
    "test_command": "python -m pytest -q -p no:cacheprovider tests | tail -n 2",
    "stages": [
        {"key": "version-tuple", "done": "Added freezegun/version_info.py; freezegun's own tests pass.",
         "files": {"freezegun/version_info.py": '"""freezegun\'s version as numbers."""\nfrom . import __version__\n\n\n'
                                                "def version_tuple() -> tuple:\n"
                                                "    return tuple(int(part) for part in __version__.split('.'))\n"}},
        {"key": "at-least", "done": "Added is_at_least() and its test; the tests pass.",
         "files": {"freezegun/version_check.py": '"""Comparing freezegun\'s version."""\n'
                                                 "from .version_info import version_tuple\n\n\n"
                                                 "def is_at_least(major: int, minor: int) -> bool:\n"
                                                 "    return version_tuple()[:2] >= (major, minor)\n",
                   "tests/test_version_info.py": "from freezegun.version_check import is_at_least\n\n\n"
                                                 "def test_is_at_least():\n    assert is_at_least(1, 5)\n"
                                                 "    assert not is_at_least(2, 0)\n"}},
    ],
    "docs": {"docs/version_info.md": "# version_info\n\n`freezegun.version_info.version_tuple()` is "
                                     "`__version__` as a tuple of ints.\n",
             "docs/INDEX.md": "# Specification index\n\n- [version_info.md](version_info.md): version_tuple, as "
                              "implemented and verified.\n- [../README.rst](../README.rst): what freezegun is.\n"},
}


def checkout(project: dict, tmp_path: Path) -> Path:
    sample = ROOT / "tools" / "repos" / project["sample"]
    if not sample.is_dir() or not (REGISTRY / "npm").is_dir():
        pytest.skip("run `make samples` to fetch the sample projects and the registry mirror")
    repo = tmp_path / project["sample"]
    shutil.copytree(sample, repo, ignore=shutil.ignore_patterns(
        "__pycache__", ".sdist-sha256", ".npm-integrity", "node_modules", "*.egg-info"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"{project['sample']} as published")
    return repo


def pipeline_with_offline_profiles(project: dict):
    """The project's pipeline file with one `<cli>-offline` profile per CLI: the real binary, the
    model's choices from ``scenario``."""
    path = ROOT / "pipelines" / project["pipeline"]
    doc = yaml.safe_load(path.read_text())
    for adapter, executable in CLIS.items():
        doc["profiles"][f"{executable}-offline"] = {"adapter": adapter, "max_turns": 8,
                                                    "scripted_endpoint": scenario(adapter, project)}
    pipeline, _ = operations.save_pipeline(validate(doc, str(path)), str(path))
    return pipeline


def logs_of(run) -> str:
    """The end of each attempt's log and of each failed check's, for a failure's message."""
    from engine.processes.process import tail_text

    said = [f"--- attempt {a.number} ({a.operation}):\n{tail_text(Path(settings.VAR_DIR) / a.log_path, 1500)}"
            for a in Attempt.objects.filter(run=run).order_by("number") if a.log_path]
    said += [f"--- check {c.name} ({c.kind}):\n{tail_text(Path(settings.VAR_DIR) / c.log_path, 2500)}"
             for c in Check.objects.filter(run=run, passed=False) if c.log_path]
    return "\n".join(said)


def shell_results(attempt: Attempt) -> list[dict]:
    """The shell results of the attempt's conversation as the run page shows it: what the engine's model
    gateway saw the CLI tell its model (gemini's own stream leaves the exit status out)."""
    path = conversation_path(str(Path(settings.VAR_DIR) / attempt.raw_path))
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in entries if e.get("kind") == "tool_result" and "exit" in e]


@pytest.mark.longest
@pytest.mark.parametrize("project", [QS, FREEZEGUN], ids=["qs", "freezegun"])
def test_a_real_project_runs_with_its_dependencies_installed_once_with_each_cli(project, tmp_path, sent, settings,
                                                                            live_server, django_user_model):
    missing = [exe for exe in CLIS.values() if find_executable(exe) is None]
    if missing:
        pytest.skip(f"run `make agents` to install the pinned CLIs ({', '.join(missing)})")
    repo = checkout(project, tmp_path)
    with PackageRegistry(REGISTRY) as registry:
        settings.CP_SETUP_REGISTRIES = []  # the operator lists the mirror alone: no public registry
        settings.CP_SETUP_NPM_REGISTRY = registry.npm_url
        settings.CP_SETUP_PIP_INDEX_URL = registry.pypi_url
        pipeline = pipeline_with_offline_profiles(project)
        runs, fetched = [], []
        for executable in CLIS.values():
            profile = f"{executable}-offline"
            run = operations.create_run(pipeline, str(repo), "main", {role: profile for role in operations.ROLES})
            assert run.simulated
            before = len(registry.requests)
            operations.request_start(run, requested_by="t", source="test")
            run = drive(run.pk, sent, limit=60)
            fetched.append(len(registry.requests) - before)
            assert run.status == "succeeded", (executable, run.stop_reason, run.stop_message, logs_of(run))
            runs.append(run)

    setups = [Check.objects.get(run=run, kind="setup") for run in runs]
    first, *later = setups
    # installed once, from the listed registry only; the three later runs took it and fetched nothing
    assert first.passed and first.exit_code == 0 and not first.setup["reused"]
    assert fetched[0] > 0 and fetched[1:] == [0, 0, 0], fetched
    assert {f"{c['host']}:{c['port']}" for c in first.network["connected"]} == {registry.host_port}
    assert not first.network["refused"], first.network
    assert all(c.setup["reused"] and c.setup["key"] == first.setup["key"] for c in later)
    assert all(c.elapsed_seconds < first.elapsed_seconds / 5 for c in later), \
        [(c.elapsed_seconds, first.elapsed_seconds) for c in setups]
    for run in runs:
        attempts = list(Attempt.objects.filter(run=run).order_by("stage__order", "number"))
        assert {a.operation for a in attempts} == {"implement", "review", "document"}
        assert all(a.status == "succeeded" and a.structured for a in attempts)
        # the agent's shell ran the library's own tests with the environment's tools: exit status 0, shown
        implements = [a for a in attempts if a.operation == "implement"]
        for attempt in implements:
            results = shell_results(attempt)
            assert results and all(r["exit"] == 0 and r["ok"] for r in results), (attempt.adapter, results)
        # agents reached their model and nothing else; gates had no network at all
        assert all(not (a.network or {}).get("refused") or all(f"{r['host']}:{r['port']}" != registry.host_port
                                                                 for r in a.network["refused"]) for a in attempts)
        assert not any(registry.host_port in json.dumps(a.network or {}) for a in attempts)
        suites = Check.objects.filter(run=run, name="library-tests")
        assert suites.count() >= 3 and all(c.exit_code == 0 and c.passed for c in suites)
        assert all(c.network is None for c in suites)
    branch = runs[-1].branch
    for stage in project["stages"]:
        for path in stage["files"]:
            assert git(repo, "show", f"{branch}:{path}").strip()
    assert "node_modules" not in git(repo, "ls-tree", "-r", "--name-only", branch)
    assert git(repo, "status", "--porcelain") == ""
    # issue 22: each CLI's run read in Chromium at 1280 and 390 px: its conversations open at their start, no
    # element scrolling sideways on any of its pages (the pages around a run: tests/browser/test_pages.py)
    user(django_user_model, "admin", superuser=True)
    pages = [(run.attempts.first().adapter, run_pages(run, around=False)) for run in runs]
    with standalone_tab(live_server.url) as tab:
        log_in(tab, "admin")
        for adapter, paths in pages:
            fits_every_width(tab, paths, f"22-{project['sample']}-{adapter}", shots=False)
