"""The steps of a stage: implement, verify, checkpoint, and the run's finish.

Each step has three parts, called by ``engine.runner``:

* ``begin(run, step, lease)``: inside the short locking transaction; persists the intent
  (an Attempt row before an agent starts, a JournalEntry before git commits) and returns a
  plain ``plan`` dict;
* ``execute(plan, should_stop)``: outside any transaction; runs git, the agent, the gates;
  returns a plain ``outcome`` dict;
* ``finish(run, plan, outcome)``: inside the second locking transaction; records evidence and
  asks ``engine.machine`` for the transition.
"""
from __future__ import annotations

import hashlib
import json
import logging
import contextlib
import os
import shutil
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from . import boundary, context, faults, machine, process, protected, review, globs, workspace
from .agents import AgentRequest, get_adapter, sandbox
from .agents.network import egress, network_record
from .models import (
    Attempt,
    AttemptStatus,
    Check,
    Decision,
    JournalEntry,
    Manifest,
    Run,
    RunStatus,
    StageRun,
    StageStatus,
)
from .redaction import Redactor, redact_text, secret_env_values
from .simulation import simulation

log = logging.getLogger("engine.steps")

# ----------------------------------------------------------------------------- paths and environment


def var_path(rel: str) -> Path:
    """Absolute path of a file recorded relative to CP_VAR_DIR."""
    return Path(settings.VAR_DIR) / rel


def control_path(run: Run, *parts: str) -> str:
    """Relative path (to CP_VAR_DIR) of a control record of ``run``; creates its folder."""
    rel = os.path.join(run.control_dir, *parts)
    var_path(rel).parent.mkdir(parents=True, exist_ok=True)
    return rel


def scratch_dirs(run_id: int) -> dict[str, str]:
    """The run's own temporary and data folders (outside the worktree and the control records)."""
    base = Path(settings.VAR_DIR) / "scratch" / f"run-{run_id}"
    dirs = {"tmp": str(base / "tmp"), "data": str(base / "data")}
    for path in dirs.values():
        os.makedirs(path, exist_ok=True)
    return dirs


def run_env(run: Run, stage_key: str) -> dict[str, str]:
    """The environment of the run's commands (agents and gates), by allow-list: the worker's
    PATH, locale, TERM and TZ (engine/boundary.py ``base_env``; nothing else of the worker's
    environment), plus the run's folders and port range. An agent adds its CLI's credential
    variable and its profile's ``env``; each process gets its own HOME.

    Variables: CP_RUN_ID, CP_STAGE, CP_WORKTREE, TMPDIR and CP_TMP_DIR, CP_DATA_DIR,
    CP_PORT_BASE and CP_PORT_COUNT (ports CP_PORT_BASE .. CP_PORT_BASE + CP_PORT_COUNT - 1
    are this run's; inside the sandbox's own network namespace every port is), 
    PYTHONDONTWRITEBYTECODE=1, GIT_TERMINAL_PROMPT=0.
    """
    env = boundary.base_env()
    dirs = scratch_dirs(run.pk)
    env.update(
        {
            "CP_RUN_ID": str(run.pk),
            "CP_STAGE": stage_key,
            "CP_WORKTREE": run.worktree,
            "TMPDIR": dirs["tmp"],
            "CP_TMP_DIR": dirs["tmp"],
            "CP_DATA_DIR": dirs["data"],
            "CP_PORT_BASE": str(run.port_base or 0),
            "CP_PORT_COUNT": str(settings.CP_PORT_SPAN),
            "PYTHONDONTWRITEBYTECODE": "1",
            "GIT_TERMINAL_PROMPT": "0",
        }
    )
    return env


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_excludes(run: Run) -> list[str]:
    """The run's manifest exclusions: the engine's DEFAULT_EXCLUDES plus the pipeline's ``exclude``."""
    return list(workspace.DEFAULT_EXCLUDES) + list(run.definition["pipeline"].get("exclude") or [])


def _stage_row(plan: dict) -> StageRun:
    return StageRun.objects.select_related("run").get(pk=plan["stage_id"])


def process_marker_prefix(run: Run) -> str:
    """``cp-run-<id>-<first 8 hex of uid>-``: every process the run starts (agents, gates) carries a
    ``CP_PROCESS_MARKER`` beginning so, which is how a reconciler or ``fail_run`` finds them all."""
    return f"cp-run-{run.pk}-{run.uid.hex[:8]}-"


class LeaseLost(Exception):
    """The step's lease was taken away (the run was failed, or a reconciler took it over) while
    its process was starting: the process tree is stopped and the step's result is late."""


def _lease_guard(run_id: int, lease: str):
    """An ``on_start`` callback for ``process.run_supervised`` that raises LeaseLost when ``lease``
    is no longer the run's token. It closes the gap between the last look at the lease and the
    launch: a ``fail_run`` that took the lease before the process started finds it by its marker
    or its recorded pid, and one that took it after is seen here."""
    def guard(pid: int, create_time: float) -> None:
        if not Run.objects.filter(pk=run_id, lease_token=lease, status=RunStatus.RUNNING).exists():
            raise LeaseLost(f"the lease of run {run_id} was taken away as process {pid} started")
    return guard


def _fenced(run_id: int, lease: str):
    """Lock the run inside the caller's transaction; None when ``lease`` is no longer its token."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.lease_token != lease or run.status != RunStatus.RUNNING:
        return None
    return run


def definition_tampered(run: Run) -> dict | None:
    """None when the run's frozen definition is intact, else ``{"message", "evidence"}``.

    The digest of the row's definition must equal the row's ``definition_sha256`` and the control
    record ``definition.sha256`` written when the run was created (in the var directory, which no
    agent or gate can reach): the file is the authority, so an edit of both columns is caught too.
    """
    actual = machine.definition_digest(run.definition)
    try:
        recorded = var_path(os.path.join(run.control_dir, "definition.sha256")).read_text(encoding="utf-8").strip()
    except OSError:
        recorded = ""
    expected = {"row": run.definition_sha256, **({"control_record": recorded} if recorded else {})}
    if all(actual == digest for digest in expected.values()):
        return None
    return {"message": f"The run's frozen definition no longer has the digest it was frozen with (sha256 "
                       f"{(recorded or run.definition_sha256)[:12]}, now {actual[:12]}): it was changed after the run "
                       f"was created. Nothing was launched; a new run of the saved pipeline is needed.",
            "evidence": {"actual_sha256": actual, **{f"{k}_sha256": v for k, v in expected.items()}}}


# ----------------------------------------------------------------------------- manifests


def save_manifest(run: Run, stage: StageRun | None, data: dict) -> Manifest:
    """Store a manifest dict (``workspace.manifest``) as a control record and a row; reuses an equal one."""
    existing = Manifest.objects.filter(run=run, stage=stage, digest=data["digest"], base_commit=data["base"]).first()
    if existing is not None:
        return existing
    rel = control_path(run, "manifests", f"{data['digest']}-{data['base'][:12]}.json")
    path = var_path(rel)
    path.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    counts = {"added": 0, "modified": 0, "deleted": 0}
    for change in data["changes"]:
        key = {"added": "added", "deleted": "deleted"}.get(change["status"], "modified")
        counts[key] += 1
    return Manifest.objects.create(
        run=run, stage=stage, digest=data["digest"], base_commit=data["base"], path=rel, sha256=sha256_file(path),
        files=len(data["entries"]), excluded=data.get("excluded", []), **counts,
    )


# ----------------------------------------------------------------------------- begin


def begin(run: Run, step: machine.Step, lease: str) -> dict:
    """Persist the intent of ``step`` (run locked by the caller) and return its plan."""
    plan = {"kind": step.kind, "run_id": run.pk, "lease": lease, "stage_id": step.stage_id}
    if step.kind == "finish":
        last = run.stages.order_by("-order").first()
        plan["checkpoint"] = last.checkpoint_commit if last else run.commit
        machine.event(run, "final_verify",
                      f"Every stage is checkpointed; verifying the whole result: every baseline check and every "
                      f"stage's gates run again on a clean checkout of the final checkpoint {plan['checkpoint'][:12]} "
                      f"(exactly what was committed).")
        return plan
    stage = StageRun.objects.select_related("run").get(pk=step.stage_id)
    if stage.status == StageStatus.PENDING or not stage.base_commit:
        previous = run.stages.filter(order__lt=stage.order).order_by("-order").first()
        machine.start_stage(stage, previous.checkpoint_commit if previous else run.commit)
    elif stage.status != StageStatus.RUNNING:
        machine.start_stage(stage, stage.base_commit)
    plan["stage_key"] = stage.key
    if step.kind in ("implement", "repair"):
        plan.update(_begin_attempt(run, stage, step.kind, "implementer", lease))
    elif step.kind == "review":
        plan.update(_begin_attempt(run, stage, "review", "reviewer", lease, profile_name=_next_reviewer(run, stage)))
    elif step.kind == "document":
        plan.update(_begin_attempt(run, stage, "document", "documenter", lease))
    elif step.kind == "checkpoint":
        entry = machine.journal_intent(run, stage)
        plan["journal_id"] = entry.pk
        plan["started"] = timezone.now().timestamp()
        machine.event(run, "checkpoint_intent",
                      f"Checkpoint of stage '{stage.key}' journaled (entry {entry.uid}) before git runs.",
                      stage=stage)
    elif step.kind == "verify":
        machine.event(run, "verify", f"Verifying stage '{stage.key}': running its gates on the worktree.",
                      stage=stage)
    return plan


def reviewers(run: Run) -> list[str]:
    """The reviewer profiles of the run, in order (``roles.reviewer``: one name or a list); all must pass."""
    names = run.definition["roles"]["reviewer"]
    return [names] if isinstance(names, str) else list(names)


def _passed_reviewers(stage: StageRun) -> set[str]:
    """Reviewer profiles whose verdict was ``pass`` on the stage's verified files (its accepted manifest)."""
    done = set()
    for attempt in stage.attempts.filter(operation="review", start_manifest=stage.accepted_manifest,
                                         status=AttemptStatus.SUCCEEDED, late=False):
        if (attempt.verdict or {}).get("verdict") == "pass":
            done.add(attempt.profile_name)
    return done


def _next_reviewer(run: Run, stage: StageRun) -> str:
    passed = _passed_reviewers(stage)
    return next(name for name in reviewers(run) if name not in passed)


def _begin_attempt(run: Run, stage: StageRun, operation: str, role: str, lease: str,
                   profile_name: str | None = None) -> dict:
    definition = run.definition
    profile_name = profile_name or definition["roles"][role]
    profile = definition["profiles"][profile_name]
    deadline = float(definition["pipeline"]["deadlines"][operation])
    budget = (definition["pipeline"].get("budgets") or {}).get("max_active_seconds")
    configured = deadline
    if budget is not None:  # an attempt never runs past the run's active-time budget
        deadline = max(1.0, min(deadline, float(budget) - run.active_seconds))
    number = (stage.attempts.aggregate(n=Max("number"))["n"] or 0) + 1
    nth = stage.attempts.filter(operation=operation).count() + 1
    why = simulation(profile["adapter"], profile)
    attempt = machine.attempt_intent(
        run, stage, operation=operation, number=number, role=role, profile_name=profile_name,
        adapter=profile["adapter"], simulated=bool(why), deadline_seconds=deadline,
        start_commit=stage.base_commit, lease_token=lease, host=socket.gethostname(),
        marker=f"{process_marker_prefix(run)}attempt-{number}-{lease[:8]}",
    )
    folder = f"stages/{stage.order + 1:02d}-{stage.key}/attempts/{number:03d}-{operation}"
    attempt.log_path = control_path(run, folder, "output.log")
    attempt.raw_path = control_path(run, folder, "output.raw")
    attempt.save()
    sim = f" (simulated: {why})" if why else ""
    machine.event(run, "attempt_intent",
                  f"Attempt {number} ({operation}) of stage '{stage.key}' recorded before launch with profile "
                  f"'{profile_name}'{sim}, deadline {deadline:.0f} s.", stage=stage, attempt=attempt)
    return {"attempt_id": attempt.pk, "operation": operation, "role": role, "profile": profile,
            "profile_name": profile_name, "operation_attempt": nth, "folder": folder,
            "budget_cut": deadline < configured}


# ----------------------------------------------------------------------------- execute


def execute(plan: dict, should_stop) -> dict:
    """Do the step's slow work outside any transaction; returns its outcome dict."""
    kind = plan["kind"]
    if kind in ("implement", "repair", "review", "document"):
        return _execute_agent(plan, should_stop)
    if kind == "verify":
        return _execute_verify(plan, should_stop)
    if kind == "checkpoint":
        return _execute_checkpoint(plan)
    if kind == "finish":
        return _execute_final(plan, should_stop)
    return {}


def _execute_final(plan: dict, should_stop) -> dict:
    """Run every baseline check and every stage's gates (Check kind final), each on a fresh clean
    checkout of the final checkpoint: exactly what was committed, nothing an agent left beside it
    (files git ignores or the exclusions drop are tested nowhere else), and nothing an earlier
    final check wrote (a check runs the agent's code, which could rewrite the files, a protected
    test among them, or leave an ignored helper for the checks after it). Each checkout is a
    detached worktree under the run's scratch folder with a TMPDIR and data folder of its own,
    removed after its check. Every check runs, so the report names all that fail.
    """
    run = Run.objects.get(pk=plan["run_id"])
    checkpoint = plan["checkpoint"]
    folder = Path(scratch_dirs(run.pk)["tmp"]).parent / f"final-{checkpoint[:12]}"
    own = folder.parent / f"{folder.name}-scratch"
    tree = workspace.git(["rev-parse", f"{checkpoint}^{{tree}}"], run.repo_path).stdout.decode().strip()
    manifest_row = Manifest.objects.filter(run=run, digest=tree).order_by("-id").first()
    pipeline = run.definition["pipeline"]
    stages = list(run.stages.order_by("order"))
    plan_gates = [(stages[0] if stages else None, g) for g in pipeline.get("baseline_checks") or []]
    plan_gates += [(stage, g) for stage in stages for g in stage.spec.get("gates") or []]
    checks = []
    try:
        for stage, gate in plan_gates:
            _final_checkout(run, checkpoint, folder, own)
            env = {**run_env(run, "final"), "CP_WORKTREE": str(folder), "TMPDIR": str(own / "tmp"),
                   "CP_TMP_DIR": str(own / "tmp"), "CP_DATA_DIR": str(own / "data")}
            check = _run_gate(run, stage, gate, Check.Kind.FINAL, tree, env, should_stop, 1,
                              cwd=str(folder), lease=plan["lease"])
            if manifest_row is not None:
                Check.objects.filter(pk=check.pk).update(manifest=manifest_row)
            checks.append(check.pk)
            if should_stop():
                return {"cancelled": True, "checks": checks}
        return {"checks": checks, "digest": tree}
    finally:
        try:
            _remove_final_checkout(run, folder, own)
        except workspace.WorkspaceError as exc:  # the checks' result stands; the leftover is said
            log.warning("run %s: the final checkout %s could not be unregistered: %s", run.pk, folder, exc)


def _lock_dir() -> str:
    """The folder of the per-repository lock files (engine/workspace.py ``repo_lock``)."""
    return str(Path(settings.VAR_DIR) / "locks")


def _remove_final_checkout(run: Run, folder: Path, own: Path) -> None:
    """The files first (checks ran agent code there: git must not read what they left), then git's
    record of this checkout only (``workspace.remove_worktree``, holding the repository lock):
    other registrations of the user's repository, one whose folder is missing too, are never
    pruned. Raises workspace.WorkspaceError (the repository cannot be read)."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(own, ignore_errors=True)
    workspace.remove_worktree(run.repo_path, str(folder), lock_dir=_lock_dir())


def _final_checkout(run: Run, checkpoint: str, folder: Path, own: Path) -> None:
    """A fresh detached checkout of ``checkpoint`` at ``folder`` (whatever was there removed without
    git reading it), its submodules from the starting commit's ``.gitmodules``, and an empty
    ``own`` folder for its TMPDIR and data folder."""
    _remove_final_checkout(run, folder, own)
    workspace.add_detached_worktree(run.repo_path, str(folder), checkpoint, lock_dir=_lock_dir())
    _final_submodules(run, checkpoint, folder)
    for sub in ("tmp", "data"):
        (own / sub).mkdir(parents=True, exist_ok=True)


def _final_submodules(run: Run, checkpoint: str, folder: Path) -> None:
    """Populate the final checkout's submodules from the run's starting commit's ``.gitmodules`` only.

    The checkpoint's ``.gitmodules`` may have been written by an agent: if it is not the
    starting commit's (same blob), nothing is fetched and the run stops ``nested_repository``
    (an agent's URL could name a repository the agent cannot read, whose content would reach a
    check log). Its gitlinks are those of the starting commit (a new one stops the run earlier).
    Raises workspace.WorkspaceError (``nested_repository``, ``submodule_init_failed``)."""
    def blob(commit: str) -> str:
        proc = workspace.git(["rev-parse", "-q", "--verify", f"{commit}:.gitmodules"], run.repo_path, check=False)
        return proc.stdout.decode().strip() if proc.returncode == 0 else ""

    final, start = blob(checkpoint), blob(run.commit)
    if final != start:
        raise workspace.WorkspaceError(
            "nested_repository",
            f"The final checkpoint {checkpoint[:12]} changes .gitmodules (where submodules are fetched from); the "
            f"final verification fetches only what the run's starting commit {run.commit[:12]} names, and fetched "
            f"nothing.")
    if final:
        workspace.init_submodules(str(folder))  # noqa: the starting commit's URLs


def _prepare_workspace(run: Run, lease: str) -> dict:
    """Make sure the run's worktree exists on its branch (C01, C02, C04 handled by workspace).

    A branch of the run's name that this run did not create is taken only when it points at
    the run's own commit (nothing on it could be lost); otherwise ``workspace_branch_exists``.
    A branch checked out in another worktree is refused first (``workspace_branch_in_use``).
    """
    owned = run.branch_created or workspace.branch_tip(run.repo_path, run.branch) == run.commit
    info = workspace.ensure_worktree(
        run.repo_path, run.worktree, run.branch, run.commit, branch_owned=owned,
        lock_dir=str(Path(settings.VAR_DIR) / "locks"),
    )
    if not run.branch_created:
        with transaction.atomic():
            locked = _fenced(run.pk, lease)
            if locked is not None:
                locked.branch_created = True
                locked.save(update_fields=["branch_created", "updated_at"])
                machine.event(locked, "workspace",
                              f"Worktree {run.worktree} created on branch {run.branch} from {run.commit[:12]}.")
    elif info.get("created") or info.get("pruned_stale"):
        with transaction.atomic():
            locked = _fenced(run.pk, lease)
            if locked is not None:
                note = " after pruning a stale registration" if info.get("pruned_stale") else ""
                machine.event(locked, "workspace", f"Worktree {run.worktree} re-created{note}.")
    return info


def _reset_for_retry(run: Run, stage: StageRun, attempt: Attempt, lease: str) -> None:
    """A person's ``recover --action retry`` asks for a new attempt of the stage: its first
    attempt after that decision starts from the stage's starting checkpoint, not from what an
    interrupted or refused attempt left (that is kept in the earlier attempt's patch and
    manifest). ``verify`` keeps the files; so does every later attempt."""
    decision = stage.decisions.filter(kind=Decision.Kind.REVIEW, state=Decision.State.RECOVERED,
                                      action="retry").order_by("-decided_at").first()
    if decision is None or stage.attempts.filter(created_at__gt=decision.decided_at).exclude(pk=attempt.pk).exists():
        return
    undone = workspace.restore_to(run.worktree, stage.base_commit, manifest_excludes(run), repo=run.repo_path,
                                  lock_wait=min(float(settings.CP_INDEX_LOCK_WAIT), attempt.deadline_seconds),
                                  on_lock_wait=_lock_waiter(run, {"lease": lease, "stage_id": stage.pk},
                                                            "the retry's reset of the worktree"))
    if undone:
        paths = ", ".join(c["path"] for c in undone[:8]) + (" ..." if len(undone) > 8 else "")
        with transaction.atomic():
            locked = _fenced(run.pk, lease)
            if locked is not None:
                machine.event(locked, "workspace",
                              f"Retry (decision {decision.pk}): the worktree was put back to the stage's start "
                              f"{stage.base_commit[:12]} before attempt {attempt.number}; {len(undone)} file(s) left "
                              f"by earlier attempts were undone ({paths}); their patches keep them.",
                              stage=stage, attempt=attempt, decision=decision)


def _dependency_summaries(run: Run, stage_def: dict) -> list[dict]:
    """The accepted output of the stages ``stage_def`` depends on: the files of the manifest its
    checkpoint committed, and the final message of the implementer (or repairer) that wrote them."""
    summaries = []
    for key in stage_def.get("depends_on") or []:
        dep = run.stages.get(key=key)
        accepted = (Manifest.objects.filter(run=run, stage=dep, digest=dep.accepted_manifest).order_by("-id").first()
                    if dep.accepted_manifest else None)
        author = (dep.attempts.filter(operation__in=("implement", "repair"), status=AttemptStatus.SUCCEEDED,
                                      late=False).order_by("-number").first())
        lines = []
        if accepted is not None:
            data = json.loads(var_path(accepted.path).read_text(encoding="utf-8"))
            lines += [f"- {c['status']}: {c['path']}" for c in data["changes"]]
        if author is not None and author.final_message:
            lines += ["", "Agent's final message:", author.final_message]
        if accepted is not None and dep.checkpoint_commit:
            docs = [c["path"] for c in data["changes"] if c["status"] != "deleted"
                    and globs.matches(c["path"], list(run.definition["pipeline"]["documentation_paths"]))]
            for rel in docs[:20]:
                shown = workspace.git(["show", f"{dep.checkpoint_commit}:{rel}"], run.worktree, check=False)
                if shown.returncode == 0:
                    lines += ["", f"Documentation {rel} (as checkpointed):",
                              shown.stdout[:32_000].decode("utf-8", "replace").strip()]
        summaries.append({"key": key, "checkpoint": dep.checkpoint_commit,
                          "summary": "\n".join(lines) or "(no file changes)"})
    return summaries


def _initial_spec_index(run: Run, stage: StageRun, plan: dict) -> str | None:
    """The engine's initial specification index when the repository has none at the pipeline's
    ``spec_index`` (None otherwise); kept with the attempt (``spec-index.md``), announced once per run."""
    rel = run.definition["pipeline"].get("spec_index")
    if not rel or os.path.isfile(context.resolve_inside(run.worktree, rel)):
        return None
    text = redact_text(context.initial_spec_index(run.worktree, rel))[0]
    record = control_path(run, plan["folder"], "spec-index.md")
    var_path(record).write_text(text, encoding="utf-8")
    with transaction.atomic():
        locked = _fenced(run.pk, plan["lease"])
        if locked is not None and not locked.events.filter(kind="spec_index_created").exists():
            listed = sum(1 for line in text.splitlines() if line.startswith("- `"))
            machine.event(locked, "spec_index_created",
                          f"The repository has no specification index at {rel}: the engine created an initial one "
                          f"listing its {listed} documentation file(s), gave it to the agents and kept it at "
                          f"{record}. It is not written into the repository.",
                          stage=stage, data={"path": record, "spec_index": rel, "files": listed})
    return text


def _execute_agent(plan: dict, should_stop) -> dict:
    stage = _stage_row(plan)
    run = stage.run
    attempt = Attempt.objects.get(pk=plan["attempt_id"])
    try:
        _prepare_workspace(run, plan["lease"])
        run.refresh_from_db()
        if plan["operation"] == "implement":
            _reset_for_retry(run, stage, attempt, plan["lease"])
        start = workspace.manifest(run.worktree, stage.base_commit, manifest_excludes(run))
        prompt = _build_prompt(run, stage, plan, start)
    except workspace.WorkspaceError as exc:
        return {"failure_kind": exc.code, "failure_message": exc.message, "launched": False}
    except context.ContextError as exc:
        return {"failure_kind": exc.code, "failure_message": exc.message, "launched": False}
    try:
        boundary.self_check()
    except boundary.BoundaryNotEnforced as exc:
        return {"failure_kind": "boundary_not_enforced", "launched": False,
                "failure_message": f"The agent was not launched: the sandbox boundary is not enforced here "
                                   f"({exc}). Agents never run unguarded."}
    home_dir = str(Path(scratch_dirs(run.pk)["tmp"]).parent / "home" / f"attempt-{attempt.number:03d}")
    env = {**run_env(run, stage.key), **boundary.credential_env(plan["profile"]["adapter"])}
    if plan["role"] == "reviewer":
        # a reviewer writes nothing another role reads: its TMPDIR and data folder are its own,
        # inside its HOME, gone with it
        env.update({"TMPDIR": os.path.join(home_dir, "tmp"), "CP_TMP_DIR": os.path.join(home_dir, "tmp"),
                    "CP_DATA_DIR": os.path.join(home_dir, "data")})
    secrets = secret_env_values(env)
    prompt, prompt_redactions = redact_text(prompt, secrets)
    prompt_rel = control_path(run, plan["folder"], "prompt.md")
    var_path(prompt_rel).write_text(prompt, encoding="utf-8")
    now = timezone.now()
    with transaction.atomic():
        if _fenced(run.pk, plan["lease"]) is None:
            return {"failure_kind": "cancelled", "failure_message": "The lease was lost before launch.",
                    "launched": False}
        machine.attempt_launched(
            attempt.pk, start_manifest=start["digest"], prompt_path=prompt_rel,
            prompt_sha256=sha256_file(var_path(prompt_rel)), started_at=now,
            deadline_at=now + timedelta(seconds=attempt.deadline_seconds),
        )

    guard = _lease_guard(run.pk, plan["lease"])

    def on_start(pid: int, create_time: float) -> None:
        Attempt.objects.filter(pk=attempt.pk).update(pid=pid, pid_create_time=create_time)
        guard(pid, create_time)

    adapter = get_adapter(plan["profile"]["adapter"])
    control_dir = str(var_path(control_path(run, plan["folder"], "adapter")).parent)
    request = AgentRequest(
        role=plan["role"], operation=plan["operation"], prompt=prompt, workspace=run.worktree,
        profile=plan["profile"], deadline_seconds=attempt.deadline_seconds,
        log_path=str(var_path(attempt.log_path)), raw_path=str(var_path(attempt.raw_path)), env=env,
        stage_key=stage.key, attempt_number=attempt.number, control_dir=control_dir,
        operation_attempt=plan["operation_attempt"], marker=attempt.marker, secrets=secrets,
        should_stop=should_stop, on_start=on_start, prompt_path=str(var_path(prompt_rel)),
        home_dir=home_dir, deny_addresses=boundary.service_addresses(),
    )
    git_file = Path(run.worktree, ".git")
    git_link = git_file.read_bytes() if git_file.is_file() else None
    try:
        result = adapter.run(request)
    finally:
        # the CLI's own transcripts and session state hold its output unredacted: our redacted
        # logs are the evidence, this folder is not kept
        shutil.rmtree(request.home_dir, ignore_errors=True)
    outcome = {"launched": True, "result": result.as_dict(), "prompt_redactions": prompt_redactions}
    if (git_file.read_bytes() if git_file.is_file() else None) != git_link:
        # never run git in a worktree whose .git now points somewhere the agent chose
        outcome.update({"tampered": True, "manifest": None, "patch_path": "", "patch": {"sha256": ""},
                        "changed": [".git"]})
        return outcome
    nested = workspace.find_nested_repositories(run.worktree, stage.base_commit)
    if nested:  # before any git reads the files: git would read that repository's configuration
        outcome.update({"nested": nested, "manifest": None, "patch_path": "", "patch": {"sha256": ""},
                        "changed": nested})
        return outcome
    after = workspace.manifest(run.worktree, stage.base_commit, manifest_excludes(run))
    outcome["changed"] = _changed_paths(start, after)
    patch_rel = control_path(run, plan["folder"], "patch.diff")
    patch = workspace.write_patch(run.worktree, stage.base_commit, after["tree"], str(var_path(patch_rel)))
    outcome.update({"manifest": after, "patch_path": patch_rel, "patch": patch})
    outcome["tamper"] = _tamper(run, after, plan["folder"], secrets)
    outcome["outward"] = workspace.outward_symlinks(run.worktree, after["changes"])
    if plan["operation"] == "review":
        try:
            outcome["verdict"] = review.parse(result.final_message, (result.extra or {}).get("verdict"))
        except review.InvalidVerdict as exc:
            outcome["verdict_problem"] = str(exc)
    return outcome


def gate_commands(run: Run) -> list[str]:
    """Every gate command of the run's frozen definition: baseline checks, then each stage's gates."""
    pipeline = run.definition["pipeline"]
    commands = [g["command"] for g in pipeline.get("baseline_checks") or []]
    return commands + [g["command"] for stage in pipeline["stages"] for g in stage.get("gates") or []]


def _tamper(run: Run, current: dict, folder: str, secrets: list[str]) -> dict | None:
    """Compare the protected files with a manifest; on tampering write the report and return
    ``{"changes": [...], "report": rel path of the .diff, "files": rel path of the .json}``, else
    None."""
    added = {c["path"] for c in current["changes"] if c["status"] == "added"}
    base_paths = {e["path"] for e in current["entries"]} - added
    base_paths |= {c["path"] for c in current["changes"] if c["status"] == "deleted"}
    pipeline = run.definition["pipeline"]
    commands = gate_commands(run)
    records = run.protected_files or []
    snapshot_dir = str(var_path(control_path(run, "protected", "index.json")).parent)
    shadowed = protected.shadowed_names(records, snapshot_dir, base_paths) if added else set()
    changes = protected.compare(records, list(pipeline["protected_paths"]), current["entries"],
                                base_paths, gates=bool(commands), shadowed=shadowed, worktree=run.worktree,
                                tools=protected.gate_tools(commands), snapshot_dir=snapshot_dir)
    if not changes:
        return None
    report_rel = control_path(run, folder, "protected-files.diff")
    real_paths = {protected.shown(e["path"]): e["path"] for e in current["entries"]}
    changes = protected.write_report(changes, snapshot_dir, run.worktree, str(var_path(report_rel)),
                                     redact=lambda text: redact_text(text, secrets)[0], records=records,
                                     real_paths=real_paths)
    return {"changes": changes, "report": report_rel, "files": report_rel[:-len(".diff")] + ".json"}


def _build_prompt(run: Run, stage: StageRun, plan: dict, start: dict) -> str:
    """The prompt of an implement, repair or review session (raises context.ContextError)."""
    pipeline = run.definition["pipeline"]
    if plan["operation"] == "review":
        patch_rel = control_path(run, plan["folder"], "reviewed.diff")
        workspace.write_patch(run.worktree, stage.base_commit, start["tree"], str(var_path(patch_rel)))
        checks = [{"name": c.name, "command": c.command, "exit_code": c.exit_code, "passed": c.passed}
                  for c in stage.checks.filter(manifest_digest=start["digest"], stale=False).order_by("id")]
        return review.prompt(pipeline=pipeline, stage=stage.spec, worktree=run.worktree,
                             patch=var_path(patch_rel).read_text(encoding="utf-8", errors="replace"), checks=checks,
                             reviewer=f"reviewer '{plan['profile_name']}'")
    text = context.assemble_prompt(pipeline=pipeline, stage=stage.spec, worktree=run.worktree,
                                   operation=plan["operation"], dependencies=_dependency_summaries(run, stage.spec),
                                   spec_index_text=_initial_spec_index(run, stage, plan))
    if plan["operation"] == "repair":
        text += _repair_section(run, stage, plan, start)
    elif plan["operation"] == "document":
        text += _document_section(run, stage, plan, start)
    return text


def _document_section(run: Run, stage: StageRun, plan: dict, start: dict) -> str:
    """What the documentation agent is told: its paths, the verified diff and the knowledge base."""
    pipeline = run.definition["pipeline"]
    paths = list(pipeline["documentation_paths"])
    patch_rel = control_path(run, plan["folder"], "verified.diff")
    workspace.write_patch(run.worktree, stage.base_commit, start["tree"], str(var_path(patch_rel)))
    patch = var_path(patch_rel).read_text(encoding="utf-8", errors="replace")
    if len(patch) > 100_000:
        patch = patch[:100_000] + "\n[... cut; read the files for the rest]\n"
    lines = ["", "## Your task: update the documentation",
             "The change below passed every check and the independent review. Bring the documentation up to "
             "date with it: the specification index and the notes it lists that this change affects. Describe "
             "the behaviour as implemented and the commands that verify it (the gates above). You may change "
             f"only these paths: {', '.join(paths)}; any other change stops the run. If a note is missing, "
             "create it and list it in the index.", ""]
    lines += _knowledge_base(run.worktree, pipeline, paths)
    lines += ["", "## The verified change (against the stage's starting checkpoint)", "```diff",
              patch.rstrip() or "(empty)", "```"]
    return "\n".join(lines) + "\n"


def _knowledge_base(worktree: str, pipeline: dict, paths: list[str], limit: int = 200_000) -> list[str]:
    """The notes under the documentation paths, each as a section (cut at ``limit`` bytes in all)."""
    index = pipeline.get("spec_index")
    notes = sorted(e for e in _tracked_and_new(worktree) if globs.matches(e, paths) and e != index
                   and e.endswith((".md", ".rst", ".txt")))
    lines, used = ["### The knowledge base" + (f" (index: {index})" if index else "")], 0
    for rel in notes:
        try:
            text = context.read_inside(worktree, rel, required=False) or ""
        except context.ContextError:
            continue
        if used + len(text) > limit:
            lines.append(f"- {rel} (not included: the knowledge base passed {limit} bytes; read it yourself)")
            continue
        used += len(text)
        lines += [f"#### {rel}", text.strip()]
    return lines if len(lines) > 1 else lines + ["(no notes yet)"]


def _tracked_and_new(worktree: str) -> list[str]:
    out = workspace.git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], worktree).stdout
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def _repair_section(run: Run, stage: StageRun, plan: dict, start: dict) -> str:
    """What a repair session is told: the defect, its evidence, and the current patch."""
    defect = stage.last_defect or {}
    allowance = stage.spec.get("repair_allowance", 0)
    lines = ["", f"## Repair {stage.repairs_used} of {allowance}: what failed",
             "A fresh session: the files below are the current attempt's; fix the defect without weakening any "
             "check (protected files and gate commands cannot change).", "", defect.get("message", "")]
    evidence = defect.get("evidence") or {}
    if evidence.get("check"):
        check = Check.objects.filter(pk=evidence["check"]).first()
        if check is not None and check.log_path:
            tail = process.tail_text(var_path(check.log_path), 16 * 1024)
            lines += ["", f"### Output of `{check.command}` (exit {check.exit_code}; last 16 KiB)", "```",
                      tail.rstrip(), "```"]
    for finding in evidence.get("findings") or []:
        where = finding.get("file") or "(general)"
        if finding.get("line"):
            where += f":{finding['line']}"
        lines.append(f"- [{finding.get('severity')}] {where}: {finding.get('text')}")
    patch_rel = control_path(run, plan["folder"], "current.diff")
    workspace.write_patch(run.worktree, stage.base_commit, start["tree"], str(var_path(patch_rel)))
    patch = var_path(patch_rel).read_text(encoding="utf-8", errors="replace")
    if len(patch) > 100_000:
        patch = patch[:100_000] + "\n[... cut; read the files for the rest]\n"
    lines += ["", "### The current patch (against the stage's starting checkpoint)", "```diff",
              patch.rstrip() or "(empty)", "```"]
    return "\n".join(lines) + "\n"


def _run_gate(run: Run, stage: StageRun, gate: dict, kind: str, digest_before: str, env: dict, should_stop,
              round_no: int, cwd: str | None = None, lease: str | None = None) -> Check:
    """Run one frozen gate command with ``bash -eo pipefail -c`` in the worktree (or ``cwd``) and record a Check.

    ``lease``: the step's fencing token; a gate whose lease is gone by the time it starts is
    stopped at once (LeaseLost)."""
    argv = ["bash", "-eo", "pipefail", "-c", gate["command"]]
    cwd = cwd or run.worktree
    if gate.get("network_allow"):  # the only hosts this gate reaches, through its own egress proxy
        with egress({"network_allow": gate["network_allow"]}, deny=boundary.service_addresses()) as (proxy, policy):
            check = _run_gate_in(run, stage, gate, kind, digest_before, argv, cwd, env, should_stop, lease, policy)
        record = network_record(proxy)
        Check.objects.filter(pk=check.pk).update(network=record)
        if record["refused"] and lease:
            with transaction.atomic():
                if _fenced(run.pk, lease) is not None:
                    machine.event(run, "network_refused",
                                  f"Check '{gate['name']}' tried to reach what its network_allow does not name: "
                                  f"{_hosts_sentence(record['refused'])}. Its egress proxy refused each.",
                                  stage=stage, gate_check=check, data={"refused": record["refused"][:50]})
        return check
    return _run_gate_in(run, stage, gate, kind, digest_before, argv, cwd, env, should_stop, lease, None)


def _run_gate_in(run: Run, stage: StageRun, gate: dict, kind: str, digest_before: str, argv: list[str], cwd: str,
                 env: dict, should_stop, lease: str | None, network) -> Check:
    """``_run_gate`` inside the sandbox, with ``network`` (a NetworkPolicy) or none."""
    env, launch = _gate_sandbox(run, argv, cwd, env, network)
    try:
        return _run_gate_process(run, stage, gate, kind, digest_before, argv, cwd, env, launch, should_stop, lease)
    finally:
        shutil.rmtree(env["HOME"], ignore_errors=True)


def _run_gate_process(run: Run, stage: StageRun, gate: dict, kind: str, digest_before: str, argv: list[str],
                      cwd: str, env: dict, launch: list[str], should_stop, lease: str | None) -> Check:
    """Record the Check, run ``launch`` under supervision, and fill the Check in."""
    check = Check.objects.create(
        run=run, stage=stage, kind=kind, name=gate["name"], command=gate["command"], argv=argv, cwd=cwd,
        started_at=timezone.now(), manifest_digest=digest_before,
    )
    log_rel = control_path(run, "checks", f"{check.pk:05d}-{gate['name']}.log")
    check.log_path = log_rel  # recorded before it runs: a running gate's log can be followed
    check.save(update_fields=["log_path"])
    deadline = float(gate.get("deadline") or run.definition["pipeline"]["deadlines"]["gate"])
    try:
        result = process.run_supervised(
            launch, cwd=cwd, env=env, deadline_seconds=deadline, log_path=str(var_path(log_rel)),
            redactor=Redactor(secret_env_values(env)), marker=f"{process_marker_prefix(run)}check-{check.pk}",
            should_stop=should_stop, grace_seconds=5.0, on_start=_lease_guard(run.pk, lease) if lease else None,
        )
    except LeaseLost:
        Check.objects.filter(pk=check.pk).update(failure_kind="cancelled", ended_at=timezone.now())
        raise
    if launch is not argv and result.signal is None and result.exit_code is not None and result.exit_code > 128:
        # bubblewrap reports a command killed by signal N as exit 128 + N
        result.signal, result.exit_code = result.exit_code - 128, None
    failure = ""
    if result.missing_executable:
        failure = "missing_executable"
    elif result.timed_out:
        failure = "timeout"
    elif result.cancelled:
        failure = "cancelled"
    elif result.signal is not None:
        failure = "killed"
    elif result.exit_code == 127:
        failure = "command_not_found"
    elif result.exit_code != 0:
        failure = "nonzero_exit"
    check.log_path = log_rel
    check.ended_at = timezone.now()
    check.elapsed_seconds = result.elapsed_seconds
    check.exit_code = result.exit_code
    check.signal = result.signal
    check.passed = result.exit_code == 0 and not result.timed_out and not result.cancelled
    check.failure_kind = failure
    check.save()
    return check


def _gate_sandbox(run: Run, argv: list[str], cwd: str, env: dict, network=None) -> tuple[dict, list[str]]:
    """The environment and argument array of a gate: inside the agents' bubblewrap sandbox.

    A gate runs code an agent wrote, so it gets what an agent gets (engine/agents/sandbox.py):
    an allow-listed view (system folders, the Python install and PATH folders read-only), ``cwd``
    (the worktree or the final checkout), the run's TMPDIR and data folder and a fresh HOME of its
    own writable (``gate-home-*``, removed after the check: what one gate's code leaves there, a
    ``.pth`` file in the user site folder or a ``.gitconfig``, never reaches the next gate), its own PID namespace (nothing it starts outlives it) and its own network
    namespace with no way out: loopback only, where two runs' gates may bind the same port. The
    run's protected files are bound read-only in ``cwd`` (``_protected_in``).
    ``network``: a gate with ``network_allow`` gets its egress proxy's NetworkPolicy (those hosts only).

    Raises boundary.BoundaryNotEnforced when no sandbox can be made, or the self-check finds a
    Control Panel service reachable from inside: a gate never runs unguarded.
    """
    boundary.self_check()
    home = Path(tempfile.mkdtemp(prefix="gate-home-", dir=Path(scratch_dirs(run.pk)["tmp"]).parent))
    remove_bytecode(cwd)
    env = {**env, "HOME": str(home), **(network.env() if network is not None else {})}
    writable = [cwd, env["TMPDIR"], env["CP_DATA_DIR"], str(home)]
    visible = sandbox.git_dirs(cwd) + sandbox.tool_paths(env.get("PATH"))
    read_only = [os.path.join(cwd, ".git"), *_protected_in(run, cwd)]
    return env, sandbox.wrap(argv, writable=writable, read_only=read_only,
                             hide=sandbox.private_paths(str(settings.VAR_DIR)), visible=visible, network=network)


#: Protected files bound read-only one by one while a gate runs, at most (each is three bwrap
#: arguments; a command line has a size limit).
MAX_BOUND_PROTECTED = 4000


def remove_bytecode(top: str) -> int:
    """Remove every ``__pycache__`` folder and ``*.pyc``/``*.pyo`` file under ``top`` (not in its
    ``.git``, following no symlink); returns how many were removed.

    Called before every gate: bytecode is excluded from manifests (never a deliverable, never
    seen by the tamper checks), and Python runs a ``.pyc`` whose header matches a source file's
    size and mtime instead of that source, or a sourceless ``x.pyc`` as module ``x``: an agent
    (or an earlier gate's code) could plant one for a protected helper.
    """
    removed = 0
    for folder, dirs, files in os.walk(top, followlinks=False):
        if folder == top and ".git" in dirs:
            dirs.remove(".git")
        for name in list(dirs):
            if name == "__pycache__":
                dirs.remove(name)
                path = os.path.join(folder, name)
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)
                removed += 1
        for name in files:
            if name.endswith((".pyc", ".pyo")) or name == "__pycache__":
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
                removed += 1
    return removed


def _protected_in(run: Run, cwd: str) -> list[str]:
    """The run's protected files as they lie in ``cwd``, to be bound read-only while a gate runs:
    code a gate runs (the agent's) must not rewrite a protected test before the runner reads it
    (and put it back after, out of the manifests' sight). Regular files only, whose real path is
    inside ``cwd``: a symlink, or a file reached through one, is never bound (the tamper checks
    report what changed)."""
    top = os.path.realpath(cwd)
    found = []
    # the records the patterns or a gate name first, then the folder rule's: past the cap, the
    # manifests before and after the gates still see a change (only a rewrite put back unseen)
    records = sorted(run.protected_files or [], key=lambda r: not r["why"].startswith(("matches", "named", "read by")))
    for record in records[:MAX_BOUND_PROTECTED]:
        path = os.path.join(top, record["path"])
        real = os.path.realpath(path)
        if real == path and real.startswith(top + os.sep) and os.path.isfile(path) and not os.path.islink(path):
            found.append(path)
    return found


def _execute_verify(plan: dict, should_stop) -> dict:
    """Run the baseline checks and the stage's gates until they ran on one unchanged artifact.

    A gate that changes the files (or anything else that does) makes passing results belong to
    the old manifest: they are marked stale and every gate runs again on the new one, up to 3
    rounds. A failed gate ends verification at once: a failure is never re-run away.
    """
    stage = _stage_row(plan)
    run = stage.run
    pipeline = run.definition["pipeline"]
    gates = [(g, Check.Kind.BASELINE) for g in pipeline.get("baseline_checks") or []]
    gates += [(g, Check.Kind.GATE) for g in stage.spec.get("gates") or []]
    env = run_env(run, stage.key)
    excludes = manifest_excludes(run)
    for round_no in range(1, 4):
        before = workspace.manifest(run.worktree, stage.base_commit, excludes)
        manifest_row = save_manifest(run, stage, before)
        tamper = _tamper(run, before, f"stages/{stage.order + 1:02d}-{stage.key}/verify",
                         secret_env_values(env))
        if tamper is not None:  # a weakened check never runs: its result could not be trusted
            return {"tamper": tamper, "checks": [], "digest": before["digest"]}
        outward = workspace.outward_symlinks(run.worktree, before["changes"])
        if outward:
            return {"outward": outward, "checks": [], "digest": before["digest"]}
        checks = []
        for gate, kind in gates:
            check = _run_gate(run, stage, gate, kind, before["digest"], env, should_stop, round_no,
                              lease=plan["lease"])
            Check.objects.filter(pk=check.pk).update(manifest=manifest_row)
            checks.append(check.pk)
            if should_stop():
                return {"cancelled": True, "checks": checks}
            if not check.passed:
                # a failure stops the stage whatever the files are now: nothing to re-run for
                return {"digest": before["digest"], "checks": checks, "rounds": round_no}
        if workspace.manifest_digest(run.worktree, stage.base_commit, excludes) == before["digest"]:
            return {"digest": before["digest"], "checks": checks, "rounds": round_no,
                    "changed": [change["path"] for change in before["changes"]]}
        after = workspace.manifest(run.worktree, stage.base_commit, excludes)
        Check.objects.filter(pk__in=checks).update(stale=True)
        changed = _changed_paths(before, after)
        stray = globs.outside(changed, list(stage.spec["scope"]))
        if stray:  # no round can make these acceptable: stop now, deterministically
            return {"gates_wrote_outside": stray, "checks": checks, "digest": after["digest"]}
        with transaction.atomic():
            locked = _fenced(run.pk, plan["lease"])
            if locked is not None:
                machine.event(locked, "artifact_changed",
                              f"The files changed while the gates ran ({before['digest'][:12]} -> "
                              f"{after['digest'][:12]}: {', '.join(changed[:10])}); those results belong to the old "
                              f"files and every gate runs again. Gates should write logs under $TMPDIR, not into "
                              f"the worktree.", stage=stage, data={"changed": changed})
    return {"unstable": True, "checks": checks}


def _changed_paths(before: dict, after: dict) -> list[str]:
    """Paths whose blob or mode differs between two manifests of the same base."""
    old = {e["path"]: (e["mode"], e["blob"]) for e in before["entries"]}
    new = {e["path"]: (e["mode"], e["blob"]) for e in after["entries"]}
    return sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))


def _execute_checkpoint(plan: dict) -> dict:
    """Commit the stage's accepted files (once, found again after a crash), and copy the files it
    added to the protected set into the control records (``carried``: their records)."""
    outcome = _commit_checkpoint(plan)
    if outcome.get("commit"):
        stage = _stage_row(plan)
        run = stage.run
        outcome["carried"] = protected.carry_forward(
            run.repo_path, outcome["commit"], run.commit, list(run.definition["pipeline"]["protected_paths"]),
            run.protected_files or [],
            str(var_path(control_path(run, "protected", "index.json")).parent), stage.key)
    return outcome


def _lock_waiter(run: Run, plan: dict, what: str):
    """An ``on_wait`` callback for workspace's index operations: the first wait for a live
    ``index.lock`` holder is said on the run (when ``plan``'s lease still holds it)."""
    def on_wait(info: dict) -> None:
        holders = ", ".join(f"pid {h['pid']} ({h['name'] or '?'})" for h in info["holders"][:5]) or "a live process"
        with transaction.atomic():
            locked = _fenced(run.pk, plan["lease"])
            if locked is not None:
                machine.event(locked, "index_lock_wait",
                              f"git's index lock of the worktree ({info['path']}) is held by {holders}; {what} waits "
                              f"for it (up to {info['wait_seconds']:.0f} s) and tries again.",
                              stage_id=plan.get("stage_id"), data={"path": info["path"], "holders": info["holders"]})
    return on_wait


def _lock_wait_seconds(plan: dict) -> float:
    """Seconds the step of ``plan`` may still wait for git's index lock: CP_INDEX_LOCK_WAIT from the
    step's start (``plan["started"]``, a ``time.time()``), or all of it when the plan has none."""
    limit = float(settings.CP_INDEX_LOCK_WAIT)
    started = plan.get("started")
    return max(0.0, limit - (time.time() - started)) if started else limit


def _commit_checkpoint(plan: dict) -> dict:
    """Commit the stage's accepted files once and make the worktree's index agree with the commit.

    A commit found by the entry's journal trailer (an earlier try of this step committed and
    died) or by an earlier entry's (``_earlier_checkpoint``) is reused, and what its crash left
    undone is done now (``_settle_worktree``). A failure after the commit exists returns the
    commit with ``index_failure``: the commit is the truth, never abandoned."""
    stage = _stage_row(plan)
    run = stage.run
    entry = JournalEntry.objects.get(pk=plan["journal_id"])
    existing = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal", str(entry.uid))
    if existing:
        return _settle_worktree(run, stage, plan, existing, {"commit": existing, "created": False, "recovered": True})
    digest = workspace.manifest_digest(run.worktree, stage.base_commit, manifest_excludes(run))
    if digest != stage.accepted_manifest:
        return {"changed": True, "digest": digest}
    current = {"digest": digest, "tree": digest}  # the digest is the tree id of the deliverable files
    earlier = _earlier_checkpoint(run, stage, current["tree"])
    if earlier:  # an earlier checkpoint step committed these files and died before its journal said so
        return _settle_worktree(run, stage, plan, earlier, {"commit": earlier, "created": False, "recovered": True})
    faults.hit("checkpoint.before_commit")
    message = f"{run.pipeline_name}: stage {stage.key} (run {run.pk})\n\n{stage.spec['title'] or stage.key}"
    trailers = {"Control-Panel-Run": str(run.uid), "Control-Panel-Stage": stage.key,
                "Control-Panel-Journal": str(entry.uid), "Control-Panel-Manifest": current["digest"]}
    try:
        result = workspace.commit_checkpoint(
            run.worktree, run.branch, current["tree"], stage.base_commit, message, trailers,
            keep_agent_commits=f"refs/controlpanel/run-{run.pk}/stage-{stage.order + 1}-agent-commits",
            repo=run.repo_path, lock_wait=_lock_wait_seconds(plan),
            on_lock_wait=_lock_waiter(run, plan, "the checkpoint's index update"))
    except workspace.WorkspaceError as exc:
        try:  # git is the truth: a commit carrying the entry's id exists whatever failed after it
            made = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal", str(entry.uid))
        except workspace.WorkspaceError:
            made = None
        if made:
            return {"commit": made, "created": True,
                    "index_failure": {"failure_kind": exc.code, "failure_message": exc.message}}
        return {"failure_kind": exc.code, "failure_message": exc.message}
    faults.hit("checkpoint.after_commit")
    return {"commit": result["commit"], "created": result["created"]}


def _settle_worktree(run: Run, stage: StageRun, plan: dict, commit: str, outcome: dict) -> dict:
    """What a checkpoint that died after its commit left undone: the worktree's index reset to
    ``commit`` (``workspace.reset_index_to``, living with git's index lock) and its deliverable
    files put to the commit's when they differ (``restore``: the paths undone). A failure is
    returned as ``index_failure`` next to the commit."""
    wait = {"repo": run.repo_path, "on_wait": _lock_waiter(run, plan, "the recovered checkpoint's index reset")}
    try:
        workspace.reset_index_to(run.worktree, run.branch, commit, wait_seconds=_lock_wait_seconds(plan), **wait)
        tree = workspace.git(["rev-parse", f"{commit}^{{tree}}"], run.worktree).stdout.decode().strip()
        excludes = manifest_excludes(run)
        if workspace.manifest_digest(run.worktree, stage.base_commit, excludes) != tree:
            undone = workspace.restore_to(run.worktree, commit, excludes, repo=run.repo_path,
                                          lock_wait=_lock_wait_seconds(plan), on_lock_wait=wait["on_wait"])
            outcome["restored"] = [change["path"] for change in undone]
    except workspace.WorkspaceError as exc:
        outcome["index_failure"] = {"failure_kind": exc.code, "failure_message": exc.message}
    return outcome


def _earlier_checkpoint(run: Run, stage: StageRun, tree: str) -> str | None:
    """The branch tip when an earlier checkpoint step of this stage committed exactly ``tree``
    (found by its journal trailer), so that recovery never makes a second commit; else None."""
    tip = workspace.branch_tip(run.repo_path, run.branch)
    if not tip or tip == stage.base_commit:
        return None
    for entry in stage.journal.exclude(pk=None).order_by("-id"):
        found = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal", str(entry.uid))
        if found == tip and workspace.git(["rev-parse", f"{tip}^{{tree}}"], run.worktree).stdout.decode().strip() == tree:
            return tip
    return None


#: Errors of a step's machinery that an agent or a gate caused: the run stops with their own code.
_STOP_CODES = ("nested_repository", "boundary_not_enforced")


def crashed(plan: dict, exc: BaseException) -> dict:
    """The outcome of a step whose own machinery raised: infrastructure broke, not the agent; or
    a refusal an agent's files caused (a nested repository found by the manifest, a boundary the
    sandbox cannot enforce), whose code becomes the stop reason."""
    code = getattr(exc, "code", "") if isinstance(exc, workspace.WorkspaceError) else ""
    if isinstance(exc, boundary.BoundaryNotEnforced):
        code = "boundary_not_enforced"
    if code in _STOP_CODES:
        return {"crashed": True, "failure_kind": code, "stop_reason": code,
                "failure_message": getattr(exc, "message", str(exc))}
    return {"crashed": True, "failure_kind": "crashed", "failure_message": f"{type(exc).__name__}: {exc}"}


# ----------------------------------------------------------------------------- finish


def finish(run: Run, plan: dict, outcome: dict) -> None:
    """Record the outcome of a step on the locked ``run`` and move it on or stop it."""
    if plan["kind"] == "finish":
        _finish_final(run, plan, outcome)
        return
    stage = StageRun.objects.select_related("run").get(pk=plan["stage_id"])
    stage.run = run
    if outcome.get("crashed"):
        if plan.get("attempt_id"):
            machine.end_attempt_id(plan["attempt_id"], AttemptStatus.FAILED, failure_kind=outcome["failure_kind"],
                                   failure_message=storable(outcome["failure_message"]))
        if outcome.get("stop_reason"):
            machine.stop(run, outcome["stop_reason"], f"The {plan['kind']} step of stage '{stage.key}' was refused: "
                         f"{outcome['failure_message']}", stage=stage)
            return
        machine.stop(run, "crashed", f"The engine failed during the {plan['kind']} step of stage '{stage.key}': "
                     f"{outcome['failure_message']}", stage=stage)
        return
    FINISHERS[plan["kind"]](run, stage, plan, outcome)


def _finish_final(run: Run, plan: dict, outcome: dict) -> None:
    """Succeed only when every check passed on the final checkpoint; else stop naming what failed."""
    checkpoint = plan["checkpoint"]
    if outcome.get("crashed"):
        if outcome.get("stop_reason"):
            machine.stop(run, outcome["stop_reason"], f"The final verification was refused: {outcome['failure_message']}")
            return
        machine.stop(run, "crashed", f"The engine failed during the final verification: {outcome['failure_message']}")
        return
    if outcome.get("cancelled"):
        machine.stop(run, "interrupted", "The final verification was stopped before it finished.")
        return
    checks = list(Check.objects.filter(pk__in=outcome["checks"]).select_related("stage").order_by("id"))
    for check in checks:
        machine.event(run, "check_passed" if check.passed else "check_failed",
                      f"Final verification on {checkpoint[:12]}: " + _check_sentence(check), stage=check.stage,
                      gate_check=check)
    failed = [c for c in checks if not c.passed]
    if failed:
        names = ", ".join(f"'{c.name}' of stage '{c.stage.key}'" if c.stage else f"'{c.name}'" for c in failed)
        machine.stop(run, "final_verification_failed",
                     f"The whole result does not verify: {names} failed on the final checkpoint {checkpoint[:12]} "
                     f"({_check_sentence(failed[0])}) A later stage may have broken an earlier stage's gate.",
                     evidence={"checkpoint": checkpoint, "checks": [c.pk for c in failed],
                               "failed": [c.name for c in failed]})
        return
    machine.succeed(run)


#: Kept for callers of this module: engine/machine.py decides what a stored value may hold.
storable = machine.storable


def _apply_attempt_result(attempt: Attempt, outcome: dict) -> None:
    if not outcome.get("launched"):
        if attempt.log_path:
            with open(var_path(attempt.log_path), "a", encoding="utf-8") as log:
                log.write(f"[run-engine] not launched: {outcome['failure_kind']}: {outcome['failure_message']}\n")
        machine.end_attempt(attempt, AttemptStatus.FAILED, failure_kind=outcome["failure_kind"],
                            failure_message=storable(outcome["failure_message"]))
        return
    result = storable(outcome["result"])
    attempt.exit_code = result["exit_code"]
    attempt.signal = result["signal"]
    attempt.elapsed_seconds = result["elapsed_seconds"]
    attempt.usage = result["usage"]
    # what a CLI printed is cut to the column's size: a stray line must not fail the record
    attempt.session_id = (result["session_id"] or "")[:200]
    attempt.final_message = result["final_message"]
    attempt.cli_version = (result["cli_version"] or "")[:200]
    attempt.output_bytes = result["output_bytes"]
    attempt.redactions = result["redactions"] + outcome.get("prompt_redactions", 0)
    attempt.refusals = (result.get("extra") or {}).get("refusals") or []
    attempt.failure_message = result["failure_message"]
    attempt.patch_path = outcome["patch_path"]
    attempt.patch_sha256 = outcome["patch"]["sha256"]
    attempt.network = (result.get("extra") or {}).get("network")
    machine.end_attempt_for(attempt, result["failure_kind"])
    refused = (attempt.network or {}).get("refused") or []
    if refused:
        machine.event(attempt.run, "network_refused",
                      f"Attempt {attempt.number} ({attempt.operation}) tried {len(refused)} time(s) to reach what its "
                      f"network allow-list does not name, or a Control Panel service: {_hosts_sentence(refused)}. Its "
                      f"egress proxy refused each.", stage=attempt.stage, attempt=attempt,
                      data={"refused": refused[:50]})


def _hosts_sentence(refused: list[dict], shown: int = 10) -> str:
    """``host:port`` of the refusals, distinct and sorted, the first ``shown`` and how many more."""
    hosts = sorted({f"{item['host']}:{item['port']}" for item in refused})
    more = f" and {len(hosts) - shown} more (all on the attempt's network record)" if len(hosts) > shown else ""
    return ", ".join(hosts[:shown]) + more


def _refuse_attempt(evidence: dict, kind: str, message: str) -> None:
    """Record on the attempt named in ``evidence`` (if any) that its work was refused: its process may
    have exited 0, but the page shows it red, with ``kind``."""
    if evidence.get("attempt"):
        machine.refuse_attempt(evidence["attempt"], kind, message)


def _stop_tampered(run: Run, stage: StageRun, tamper: dict, who: str, evidence: dict) -> None:
    changes = tamper["changes"]
    text = protected.describe(changes)
    _refuse_attempt(evidence, "protected_files_changed", f"changed protected files: {text}")
    machine.event(run, "protected_files_changed",
                  f"{who} changed protected files: {text}. The diff against the protected copies is kept "
                  f"({tamper['report']}).", stage=stage, attempt_id=evidence.get("attempt"),
                  data={"changes": changes, "report": tamper["report"], "files": tamper.get("files")})
    machine.stop(run, "protected_files_changed",
                 f"Protected checks were changed, so no result can be accepted: {text}. Agents may add new test "
                 f"files but not change, delete, rename or chmod the agreed ones (nor those an earlier stage "
                 f"added), nor add a file that changes how the tests run (a conftest.py or runner configuration "
                 f"anywhere, a module shadowing one the tests import).",
                 stage=stage, evidence={**evidence, "changes": changes, "report": tamper["report"],
                                        "files": tamper.get("files")})


def _stop_outward(run: Run, stage: StageRun, links: list[dict], who: str, evidence: dict) -> None:
    """Stop the run ``external_symlink``: a link out of the worktree would reach, in a gate, a
    reviewer or a person's checkout, what the agent chose."""
    shown = "; ".join(f"{link['path']} -> {link['target']}" for link in links[:10])
    more = f" and {len(links) - 10} more" if len(links) > 10 else ""
    _refuse_attempt(evidence, "external_symlink", f"symlinks out of the worktree: {shown}{more}")
    machine.event(run, "external_symlink", f"{who} made symlinks that point out of the worktree: {shown}{more}.",
                  stage=stage, attempt_id=evidence.get("attempt"), data={"links": links[:100]})
    machine.stop(run, "external_symlink",
                 f"{who} left symlinks pointing out of the worktree ({shown}{more}). A checkpoint would carry them "
                 f"into every checkout of the branch, where gates and people would read what they point at; links "
                 f"must be relative and stay inside the repository.",
                 stage=stage, evidence={**evidence, "links": links[:100]})


def _finish_agent(run: Run, stage: StageRun, plan: dict, outcome: dict) -> None:
    attempt = Attempt.objects.get(pk=plan["attempt_id"])
    _apply_attempt_result(attempt, outcome)
    if outcome.get("nested"):
        shown = ", ".join(outcome["nested"][:10])
        machine.event(run, "nested_repository",
                      f"Attempt {attempt.number} ({attempt.operation}) left a git repository in the worktree "
                      f"({shown}); the engine ran no git on it.", stage=stage, attempt=attempt,
                      data={"paths": outcome["nested"]})
        _refuse_attempt({"attempt": attempt.pk}, "nested_repository", f"made a git repository in the worktree: {shown}")
        machine.stop(run, "nested_repository",
                     f"Attempt {attempt.number} ({attempt.operation}) made a git repository inside the worktree "
                     f"({shown}). The engine runs no git on what an agent made there (git would read that "
                     f"repository's configuration and could run what it names) and never checkpoints a gitlink an "
                     f"agent made. The worktree is kept as it was left.",
                     stage=stage, evidence={"attempt": attempt.pk, "paths": outcome["nested"]})
        return
    if outcome.get("tampered"):
        machine.stop(run, "workspace_tampered",
                     f"Attempt {attempt.number} rewrote the worktree's .git file, which ties it to the run's "
                     f"repository; the engine ran no git in it. The worktree is kept as it was left.",
                     stage=stage, evidence={"attempt": attempt.pk})
        return
    if outcome.get("launched"):
        manifest = save_manifest(run, stage, outcome["manifest"])
        attempt.result_manifest = manifest
        attempt.save(update_fields=["result_manifest"])
    evidence = {"attempt": attempt.pk}
    if attempt.status == AttemptStatus.TIMEOUT and plan.get("budget_cut"):
        budgets = run.definition["pipeline"].get("budgets") or {}
        machine.stop(run, "budget_exhausted",
                     f"Attempt {attempt.number} ({attempt.operation}) was stopped after {attempt.deadline_seconds:.0f} s, "
                     f"where the run's active-time budget ran out (budgets.max_active_seconds: "
                     f"{budgets.get('max_active_seconds')}). An exhausted budget needs a new run.",
                     stage=stage, evidence={**evidence, "budgets": budgets})
        return
    if outcome.get("tamper"):
        if outcome.get("outward"):  # both: the tamper report stops the run, the links are in its evidence too
            evidence = {**evidence, "links": outcome["outward"][:100]}
        _stop_tampered(run, stage, outcome["tamper"], f"Attempt {attempt.number} ({attempt.operation})", evidence)
        return
    if outcome.get("outward"):
        _stop_outward(run, stage, outcome["outward"], f"Attempt {attempt.number} ({attempt.operation})", evidence)
        return
    allowed = _role_scope(run, stage, plan["role"])
    stray = globs.outside(outcome.get("changed", []), allowed)
    if stray:
        machine.event(run, "scope_violation",
                      f"Attempt {attempt.number} ({attempt.operation}) changed files outside the {plan['role']}'s "
                      f"scope ({', '.join(allowed)}): {', '.join(stray[:20])}. The diff is kept with the attempt.",
                      stage=stage, attempt=attempt, data={"outside": stray})
        _refuse_attempt(evidence, "scope_violation", f"changed files outside its scope: {', '.join(stray[:10])}")
        machine.stop(run, "scope_violation",
                     f"The {plan['role']} changed {len(stray)} file(s) outside its scope: {', '.join(stray[:10])}.",
                     stage=stage, evidence={**evidence, "outside": stray})
        return
    if plan["operation"] == "review":
        _finish_review(run, stage, attempt, outcome)
        return
    if plan["operation"] == "document":
        _finish_document(run, stage, attempt, outcome)
        return
    if attempt.status != AttemptStatus.SUCCEEDED:
        what = {"workspace_branch_in_use": "the run's branch is checked out in another worktree",
                "missing_executable": "the agent's executable was not found"}.get(attempt.failure_kind, "")
        message = attempt.failure_message or what or f"attempt {attempt.number} ended {attempt.status}"
        machine.event(run, "attempt_failed",
                      f"Attempt {attempt.number} ({attempt.operation}) of stage '{stage.key}' ended "
                      f"{attempt.status} ({attempt.failure_kind}).", stage=stage, attempt=attempt)
        machine.stop(run, attempt.failure_kind or "crashed", message, stage=stage, evidence=evidence)
        return
    changes = outcome["manifest"]["changes"]
    machine.event(run, "attempt_done",
                  f"Attempt {attempt.number} ({attempt.operation}) of stage '{stage.key}' exited 0 after "
                  f"{attempt.elapsed_seconds:.1f} s and changed {len(changes)} file(s); its claim is not evidence, "
                  f"the gates decide.", stage=stage, attempt=attempt)
    if plan["operation"] == "repair":
        machine.repaired(stage)
    else:
        machine.implemented(stage)


def _finish_review(run: Run, stage: StageRun, attempt: Attempt, outcome: dict) -> None:
    """Record a reviewer's verdict and act on it: pass, repair (a defect) or escalate."""
    who = f"Reviewer '{attempt.profile_name}' (attempt {attempt.number})"
    if not outcome.get("launched"):  # the workspace, not the reviewer, is at fault (e.g. head_moved)
        machine.stop(run, attempt.failure_kind, f"{who} was not started: {attempt.failure_message}", stage=stage,
                     evidence={"attempt": attempt.pk})
        return
    if attempt.status != AttemptStatus.SUCCEEDED:
        machine.event(run, "attempt_failed", f"{who} ended {attempt.status} ({attempt.failure_kind}).",
                      stage=stage, attempt=attempt)
        machine.stop(run, "reviewer_unavailable",
                     f"{who} gave no verdict: it ended {attempt.status} ({attempt.failure_kind}): "
                     f"{attempt.failure_message or 'no message'}. No review, no acceptance.",
                     stage=stage, evidence={"attempt": attempt.pk, "failure_kind": attempt.failure_kind})
        return
    problem = outcome.get("verdict_problem")
    if problem:
        attempt.verdict_problem = storable(problem)
        attempt.save(update_fields=["verdict_problem"])
        machine.stop(run, "invalid_review", f"{who} did not answer a valid verdict: {problem}.", stage=stage,
                     evidence={"attempt": attempt.pk})
        return
    verdict = storable(outcome["verdict"])
    attempt.verdict = verdict
    attempt.save(update_fields=["verdict"])
    if outcome["manifest"]["digest"] != stage.accepted_manifest:
        machine.event(run, "artifact_changed", f"The files of stage '{stage.key}' changed during the review; "
                      f"they are verified again.", stage=stage, attempt=attempt)
        machine.reverify(stage)
        return
    findings = verdict.get("findings") or []
    listed = "; ".join(_finding_text(f) for f in findings[:10])
    kind = verdict["verdict"]
    if kind == "escalate":
        machine.stop(run, "review_escalated", f"{who} escalated to a person: {listed}", stage=stage,
                     evidence={"attempt": attempt.pk, "findings": findings})
        return
    if kind == "repair":
        _defect(run, stage, "review", attempt.profile_name, stage.accepted_manifest,
                f"{who} asked for a repair: {listed}", {"attempt": attempt.pk, "findings": findings})
        return
    failed = [name for name, passed in gate_results(stage, stage.accepted_manifest).items() if not passed]
    if failed:  # never reached through the step order; a verdict never overrides a failed command
        machine.stop(run, "gate_failed", f"{who} answered pass, but gate(s) {', '.join(failed)} did not pass on these "
                     f"files; a verdict never overrides a failed command.", stage=stage,
                     evidence={"attempt": attempt.pk})
        return
    remaining = [name for name in reviewers(run) if name not in _passed_reviewers(stage)]
    machine.event(run, "review_passed",
                  f"{who} passed files {stage.accepted_manifest[:12]}"
                  + (f"; still to review: {', '.join(remaining)}." if remaining else "; they go to the checkpoint."),
                  stage=stage, attempt=attempt, data={"verdict": verdict})
    if not remaining:
        machine.reviewed(run, stage)


def _finish_document(run: Run, stage: StageRun, attempt: Attempt, outcome: dict) -> None:
    """The documentation agent's attempt: a failure stops the run (docs_failed); changed docs are
    verified and reviewed again before the checkpoint."""
    if not outcome.get("launched"):
        machine.stop(run, attempt.failure_kind, f"The documentation agent was not started: {attempt.failure_message}",
                     stage=stage, evidence={"attempt": attempt.pk})
        return
    if attempt.status != AttemptStatus.SUCCEEDED:
        machine.stop(run, "docs_failed",
                     f"The documentation agent (attempt {attempt.number}) ended {attempt.status} "
                     f"({attempt.failure_kind}): {attempt.failure_message or 'no message'}. The verified files are "
                     f"kept; the stage is not checkpointed without current documentation.",
                     stage=stage, evidence={"attempt": attempt.pk, "failure_kind": attempt.failure_kind})
        return
    changed = outcome.get("changed") or []
    machine.event(run, "documented",
                  f"The documentation agent (attempt {attempt.number}) updated {', '.join(changed[:10])}; the checks "
                  f"and reviews run again on the updated files." if changed else
                  f"The documentation agent (attempt {attempt.number}) found the documentation current; nothing "
                  f"changed.", stage=stage, attempt=attempt, data={"changed": changed})
    machine.documented(run, stage, stage.accepted_manifest, bool(changed))


def _finding_text(finding: dict) -> str:
    where = finding.get("file") or "general"
    if finding.get("line"):
        where += f":{finding['line']}"
    return f"[{finding['severity']}] {where}: {finding['text']}"


def gate_results(stage: StageRun, digest: str) -> dict[str, bool]:
    """The latest non-stale result of each of the stage's gates on the files ``digest``;
    a gate that did not run on them counts as not passed."""
    pipeline = stage.run.definition["pipeline"]
    names = [g["name"] for g in pipeline.get("baseline_checks") or []] + [g["name"] for g in stage.spec["gates"]]
    results = {name: False for name in names}
    for check in stage.checks.filter(manifest_digest=digest, stale=False).order_by("id"):
        if check.name in results:
            results[check.name] = check.passed
    return results


def _defect(run: Run, stage: StageRun, kind: str, name: str, digest: str, message: str, evidence: dict) -> None:
    """A failed gate or a reviewer's ``repair``: a repair attempt, or a stop when none may help."""
    allowance = stage.spec.get("repair_allowance", 0)
    if kind == "gate" and allowance == 0:  # no repair may follow: the failed gate itself is the reason
        machine.stop(run, "gate_failed", f"{message} The stage allows no repairs (repair_allowance: 0).",
                     stage=stage, evidence=evidence)
        return
    decision = machine.defect(stage, kind, name, digest, message, evidence)
    if decision == machine.REPAIR:
        machine.event(run, "repair_needed",
                      f"{message} Repair {stage.repairs_used} of {allowance} starts a fresh session with this "
                      f"evidence; the checks run again afterwards.", stage=stage, data={"defect": kind, "name": name})
        return
    if decision == machine.UNCHANGED_FAILURE:
        machine.stop(run, "unchanged_failure",
                     f"The same failure again on unchanged files ({digest[:12]}): {message} Another repair would "
                     f"not help.", stage=stage, evidence={**evidence, "manifest": digest})
        return
    machine.stop(run, "repair_exhausted",
                 f"{message} The stage's repair allowance ({allowance}) is used up ({stage.repairs_used} repairs).",
                 stage=stage, evidence={**evidence, "manifest": digest})


def _finish_verify(run: Run, stage: StageRun, plan: dict, outcome: dict) -> None:
    checks = list(Check.objects.filter(pk__in=outcome.get("checks", [])).order_by("id"))
    if outcome.get("cancelled"):
        machine.stop(run, "interrupted", f"Verification of stage '{stage.key}' was stopped before it finished.",
                     stage=stage)
        return
    if outcome.get("unstable"):
        machine.stop(run, "artifact_unstable",
                     f"The files of stage '{stage.key}' kept changing while the gates ran (3 rounds); no result "
                     f"can be trusted.", stage=stage, evidence={"checks": [c.pk for c in checks]})
        return
    if outcome.get("tamper"):
        _stop_tampered(run, stage, outcome["tamper"], "Something between the agent's attempt and the gates",
                       {"manifest": outcome.get("digest")})
        return
    if outcome.get("outward"):
        _stop_outward(run, stage, outcome["outward"], "Something between the agent's attempt and the gates",
                      {"manifest": outcome.get("digest")})
        return
    if outcome.get("gates_wrote_outside"):
        stray = outcome["gates_wrote_outside"]
        machine.stop(run, "scope_violation",
                     f"While the gates of stage '{stage.key}' ran, files outside its scope "
                     f"({', '.join(stage.spec['scope'])}) changed: {', '.join(stray[:10])}. A gate writing into the "
                     f"worktree would put them in the checkpoint; write logs under $TMPDIR instead.",
                     stage=stage, evidence={"outside": stray, "checks": [c.pk for c in checks]})
        return
    for check in checks:
        machine.event(run, "check_passed" if check.passed else "check_failed", _check_sentence(check),
                      stage=stage, gate_check=check)
    failed = [c for c in checks if not c.passed]
    if failed:
        check = failed[0]
        evidence = {"check": check.pk, "gate": check.name, "manifest": check.manifest_digest}
        if check.failure_kind in ("missing_executable", "cancelled"):  # no repair can give the engine bash
            machine.stop(run, "gate_failed", _check_sentence(check), stage=stage, evidence=evidence)
            return
        _defect(run, stage, "gate", check.name, check.manifest_digest, _check_sentence(check), evidence)
        return
    allowed = list(stage.spec["scope"])
    if stage.documented_manifest:  # the documentation agent's changes are part of these files
        allowed += list(run.definition["pipeline"]["documentation_paths"])
    stray = globs.outside(outcome.get("changed", []), allowed)
    if stray:
        machine.stop(run, "scope_violation",
                     f"The verified files of stage '{stage.key}' include changes outside its scope "
                     f"({', '.join(allowed)}): {', '.join(stray[:10])}. Something other than the agent "
                     f"wrote them (a gate writing into the worktree?); they would land in the checkpoint.",
                     stage=stage, evidence={"outside": stray, "manifest": outcome["digest"]})
        return
    machine.event(run, "verified",
                  f"Every gate of stage '{stage.key}' exited 0 on files {outcome['digest'][:12]}; they go to "
                  f"the independent review.", stage=stage)
    machine.gates_passed(stage, outcome["digest"])
    if not [name for name in reviewers(run) if name not in _passed_reviewers(stage)]:
        # a recovery or recheck verified files every reviewer already passed: their verdicts stand
        machine.event(run, "review_passed", f"Every reviewer already passed files {outcome['digest'][:12]}; their "
                      f"verdicts stand for these same files.", stage=stage)
        machine.reviewed(run, stage)


def _role_scope(run: Run, stage: StageRun, role: str) -> list[str]:
    """The globs a role may change: the stage's scope for the implementer, the documentation
    paths for the documenter, nothing for the reviewer."""
    if role == "implementer":
        return list(stage.spec["scope"])
    if role == "documenter":
        return list(run.definition["pipeline"]["documentation_paths"])
    return []


def _check_sentence(check: Check) -> str:
    label = {"baseline": "Baseline check", "gate": "Gate"}.get(check.kind, "Check")
    if check.passed:
        return f"{label} '{check.name}' passed: `{check.command}` exited 0."
    reasons = {
        "command_not_found": f"`{check.command}` failed: command not found (exit 127)",
        "missing_executable": f"`{check.command}` could not start: bash was not found",
        "timeout": f"`{check.command}` passed its deadline and was killed",
        "killed": f"`{check.command}` was killed by signal {check.signal}",
        "cancelled": f"`{check.command}` was stopped because the run stopped",
    }
    why = reasons.get(check.failure_kind, f"`{check.command}` exited {check.exit_code}")
    return f"{label} '{check.name}' failed: {why}; only an exit status of 0 passes."


def _finish_checkpoint(run: Run, stage: StageRun, plan: dict, outcome: dict) -> None:
    entry = JournalEntry.objects.get(pk=plan["journal_id"])
    if outcome.get("changed"):
        machine.journal_abandoned(entry)
        machine.event(run, "artifact_changed",
                      f"The files of stage '{stage.key}' changed after verification (now {outcome['digest'][:12]}); "
                      f"they are verified again before any checkpoint.", stage=stage)
        machine.reverify(stage)
        return
    if outcome.get("failure_kind"):  # no commit carries the entry's id: git never made it
        machine.journal_abandoned(entry)
        machine.stop(run, outcome["failure_kind"], outcome["failure_message"], stage=stage,
                     evidence={"journal": entry.pk})
        return
    commit = outcome["commit"]
    if entry.state == JournalEntry.State.INTENT:
        machine.journal_done(entry, commit)
    # entries of earlier, crashed checkpoint steps of this stage: settled now, never searched again
    for old in stage.journal.filter(state=JournalEntry.State.INTENT).exclude(pk=entry.pk):
        found = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal", str(old.uid))
        if found:
            machine.journal_done(old, found)
        else:
            machine.journal_abandoned(old)
    problem = outcome.get("index_failure")
    if problem:  # committed, but the worktree's index could not be made to agree: a clear stop
        machine.stop(run, problem["failure_kind"],
                     f"Stage '{stage.key}' is committed as {commit[:12]} on {run.branch} (journal entry {entry.uid} "
                     f"done), but the worktree's index could not be reset to it: {problem['failure_message']} A "
                     f"recovery checkpoints the stage again, finds this commit and resets the index.",
                     stage=stage, evidence={"journal": entry.pk, "commit": commit})
        return
    how = "committed as" if outcome.get("created") else ("found already committed as" if outcome.get("recovered")
                                                          else "unchanged; reusing")
    restored = outcome.get("restored") or []
    note = (f" The worktree's index was reset to it; {len(restored)} file(s) differing from it were put back "
            f"({', '.join(restored[:8])})." if restored else
            " The worktree's index was reset to it." if outcome.get("recovered") else "")
    machine.event(run, "checkpoint",
                  f"Stage '{stage.key}' checkpoint {how} {commit[:12]} on {run.branch}.{note}", stage=stage,
                  data={"commit": commit, **({"restored": restored} if restored else {})})
    _carry_forward(run, stage, outcome.get("carried") or [])
    machine.checkpointed(stage, commit)


def _carry_forward(run: Run, stage: StageRun, carried: list[dict]) -> None:
    """The accepted stage's new protected files join the run's protected set (evidence: an event)."""
    known = {r["path"] for r in run.protected_files or []}
    carried = [r for r in carried if r["path"] not in known]
    if not carried:
        return
    run.protected_files = [*(run.protected_files or []), *carried]
    run.save(update_fields=["protected_files"])
    protected.save_index(str(var_path(control_path(run, "protected", "index.json")).parent), run.protected_files)
    shown = ", ".join(r["path"] for r in carried[:10]) + (f" and {len(carried) - 10} more" if len(carried) > 10 else "")
    machine.event(run, "protected_carried",
                  f"Stage '{stage.key}' added {len(carried)} file(s) to the protected checks, protected for the "
                  f"rest of the run: {shown}.", stage=stage,
                  data={"paths": [r["path"] for r in carried], "sha256": {r["path"]: r["sha256"] for r in carried}})


def record_late(run: Run, plan: dict, outcome: dict) -> None:
    """A result that arrived after the run moved on: kept as evidence, changes nothing."""
    if plan.get("attempt_id"):
        attempt = Attempt.objects.get(pk=plan["attempt_id"])
        if attempt.status in (AttemptStatus.PREPARING, AttemptStatus.RUNNING) and "launched" in outcome:
            _apply_attempt_result(attempt, outcome)
        attempt.late = True
        attempt.save(update_fields=["late"])
    result = outcome.get("result") or {}
    summary = {"step": plan["kind"], "attempt": plan.get("attempt_id"), "exit_code": result.get("exit_code"),
               "signal": result.get("signal"), "failure_kind": result.get("failure_kind") or outcome.get("failure_kind"),
               "checks": outcome.get("checks") or []}
    machine.event(run, "late_result",
                  f"A result of the {plan['kind']} step arrived after the run moved on "
                  f"({'it is being failed' if run.lease_owner.startswith('fail:') else 'it is ' + run.status}); it was "
                  f"stored as late and changed nothing.", data=storable(summary))


FINISHERS = {"implement": _finish_agent, "repair": _finish_agent, "review": _finish_agent, "document": _finish_agent,
             "verify": _finish_verify, "checkpoint": _finish_checkpoint}


def remove_scratch(run_id: int) -> None:
    """Remove the run's temporary folders (its worktree and control records stay)."""
    shutil.rmtree(Path(settings.VAR_DIR) / "scratch" / f"run-{run_id}", ignore_errors=True)


__all__ = ["definition_tampered", "begin", "execute", "finish", "crashed", "record_late", "run_env", "var_path", "save_manifest",
           "process_marker_prefix", "LeaseLost"]
