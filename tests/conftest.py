"""Shared fixtures: git repositories, saved pipelines, and real Celery worker processes.

Worker processes are the real ``celery -A controlpanel worker``, connected to the same test
database (SQLite file or PostgreSQL) and the same broker (the filesystem broker under the test
var directory, or Redis when CELERY_BROKER_URL says so). Tests that use them are marked
``slow`` and use ``django_db(transaction=True)`` so the workers see committed rows.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings

from bench.integrity_corpus.base import ADDOPTS
from engine import operations
from engine.pipeline.format import validate
from engine.processes.worker_process import start_worker, stop_worker

#: fixtures more than one module uses (route, staff, author, bare, claude_pipeline)
pytest_plugins = ["tests.support.fixtures"]

GIT_ENV = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.invalid", "GIT_COMMITTER_NAME": "Test",
           "GIT_COMMITTER_EMAIL": "test@example.invalid", "GIT_TERMINAL_PROMPT": "0"}
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts"


def git(repo, *args, check=True) -> str:
    """Run git in ``repo`` and return stdout (text)."""
    result = subprocess.run(["git", *args], cwd=str(repo), env={**os.environ, **GIT_ENV}, capture_output=True,
                            text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
    return result.stdout


def index_is(worktree: str, commit: str) -> bool:
    """The worktree's index holds exactly ``commit``'s tree: ``git diff --cached --quiet`` through
    the engine's one hardened invocation (engine/workspace.py ``git``), read-only (no index lock)."""
    from engine import workspace

    return workspace.git(["--no-optional-locks", "diff", "--cached", "--quiet", commit, "--"], str(worktree),
                         check=False).returncode == 0


def run_data_dir(run) -> Path:
    """The run's data folder (``$CP_DATA_DIR``), made now: a file a test puts there before Start
    is seen by the run's agents and gates, which see nothing else of the host outside the worktree."""
    from engine.steps import scratch_dirs

    return Path(scratch_dirs(run.pk)["data"])


def make_repo(path: Path, files: dict[str, str], message: str = "initial") -> Path:
    """A git repository at ``path`` with ``files`` committed on main."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for rel, content in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", message)
    return path


#: pytest options a fixture repository's own pytest configuration carries: no cache, and none of the plugins of
#: the Control Panel's own test suite (why, measured: bench/integrity_corpus/base.py ``ADDOPTS``, the one list,
#: which the cheating corpus's repository carries too). A real project's settings say which plugins its pytest
#: loads; a fixture's say the same.
PYTEST_ADDOPTS = ADDOPTS
PYTEST_INI = f"[pytest]\naddopts = {PYTEST_ADDOPTS}\n"


@pytest.fixture
def repo(tmp_path):
    """A small Python project with a passing and a to-be-implemented test."""
    return make_repo(tmp_path / "origin", {
        "app/__init__.py": "",
        "app/core.py": '"""Core."""\n',
        "tests/test_core.py": "from app import core\n\n\ndef test_answer():\n    assert core.answer() == 42\n",
        "docs/PLAN.md": "# Plan\nOne stage: answer.\n",
        "docs/INDEX.md": "# Index\n- docs/PLAN.md\n",
        "pytest.ini": PYTEST_INI,
    })


ANSWER_STEP = {"write": {"app/core.py": '"""Core."""\n\n\ndef answer():\n    return 42\n'},
               "print": ["thinking", "writing app/core.py"], "usage": {"input_tokens": 10, "output_tokens": 5}}


PASS_REVIEW = {"verdict": {"verdict": "pass", "findings": []}, "final_message": "pass: meets the requirement"}


def with_passing_reviews(scenario: dict, stages: list[dict]) -> dict:
    """``scenario`` where every stage without review steps gets a reviewer answering ``pass``.

    Most tests are about something else than the review: this keeps them explicit about it
    (a scripted reviewer with nothing to say gives no verdict, which stops the run)."""
    scenario = {**scenario, "stages": {key: dict(ops) for key, ops in (scenario.get("stages") or {}).items()}}
    for stage in stages:
        ops = scenario["stages"].setdefault(stage["key"], {})
        if "implement" not in ops and scenario.get("default"):
            ops["implement"] = scenario["default"]
        ops.setdefault("review", [PASS_REVIEW])
    return scenario


def pipeline_definition(name="p", stages=None, scenario=None, reviews=True, **extra) -> dict:
    """A validated pipeline definition with a scripted profile (every role) for tests.

    ``reviews``: give every stage a passing scripted reviewer unless the scenario says otherwise.
    """
    stages = stages or [{"key": "answer", "requirement": "Make app.core.answer() return 42.",
                         "scope": ["app/**"], "gates": [{"name": "unit", "command": "python -m pytest -q"}]}]
    scenario = scenario or {"stages": {"answer": {"implement": [ANSWER_STEP]}}}
    if reviews:
        scenario = with_passing_reviews(scenario, stages)
    doc = {
        "name": name,
        "master_plan": "docs/PLAN.md",
        "stages": stages,
        "roles": {"implementer": "scripted", "reviewer": "scripted", "documenter": "scripted"},
        "profiles": {"scripted": {"adapter": "scripted", "scenario": scenario}},
        "deadlines": {"implement": 60, "gate": 120},
    }
    doc.update(extra)
    return validate(doc, f"<test {name}>")


@pytest.fixture
def make_pipeline(db):
    """Save a pipeline from keyword arguments of ``pipeline_definition``; returns the Pipeline."""
    def factory(**kwargs):
        pipeline, _ = operations.save_pipeline(pipeline_definition(**kwargs))
        return pipeline
    return factory


@pytest.fixture
def sent(monkeypatch):
    """Record the wake-up messages (run id, token) instead of sending them: the test drives steps itself."""
    from engine import runner

    messages = []
    monkeypatch.setattr(runner, "enqueue", lambda run_id, token: messages.append((run_id, token)))
    return messages


# ----------------------------------------------------------------------------- real workers


def database_url() -> str:
    """The URL of the test database the test process is connected to, for worker processes."""
    from django.db import connection

    data = connection.settings_dict
    if data["ENGINE"].endswith("sqlite3"):
        return "sqlite:///" + str(Path(data["NAME"]).resolve())
    auth = quote(data["USER"] or "")
    if data.get("PASSWORD"):
        auth += ":" + quote(data["PASSWORD"])
    host = data.get("HOST") or "127.0.0.1"
    port = data.get("PORT") or 5432
    return f"postgres://{auth}@{host}:{port}/{data['NAME']}"


def purge_broker() -> None:
    """Drop every message waiting in the runs queue (a previous session's leftovers)."""
    from controlpanel.celery import app

    with app.connection_for_write() as conn:
        try:
            conn.default_channel.queue_purge(settings.CELERY_TASK_DEFAULT_QUEUE)
        except Exception as exc:  # a queue that does not exist yet has nothing to purge
            if "NOT_FOUND" not in str(exc).upper() and "no such" not in str(exc).lower():
                raise


class Workers:
    """Real worker processes and their logs."""

    def __init__(self, count: int, log_dir: Path):
        self.count, self.log_dir = count, log_dir
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def env(self) -> dict:
        env = os.environ.copy()
        env.update({"DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "controlpanel.test_settings",
                    "CP_VAR_DIR": str(settings.VAR_DIR), "CP_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
                    "CP_HEARTBEAT_INTERVAL": "1"})
        env["PATH"] = os.path.dirname(os.path.abspath(os.sys.executable)) + os.pathsep + env.get("PATH", "")
        return env

    def start(self, extra_env: dict | None = None) -> None:
        for n in range(self.count):
            log = self.log_dir / f"worker-{len(self.logs) + 1}.log"
            self.logs.append(log)
            self.procs.append(start_worker(str(log), env={**self.env(), **(extra_env or {})}, concurrency=1))

    def stop(self) -> None:
        for proc in self.procs:
            stop_worker(proc)
        self.procs = []

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


@pytest.fixture(scope="session")
def worker_pool(django_db_setup, django_db_blocker, tmp_path_factory):
    """Two real worker processes for the whole session (started on first use)."""
    log_dir = tmp_path_factory.mktemp("workers")
    with django_db_blocker.unblock():
        purge_broker()
    pool = Workers(2, log_dir)
    pool.start()
    yield pool
    pool.stop()


@pytest.fixture
def workers(worker_pool, transactional_db):
    """The session's workers, with the test using committed transactions they can see."""
    mark = {p: p.stat().st_size if p.exists() else 0 for p in worker_pool.logs}
    worker_pool.log_offsets = mark
    yield worker_pool


def new_log_text(pool: Workers) -> str:
    """What the workers logged since the current test started."""
    parts = []
    for path in pool.logs:
        data = path.read_bytes()[getattr(pool, "log_offsets", {}).get(path, 0):]
        parts.append(data.decode("utf-8", errors="replace"))
    return "\n".join(parts)


def wait_for(run_id: int, statuses=("succeeded", "failed", "waiting_review", "waiting_approval"),
             timeout: float = 120.0):
    """Poll the database until run ``run_id`` is in one of ``statuses``; returns the Run."""
    from engine.models import Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status in statuses:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} is still {Run.objects.get(pk=run_id).status} after {timeout} s")


#: Debian's Chromium (``make browser``: scripts/install-chromium.sh), or the one ``CP_CHROMIUM`` names; the browser
#: tests skip without it, naming the command that installs it.
CHROMIUM = os.environ.get("CP_CHROMIUM", "/usr/bin/chromium")
NO_CHROMIUM = f"no Chromium at {CHROMIUM}: run `make browser` (scripts/install-chromium.sh) or set CP_CHROMIUM"


def has_chromium() -> bool:
    return os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)


def _live_servers_never_block_in_accept() -> None:
    """Make the listening socket of pytest-django's live server non-blocking. A connection Chromium opened
    ahead (a preconnect) and reset before the server took it left the server's thread blocked in
    ``accept()`` (select said readable, the connection was gone), and the teardown of ``live_server``
    then waited for that thread for ever (make test hung 307 s at its last test until a request came).
    Non-blocking, that ``accept()`` raises BlockingIOError, which socketserver ignores and polls again;
    the connections it accepts stay blocking, as the handlers expect."""
    from django.core.servers.basehttp import ThreadedWSGIServer
    from django.test.testcases import LiveServerThread

    class NonBlockingAccept(ThreadedWSGIServer):
        def server_activate(self):
            super().server_activate()
            self.socket.setblocking(False)

    LiveServerThread.server_class = NonBlockingAccept


_live_servers_never_block_in_accept()


@pytest.fixture
def narrow_page(live_server):
    """A headless Chromium page 390 px wide on the live server (skips without Chromium: NO_CHROMIUM)."""
    if not has_chromium():
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API keeps an asyncio loop in this thread
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                  args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
            context = chromium.new_context(base_url=live_server.url, viewport={"width": 390, "height": 844})
            context.set_default_timeout(20_000)
            yield context.new_page()
            context.close()
            chromium.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


def navigate_by(tab, press) -> None:
    """Call ``press()`` (a click that leads to another page) and wait until a new document has replaced
    the one the click was made on and is parsed. The old document carries a marker; the wait ends when
    the page's document no longer has it. (Playwright's navigation waiter twice missed a lifecycle event
    in CI, "load" once and "domcontentloaded" once, with the page there: a marker cannot be missed.)"""
    tab.evaluate("window.__cpOldDocument = true")
    press()
    tab.wait_for_function("() => window.__cpOldDocument === undefined && document.readyState !== 'loading'",
                          timeout=30_000)


def wait_until(predicate, timeout: float = 60.0, what: str = "the condition", logs=()):
    """Poll ``predicate`` every 0.1 s until it returns something true (returned) or ``timeout`` seconds
    pass (AssertionError naming ``what``, with the tails of ``logs``: objects with ``text()``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {getattr(log, 'log', log)}\n{log.text()[-3000:]}" for log in logs)
            raise AssertionError(f"{what} did not happen within {timeout} s\n{tails}".rstrip())
        time.sleep(0.1)


@pytest.fixture(autouse=True, scope="session")
def _session_var_dir():
    """The session's own var directory (controlpanel.test_settings); ``pytest_unconfigure`` removes it."""
    ARTIFACTS.mkdir(exist_ok=True)


def pytest_unconfigure(config):
    """The var directory this process's settings made (controlpanel.test_settings: each pytest-xdist
    worker and the controlling process has its own) is removed once its test databases are gone."""
    made = os.environ.get("CP_TEST_SESSION_VAR")
    if made and Path(made).resolve() == Path(settings.VAR_DIR) and not os.environ.get("CP_KEEP_TEST_VAR"):
        shutil.rmtree(settings.VAR_DIR, ignore_errors=True)


@pytest.fixture
def run_row(make_pipeline):
    """Factory of a Run row with its stages, made in the database only (no repository, no git,
    no process): for tests of what the engine reads from records. ``status`` and the stages'
    ``stage_statuses`` are written as fixture data (engine/machine.py makes them in a real run)."""
    from engine import answers
    from engine.models import Run, StageRun

    def factory(status="pending", stage_statuses=("pending",), **fields):
        kwargs = fields.pop("pipeline_kwargs", {})
        if len(stage_statuses) > 1 and "stages" not in kwargs:
            kwargs["stages"] = [{"key": f"s{n}", "requirement": "r", "scope": ["app/**"],
                                 "gates": [{"name": "unit", "command": "true"}]} for n in range(len(stage_statuses))]
            kwargs["scenario"] = {"stages": {}}
        pipeline = make_pipeline(**kwargs)
        definition = {"pipeline": pipeline.definition, "roles": pipeline.definition["roles"],
                      "profiles": pipeline.definition["profiles"]}
        roles = definition["roles"]
        used = {name for names in roles.values() for name in ([names] if isinstance(names, str) else names)}
        reason = answers.run_simulation(definition["profiles"], used)  # as engine/operations.py create_run
        fields.setdefault("repo_path", "/nonexistent")
        run = Run.objects.create(pipeline=pipeline, pipeline_name=pipeline.name,
                                 revision="main", commit="0" * 40, definition=definition,
                                 definition_sha256="0" * 64, status=status, simulated=bool(reason),
                                 simulated_reason=reason, **fields)
        keys = [s["key"] for s in pipeline.definition["stages"]]
        for order, stage_status in enumerate(stage_statuses):
            StageRun.objects.create(run=run, key=keys[order], order=order, status=stage_status)
        return run
    return factory


# ----------------------------------------------------------------------------- tiers

#: Helpers that drive a whole run in-process (agents in the sandbox, real git, real gates).
_DRIVERS = frozenset({"drive", "start_and_drive"})
#: Modules whose every test drives runs: the hostile-agent suite and the verification scenarios.
_PIPELINE_MODULES = ("tests/security/", "tests/test_verification.py", "tests/test_context_regressions.py",
                     "tests/test_acceptance_runs.py")


def _names_a_driver(code, scope: dict, seen: set) -> bool:
    """True when ``code`` calls a run driver, directly or through a helper of the test modules
    (a function of ``scope``, the module's globals, defined under tests/), followed recursively."""
    if code in seen:
        return False
    seen.add(code)
    if _DRIVERS & set(code.co_names):
        return True
    for const in code.co_consts:
        if hasattr(const, "co_names") and _names_a_driver(const, scope, seen):
            return True
    for name in code.co_names:
        helper = scope.get(name)
        helper_code = getattr(helper, "__code__", None)
        if helper_code is not None and "/tests/" in helper_code.co_filename.replace("\\", "/"):
            if _names_a_driver(helper_code, getattr(helper, "__globals__", scope), seen):
                return True
    return False


def _drives(item) -> bool:
    """True when the test, or a fixture it uses, calls a run driver (``_DRIVERS``)."""
    seen: set = set()
    function = getattr(item, "function", None)
    if function is not None and _names_a_driver(function.__code__, function.__globals__, seen):
        return True
    for defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values():
        for fixturedef in defs:
            func = getattr(fixturedef, "func", None)
            if hasattr(func, "__code__") and _names_a_driver(func.__code__, getattr(func, "__globals__", {}), seen):
                return True
    return False


def pytest_collection_modifyitems(config, items):
    """The tiers are explicit: a test that drives a whole run carries ``@pytest.mark.pipeline`` (or
    ``slow``), and every test of a ``_PIPELINE_MODULES`` module or folder is marked ``pipeline`` here;
    ``make test-fast`` leaves them to ``make test`` (the fast tier is what needs no worker and no whole
    run). A test that calls a run driver (``_drives``, read from its code and its fixtures') without
    either mark is a collection error naming it, so none slips into the fast tier unmarked."""
    unmarked = []
    for item in items:
        path = Path(str(item.fspath)).as_posix()
        if any(part in path for part in _PIPELINE_MODULES):
            item.add_marker(pytest.mark.pipeline)
        elif item.get_closest_marker("pipeline") is None and item.get_closest_marker("slow") is None \
                and _drives(item):
            unmarked.append(item.nodeid)
    if unmarked:
        raise pytest.UsageError("these tests drive a whole run but carry no @pytest.mark.pipeline (or slow): "
                                + ", ".join(unmarked[:20]))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # the longest first, so that pytest-xdist's workers (make test: --maxschedchunk 2, each takes the
        # next test when it is free) end together: the integrity corpus, then the other tests with real
        # worker processes, then the ones that drive a run, then the rest (stable within each kind)
        items.sort(key=_expected_length)
    wanted = os.environ.get("CP_TEST_SET", "")
    if wanted in ("database", "no-database"):
        # the tests that touch the database or the broker (CI's second job, .ci/suites: on PostgreSQL and
        # Redis after the whole suite ran on the embedded defaults), or those that reach neither
        # (pytest-django refuses a database access a test did not ask for), which run the same whatever
        # DATABASE_URL says. Unset: every test.
        kept = [item for item in items if _uses_database(item) == (wanted == "database") and _on_this_backend(item)]
        if len(kept) < len(items):
            chosen = {id(item) for item in kept}
            config.hook.pytest_deselected(items=[item for item in items if id(item) not in chosen])
            items[:] = kept
    elif wanted:
        raise pytest.UsageError(f"CP_TEST_SET={wanted!r}: use 'database', 'no-database' or leave it unset")


def _expected_length(item) -> int:
    """0 for the longest kind of test, 3 for the shortest: ``longest``, ``slow``, ``pipeline``, the rest."""
    for rank, mark in enumerate(("longest", "slow", "pipeline")):
        if item.get_closest_marker(mark) is not None:
            return rank
    return 3


#: pytest-django's fixtures that give a test the database (a test without one of them, or the
#: django_db mark, cannot reach it: pytest-django raises "Database access not allowed").
DATABASE_FIXTURES = ("db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                     "live_server", "admin_client", "admin_user", "django_user_model")


def _on_this_backend(item) -> bool:
    """False for a test marked ``backend("sqlite")`` or ``backend("postgres")`` when CI's database job
    runs the other one (DATABASE_URL): an end-to-end test whose subject is not the storage (the real
    CLIs on real projects, the browser) runs in one of CI's jobs, not twice; unsplit, every test runs."""
    mark = item.get_closest_marker("backend")
    if mark is None:
        return True
    if mark.args[0] not in ("sqlite", "postgres"):
        raise pytest.UsageError(f"{item.nodeid}: backend({mark.args[0]!r}): use 'sqlite' or 'postgres'")
    here = "postgres" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    return mark.args[0] == here


def _uses_database(item) -> bool:
    """Whether a collected test asks for the database (the django_db mark or a DATABASE_FIXTURES one)."""
    return item.get_closest_marker("django_db") is not None or any(
        name in getattr(item, "fixturenames", ()) for name in DATABASE_FIXTURES)


#: The skips CI expects (words of their reasons): what one backend of the suite cannot show, and a
#: timing the machine's load can take away. Any other skip is a failure with CP_TEST_STRICT_SKIPS=1.
EXPECTED_SKIPS = ("this suite runs on SQLite and the filesystem broker",  # tests/test_two_hosts.py
                  "the filesystem broker carries no broadcast",  # tests/security/test_network.py
                  "SIGINT delivery not observable")  # tests/test_process.py, under load


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With ``CP_TEST_STRICT_SKIPS=1`` (.ci/suites sets it, after installing everything) a skip
    fails unless its reason is an expected one (EXPECTED_SKIPS): in CI no skip may hide an install
    step that did not happen, a program only a hand-installed package gave, or a missing service."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("CP_TEST_STRICT_SKIPS") != "1" or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(words in reason for words in EXPECTED_SKIPS):
        report.outcome = "failed"
        report.longrepr = (f"skipped, which CP_TEST_STRICT_SKIPS=1 refuses (CI installs everything a test needs; "
                           f"only tests/conftest.py EXPECTED_SKIPS may skip): {reason}")


@pytest.fixture
def listed(settings):
    """``listed(path, ...)``: make stand-in CLIs executables the operator listed for this test
    (``CP_AGENT_EXECUTABLES``, engine/agents/executables.py); returns the first path, as a str."""
    def allow(*paths):
        settings.CP_AGENT_EXECUTABLES = [*settings.CP_AGENT_EXECUTABLES, *(str(p) for p in paths)]
        return str(paths[0])
    return allow


@pytest.fixture
def gateway_listed(settings):
    """``gateway_listed(url, key_env)``: make ``url`` a gateway the operator listed for this test, with the
    variable that holds its key (``CP_GATEWAYS``, engine/agents/gateways.py); returns ``url``."""
    def allow(url, key_env="GATEWAY_TEST_KEY"):
        settings.CP_GATEWAYS = [*settings.CP_GATEWAYS, f"{url}={key_env}"]
        return url
    return allow


@pytest.fixture
def example_gateway(gateway_listed):
    """https://example.org is a gateway the operator listed (key in GATEWAY_TEST_KEY): the profile of
    tests/test_pipeline_schema.py ``full`` names it as its base_url."""
    return gateway_listed("https://example.org")


#: The stand-in CLIs the adapter tests write (or name, missing) in their tmp_path.
STAND_INS = ("claude", "codex", "gemini", "pi", "none", "no-such-claude", "no-such-codex", "no-such-gemini",
             "no-such-pi")


@pytest.fixture
def stand_ins_listed(listed, tmp_path):
    """The test's stand-in CLIs (``tmp_path / name`` for STAND_INS) are executables the operator listed."""
    listed(*(tmp_path / name for name in STAND_INS))
