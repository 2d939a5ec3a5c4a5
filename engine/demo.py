"""The demo repository: a small real Python project with real pytest tests (engine/demo_template).

``make_demo_repo(dest)`` copies the template, makes it a git repository with one commit, and
leaves one untracked file so a run shows what it does not include.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "demo_template"
_GIT_ENV = {"GIT_AUTHOR_NAME": "Demo Author", "GIT_AUTHOR_EMAIL": "demo@example.invalid",
            "GIT_COMMITTER_NAME": "Demo Author", "GIT_COMMITTER_EMAIL": "demo@example.invalid"}


def git(repo: str, *args: str) -> str:
    """Run git in ``repo`` (argument array) and return its stdout; raises CalledProcessError."""
    env = {**os.environ, **_GIT_ENV, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def make_demo_repo(dest: str) -> dict:
    """Create the demo repository at ``dest`` (must not exist). Returns {"path", "commit", "untracked"}."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "textstats: plan, tests and an empty module")
    git(dest, "tag", "-a", "v0", "-m", "before the agents")
    Path(dest, "SCRATCH.txt").write_text("an untracked note the run must not take\n", encoding="utf-8")
    return {"path": dest, "commit": git(dest, "rev-parse", "HEAD").strip(), "untracked": ["SCRATCH.txt"]}
