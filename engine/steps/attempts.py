"""An agent attempt, whatever its role: recorded before launch (``begin_attempt``), its worktree
prepared and its prompt written (engine/steps/prompts.py), the agent launched in the sandbox under
the lease guard (``execute_agent``), its result applied to the Attempt row, and the checks every
attempt's files pass before its step kind looks at them (``finish_attempt``): no nested
repository, an intact .git file, no protected file changed, no symlink out of the worktree,
nothing outside the role's scope."""
from __future__ import annotations

import os
import shutil
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from .. import boundary, context, environments, hosts, machine, workspace
from ..checks import globs, protected
from ..processes import limits
from ..agents import AgentRequest, get_adapter
from ..budgets import spent_by
from ..model_gateway import spend_of
from ..models import Attempt, AttemptStatus, Decision, Run, StageRun
from ..redaction import redact_text, secret_env_values
from ..simulation import simulation
from .common import (
    changed_paths,
    fenced,
    hosts_sentence,
    lease_guard,
    lock_waiter,
    manifest_excludes,
    save_manifest,
    stage_row,
    storable,
)
from . import agreed
from .gates import gate_commands
from .paths import (attempt_homes, control_path, process_marker_prefix, run_env, scratch_dirs, sha256_file,
                    var_path)
from .plans import AgentOutcome, AgentPlan, Tamper
from .prompts import build_prompt


def begin_attempt(run: Run, stage: StageRun, operation: str, role: str, lease: str,
                  profile_name: str | None = None) -> dict:
    """Record the Attempt of ``operation`` by ``role`` (its profile: ``profile_name`` or the role's)
    before anything launches, with its deadline (cut to what is left of the run's active-time
    budget) and its folder of control records; returns the plan's attempt keys (engine/steps/plans.py
    ``AgentPlan``)."""
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
        start_commit=stage.base_commit, lease_token=lease, host=hosts.this_host(),
        marker=f"{process_marker_prefix(run)}attempt-{number}-{lease[:8]}",
    )
    folder = f"stages/{stage.order + 1:02d}-{stage.key}/attempts/{number:03d}-{operation}"
    attempt.log_path = control_path(run, folder, "output.log")
    attempt.raw_path = control_path(run, folder, "output.raw")
    attempt.stderr_path = control_path(run, folder, "output.stderr")
    attempt.save()
    sim = f" (simulated: {why})" if why else ""
    machine.event(run, "attempt_intent",
                  f"Attempt {number} ({operation}) of stage '{stage.key}' recorded before launch with profile "
                  f"'{profile_name}'{sim}, deadline {deadline:.0f} s.", stage=stage, attempt=attempt)
    return {"attempt_id": attempt.pk, "operation": operation, "role": role, "profile": profile,
            "profile_name": profile_name, "operation_attempt": nth, "folder": folder,
            "budget_cut": deadline < configured}


def _prepare_workspace(run: Run, lease: str) -> dict:
    """Make sure the run's worktree exists on its branch (docs/field-cases.md C01, C02, C04 handled by workspace).

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
            locked = fenced(run.pk, lease)
            if locked is not None:
                locked.branch_created = True
                locked.save(update_fields=["branch_created", "updated_at"])
                machine.event(locked, "workspace",
                              f"Worktree {run.worktree} created on branch {run.branch} from {run.commit[:12]}.")
    elif info.get("created") or info.get("pruned_stale"):
        with transaction.atomic():
            locked = fenced(run.pk, lease)
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
                                  on_lock_wait=lock_waiter(run, {"lease": lease, "stage_id": stage.pk},
                                                           "the retry's reset of the worktree"))
    if undone:
        paths = ", ".join(c["path"] for c in undone[:8]) + (" ..." if len(undone) > 8 else "")
        with transaction.atomic():
            locked = fenced(run.pk, lease)
            if locked is not None:
                machine.event(locked, "workspace",
                              f"Retry (decision {decision.pk}): the worktree was put back to the stage's start "
                              f"{stage.base_commit[:12]} before attempt {attempt.number}; {len(undone)} file(s) left "
                              f"by earlier attempts were undone ({paths}); their patches keep them.",
                              stage=stage, attempt=attempt, decision=decision)


def execute_agent(plan: AgentPlan, should_stop) -> AgentOutcome:
    """Prepare the worktree, write the prompt, launch the agent under the lease guard and look at
    what it left: the .git file, nested repositories (both before any git reads the files), then
    the manifest, the patch, protected files and outward symlinks."""
    stage = stage_row(plan)
    run = stage.run
    attempt = Attempt.objects.get(pk=plan["attempt_id"])
    try:
        _prepare_workspace(run, plan["lease"])
        run.refresh_from_db()
        if plan["operation"] == "implement":
            _reset_for_retry(run, stage, attempt, plan["lease"])
        start = workspace.manifest(run.worktree, stage.base_commit, manifest_excludes(run))
        prompt = build_prompt(run, stage, plan, start)
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
    scratch_dirs(run.pk)
    home_dir = str(attempt_homes(run.pk) / f"attempt-{attempt.number:03d}")
    env = {**run_env(run, stage.key), **boundary.credential_env(plan["profile"]["adapter"], profile=plan["profile"])}
    if plan["role"] == "reviewer":
        # a reviewer writes nothing another role reads: its TMPDIR and data folder are its own,
        # inside its HOME, gone with it
        env.update({"TMPDIR": os.path.join(home_dir, "tmp"), "CP_TMP_DIR": os.path.join(home_dir, "tmp"),
                    "CP_DATA_DIR": os.path.join(home_dir, "data")})
    try:  # the setup's environment: read-only, first on PATH (engine/environments.py)
        env, binds = environments.apply_to(run, env, run.worktree)
    except environments.EnvironmentMissing as exc:
        return {"failure_kind": "crashed", "launched": False,
                "failure_message": f"The agent was not launched: {exc}. Recover the run: its setup step makes it again."}
    secrets = secret_env_values(env)
    prompt, prompt_redactions = redact_text(prompt, secrets)
    prompt_rel = control_path(run, plan["folder"], "prompt.md")
    var_path(prompt_rel).write_text(prompt, encoding="utf-8")
    now = timezone.now()
    with transaction.atomic():
        if fenced(run.pk, plan["lease"]) is None:
            return {"failure_kind": "cancelled", "failure_message": "The lease was lost before launch.",
                    "launched": False}
        machine.attempt_launched(
            attempt.pk, start_manifest=start["digest"], prompt_path=prompt_rel,
            prompt_sha256=sha256_file(var_path(prompt_rel)), started_at=now,
            deadline_at=now + timedelta(seconds=attempt.deadline_seconds),
        )

    guard = lease_guard(run.pk, plan["lease"])

    def on_start(pid: int, create_time: float) -> None:
        Attempt.objects.filter(pk=attempt.pk).update(pid=pid, pid_create_time=create_time)
        guard(pid, create_time)

    def on_usage(usage: dict, spend: dict) -> None:  # the model gateway's meter, live on the run's pages
        Attempt.objects.filter(pk=attempt.pk, ended_at=None).update(usage=usage, spend=spend)

    adapter = get_adapter(plan["profile"]["adapter"])
    control_dir = str(var_path(control_path(run, plan["folder"], "adapter")).parent)
    request = AgentRequest(
        role=plan["role"], operation=plan["operation"], prompt=prompt, workspace=run.worktree,
        profile=plan["profile"], deadline_seconds=attempt.deadline_seconds,
        log_path=str(var_path(attempt.log_path)), raw_path=str(var_path(attempt.raw_path)), env=env,
        stage_key=stage.key, attempt_number=attempt.number, control_dir=control_dir,
        operation_attempt=plan["operation_attempt"], marker=attempt.marker, secrets=secrets,
        should_stop=should_stop, on_start=on_start, on_usage=on_usage, prompt_path=str(var_path(prompt_rel)),
        home_dir=home_dir, deny_addresses=boundary.service_addresses(), binds=binds,
        stderr_path=str(var_path(attempt.stderr_path)) if attempt.stderr_path else "",
        limits=limits.effective(run.definition["pipeline"].get("limits")),
        spend={"budgets": run.definition["pipeline"].get("budgets") or {},
               "before": spent_before(run, stage, attempt), "stall": run.definition["pipeline"].get("stall") or {}},
    )
    git_file = Path(run.worktree, ".git")
    git_link = git_file.read_bytes() if git_file.is_file() else None
    try:
        result = adapter.run(request)
        if adapter.bounds is not None:  # what bounded the process tree (engine/processes/limits.py)
            result.extra = {**result.extra, "limits": adapter.bounds}
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
    outcome["changed"] = changed_paths(start, after)
    patch_rel = control_path(run, plan["folder"], "patch.diff")
    patch = workspace.write_patch(run.worktree, stage.base_commit, after["tree"], str(var_path(patch_rel)))
    outcome.update({"manifest": after, "patch_path": patch_rel, "patch": patch})
    outcome["tamper"] = tamper_report(run, after, plan["folder"], secrets)
    if outcome["tamper"] is not None:  # which agreed tests the changed files would take away, by id
        outcome["tamper"]["dropped"] = agreed.dropped(run, stage, after["tree"], plan["folder"], run_env(run, stage.key),
                                                      should_stop, plan["lease"])
    outcome["outward"] = workspace.outward_symlinks(run.worktree, after["changes"])
    return outcome


def spent_before(run: Run, stage: StageRun, attempt: Attempt) -> dict:
    """What the run and ``stage`` spent in their attempts before ``attempt`` (``spent_by`` each, summed), for
    the meter of its model gateway (engine/model_gateway/meter.py)."""
    totals = {"run": {"tokens": 0, "cost_usd": 0.0, "unpriced_calls": 0},
              "stage": {"tokens": 0, "cost_usd": 0.0, "unpriced_calls": 0}}
    for key, value in ((run.carried or {}).get("spent") or {}).items():  # the runs this one continues
        totals["run"][key] = totals["run"].get(key, 0) + (value or 0)
    for earlier in run.attempts.exclude(pk=attempt.pk).only("usage", "spend", "stage_id", "simulated"):
        spent = spent_by(earlier)
        for level in (("run", "stage") if earlier.stage_id == stage.pk else ("run",)):
            for key, value in spent.items():
                totals[level][key] += value
    return totals


def tamper_report(run: Run, current: dict, folder: str, secrets: list[str]) -> Tamper | None:
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
    for change in changes:  # a protected test module changed: the agreed tests it held, by id
        held = protected.held_tests(snapshot_dir, change["path"]) if change["change"] != "added" else []
        if held:
            change["tests"] = held
    return {"changes": changes, "report": report_rel, "files": report_rel[:-len(".diff")] + ".json"}


def apply_attempt_result(attempt: Attempt, outcome: AgentOutcome) -> None:
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
    attempt.structured = result.get("structured")
    attempt.cli_version = (result["cli_version"] or "")[:200]
    attempt.output_bytes = result["output_bytes"]
    attempt.redactions = result["redactions"] + outcome.get("prompt_redactions", 0)
    attempt.refusals = (result.get("extra") or {}).get("refusals") or []
    attempt.failure_message = result["failure_message"]
    attempt.patch_path = outcome["patch_path"]
    attempt.patch_sha256 = outcome["patch"]["sha256"]
    attempt.network = (result.get("extra") or {}).get("network")
    attempt.limits = (result.get("extra") or {}).get("limits")
    attempt.gateway = (result.get("extra") or {}).get("gateway")
    attempt.spend = spend_of(attempt.gateway, attempt.usage, attempt.simulated)
    machine.end_attempt_for(attempt, result["failure_kind"])
    refused = (attempt.network or {}).get("refused") or []
    if refused:
        machine.event(attempt.run, "network_refused",
                      f"Attempt {attempt.number} ({attempt.operation}) tried {len(refused)} time(s) to reach what its "
                      f"network allow-list does not name, or a Control Panel service: {hosts_sentence(refused)}. Its "
                      f"egress proxy refused each.", stage=attempt.stage, attempt=attempt,
                      data={"refused": refused[:50]})


def refuse_attempt(evidence: dict, kind: str, message: str) -> None:
    """Record on the attempt named in ``evidence`` (if any) that its work was refused: its process may
    have exited 0, but the page shows it red, with ``kind``."""
    if evidence.get("attempt"):
        machine.refuse_attempt(evidence["attempt"], kind, message)


def stop_tampered(run: Run, stage: StageRun, tamper: Tamper, who: str, evidence: dict) -> None:
    changes = tamper["changes"]
    text = protected.describe(changes)
    dropped = tamper.get("dropped") or {}
    refuse_attempt(evidence, "protected_files_changed", f"changed protected files: {text}")
    machine.event(run, "protected_files_changed",
                  f"{who} changed protected files: {text}. The diff against the protected copies is kept "
                  f"({tamper['report']}).", stage=stage, attempt_id=evidence.get("attempt"),
                  data={"changes": changes, "report": tamper["report"], "files": tamper.get("files")})
    machine.stop(run, "protected_files_changed",
                 f"Protected checks were changed, so no result can be accepted: {text}. Agents may add new test "
                 f"files but not change, delete, rename or chmod the agreed ones (nor those an earlier stage "
                 f"added), nor add a file that changes how the tests run (a conftest.py or runner configuration "
                 f"anywhere, a module shadowing one the tests import)." + agreed.dropped_sentence(dropped),
                 stage=stage, evidence={**evidence, "changes": changes, "report": tamper["report"],
                                        "files": tamper.get("files"), "dropped": dropped})


def stop_outward(run: Run, stage: StageRun, links: list[dict], who: str, evidence: dict) -> None:
    """Stop the run ``external_symlink``: a link out of the worktree would reach, in a gate, a
    reviewer or a person's checkout, what the agent chose."""
    shown = "; ".join(f"{link['path']} -> {link['target']}" for link in links[:10])
    more = f" and {len(links) - 10} more" if len(links) > 10 else ""
    refuse_attempt(evidence, "external_symlink", f"symlinks out of the worktree: {shown}{more}")
    machine.event(run, "external_symlink", f"{who} made symlinks that point out of the worktree: {shown}{more}.",
                  stage=stage, attempt_id=evidence.get("attempt"), data={"links": links[:100]})
    machine.stop(run, "external_symlink",
                 f"{who} left symlinks pointing out of the worktree ({shown}{more}). A checkpoint would carry them "
                 f"into every checkout of the branch, where gates and people would read what they point at; links "
                 f"must be relative and stay inside the repository.",
                 stage=stage, evidence={**evidence, "links": links[:100]})


def finish_attempt(run: Run, stage: StageRun, plan: AgentPlan, outcome: AgentOutcome) -> Attempt | None:
    """Apply an agent attempt's result to its row and check its files the same way for every
    role: no nested repository, an intact .git file, the active-time budget, no protected file
    changed, no symlink out of the worktree, nothing outside the role's scope. Returns the
    Attempt when every check passed (its step kind decides what follows), None when the run was
    stopped."""
    attempt = Attempt.objects.get(pk=plan["attempt_id"])
    apply_attempt_result(attempt, outcome)
    if outcome.get("nested"):
        shown = ", ".join(outcome["nested"][:10])
        machine.event(run, "nested_repository",
                      f"Attempt {attempt.number} ({attempt.operation}) left a git repository in the worktree "
                      f"({shown}); the engine ran no git on it.", stage=stage, attempt=attempt,
                      data={"paths": outcome["nested"]})
        refuse_attempt({"attempt": attempt.pk}, "nested_repository", f"made a git repository in the worktree: {shown}")
        machine.stop(run, "nested_repository",
                     f"Attempt {attempt.number} ({attempt.operation}) made a git repository inside the worktree "
                     f"({shown}). The engine runs no git on what an agent made there (git would read that "
                     f"repository's configuration and could run what it names) and never checkpoints a gitlink an "
                     f"agent made. The worktree is kept as it was left.",
                     stage=stage, evidence={"attempt": attempt.pk, "paths": outcome["nested"]})
        return None
    if outcome.get("tampered"):
        machine.stop(run, "workspace_tampered",
                     f"Attempt {attempt.number} rewrote the worktree's .git file, which ties it to the run's "
                     f"repository; the engine ran no git in it. The worktree is kept as it was left.",
                     stage=stage, evidence={"attempt": attempt.pk})
        return None
    if outcome.get("launched"):
        manifest = save_manifest(run, stage, outcome["manifest"])
        attempt.result_manifest = manifest
        attempt.save(update_fields=["result_manifest"])
    evidence = {"attempt": attempt.pk}
    if attempt.failure_kind == "budget_reached":  # the model gateway kept a call from crossing a cap
        meter = (attempt.gateway or {}).get("meter") or {}
        said = (f"was stopped by its model gateway: {attempt.failure_message.removeprefix('A model call was not sent: ').rstrip('.')}. "
                "That call was not sent. Its patch and conversation are kept" if outcome.get("launched") else
                f"was not launched: {attempt.failure_message.removeprefix('Not launched: ').rstrip('.')}")
        machine.stop(run, "budget_reached",
                     f"Attempt {attempt.number} ({attempt.operation}) {said}. An exhausted budget needs a new run with a "
                     f"raised budget (Continue with a raised budget), or fail this one.",
                     stage=stage, evidence={**evidence, "meter": meter,
                                            "budgets": run.definition["pipeline"].get("budgets") or {}})
        return None
    if attempt.status == AttemptStatus.TIMEOUT and plan.get("budget_cut"):
        budgets = run.definition["pipeline"].get("budgets") or {}
        machine.stop(run, "budget_exhausted",
                     f"Attempt {attempt.number} ({attempt.operation}) was stopped after {attempt.deadline_seconds:.0f} s, "
                     f"where the run's active-time budget ran out (budgets.max_active_seconds: "
                     f"{budgets.get('max_active_seconds')}). An exhausted budget needs a new run.",
                     stage=stage, evidence={**evidence, "budgets": budgets})
        return None
    if outcome.get("tamper"):
        if outcome.get("outward"):  # both: the tamper report stops the run, the links are in its evidence too
            evidence = {**evidence, "links": outcome["outward"][:100]}
        stop_tampered(run, stage, outcome["tamper"], f"Attempt {attempt.number} ({attempt.operation})", evidence)
        return None
    if outcome.get("outward"):
        stop_outward(run, stage, outcome["outward"], f"Attempt {attempt.number} ({attempt.operation})", evidence)
        return None
    allowed = _role_scope(run, stage, plan["role"])
    stray = globs.outside(outcome.get("changed", []), allowed)
    if stray:
        machine.event(run, "scope_violation",
                      f"Attempt {attempt.number} ({attempt.operation}) changed files outside the {plan['role']}'s "
                      f"scope ({', '.join(allowed)}): {', '.join(stray[:20])}. The diff is kept with the attempt.",
                      stage=stage, attempt=attempt, data={"outside": stray})
        refuse_attempt(evidence, "scope_violation", f"changed files outside its scope: {', '.join(stray[:10])}")
        machine.stop(run, "scope_violation",
                     f"The {plan['role']} changed {len(stray)} file(s) outside its scope: {', '.join(stray[:10])}.",
                     stage=stage, evidence={**evidence, "outside": stray})
        return None
    return attempt


def _role_scope(run: Run, stage: StageRun, role: str) -> list[str]:
    """The globs a role may change: the stage's scope for the implementer, the documentation
    paths for the documenter, nothing for the reviewer."""
    if role == "implementer":
        return list(stage.spec["scope"])
    if role == "documenter":
        return list(run.definition["pipeline"]["documentation_paths"])
    return []
