"""The setup step: before the first stage, the pipeline's ``setup`` commands make the run's environment.

``next_step`` (engine/machine.py) gives it to a run whose pipeline has a ``setup`` and whose
environment is not made yet. ``execute`` computes the environment's key (engine/environments.py
``key_of``) and, holding the key's lock:

* **found**: the environment of that key is made: recorded as a setup check that ran nothing
  (``setup.reused``, naming the run and check that made it; its log is a copy of theirs);
* **not found**: the commands run once, in order, as one ``bash -eo pipefail -c`` script, in the
  agents' sandbox (engine/agents/sandbox.py) on a fresh checkout of the run's commit (nothing of it
  is kept but the environment), the environment's folders mounted writable (``$CP_ENV`` at
  ``/cp/env`` and each ``keep`` folder at its place), a HOME and TMPDIR of its own, bounded by the
  run's limits and the setup's deadline, and with the operator's package registries
  (``CP_SETUP_REGISTRIES``) as its only network, through an egress proxy that records what it
  reached and refused. Its log, duration and exit status are a Check (kind ``setup``). Only an exit
  status of 0 makes the environment (moved into place then); anything else removes the build and
  the run stops ``setup_failed`` with the log's end.

``finish`` records the environment on the run (``machine.environment_ready``): from then on every
agent and gate sees it read-only (``environments.apply_to``, used by engine/steps/gates.py and
engine/steps/attempts.py).
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from .. import boundary, environments, machine, workspace
from ..checks import protected
from ..processes import limits
from ..agents import sandbox
from ..agents.network import egress, network_record, url_entry
from ..models import Check, Run
from ..processes.process import tail_text
from ..redaction import Redactor, secret_env_values
from .checkouts import final_checkout, remove_final_checkout
from .common import LeaseLost, hosts_sentence, lease_guard
from .gates import process_failure, setup_sentence as sentence
from .paths import control_path, process_marker_prefix, scratch_dirs, var_path
from .plans import StepPlan


def begin(run: Run, plan: StepPlan) -> StepPlan:
    return plan


def registries() -> tuple[list[str], dict[str, str]]:
    """``(hosts, variables)``: what the setup may reach (the operator's CP_SETUP_REGISTRIES, and the
    hosts of the mirrors named by CP_SETUP_PIP_INDEX_URL and CP_SETUP_NPM_REGISTRY) and the variables
    that point pip and npm at those mirrors."""
    hosts, variables = list(settings.CP_SETUP_REGISTRIES), {}
    for url, names in ((settings.CP_SETUP_PIP_INDEX_URL, ("PIP_INDEX_URL",)),
                       (settings.CP_SETUP_NPM_REGISTRY, ("npm_config_registry",))):
        entry = url_entry(url) if url else None
        if entry:
            hosts.append(entry)
            variables.update({name: url for name in names})
    return list(dict.fromkeys(hosts)), variables


def script(commands: list[str]) -> str:
    """One bash script of the commands, each announced in the log before it runs (``+ command``)."""
    lines = []
    for command in commands:
        lines.append(f"printf '%s\\n' {shlex.quote('+ ' + command)}")
        lines.append(command)
    return "\n".join(lines) + "\n"


def _blobs(run: Run, paths: list[str]) -> dict[str, str | None]:
    """The object ids of the ``cache_key`` files at the run's commit (None for a missing one)."""
    if not paths:
        return {}
    out = workspace.git(["ls-tree", "-z", run.commit, "--", *paths], run.repo_path).stdout
    found = {}
    for row in out.split(b"\0"):
        if b"\t" in row:
            meta, name = row.split(b"\t", 1)
            found[name.decode("utf-8", "surrogateescape")] = meta.split()[2].decode()
    return {path: found.get(path) for path in paths}


def execute(plan: StepPlan, should_stop) -> dict:
    """The environment found or made (module docstring): ``{"key", "keep", "reused", "check_id", "passed"}``."""
    run = Run.objects.get(pk=plan["run_id"])
    spec = run.definition["pipeline"]["setup"]
    keep = tuple(spec.get("keep") or ())
    blobs = _blobs(run, list(spec.get("cache_key") or []))
    key = environments.key_of(run.repo_path, run.commit, spec, blobs)
    outcome = {"key": environments.name_of(key, run.commit), "keep": list(keep)}
    environments.evict_now_and_then(keep_key=key)
    problem = _refusal(run, spec, keep, blobs)  # checked at this commit, whether the environment is made or not
    if problem:
        check = _refused(run, spec, problem)
        return {**outcome, "reused": False, "check_id": check.pk, "passed": False}
    with environments.key_lock(key):
        found = environments.find(key, keep, run.repo_path, run.commit)
        if found is not None:
            check = _reused(run, spec, found[0].key, found[1])
            environments.touch(found[0].key)
            return {**outcome, "key": found[0].key, "reused": True, "check_id": check.pk, "passed": True}
        built = environments.building(environments.name_of(key, run.commit), run.pk, keep)
        try:
            try:
                check = _build(run, spec, built, should_stop, plan["lease"])
            except environments.EnvironmentMissing as exc:  # a kept folder's place is a link or a file
                check = _refused(run, spec, str(exc))
            loaders = _loaders_kept(built) if check.passed else []
            if loaders:
                Check.objects.filter(pk=check.pk).update(passed=False, failure_kind="setup_refused")
                check.passed, check.failure_kind = False, "setup_refused"
                with open(var_path(check.log_path), "a", encoding="utf-8") as log:
                    log.write(f"\n[control panel] Refused: the kept folders hold files a test runner or Python "
                              f"loads by itself, links, or Python code an import could take in place of the repository's "
                              f"own ({', '.join(loaders[:10])}): in the worktree they would change what the tests "
                              f"run, unseen by the protected-file checks. Nothing was kept. A Python project's "
                              f"dependencies go to $CP_ENV, outside the worktree.\n")
            if check.passed:
                made = environments.publish(built, {
                    "made_by": {"run": run.pk, "check": check.pk}, "repository": run.repo_path,
                    "commit": run.commit, "commands": list(spec["commands"]), "keep": list(keep),
                    "cache_key": blobs, "log_path": check.log_path})
                record = environments.find(key, keep, run.repo_path, run.commit)
                check.setup = {"key": made.key, "reused": False, "folder": made.folder,
                               "size_bytes": (record[1] if record else {}).get("size_bytes")}
                check.save(update_fields=["setup"])
        finally:
            environments.discard(built)  # gone already when published
    return {**outcome, "reused": False, "check_id": check.pk, "passed": check.passed}


def _refusal(run: Run, spec: dict, keep: tuple[str, ...], blobs: dict) -> str:
    """Why the setup must not run at the run's commit ('' when it may): a ``keep`` folder the repository
    tracks, or one where its protected checks lie (it would hide or shadow them from every agent and
    gate), or a ``cache_key`` file the commit does not have (a typo would key the environment on nothing)."""
    tracked = _tracked(run, keep)
    if tracked:
        return (f"keep names folders the repository tracks at {run.commit[:12]} ({', '.join(tracked)}): the "
                f"setup's kept folders would hide the repository's own files from every agent and gate. keep "
                f"names only folders the setup makes (such as node_modules).")
    protected = [record["path"] for record in run.protected_files or []]
    near = sorted({path for path in keep for held in protected  # a protected file under it, or it under theirs
                   if held.startswith(path + "/") or (os.path.dirname(held) and path.startswith(os.path.dirname(held) + "/"))})
    if near:
        return (f"keep names folders among the run's protected checks ({', '.join(near)}): what the setup "
                f"put there would sit beside the agreed tests, where their runner loads files by itself, unseen by "
                f"the protected-file checks. keep names folders away from them (such as node_modules).")
    missing = [path for path, blob in blobs.items() if blob is None]
    if missing:
        return (f"cache_key names files the repository does not have at {run.commit[:12]} ({', '.join(missing)}): "
                f"the environment would not change when the files it installs from do.")
    return ""


#: What Python imports or runs as code: sources, bytecode, extension modules and the archives it imports
#: from when they are on its path.
PYTHON_CODE = (".py", ".pyc", ".pyo", ".pyw", ".pyd", ".so", ".zip", ".egg", ".whl")


def _loaders_kept(built: environments.Environment) -> list[str]:
    """What in the kept folders could change what the tests run, unseen by the protected-file checks:
    a file a test runner or Python loads by itself wherever it is (engine/checks/protected.py ``is_loader``:
    conftest.py, pytest.ini, *.pth...), any Python code (PYTHON_CODE: a kept ``mod/__init__.py`` beside the
    repository's ``mod.py`` is what ``import mod`` takes, a kept ``__pycache__`` holds bytecode Python runs
    in place of the source, an archive on a ``pythonpath``) and any link (what it names is not walked).
    Under a ``node_modules`` folder (JavaScript packages, Python never imports from there) only a
    ``conftest.py`` counts: pytest skips those folders by default, but a repository's own
    ``norecursedirs`` can make it collect them. A Python project's dependencies go to the environment
    (``$CP_ENV``), outside the worktree."""
    found = []
    for path in built.keep:
        top = built.keep_dir(path)
        packages = os.path.basename(path) == "node_modules"
        for folder, dirs, files in os.walk(top):
            inside = packages or "node_modules" in os.path.relpath(folder, top).split(os.sep)
            for name in [*files, *dirs]:
                rel = os.path.join(path, os.path.relpath(os.path.join(folder, name), top))
                if name == "conftest.py" or (not inside and (
                        os.path.islink(os.path.join(folder, name)) or name.endswith(PYTHON_CODE)
                        or (name in files and protected.is_loader(rel, {"pytest", "make", "npm"})
                            and not rel.endswith("package.json")))):
                    found.append(rel)
            dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(folder, name))]
    return sorted(found)


def _tracked(run: Run, keep: tuple[str, ...]) -> list[str]:
    """The ``keep`` folders that hold files of the repository at the run's commit."""
    if not keep:
        return []
    out = workspace.git(["ls-tree", "-z", "--name-only", run.commit, "--", *keep], run.repo_path).stdout
    return sorted({name.decode("utf-8", "surrogateescape") for name in out.split(b"\0") if name})


def _refused(run: Run, spec: dict, why: str) -> Check:
    """A setup check that ran nothing because its definition cannot be run safely (its log says why)."""
    return _nothing_ran(run, spec, lambda log: log.write(f"[control panel] The setup was not run: {why}\n"),
                        passed=False, failure_kind="setup_refused", setup=None)


def _reused(run: Run, spec: dict, key: str, record: dict) -> Check:
    """A setup check that ran nothing: the environment of ``key`` was made by an earlier run's setup."""
    made_by = record.get("made_by") or {}

    def write(log) -> None:
        log.write(f"[control panel] Reused the environment {environments.short(key)} (same repository, commands and cache_key files; "
                  f"made at {str(record.get('commit'))[:12]}, this run's commit or an ancestor of it) "
                  f"made by run {made_by.get('run', '?')}'s setup (check {made_by.get('check', '?')}, exit status 0); "
                  f"nothing ran. Its log follows.\n\n")
        original = var_path(record["log_path"]) if record.get("log_path") else None
        try:
            with open(original, encoding="utf-8", errors="replace") as fh:  # type: ignore[arg-type]
                shutil.copyfileobj(fh, log)
        except (OSError, TypeError):
            log.write("[control panel] (that log is no longer on this host)\n")

    return _nothing_ran(run, spec, write, passed=True, failure_kind="",
                        setup={"key": key, "reused": True, "made_by": made_by, "size_bytes": record.get("size_bytes"),
                               "folder": str(environments.root() / key)})


def _nothing_ran(run: Run, spec: dict, write_log, *, passed: bool, failure_kind: str, setup: dict | None) -> Check:
    """A setup check that ran no command (refused, or an environment reused): ``write_log(file)`` writes its log."""
    now = timezone.now()
    check = Check.objects.create(run=run, kind=Check.Kind.SETUP, name="setup", command="\n".join(spec["commands"]),
                                 argv=[], cwd="", started_at=now)
    check.log_path = control_path(run, "checks", f"{check.pk:05d}-setup.log")
    with open(var_path(check.log_path), "w", encoding="utf-8") as log:
        write_log(log)
    check.ended_at = timezone.now()
    check.elapsed_seconds = (check.ended_at - now).total_seconds()
    check.passed, check.failure_kind, check.setup = passed, failure_kind, setup
    check.save()
    return check


def _build(run: Run, spec: dict, built: environments.Environment, should_stop, lease: str | None) -> Check:
    """Run the setup's commands into ``built`` (module docstring) and record the Check."""
    boundary.self_check()
    scratch = Path(scratch_dirs(run.pk)["tmp"]).parent
    folder, own = scratch / "setup", scratch / "setup-scratch"
    final_checkout(run, run.commit, folder, own)
    try:
        home = own / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {**boundary.base_env(), "HOME": str(home), "TMPDIR": str(own / "tmp"), "CP_TMP_DIR": str(own / "tmp"),
               "CP_DATA_DIR": str(own / "data"), "CP_RUN_ID": str(run.pk), "CP_WORKTREE": str(folder),
               "GIT_TERMINAL_PROMPT": "0"}
        built.prepare(str(folder))
        env = {**env, "CP_ENV": environments.MOUNT,
               "PATH": ":".join([*built.path_entries(str(folder)), env.get("PATH") or "/usr/bin:/bin"])}
        hosts, variables = registries()
        env.update(variables)
        argv = ["bash", "-eo", "pipefail", "-c", script(list(spec["commands"]))]
        with egress({"network_allow": hosts}, deny=boundary.service_addresses()) as (proxy, policy):
            env = {**env, **policy.env()}
            launch = sandbox.wrap(argv, writable=[str(folder), str(own)], read_only=[str(folder / ".git")],
                                  hide=sandbox.private_paths(str(settings.VAR_DIR)),
                                  visible=sandbox.git_dirs(str(folder)) + sandbox.tool_paths(env.get("PATH")),
                                  network=policy, binds=built.binds(str(folder), writable=True))
            check = _run(run, spec, argv, str(folder), env, launch, built, should_stop, lease)
        check.network = network_record(proxy)
        check.save(update_fields=["network"])
        return check
    finally:
        with contextlib.suppress(workspace.WorkspaceError):
            remove_final_checkout(run, folder, own)


def _run(run: Run, spec: dict, argv: list[str], cwd: str, env: dict, launch: list[str],
         built: environments.Environment, should_stop, lease: str | None) -> Check:
    check = Check.objects.create(run=run, kind=Check.Kind.SETUP, name="setup", command="\n".join(spec["commands"]),
                                 argv=argv, cwd=cwd, started_at=timezone.now())
    log_rel = control_path(run, "checks", f"{check.pk:05d}-setup.log")
    check.log_path = log_rel  # before it runs: a running setup's log can be followed
    check.save(update_fields=["log_path"])
    bounds = limits.Bounds(limits.effective(run.definition["pipeline"].get("limits")), "check",
                           [cwd, env["HOME"], env["TMPDIR"], built.folder],
                           marker=f"{process_marker_prefix(run)}setup-{check.pk}")
    try:
        result = bounds.run(launch, cwd=cwd, env=env, deadline_seconds=float(spec["deadline"]),
                            log_path=str(var_path(log_rel)), redactor=Redactor(secret_env_values(env)),
                            should_stop=should_stop, grace_seconds=5.0,
                            on_start=lease_guard(run.pk, lease) if lease else None)
    except LeaseLost:
        Check.objects.filter(pk=check.pk).update(failure_kind="cancelled", ended_at=timezone.now())
        raise
    if result.signal is None and result.exit_code is not None and result.exit_code > 128:
        result.signal, result.exit_code = result.exit_code - 128, None  # bubblewrap: 128 + the signal
    check.limits = bounds.record()
    check.failure_kind = process_failure(result)
    check.ended_at = timezone.now()
    check.elapsed_seconds = result.elapsed_seconds
    check.exit_code = result.exit_code
    check.signal = result.signal
    check.passed = result.exit_code == 0 and not check.failure_kind
    check.save()
    return check


def finish(run: Run, plan: StepPlan, outcome: dict) -> None:
    """Record the environment on the run, or stop it ``setup_failed`` (``crashed`` when the engine failed)."""
    if outcome.get("crashed"):
        machine.stop(run, outcome.get("stop_reason") or "crashed",
                     f"The engine failed during the setup step: {outcome['failure_message']}")
        return
    check = Check.objects.get(pk=outcome["check_id"])
    refused = (check.network or {}).get("refused") or []
    if refused:
        why = str(refused[0].get("why") or "").rstrip(".")
        machine.event(run, "network_refused", f"The setup's egress proxy refused {hosts_sentence(refused)}"
                      f"{f' ({why})' if why else ''}: the setup reaches only the operator's package registries "
                      f"(CP_SETUP_REGISTRIES).", gate_check=check, data={"refused": refused[:50]})
    if outcome["passed"]:
        machine.environment_ready(run, {"key": outcome["key"], "keep": outcome["keep"], "reused": outcome["reused"],
                                        "check": check.pk})
        machine.event(run, "setup", sentence(check), gate_check=check)
        return
    tail = tail_text(str(var_path(check.log_path)), 1500) if check.log_path else ""
    machine.stop(run, "setup_failed", f"{sentence(check)} The run's agents and gates need its environment; fix the "
                 f"setup (or what it installs) and recover the run or start a new one. The end of its log:\n{tail}",
                 evidence={"check": check.pk, "log_path": check.log_path})
