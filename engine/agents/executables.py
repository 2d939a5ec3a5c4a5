"""Which agent CLI binaries may run: the operator's list, never a pipeline author's choice.

A profile's ``executable`` is written by a pipeline author, who is less trusted than the operator
(README.md, "Who decides what"). A CLI binary runs with the worker's credentials in its
environment, and its path could name a script an agent wrote in an earlier run's worktree. So:

* a profile may name only an executable the operator listed: the pinned installs of ``make
  agents`` (tools/agents, ``PINNED``) and the absolute paths of ``CP_AGENT_EXECUTABLES`` (the
  workers' and the Control Panel's setting, a list separated by ``:``);
* a path under a var directory (this host's ``CP_VAR_DIR``, where worktrees, scratch folders and
  records live, or one of ``CP_OTHER_VAR_DIRS``) is refused whatever the list says, by its own
  path and by the file it resolves to;
* with no ``executable``, the pinned install runs; without one, only a listed path on PATH.

``refusal`` is called when a definition is loaded or saved (engine/pipeline/schema/), when a
run is created (engine/operations.py) and before each launch (``resolve``). Probes of a CLI
(``--version``, ``--help``) run inside the sandbox (engine/agents/cli_adapter.py ``probe_output``).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import registry

BASE_DIR = Path(__file__).resolve().parent.parent.parent
TOOLS_BIN = BASE_DIR / "tools" / "agents" / "node_modules" / ".bin"
#: The executables ``make agents`` installs (scripts/install-agent-clis.sh).
PINNED = tuple(registry.CLIS.values())
SETTING = "CP_AGENT_EXECUTABLES"


def _settings():
    try:
        from django.conf import settings  # noqa: PLC0415 - imported where Django is configured

        return settings if settings.configured else None
    except ImportError:
        return None


def operator_listed() -> list[str]:
    """The operator's ``CP_AGENT_EXECUTABLES`` (absolute paths; anything else in it is ignored)."""
    settings = _settings()
    listed = getattr(settings, SETTING, None) if settings is not None else None
    if listed is None:
        listed = [p for p in os.environ.get(SETTING, "").split(os.pathsep) if p.strip()]
    return [os.path.normpath(p) for p in listed if os.path.isabs(p)]


def allowed() -> list[str]:
    """Every executable a profile may name: the pinned installs, then the operator's list."""
    return [str(TOOLS_BIN / name) for name in PINNED] + operator_listed()


def var_dirs() -> list[str]:
    """The folders whose files no executable may come from: every var directory this host knows."""
    settings = _settings()
    folders = []
    if settings is not None:
        folders = [str(getattr(settings, "VAR_DIR", "") or "")] + list(getattr(settings, "CP_OTHER_VAR_DIRS", []))
    return [os.path.realpath(f) for f in folders if f]


#: The folders of a var directory where agents and the runs' processes write (engine/operations.py
#: puts worktrees there, engine/steps/paths.py the scratch folders: HOME, TMPDIR, data).
AGENT_FOLDERS = ("worktrees", "scratch")


def agent_folders() -> list[str]:
    """Where agents write: each var directory's worktrees and scratch folders (``make demo``'s own
    repository, var/demo, is not among them)."""
    return [os.path.join(var, name) for var in var_dirs() for name in AGENT_FOLDERS]


def _under(path: str, folders: list[str]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip(os.sep) + os.sep) for folder in folders)


def refusal(value: str | None) -> str | None:
    """Why a profile's ``executable`` may not run (a sentence), or None when it may (or is unset)."""
    if not value:
        return None
    if not os.path.isabs(value):
        return (f"'{value}' is not an absolute path: a profile names one of the executables the operator "
                f"listed ({SETTING}) or leaves executable out for the pinned install of `make agents`")
    path = os.path.normpath(value)
    if path != value or "/../" in f"{value}/":
        # the kernel resolves '..' after following links, normpath before: /var/x/link/../../bin/<cli>
        # reads as a listed path and runs a file under the var directory
        return (f"'{value}' is not written plainly: give the executable's absolute path without '..', '.', "
                "repeated or trailing '/'")
    real = os.path.realpath(path)
    if _under(path, var_dirs()) or _under(real, var_dirs()):
        return (f"'{value}' lies in the engine's var directory, where agents and runs write: it never runs, "
                f"whatever {SETTING} lists")
    if path not in allowed() or real not in {os.path.realpath(entry) for entry in allowed()}:
        listed = operator_listed()
        return (f"'{value}' is not an executable the operator listed: only the pinned installs of `make agents` "
                f"and the paths of the workers' {SETTING} run "
                + (f"(now: {', '.join(listed)})" if listed else f"({SETTING} is empty)"))
    return None


def resolve(name: str, configured: str | None = None) -> str | None:
    """The CLI to run for ``name`` (an agent CLI's executable name): the profile's ``executable`` when the
    operator allows it (``refusal``) and it is executable; else the pinned install; else ``name``
    on PATH if that path is one the operator listed. None when none may run."""
    if configured:
        if refusal(configured) is not None:
            return None
        return configured if os.access(configured, os.X_OK) else None
    pinned = TOOLS_BIN / name
    if os.access(pinned, os.X_OK):
        return str(pinned)
    found = shutil.which(name)
    if found and os.path.normpath(found) in operator_listed() and not _under(os.path.realpath(found), var_dirs()):
        return found
    return None
