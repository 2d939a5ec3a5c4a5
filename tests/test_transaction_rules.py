"""Issue 21's rules of the design, each held by the code: git never runs inside a database transaction or row lock
(engine/apps.py GitOutsideTransactions: the test settings refuse it, so every test that drives a step finds one),
the verbs commit what they do before they return (``durable=True``), and Celery bounds every task above anything a
step may take."""
import ast
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction

from engine import operations, tasks, workspace
from engine.models import Run
from engine.pipeline.schema import MAX_DEADLINE_SECONDS

ROOT = Path(__file__).resolve().parent.parent

#: verbs that join their caller's transaction on purpose (another verb calls them inside its own)
JOINING = {"save_pipeline": "load_pipelines saves every file in one transaction",
           "request_start": "create_run(start=True) and continue_run request the start in their transaction"}


@pytest.mark.django_db(transaction=True)
def test_git_inside_a_transaction_or_row_lock_is_refused(repo):
    assert settings.CP_REFUSE_GIT_IN_TRANSACTION
    assert workspace.git(["rev-parse", "HEAD"], str(repo)).returncode == 0  # outside: runs
    with transaction.atomic():
        with pytest.raises(workspace.WorkspaceError) as info:
            workspace.git(["rev-parse", "HEAD"], str(repo))
    assert info.value.code == "git_in_transaction" and "git rev-parse HEAD ran inside" in info.value.message
    with transaction.atomic():
        list(Run.objects.select_for_update().all())
        with pytest.raises(workspace.WorkspaceError):
            workspace.git(["status"], str(repo))


@pytest.mark.django_db
def test_the_test_framework_s_own_transaction_does_not_count(repo):
    """A test wrapped in a transaction (pytest-django's ``db``) runs git as the code under test would."""
    assert workspace.git(["rev-parse", "HEAD"], str(repo)).returncode == 0


@pytest.mark.django_db(transaction=True)
def test_create_run_reads_four_hundred_protected_files_before_its_transaction(make_pipeline, tmp_path):
    """The protected snapshot (one git read per file) was taken inside create_run's transaction: SQLite's
    write lock held for as long as git took."""
    from .conftest import make_repo

    # 400 agreed test modules, each a real check of the repository's code (app/core.py answer() is 0 here)
    files = {f"tests/test_{n:03d}.py": f"from app.core import answer\n\n\ndef test_{n}():\n    assert answer() + {n} == {n}\n"
             for n in range(400)}
    repo = make_repo(tmp_path / "many", {**files, "app/__init__.py": "", "app/core.py": "def answer():\n    return 0\n"})
    run = operations.create_run(make_pipeline(protected_paths=["tests/**"]), str(repo), "main")
    assert len(run.protected_files) == 400
    control = Path(settings.VAR_DIR) / run.control_dir
    assert (control / "protected" / "files" / "tests" / "test_399.py").is_file()
    assert not list((Path(settings.VAR_DIR) / "runs").glob(".creating-*"))  # the staging folder became the records


def _outermost_atomics(node: ast.AST, inside: bool = False) -> list[ast.Call]:
    """The ``transaction.atomic(...)`` calls of ``node``'s with-statements that no other such block encloses."""
    found = []
    for child in ast.iter_child_nodes(node):
        atomic = [item.context_expr for item in getattr(child, "items", []) if isinstance(child, ast.With)
                  and isinstance(item.context_expr, ast.Call)
                  and ast.unparse(item.context_expr.func) == "transaction.atomic"]
        if atomic and not inside:
            found += atomic
        found += _outermost_atomics(child, inside or bool(atomic))
    return found


def test_every_verb_commits_before_it_returns():
    """Each public verb's outermost transaction is ``durable=True`` (it refuses to run inside a caller's, where its
    wake-up message would wait for a commit it cannot see), but for the verbs that join their caller's on purpose."""
    checked = set()
    for module in ("engine/operations.py", "engine/runs_again.py"):
        tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
        for function in tree.body:
            if not isinstance(function, ast.FunctionDef) or (function.name.startswith("_")
                                                              and function.name != "_freeze_run"):  # create_run's
                continue
            for call in _outermost_atomics(function):
                durable = any(k.arg == "durable" and ast.unparse(k.value) == "True" for k in call.keywords)
                if function.name in JOINING:
                    assert not durable, f"{function.name} joins its caller's transaction: {JOINING[function.name]}"
                else:
                    assert durable, f"{module} {function.name} line {call.lineno}: transaction.atomic(durable=True)"
                    checked.add(function.name)
    assert {"_freeze_run", "load_pipelines", "approve", "request_changes", "recover", "fail_run", "recheck", "forget_host",
            "continue_run"} <= checked, checked


@pytest.mark.django_db(transaction=True)
def test_a_verb_refuses_to_run_inside_a_caller_s_transaction(make_pipeline, repo):
    run = operations.create_run(make_pipeline(), str(repo), "main")
    with pytest.raises(RuntimeError, match="durable"):
        with transaction.atomic():
            operations.fail_run(run, "inside another transaction")
    run.refresh_from_db()
    assert run.status == "pending"
    assert operations.fail_run(run, "on its own").status == "failed"


def test_every_task_has_time_limits_above_what_a_step_may_take():
    longest = settings.CP_STEP_CHAIN_SECONDS + MAX_DEADLINE_SECONDS
    assert longest < tasks.advance_run.soft_time_limit < tasks.advance_run.time_limit
    for task in (tasks.advance_run, tasks.reconcile, tasks.notify):
        assert task.soft_time_limit and task.time_limit and task.soft_time_limit < task.time_limit, task.name


@pytest.mark.django_db
def test_the_migrations_hold_every_model_change():
    """A new stop reason or event kind (engine/vocabulary.py) needs its migration: the constraints follow them."""
    from django.core.management import call_command

    call_command("makemigrations", "engine", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("column,value", [("status", "bogus"), ("stop_reason", "not_a_reason")])
def test_the_database_refuses_a_run_state_or_reason_outside_the_vocabulary(make_pipeline, repo, column, value):
    from django.db import IntegrityError

    run = operations.create_run(make_pipeline(), str(repo), "main")
    with pytest.raises(IntegrityError):
        Run.objects.filter(pk=run.pk).update(**{column: value})
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("pending", "")


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_an_event_kind_outside_the_vocabulary(make_pipeline, repo):
    from django.db import IntegrityError

    from engine.models import RunEvent

    run = operations.create_run(make_pipeline(), str(repo), "main")
    with pytest.raises(IntegrityError):
        RunEvent.objects.create(run=run, kind="made_up", message="a kind nobody can read")
    assert list(run.events.values_list("kind", flat=True)) == ["created"]
