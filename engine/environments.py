"""A run's setup environment: made once per repository and cache key, shared read-only by every run.

A pipeline's ``setup`` (docs/pipeline-format.md, "Setup") installs what the repository needs before
an agent or a gate can run anything (``pip install``, ``npm ci``). engine/steps/setup.py runs it;
this module decides where its result lives and how later sandboxes see it:

* **The folder**: ``CP_VAR_DIR/environments/<key>/``, holding ``env/`` (shown in every sandbox at
  MOUNT, ``/cp/env``, named by ``$CP_ENV``: a venv made there puts its ``bin`` first on ``PATH``),
  ``keep/<path>/`` for each worktree folder the setup keeps (``node_modules``: shown at that path
  of the worktree, so Node.js finds it beside the code) and ``environment.json`` (who made it, with
  which check, its size). ``used`` is touched each time a run takes it (eviction reads its time).
* **The key** (``key_of``): the repository, the setup's commands and kept folders, the content of its
  ``cache_key`` files at the run's commit (their blob ids), and the Python and Node.js the worker
  runs (a venv and native modules are built for them). An environment is made for a key at a commit
  (its folder ``<key>-<commit>``) and serves the runs of that key at that commit or a descendant
  (``find``): the setup runs repository code, so what one lineage's commits made never reaches
  another's.
* **Shared safely**: a setup builds in ``.building-<key>-<run>`` and renames it into place when its
  commands passed, under a lock per key (a second run with the same key waits, then reuses);
  every agent and gate sees it read-only (``binds``), so no run can change another's dependencies,
  and nothing of a worktree is in it (the setup ran on a checkout of its own).
* **Eviction** (``evict``): an environment no run took for ``CP_ENVIRONMENT_MAX_AGE_DAYS`` is removed,
  never one an unfinished run uses; a build left by a dead worker is removed after a day. A setup step
  evicts on its host at most once an hour (``evict_now_and_then``); ``python manage.py environments
  --evict`` does it at once, and ``python manage.py environments`` lists them.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

#: Where the environment's ``env/`` folder is in every sandbox (``$CP_ENV``).
MOUNT = "/cp/env"
#: Bumped when the folder's layout or the key's parts change: older environments are then unused.
FORMAT = 1
RECORD = "environment.json"


class EnvironmentMissing(Exception):
    """The run's environment folder is gone (removed by hand, or a different host's disk)."""


def root() -> Path:
    """The folder that holds every environment of this host."""
    return Path(settings.VAR_DIR) / "environments"


@dataclass(frozen=True)
class Environment:
    """One environment: its ``key``, its ``folder`` on this host and the worktree folders it ``keep``s."""

    key: str
    folder: str
    keep: tuple[str, ...] = ()

    @property
    def env_dir(self) -> str:
        return os.path.join(self.folder, "env")

    def keep_dir(self, path: str) -> str:
        return os.path.join(self.folder, "keep", path)

    def binds(self, cwd: str, writable: bool = False) -> list[tuple[str, str, bool]]:
        """``sandbox.wrap``'s ``binds``: ``env/`` at MOUNT and each kept folder at its place in ``cwd``."""
        found = [(self.env_dir, MOUNT, writable)]
        found += [(self.keep_dir(path), os.path.join(cwd, path), writable) for path in self.keep]
        return found

    def prepare(self, cwd: str) -> None:
        """Make the places of the kept folders in ``cwd`` (empty folders, which git never records), so
        bubblewrap can mount there even in a worktree a reviewer sees read-only. A file or a link
        there is refused: the mount would go where it points."""
        top = os.path.realpath(cwd)
        for path in self.keep:
            place = top
            for part in path.split("/"):  # each folder on the way, made here, never through a link
                place = os.path.join(place, part)
                if os.path.islink(place) or (os.path.lexists(place) and not os.path.isdir(place)):
                    raise EnvironmentMissing(f"'{os.path.relpath(place, top)}' in the worktree is a file or a link, "
                                             f"not a folder: the setup's kept folder '{path}' cannot be shown there")
                if not os.path.lexists(place):
                    os.mkdir(place)

    def path_entries(self, cwd: str) -> list[str]:
        """The folders put first on ``PATH``: ``$CP_ENV/bin``, then each kept ``node_modules``' ``.bin``."""
        entries = [f"{MOUNT}/bin"]
        entries += [os.path.join(cwd, path, ".bin") for path in self.keep if os.path.basename(path) == "node_modules"]
        return entries

    def apply(self, env: dict, cwd: str) -> tuple[dict, list[tuple[str, str, bool]]]:
        """``(env, binds)`` of a command run in ``cwd`` with this environment, read-only: ``CP_ENV``, and
        ``PATH`` with the environment's folders first (then the sandbox's system, as given). Raises
        EnvironmentMissing when the folder is gone."""
        if not os.path.isdir(self.env_dir):
            raise EnvironmentMissing(f"the run's setup environment {short(self.key)} is gone from {self.folder}")
        self.prepare(cwd)
        path = os.pathsep.join([*self.path_entries(cwd), env.get("PATH") or "/usr/bin:/bin"])
        return {**env, "CP_ENV": MOUNT, "PATH": path}, self.binds(cwd)


def of_run(run) -> Environment | None:
    """The run's environment once its setup step passed (``Run.environment``), else None."""
    record = getattr(run, "environment", None) or {}
    if not record.get("key"):
        return None
    return Environment(record["key"], os.path.join(str(root()), record["key"]), tuple(record.get("keep") or ()))


def is_made(run) -> bool:
    """Whether the run's setup made (or found) its environment and it is still on this host's disk (one
    removed since is made again by the setup step: engine/machine.py ``next_step``)."""
    found = of_run(run)
    return found is not None and os.path.isdir(found.env_dir)


def apply_to(run, env: dict, cwd: str) -> tuple[dict, list[tuple[str, str, bool]]]:
    """``Environment.apply`` for the run's environment; ``(env, [])`` for a run without one."""
    found = of_run(run)
    return found.apply(env, cwd) if found is not None else (env, [])


def _tool_version(name: str) -> str:
    path = shutil.which(name)
    if not path:
        return ""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return os.path.realpath(path)
    return f"{os.path.realpath(path)} {out.stdout.strip()[:80]}"


def key_of(repo: str, commit: str, setup: dict, blobs: dict[str, str | None]) -> str:
    """The environment's key (module docstring): ``blobs`` are the ``cache_key`` files' object ids at
    ``commit`` (None for a missing one)."""
    parts = {
        "format": FORMAT,
        "repository": os.path.realpath(repo),
        "commands": list(setup.get("commands") or []),
        "keep": list(setup.get("keep") or []),
        "cache_key": {path: blobs.get(path) for path in setup.get("cache_key") or []},
        "python": f"{os.path.realpath(sys.executable)} {platform.python_version()}",
        "node": _tool_version("node"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def name_of(key: str, commit: str) -> str:
    """The folder name of the environment of ``key`` made at ``commit`` (``Environment.key``)."""
    return f"{key}-{commit[:12]}"


def short(name: object) -> str:
    """An environment's name as people read it: its key's first 12 characters and the commit it was
    made at (``1e4bc2ccfafb@626222e00a1b``): environments of one key made at different commits differ."""
    text = str(name or "")
    key, _, commit = text.rpartition("-")
    return f"{key[:12]}@{commit}" if key and len(commit) == 12 else text[:12]


def _is_ancestor(repo: str, older: str, newer: str) -> bool:
    from . import workspace  # noqa: PLC0415 - git, only when a made environment is found

    if older == newer:
        return True
    return workspace.git(["merge-base", "--is-ancestor", older, newer], repo, check=False).returncode == 0


def find(key: str, keep: tuple[str, ...] = (), repo: str = "", commit: str = "") -> tuple[Environment, dict] | None:
    """``(environment, its record)`` of ``key`` that a run at ``commit`` may take, else None: one made at
    ``commit`` or at one of its ancestors. The setup runs the repository's code (a package's install
    scripts), so an environment made at a commit one run's agent wrote is never another lineage's: like a
    CI cache scoped to its branch, it serves only the commits that contain that commit."""
    found = []
    for folder in root().glob(f"{key}-*"):
        try:
            record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (folder / "env").is_dir():
            found.append((folder, record))
    found.sort(key=lambda item: item[1].get("commit") != commit)  # its own commit's first
    for folder, record in found:
        if not commit or _is_ancestor(repo, str(record.get("commit") or ""), commit):
            return Environment(folder.name, str(folder), tuple(keep)), record
    return None


def touch(key: str) -> None:
    """Say that a run took the environment now (eviction reads this time)."""
    with contextlib.suppress(OSError):
        (root() / key / "used").write_text(str(time.time()), encoding="utf-8")


@contextlib.contextmanager
def key_lock(key: str):
    """Held while one setup of ``key`` builds or takes it: a second waits, then finds it made."""
    root().mkdir(parents=True, exist_ok=True)
    with open(root() / f".{key}.lock", "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def building(key: str, run_id: int, keep: tuple[str, ...]) -> Environment:
    """A fresh folder a setup builds in (whatever an earlier try left there removed)."""
    folder = root() / f".building-{key}-{run_id}"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "env").mkdir(parents=True)
    for path in keep:
        (folder / "keep" / path).mkdir(parents=True, exist_ok=True)
    return Environment(key, str(folder), tuple(keep))


def folder_bytes(folder: str) -> int:
    """The bytes of the files under ``folder`` (links not followed)."""
    total = 0
    for top, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_size
    return total


def publish(built: Environment, record: dict) -> Environment:
    """Move a passed build into place as the environment of its key, with its record; returns it."""
    target = root() / built.key
    record = {**record, "key": built.key, "size_bytes": folder_bytes(built.folder), "made_at": time.time()}
    Path(built.folder, RECORD).write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
    if target.exists():  # an older copy (a record that could not be read): replaced
        shutil.rmtree(target, ignore_errors=True)
    os.rename(built.folder, target)
    touch(built.key)
    return Environment(built.key, str(target), built.keep)


def discard(built: Environment) -> None:
    shutil.rmtree(built.folder, ignore_errors=True)


def listing() -> list[dict]:
    """Every environment of this host: its record, ``used_at`` and ``folder``."""
    found = []
    if not root().is_dir():
        return found
    for folder in sorted(root().iterdir()):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        try:
            record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = {"key": folder.name}
        used = folder / "used"
        record["used_at"] = used.stat().st_mtime if used.exists() else record.get("made_at")
        record["folder"] = str(folder)
        found.append(record)
    return found


#: Seconds between two evictions a setup step makes on its host (``evict_now_and_then``).
EVICT_EVERY = 3600.0


def evict_now_and_then(keep_key: str = "") -> list[str]:
    """``evict`` at most once per EVICT_EVERY on this host (a setup step calls it: every host that makes
    environments removes its own old ones); the environments of ``keep_key`` (the key the step is about to
    look up, at any commit) are never removed."""
    stamp = root() / ".evicted"
    try:
        if time.time() - stamp.stat().st_mtime < EVICT_EVERY:
            return []
    except OSError:
        pass
    root().mkdir(parents=True, exist_ok=True)
    stamp.write_text(str(time.time()), encoding="utf-8")
    from .models import RUN_TERMINAL, Run  # noqa: PLC0415 - Django models, loaded late

    in_use = {str((record or {}).get("key")) for record in
              Run.objects.exclude(status__in=RUN_TERMINAL).values_list("environment", flat=True)}
    kept = {str(record.get("key")) for record in listing() if str(record.get("key")).startswith(f"{keep_key}-")}
    return evict(in_use=in_use | kept)


def evict(max_age_days: float | None = None, in_use: set[str] | None = None) -> list[str]:
    """Remove the environments no run took for ``max_age_days`` (default CP_ENVIRONMENT_MAX_AGE_DAYS),
    except those in ``in_use`` (default: the keys of unfinished runs), and builds older than a day.
    Returns the removed folders."""
    from .models import RUN_TERMINAL, Run  # noqa: PLC0415 - Django models, loaded late

    age = settings.CP_ENVIRONMENT_MAX_AGE_DAYS if max_age_days is None else max_age_days
    if in_use is None:
        in_use = {str((record or {}).get("key")) for record in
                  Run.objects.exclude(status__in=RUN_TERMINAL).values_list("environment", flat=True)}
    now, removed = time.time(), []
    if not root().is_dir():
        return removed
    for record in listing():
        if record.get("key") in in_use or now - float(record.get("used_at") or 0) < age * 86400:
            continue
        with key_lock(str(record["key"])):
            shutil.rmtree(record["folder"], ignore_errors=True)
        removed.append(record["folder"])
    for folder in root().glob(".building-*"):
        with contextlib.suppress(OSError):
            if now - folder.stat().st_mtime > 86400:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(str(folder))
    return removed
