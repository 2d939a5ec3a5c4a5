"""Settings for the test suite: the real settings, with a var directory of their own.

Tests never share the var directory (database file, broker folders, worktrees, control
records) of a person's real runs, nor of another test session running at the same time:
unless CP_VAR_DIR is set (worker processes started by the tests get their session's), it is
``var/test/session-<pid>``, removed when the session ends. The Celery queue is the session's
own as well (CP_QUEUE ``test-runs-<pid>``).
"""
import os
from pathlib import Path

if "CP_VAR_DIR" not in os.environ:
    os.environ["CP_VAR_DIR"] = str(Path(__file__).resolve().parent.parent / "var" / "test" / f"session-{os.getpid()}")
    os.environ["CP_TEST_SESSION_VAR"] = os.environ["CP_VAR_DIR"]  # the folder this session made (and removes)
# the session's own queue too: a worker of another session (or a person's) on the same Redis
# database never takes this session's messages
os.environ.setdefault("CP_QUEUE", f"test-runs-{os.getpid()}")
# pytest-xdist's workers inherit the environment of the controlling process, which chose the two above
# before starting them: each worker is a session of its own, with its own folder and queue. Only the
# controller's own choice is suffixed: a process a worker starts inherits the suffixed names and keeps
# them, and one a test gives a var directory of its own (tests/test_two_hosts.py's hosts) keeps that one.
_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _xdist_worker and os.environ["CP_VAR_DIR"] == os.environ.get("CP_TEST_SESSION_VAR") and \
        not os.environ["CP_VAR_DIR"].endswith(f"-{_xdist_worker}"):
    os.environ["CP_VAR_DIR"] += f"-{_xdist_worker}"
    os.environ["CP_TEST_SESSION_VAR"] = os.environ["CP_VAR_DIR"]
    os.environ["CP_QUEUE"] += f"-{_xdist_worker}"

from .settings import *  # noqa: E402,F401,F403

# git inside a database transaction or row lock fails the test that does it (engine/apps.py)
CP_REFUSE_GIT_IN_TRANSACTION = True
