"""Django app configuration of the Run Engine."""
import logging

from django.apps import AppConfig

logger = logging.getLogger(__name__)


class EngineConfig(AppConfig):
    name = "engine"
    verbose_name = "Run Engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.conf import settings

        from .git import core

        core.before_git = GitOutsideTransactions(strict=settings.CP_REFUSE_GIT_IN_TRANSACTION)


class GitOutsideTransactions:
    """git never runs inside a database transaction or row lock (a ``select_for_update`` holds one): a
    repository of thousands of files would hold the lock (SQLite's: the whole database) for as long as git
    takes. ``strict`` (the test settings): a git command there is refused (WorkspaceError
    ``git_in_transaction``), so every test finds one; otherwise it is logged. The test framework's own
    transactions (a test wrapped in one) do not count."""

    def __init__(self, strict: bool):
        self.strict = strict

    def __call__(self, args: list[str]) -> None:
        from django.db import connections

        for connection in connections.all(initialized_only=True):
            if any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks):
                from .workspace import WorkspaceError

                message = (f"git {' '.join(args[:2])} ran inside a database transaction (a row lock): git runs "
                           f"before or after it, never while it holds the lock.")
                if self.strict:
                    raise WorkspaceError("git_in_transaction", message)
                logger.warning(message)
