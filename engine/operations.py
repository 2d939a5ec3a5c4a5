"""The public verbs of the Run Engine, one per spec heading.

Admin actions, views, the API and management commands call these and nothing else. Each
validates its inputs and raises ``OperationError`` (a stable ``code``, the ``field`` at fault,
a sentence) without leaving anything half done.
"""
from __future__ import annotations

import os
import shutil
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from . import answers, diff_comments, hosts, machine, reconcile, record, runner, workspace
from .checks import protected
from .steps import gate_results
from .steps.common import role_profiles
from .agents import adapters, executables
from .models import (
    RUN_STOPPED,
    RUN_TERMINAL,
    Decision,
    Host,
    Pipeline,
    Profile,
    Run,
    RunStatus,
    StageRun,
    StartRequest,
    Worker,
)
from .diff_comments import parse_comment  # the commands' and the page's form read it here
from .pipeline.format import PipelineFormatError, load_file
from .agents.cli_options import extra_args_problems
from .redaction import redact_text
from .text import hints

ROLES = ("implementer", "reviewer", "documenter")


class OperationError(Exception):
    """A refused operation: ``code`` (stable), ``field`` (the input at fault or ''), ``message``."""

    def __init__(self, code: str, message: str, field: str = ""):
        super().__init__(message)
        self.code, self.message, self.field = code, message, field

    def as_dict(self) -> dict:
        return {"error": self.code, "field": self.field, "message": self.message}


def canonical_sha256(data) -> str:
    """sha256 (hex) of the canonical JSON of ``data`` (sorted keys, no spaces): ``machine.definition_digest``."""
    return machine.definition_digest(data)


# ----------------------------------------------------------------------------- pipelines


def load_pipelines(paths: list[str]) -> list[tuple[Pipeline, str]]:
    """Validate every file, then create or update one saved pipeline per file.

    Returns ``[(pipeline, "created" | "updated" | "unchanged")]``. Raises PipelineFormatError
    (every problem with file, field and problem) before anything is saved when any file is bad.
    """
    definitions, problems = [], []
    for path in paths:
        try:
            definitions.append((path, load_file(path)))
        except PipelineFormatError as exc:
            problems.extend(exc.errors)
    if problems:
        raise PipelineFormatError(problems)
    names = [d["name"] for _, d in definitions]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PipelineFormatError([(p, "name", f"the name {d['name']!r} is used by more than one file")
                                   for p, d in definitions if d["name"] in duplicates])
    results = []
    with transaction.atomic(durable=True):
        for path, definition in definitions:
            results.append(save_pipeline(definition, os.path.abspath(path)))
    return results


def save_pipeline(definition: dict, source_path: str = "", expected_version: int | None = None) -> tuple[Pipeline, str]:
    """Create or update the saved pipeline named in a normalized definition, and its profiles.

    ``expected_version``: the version an editor started from; compared under the pipeline's row lock, so a save
    that lands after another one since is refused (OperationError ``version_conflict`` on ``version``) instead of
    undoing it unseen."""
    digest = canonical_sha256(definition)
    with transaction.atomic():
        pipeline = Pipeline.objects.select_for_update().filter(name=definition["name"]).first()
        if expected_version is not None and pipeline is not None and pipeline.version != expected_version:
            raise OperationError("version_conflict", f"The pipeline was saved as version {pipeline.version} since you "
                                 f"opened version {expected_version}: nothing was saved. Open the editor again to start "
                                 f"from version {pipeline.version}, then make your change there.", "version")
        if pipeline is None:
            pipeline = Pipeline.objects.create(name=definition["name"], description=definition.get("description", ""),
                                               definition=definition, sha256=digest, source_path=source_path)
            outcome = "created"
        elif pipeline.sha256 == digest:
            return pipeline, "unchanged"
        else:
            pipeline.definition = definition
            pipeline.description = definition.get("description", "")
            pipeline.sha256 = digest
            pipeline.source_path = source_path
            pipeline.version += 1
            pipeline.save()
            outcome = "updated"
        pipeline.profiles.exclude(name__in=list(definition["profiles"])).delete()
        for name, profile in definition["profiles"].items():
            Profile.objects.update_or_create(pipeline=pipeline, name=name,
                                             defaults={"adapter": profile["adapter"], "settings": profile})
    return pipeline, outcome


def get_pipeline(ref) -> Pipeline:
    """A saved pipeline by instance, id or name; OperationError ``unknown_pipeline`` otherwise."""
    if isinstance(ref, Pipeline):
        return ref
    found = Pipeline.objects.filter(name=str(ref)).first()  # a name wins over an id that looks the same
    if found is None and (isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit())):
        found = Pipeline.objects.filter(pk=int(ref)).first()
    if found is None:
        known = ", ".join(Pipeline.objects.values_list("name", flat=True)) or "none loaded yet"
        raise OperationError("unknown_pipeline", f"There is no saved pipeline {ref!r} (saved: {known}).", "pipeline")
    return found


def get_run(ref) -> Run:
    """A run by instance or id; OperationError ``unknown_run`` otherwise."""
    if isinstance(ref, Run):
        return ref
    try:
        return Run.objects.get(pk=int(ref))
    except (Run.DoesNotExist, ValueError, TypeError):
        raise OperationError("unknown_run", f"There is no run {ref!r}.", "run") from None


# ----------------------------------------------------------------------------- Create A Run


def _effective_roles(pipeline: Pipeline, override: dict | None, definition: dict | None = None) -> dict:
    """The roles of ``definition`` (default: the pipeline's saved one) with ``override`` applied,
    each checked playable; OperationError [profile] otherwise."""
    definition = pipeline.definition if definition is None else definition
    roles = dict(definition["roles"])
    for role, profile in (override or {}).items():
        if role not in ROLES:
            raise OperationError("unknown_role", f"The profile override names the role {role!r}; roles are "
                                 f"{', '.join(ROLES)}.", "profile")
        if roles.get(role, "") is None:
            raise OperationError("role_not_configured", f"The profile override asks for profile {profile!r} for "
                                 f"{role}, but pipeline {pipeline.name!r} has no {role} (roles.{role}: null); "
                                 f"change the pipeline to add one.", "profile")
        if profile not in definition["profiles"]:
            raise OperationError("unknown_profile", f"The profile override asks for profile {profile!r} for "
                                 f"{role}, but pipeline {pipeline.name!r} defines only "
                                 f"{', '.join(sorted(definition['profiles']))}.", "profile")
        roles[role] = profile
    available = adapters()
    # several reviewers: each is checked as the reviewer it will be
    pairs = [(role, name) for role, names in roles.items() for name in role_profiles(names)]
    missing = [(role, name, definition["profiles"][name]["adapter"]) for role, name in pairs
               if definition["profiles"][name]["adapter"] not in available]
    if missing:
        which = "; ".join(f"{role} uses profile {name!r} (adapter {adapter!r})" for role, name, adapter in missing)
        flags = " ".join(f"--profile {role}=PROFILE" for role, _, _ in missing)
        raise OperationError(
            "adapter_unavailable",
            f"This Run Engine cannot run every adapter yet (it can run: {', '.join(sorted(available))}): {which}. "
            f"Choose other profiles with {flags}.", "profile")
    for role, name in pairs:  # before anything of the profile's CLI is looked at (engine/agents/executables.py)
        profile = definition["profiles"][name]
        refused = executables.refusal(profile.get("executable"))
        if refused:
            raise OperationError("executable_not_allowed", f"The {role}'s profile {name!r} names an executable that may "
                                 f"not run: {refused}.", f"profiles.{name}.executable")
        # a definition saved before a rule changed is checked again (engine/agents/cli_options.py EXTRA_ARGS)
        for index, problem in extra_args_problems(profile["adapter"], profile.get("extra_args") or [], (role,)):
            raise OperationError("extra_args_not_allowed", f"The {role}'s profile {name!r}: {problem}.",
                                 f"profiles.{name}.extra_args[{index}]")
    problems = []
    for role, name in pairs:
        profile = definition["profiles"][name]
        for problem in available[profile["adapter"]]().check(profile, role):
            problems.append(f"{role} (profile {name!r}): {problem}")
    if problems:
        raise OperationError("agent_unavailable", "The agent cannot play its role: " + "; ".join(problems) + ".",
                             "profile")
    _refuse_preflight(definition, pairs)
    return roles


# the order in which a refusal names its code: a missing credential first
PREFLIGHT_CODES = ("credentials_missing", "gateway_not_allowed", "gateway_unreachable")


def _refuse_preflight(definition: dict, pairs: list[tuple[str, str]]) -> None:
    """Refuse a run whose chosen profiles cannot run unattended on the workers (the adapters'
    ``preflight``: engine/agents/cli_adapter.py): OperationError ``credentials_missing``,
    ``gateway_not_allowed`` or ``gateway_unreachable`` [profile], one sentence naming each role,
    its profile and the variable, file or address to provide. Checked in this process, with its
    environment and HOME, which the workers must share."""
    found = preflight_problems(definition, sorted({name for _, name in pairs}))
    if not found:
        return
    by_profile: dict[str, list[str]] = {}
    for role, name in pairs:
        if name in found:
            by_profile.setdefault(name, []).append(role)
    codes = {problem.code for problems in found.values() for problem in problems}
    code = next(c for c in PREFLIGHT_CODES + tuple(sorted(codes)) if c in codes)
    parts = [f"{', '.join(roles)} (profile {name!r}): {'; '.join(p.message for p in found[name])}"
             for name, roles in by_profile.items()]
    raise OperationError(code, "The profiles cannot run unattended on the workers: " + "; ".join(parts) +
                         ". (Checked in the process that creates the run, with its environment: the workers must "
                         "share it.)", "profile")


def preflight_problems(definition: dict, names: list[str] | None = None) -> dict[str, list]:
    """``{profile name: [PreflightProblem]}`` for the profiles ``names`` of ``definition`` (default:
    every one) that lack something to run unattended (``Adapter.preflight``: a credential variable
    or login file, a gateway the proxy allows and that answers); profiles lacking nothing, and
    those whose adapter this engine does not have, are left out. Each problem has ``code``,
    ``message``, ``provide`` and ``label()`` (engine/agents/base.py ``PreflightProblem``)."""
    available = adapters()
    profiles = definition.get("profiles") or {}
    found = {}
    for name in (sorted(profiles) if names is None else names):
        profile = profiles.get(name)
        if profile is None or profile.get("adapter") not in available:
            continue
        problems = available[profile["adapter"]]().preflight(profile)
        if problems:
            found[name] = problems
    return found


def create_run(pipeline, repo_path: str, revision: str, profile_override: dict | None = None, *,
               start: bool = False, requested_by: str = "", source: str = "api") -> Run:
    """Validate the inputs, resolve the commit and freeze definition and profiles into a pending run.

    ``pipeline``: a Pipeline, its id or its name; ``repo_path``: any path inside a git work
    tree (the top level is recorded); ``revision``: a commit id, branch or tag (peeled to its
    commit); ``profile_override``: ``{role: profile_name}``. ``start``: also request its start
    (``request_start``, by ``requested_by`` via ``source``) in the same transaction: create and
    start in one step, the run then queued. Nothing is created when any input is refused
    (OperationError with the field at fault). The original checkout is only read; its
    uncommitted changes are listed on the run as not included.
    """
    pipeline = get_pipeline(pipeline)
    if not repo_path:
        raise OperationError("path_not_found", "A repository path is required.", "repo")
    if not revision:
        raise OperationError("unknown_revision", "A revision is required.", "rev")
    roles = _effective_roles(pipeline, profile_override)
    return _freeze_run(pipeline, _snapshot_of(pipeline, roles), repo_path, revision, profile_override,
                       start=start, requested_by=requested_by, source=source)


def _snapshot_of(pipeline: Pipeline, roles: dict) -> dict:
    """The frozen inputs of a new run of ``pipeline``'s current definition with ``roles``."""
    definition = pipeline.definition
    return {
        "pipeline": definition,
        "pipeline_id": pipeline.pk,
        "pipeline_version": pipeline.version,
        "pipeline_sha256": pipeline.sha256,
        "roles": roles,
        "profiles": definition["profiles"],
    }


def _freeze_run(pipeline: Pipeline, snapshot: dict, repo_path: str, revision: str, profile_override: dict | None,
                *, commit_ref: str = "", rerun_of: Run | None = None, how: str = "", start: bool = False,
                requested_by: str = "", source: str = "api", reruns_seen: int = 0) -> Run:
    """Create a pending run of the frozen ``snapshot`` (its roles already validated) on ``repo_path``
    at ``revision`` (resolved to its commit; ``commit_ref``: resolve that instead, a re-run's old
    commit), shared by ``create_run`` and ``rerun``. ``rerun_of``: the ended run this one re-runs
    (linked, and told with a ``rerun`` event; ``how`` says which pipeline version; its
    ``rerun_count`` must still be ``reruns_seen``, else OperationError ``already_rerun``). ``start``: its
    start requested in the same transaction. Raises OperationError [repo] / [rev]; nothing is left
    (no row, no control records) when anything fails."""
    if os.path.exists(repo_path) and not os.path.isdir(repo_path):
        raise OperationError("not_a_directory", f"The repository path {repo_path!r} is a file, not a folder.", "repo")
    agent_folders = executables.agent_folders()
    if agent_folders and hosts.covers(agent_folders, repo_path):  # as written and resolved
        # what agents wrote (a kept worktree, a repository planted in one) is never a run's repository:
        # its .git/config could name programs (a filter driver) that git would run outside any sandbox
        raise OperationError("repo_not_allowed", f"The repository path {repo_path!r} lies where agents and runs "
                             "write (a worktree or scratch folder of the engine's var directory): a run's "
                             "repository is one of your own checkouts.", "repo")
    try:
        repo = workspace.repo_root(repo_path)
        commit = workspace.resolve_commit(repo, commit_ref or revision)
        not_included = workspace.uncommitted_changes(repo)
    except workspace.WorkspaceError as exc:
        field = "repo" if exc.code in ("path_not_found", "not_a_repository") else "rev"
        if commit_ref and field == "rev":
            raise OperationError(exc.code, f"The commit {commit_ref} of run {rerun_of.pk if rerun_of else '?'} "
                                 f"cannot be found in {repo_path} any more: {exc.message}", field) from None
        raise OperationError(exc.code, exc.message, field) from None
    definition = snapshot["pipeline"]
    roles = snapshot["roles"]
    digest = canonical_sha256(snapshot)
    used = {name for names in roles.values() for name in role_profiles(names)}
    reasons = answers.run_simulation(snapshot["profiles"], used)
    simulated = bool(reasons)
    version = snapshot.get("pipeline_version", pipeline.version)
    control = None
    # the protected files are read from git before the transaction (git never runs while it holds the
    # database), into a folder of their own that becomes the run's control records once it has an id
    staging = Path(settings.VAR_DIR) / "runs" / f".creating-{uuid.uuid4().hex}"
    try:
        staging.mkdir(parents=True)
        protected_files = protected.snapshot(repo, commit, list(definition.get("protected_paths") or []),
                                             protected.gate_commands(definition), str(staging / "protected"))
        with transaction.atomic(durable=True):
            if rerun_of is not None and not Run.objects.filter(pk=rerun_of.pk, rerun_count=reruns_seen).update(
                    rerun_count=F("rerun_count") + 1):
                latest = rerun_of.reruns.order_by("-id").first()
                raise OperationError("already_rerun", f"Run {rerun_of.pk} was re-run meanwhile"
                                     f"{f' as run {latest.pk}' if latest else ''} (a second click?): open that run, "
                                     f"or re-run again from this run's page as it is now.", "run")
            run = Run.objects.create(
                pipeline=pipeline, pipeline_name=pipeline.name, repo_path=repo, revision=revision, commit=commit,
                definition=snapshot, definition_sha256=digest, profile_override=dict(profile_override or {}),
                rerun_of=rerun_of, simulated=simulated, simulated_reason=reasons, not_included=not_included,
            )
            run.branch = f"{settings.CP_BRANCH_PREFIX}/run-{run.pk}"
            # the run's uid in the folder name: a database started afresh hands out ids again,
            # and a new run must never meet an old run's worktree
            run.worktree = str(Path(settings.VAR_DIR) / "worktrees" / f"{run.pk}-{run.uid.hex[:8]}")
            run.port_base = settings.CP_PORT_BASE + (run.pk % 1000) * settings.CP_PORT_SPAN
            run.save()
            for order, stage in enumerate(definition["stages"]):
                StageRun.objects.create(run=run, key=stage["key"], order=order)
            control = Path(settings.VAR_DIR) / run.control_dir
            _set_aside_stale_records(control)
            staging.rename(control)
            protected.write_definition(str(control), snapshot, digest)
            run.protected_files = protected_files
            run.save(update_fields=["protected_files"])
            sim = f" It is simulated: it uses the {reasons}." if simulated else ""
            left = f" {len(not_included)} uncommitted change(s) in the checkout are not included." if not_included else ""
            guarded = (f" {len(run.protected_files)} protected file(s) copied to the control records: "
                       f"{', '.join(p['path'] for p in run.protected_files[:8])}"
                       f"{' ...' if len(run.protected_files) > 8 else ''}." if run.protected_files else "")
            again = f"Re-run of run {rerun_of.pk} ({how}). " if rerun_of is not None else ""
            data = {"not_included": len(not_included), "protected": len(run.protected_files)}
            if rerun_of is not None:
                data["rerun_of"] = rerun_of.pk
            machine.event(run, "created", f"{again}Run created from pipeline {pipeline.name!r} v{version} on "
                          f"{commit[:12]} ({revision}); definition frozen (sha256 {digest[:12]}).{guarded}{left}{sim}",
                          data=data)
            if rerun_of is not None:
                machine.event(rerun_of, "rerun", f"Re-run as run {run.pk} ({how}) by "
                              f"{requested_by or 'an unnamed client'} via {source}"
                              f"{'; its start was requested at once' if start else ''}.",
                              data={"rerun": run.pk, "pipeline_version": version})
            if start:
                request_start(run, requested_by=requested_by, source=source)
    except Exception:
        if control is not None:
            shutil.rmtree(control, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already once it became the control records
    return run


def _set_aside_stale_records(control: Path) -> None:
    """Control records already at a new run's path belong to no run of this database (a reset
    database, or an id SQLite gave out again after a rollback): keep them, renamed, never delete."""
    if control.exists():
        control.rename(control.with_name(f"{control.name}.orphan-{timezone.now():%Y%m%d%H%M%S%f}"))


# ----------------------------------------------------------------------------- Queue The Start Request


def request_start(run, requested_by: str = "", source: str = "api") -> StartRequest:
    """Durably request execution of a pending run and return at once.

    The request row and the move pending -> queued commit together; the message that wakes a
    worker is sent only after that commit. A second Start for the same run raises
    OperationError ``already_started`` (exactly one wins, however many arrive at once).
    """
    run = get_run(run)
    with transaction.atomic():
        if not machine.queue_run(run.pk):
            current = Run.objects.get(pk=run.pk)
            raise OperationError("already_started", f"Run {run.pk} was already started: it is {current.status}, "
                                 "and a run is started once.", "run")
        try:
            with transaction.atomic():
                start = StartRequest.objects.create(run_id=run.pk, requested_by=requested_by, source=source,
                                                    enqueued_times=1, last_enqueued_at=timezone.now())
        except IntegrityError:
            raise OperationError("already_started", f"Run {run.pk} already has a start request.", "run") from None
        run.refresh_from_db()
        machine.event(run, "start_requested", f"Start requested by {requested_by or 'an unnamed client'} via "
                      f"{source}; waiting for a worker to claim the run.")
        transaction.on_commit(lambda: _enqueue(run.pk, None), robust=True)
    return start


def _enqueue(run_id: int, token: str | None) -> None:
    runner.enqueue(run_id, token)  # through the module: tests replace runner.enqueue


#: Characters a person's note (a recovery's, a recheck's, a request for changes') may hold: it goes
#: into every later prompt of the stage.
MAX_NOTE_CHARS = 20_000
#: Characters of a person's name as recorded (``Decision.decided_by``).
MAX_NAME_CHARS = 150


def _person_note(note, field: str = "note") -> str:
    """A person's note as it is stored and put into prompts: stripped, credentials redacted at
    capture (engine/redaction.py ``redact_text``). Raises OperationError ``note_required`` [field]
    when blank, ``note_too_long`` [field] past MAX_NOTE_CHARS."""
    text = (note or "").strip() if isinstance(note, str) else ""
    if not text:
        raise OperationError("note_required", "A note is required (the agent reads it).", field)
    if len(text) > MAX_NOTE_CHARS:
        raise OperationError("note_too_long", f"The note has {len(text):,} characters; at most {MAX_NOTE_CHARS:,} "
                             "go into a prompt.", field)
    return redact_text(text)[0]


def _person_name(name, field: str, required: bool = True) -> str:
    """A person's name as recorded: one line of at most MAX_NAME_CHARS, credentials redacted.
    Raises OperationError ``reviewer_required`` [field] (blank, when ``required``) or
    ``invalid_name`` [field] (a line break, a control character, too long)."""
    text = (name or "").strip() if isinstance(name, str) else ""
    if not text:
        if required:
            raise OperationError("reviewer_required", "The person's name is required.", field)
        return ""
    if len(text) > MAX_NAME_CHARS or not text.isprintable():  # no control, format or line-separator character
        raise OperationError("invalid_name", f"A name is one line of at most {MAX_NAME_CHARS} characters, without "
                             "control, format or line-separator characters.", field)
    return redact_text(text)[0]


# ----------------------------------------------------------------------------- Recover An Interruption


def recover(run, decision_id, note: str, action: str, reviewer: str = "") -> Decision:
    """Resume a run waiting for review: ``retry`` (a new attempt of the stage, numbered after the
    last one) or ``verify`` (the gates, then the review, on the existing result).

    Requires the pending review decision's id and a note; repair counters and budgets are kept.
    Raises OperationError: ``note_required`` [note], ``unknown_action`` [action],
    ``not_waiting_review`` [run], ``unknown_decision`` / ``stale_decision`` [decision],
    ``budget_exhausted`` [action] (an exhausted execution budget requires a new run),
    ``nothing_to_verify`` [action], ``host_unconfirmed`` [action] (the run's host stopped beating and
    has not yet confirmed its old processes gone).
    """
    run = get_run(run)
    note = _person_note(note)
    reviewer = _person_name(reviewer, "reviewer", required=False)
    if action not in ("retry", "verify"):
        raise OperationError("unknown_action", f"The action must be retry or verify, not {action!r}.", "action")
    with transaction.atomic(durable=True):
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status != RunStatus.WAITING_REVIEW:
            raise OperationError("not_waiting_review", f"Run {run.pk} is {run.status}; only a run waiting for review "
                                 "can be recovered.", "run")
        decision = _decision_of(run, decision_id, Decision.Kind.REVIEW)
        if decision.state != Decision.State.PENDING:
            raise OperationError("stale_decision", f"Decision {decision.pk} is {decision.state}, not pending (run "
                                 f"{run.pk} is {run.status}; its pending decision is the one to use).", "decision")
        stage = decision.stage
        _refuse_unconfirmed_host(run, "action")
        _refuse_exhausted(run, "action")
        if action == "verify" and stage is not None and not answers.stage_has_result(stage):
            raise OperationError("nothing_to_verify", f"Stage '{stage.key}' has no result to verify; use retry.",
                                 "action")
        machine.recovered(run, stage, decision, action, note, reviewer)
        machine.event(run, "recovered", f"Recovery by {reviewer or 'an operator'}: {action}. Note: {note}",
                      stage=stage, decision=decision)
        _wake_on_commit(run)
    return decision


def exhausted_budget(run) -> str | None:
    """A sentence when the run has no budget left for more work (``budgets.max_attempts``,
    ``max_cost_usd`` or ``max_active_seconds``, as ``budgets.budget_problem`` counts them for an
    agent step: a retry implements, and a verification ends in a review), else None. Such a run
    can only be failed (or approved, at a human gate whose checks and review passed)."""
    return answers.exhausted_budget(get_run(run))


def _refuse_exhausted(run: Run, field: str) -> None:
    problem = exhausted_budget(run)
    if problem is not None:
        raise OperationError("budget_exhausted", f"{problem} An exhausted execution budget requires a new run: "
                             f"create one ({hints.manage('create_run ...')}) or fail this one (fail_run).", field)


def unconfirmed_host(run) -> str | None:
    """A sentence when ``run`` was interrupted because its host stopped beating and that host has not
    yet confirmed the old processes gone (engine/reconcile.py ``interrupt_lost_host``), else None. Such
    a run cannot be recovered until then: its worktree and processes are on that host."""
    evidence = run.stop_evidence or {}
    if evidence.get("host_confirmed") is not False:
        return None
    host = evidence.get("host") or run.host
    return (f"Run {run.pk} was interrupted when its host {host} stopped beating, and {host} has not yet confirmed "
            f"that the run's old processes are gone. Start a worker on host {host} (CP_HOST_NAME={host}): its "
            f"reconciliation confirms them gone, then the run can be recovered; or fail the run.")


def _refuse_unconfirmed_host(run: Run, field: str) -> None:
    problem = unconfirmed_host(run)
    if problem is not None:
        raise OperationError("host_unconfirmed", problem, field)


def _wake_on_commit(run: Run) -> None:
    """Count one more wake-up on the run's start request and send it once the transaction commits."""
    StartRequest.objects.filter(run=run).update(enqueued_times=F("enqueued_times") + 1,
                                                last_enqueued_at=timezone.now())
    transaction.on_commit(lambda: _enqueue(run.pk, None), robust=True)


# ----------------------------------------------------------------------------- End An Unsuccessful Run


def fail_run(run, reason: str, requested_by: str = "") -> Run:
    """Fail a run on a person's decision: stop and reap every process it owns first, then record
    the failure (``failed``, stop reason ``failed_by_operator``). All evidence is kept (attempts,
    logs, checks, manifests, the worktree and its branch); a result that arrives afterwards is
    stored as late and changes nothing.

    A running run is first fenced (its lease token replaced, so the step owner's heartbeat fails
    and stops its process, its hand-off claims nothing, and a process it starts after that is
    stopped at launch); then every process of the run on this host is reaped (recorded pids and
    the run's process markers); then, in a short transaction, the run fails (``machine.fail``:
    open attempts closed as ``cancelled``, unfinished stages failed, pending decisions superseded). A pending, queued or waiting run has no process and fails at
    once. Returns the run. Raises OperationError: ``reason_required`` [reason], ``unknown_run``
    [run], ``already_finished`` [run] (a succeeded or failed run takes no action).
    """
    run = get_run(run)
    reason = redact_text((reason or "").strip())[0]
    if not reason:
        raise OperationError("reason_required", "A reason is required to fail a run (what a person should know).",
                             "reason")
    if len(reason) > MAX_NOTE_CHARS:
        raise OperationError("reason_too_long", f"The reason has {len(reason):,} characters; at most "
                             f"{MAX_NOTE_CHARS:,}.", "reason")
    who = requested_by or "an operator"
    with transaction.atomic(durable=True):
        locked = _lock_unfinished(run.pk)
        if locked.status != RunStatus.RUNNING:
            machine.fail(locked, "failed_by_operator", f"Failed by {who}: {reason.rstrip('.')}.")
            return locked
        token = machine.fence(locked, f"fail:{runner.worker_identity()}")
        machine.event(locked, "fail_requested", f"{who} asked to fail the run; its processes are stopped first. "
                                                f"Reason: {reason}")
    reaping = reconcile.reap_run(locked)
    with transaction.atomic(durable=True):
        locked = _lock_unfinished(run.pk)
        note = f" Processes reaped first: {reaping['reaped']}." if reaping["reaped"] else " No process was left."
        if reaping["unconfirmed"]:
            note += (f" Attempts {reaping['unconfirmed']} ran on another host: their worker stops them at its next "
                     f"heartbeat, which fails now.")
        if locked.lease_token != token:  # a reconciliation pass stopped it meanwhile: it fails all the same
            note += " A reconciliation pass interrupted the run while its processes were being stopped."
        machine.fail(locked, "failed_by_operator", f"Failed by {who}: {reason.rstrip('.')}.{note}",
                     evidence=reaping)
    return locked


def forget_host(name: str) -> int:
    """Delete the record of host ``name``, gone for good (README.md, "Several hosts"), with the rows of its
    workers that no longer beat; its runs keep their ``host`` (their evidence says where they ran).
    Returns the worker rows deleted. Raises OperationError: ``unknown_host`` [host], ``host_alive``
    [host] (it beat less than CP_HOST_STALE seconds ago), ``host_has_runs`` [host] (an unfinished run is
    pinned to it: fail it first)."""
    with transaction.atomic(durable=True):
        row = Host.objects.select_for_update().filter(name=name).first()
        if row is None:
            raise OperationError("unknown_host", f"No host is named {name!r}.", "host")
        if hosts.is_alive(row):
            raise OperationError("host_alive", f"Host {name} beat {hosts.host_age(row):.0f} s ago: it is alive; "
                                 f"stop its workers first.", "host")
        unfinished = list(Run.objects.filter(host=name).exclude(status__in=RUN_TERMINAL).order_by("id")
                          .values_list("id", flat=True)[:10])
        if unfinished:
            raise OperationError("host_has_runs", f"Host {name} has unfinished run(s) {', '.join(map(str, unfinished))} "
                                 f"pinned to it: fail them first (fail_run), or bring the host back.", "host")
        fresh = timezone.now() - timedelta(seconds=float(settings.CP_WORKER_STALE))
        gone, _ = Worker.objects.filter(host=name).filter(Q(stopped_at__isnull=False) | Q(beat_at__lte=fresh)).delete()
        row.delete()
    return gone


def _lock_unfinished(run_id: int) -> Run:
    """The run, locked for the caller's transaction; OperationError ``already_finished`` when it ended."""
    locked = Run.objects.select_for_update().get(pk=run_id)
    if locked.status in RUN_TERMINAL:
        why = f" ({locked.stop_reason})" if locked.stop_reason else ""
        raise OperationError("already_finished", f"Run {run_id} already {locked.status}{why}; a finished run takes "
                             "no action.", "run")
    return locked


# ----------------------------------------------------------------------------- Approve A Human Gate


def approve(run, decision_id, artifact: str, reviewer: str) -> Decision:
    """Approve the pending human-gate decision of a run waiting for approval, for the files ``artifact``.

    ``artifact``: the manifest digest the person looked at (or a unique prefix of it, at least
    12 hex digits). Only the current pending decision for the stage's current files is
    accepted, and only when every gate of the stage passed on those files. Raises
    OperationError: ``reviewer_required`` / ``invalid_name`` [reviewer], ``not_waiting_approval`` [run],
    ``unknown_decision`` / ``stale_decision`` [decision], ``artifact_mismatch`` [artifact],
    ``checks_missing`` [decision].
    """
    run = get_run(run)
    reviewer = _person_name(reviewer, "reviewer")
    with transaction.atomic(durable=True):
        run, decision, stage, current = _pending_approval(run, decision_id, artifact)
        failed = [name for name, passed in gate_results(stage, current).items() if not passed]
        if failed:
            raise OperationError("checks_missing", f"Stage '{stage.key}' has no passing result of "
                                 f"{', '.join(failed)} on files {current[:12]}; an approval cannot pass a check "
                                 f"that is missing or failed.", "decision")
        machine.approved(run, stage, decision, reviewer)
        _wake_on_commit(run)
    return decision


def _decision_of(run: Run, decision_id, kind: str) -> Decision:
    """The decision ``decision_id`` of ``run`` when it is of ``kind``; OperationError
    ``unknown_decision`` [decision] otherwise (any state: the caller says when it is stale)."""
    decision = run.decisions.filter(pk=decision_id if str(decision_id).isdigit() else -1).first()
    if decision is None or decision.kind != kind:
        raise OperationError("unknown_decision", f"Run {run.pk} has no {kind} decision {decision_id!r}.", "decision")
    return decision


def _pending_approval(run: Run, decision_id, artifact: str) -> tuple[Run, Decision, StageRun, str]:
    """Lock ``run`` (inside the caller's transaction) and return ``(run, decision, stage, files)``
    when ``decision_id`` is its pending approval decision for the stage's current files and
    ``artifact`` names those files (the digest, or a unique prefix of at least 12 hex digits).
    Raises OperationError ``unknown_decision`` / ``stale_decision`` [decision],
    ``not_waiting_approval`` [run], ``artifact_mismatch`` [artifact]."""
    artifact = (artifact or "").strip().lower()
    run = Run.objects.select_for_update().get(pk=run.pk)
    decision = _decision_of(run, decision_id, Decision.Kind.APPROVAL)
    if decision.state != Decision.State.PENDING:
        raise OperationError("stale_decision", f"Decision {decision.pk} is {decision.state}"
                             f"{' by ' + decision.decided_by if decision.decided_by else ''}, not pending: it "
                             f"cannot be decided again (run {run.pk} is {run.status}"
                             f"{': ' + run.stop_reason if run.stop_reason else ''}).", "decision")
    if run.status != RunStatus.WAITING_APPROVAL:
        raise OperationError("not_waiting_approval", f"Run {run.pk} is {run.status}; only a run waiting for "
                             f"approval can be approved or sent back.", "run")
    stage = decision.stage
    current = stage.accepted_manifest if stage is not None else ""
    if len(artifact) < 12 or not decision.artifact.startswith(artifact) or decision.artifact != current:
        raise OperationError("artifact_mismatch", f"The artifact {artifact or '(none)'!r} is not the files "
                             f"waiting for approval ({decision.artifact}); decide on what you looked at, and look "
                             f"again if the files changed.", "artifact")
    return run, decision, stage, current


def request_changes(run, decision_id, artifact: str, reviewer: str, note: str,
                    comments: list[dict] | None = None) -> Decision:
    """Send the files waiting at a human gate back with a person's findings.

    ``decision_id`` and ``artifact`` must name the pending approval decision and its files, as
    for ``approve``; ``note``: what must change (required); ``comments``: optional
    ``[{"file": path in the diff, "line": 1-based line or None, "text": ...}]``. One repair of the
    stage's allowance is consumed and a fresh repair session gets the requirement, the current
    patch and these findings; verification, review and documentation run on the changed files
    and a new approval decision is made for them (this one is then stale). With the allowance
    used up the run waits for review (``repair_exhausted``). Raises OperationError:
    ``reviewer_required`` [reviewer], ``note_required`` [note], ``invalid_comments`` [comments],
    the refusals of ``approve`` (``unknown_decision``, ``stale_decision``, ``not_waiting_approval``,
    ``artifact_mismatch``), ``budget_exhausted`` [run].
    """
    run = get_run(run)
    reviewer = _person_name(reviewer, "reviewer")
    note = _person_note(note)
    lines = diff_comments.line_counts(run, decision_id, comments)  # git, before the run is locked
    with transaction.atomic(durable=True):
        run, decision, stage, current = _pending_approval(run, decision_id, artifact)
        try:
            checked = diff_comments.checked(comments, diff_comments.changed_paths(run, stage, current), lines.get)
        except diff_comments.CommentError as exc:
            raise OperationError("invalid_comments", str(exc), "comments") from None
        _refuse_exhausted(run, "run")
        outcome = machine.changes_requested(run, stage, decision, reviewer, note, checked)
        if outcome == machine.REPAIR:
            _wake_on_commit(run)
    return decision



# ----------------------------------------------------------------------------- Recheck A Corrected Result


def recheck(run, note: str, requested_by: str = "") -> StageRun:
    """Verify the waiting stage of a run again (after a person corrected its files).

    The stage's pending decisions are superseded (an approval given for other files no longer
    counts), its gates and reviews run again without resetting any counter or budget, and a
    stage with a human gate asks for a new approval of the files it then has. Raises
    OperationError: ``note_required`` [note], ``not_waiting`` [run], ``budget_exhausted`` [run]
    (an exhausted execution budget requires a new run), ``nothing_to_verify`` [run] (the stage's
    implementation never produced a result), ``host_unconfirmed`` [run] (as for ``recover``).
    """
    run = get_run(run)
    note = _person_note(note)
    requested_by = _person_name(requested_by, "requested_by", required=False)
    with transaction.atomic(durable=True):
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status not in (RunStatus.WAITING_REVIEW, RunStatus.WAITING_APPROVAL):
            raise OperationError("not_waiting", f"Run {run.pk} is {run.status}; only a run waiting for review or "
                                 f"approval can be rechecked.", "run")
        _refuse_unconfirmed_host(run, "run")
        _refuse_exhausted(run, "run")
        stage = answers.waiting_stage(run)
        if stage is None or not answers.stage_has_result(stage):
            raise OperationError("nothing_to_verify", f"Run {run.pk} has no stage whose implementation produced a "
                                 f"result; there is nothing to recheck.", "run")
        machine.rechecked(run, stage, note, requested_by)
        _wake_on_commit(run)
    return stage


# ----------------------------------------------------------------------------- status


def run_status(run) -> dict:
    """The public JSON shape of a run (a contract: later versions add fields, never rename), as
    engine/record.py ``RunRecord`` serializes it (docs/run-status.md says what each key means).

    Keys: id, status, simulated, pipeline, repo, revision, commit, branch, worktree, host, host_alive,
    host_beat_age_seconds (engine/hosts.py ``run_host_facts``), stop_reason,
    stop_message, stop_evidence, waiting_for ('start' | 'worker' | 'review' | 'approval' | None),
    active_seconds, heartbeat_age_seconds, heartbeat_stale (running, but no heartbeat for longer than
    CP_HEARTBEAT_STALE: its worker may be gone, and reconciliation will interrupt it), not_included, protected_files, budgets, pending_decision, stages[{key, status,
    phase, base_commit, checkpoint, repairs_used, repair_allowance, last_defect, attempts[...,
    refusals, tool_outcomes (engine/text/tool_outcomes.py ``counts``), network, verdict], checks[...]}].
    """
    run = get_run(run)
    run.refresh_from_db()
    return record.plain(record.RunRecord(run).data)


#: Filters of ``list_runs``: the statuses a run can have.
RUN_STATUSES = tuple(RunStatus.values)


def list_runs(status: list[str] | None = None, pipeline: str | None = None, waiting: bool | None = None):
    """The runs, newest first, as a queryset (the caller pages it): ``status`` one of several
    statuses (RUN_STATUSES), ``pipeline`` a saved pipeline's name or id, ``waiting`` True for runs
    that wait for a person (waiting_review, waiting_approval), False for the others. Raises
    OperationError ``invalid_filter`` [status] for an unknown status; an unknown pipeline matches
    no run."""
    runs = Run.objects.order_by("-id")
    if status:
        unknown = [s for s in status if s not in RUN_STATUSES]
        if unknown:
            raise OperationError("invalid_filter", f"status {unknown[0]!r} is not a run status (one of "
                                 f"{', '.join(RUN_STATUSES)}).", "status")
        runs = runs.filter(status__in=status)
    if pipeline:
        named = Q(pipeline_name=pipeline)
        runs = runs.filter(named | Q(pipeline_id=int(pipeline)) if str(pipeline).isdigit() else named)
    if waiting is not None:
        waits = [RunStatus.WAITING_REVIEW, RunStatus.WAITING_APPROVAL]
        runs = runs.filter(status__in=waits) if waiting else runs.exclude(status__in=waits)
    return runs


def run_summary(run: Run) -> dict:
    """One line of a run list (``GET /api/runs/``): ``id``, ``uid``, ``status``, ``simulated``,
    ``pipeline``, ``repo``, ``revision``, ``commit``, ``stop_reason``, ``waiting_for``,
    ``waiting_sentence``, ``current_stage``, ``rerun_of``, ``created_at``, ``started_at``,
    ``finished_at`` and ``totals`` (``answers.totals``), each as in ``run_status`` (engine/record.py
    ``RunSummary``)."""
    return record.plain(record.RunSummary(run).data)


def run_stopped(run: Run) -> bool:
    """True when the run waits for a person or has ended."""
    return run.status in RUN_STOPPED


__all__ = ["OperationError", "load_pipelines", "save_pipeline", "create_run", "request_start", "recover", "approve",
           "request_changes", "parse_comment", "recheck", "fail_run", "exhausted_budget", "preflight_problems",
           "rerun", "run_status", "run_summary", "list_runs", "run_stopped", "get_run", "get_pipeline"]


# Re-run an ended run, and continue a run stopped at its budget: engine/runs_again.py (kept callable here).
from .runs_again import continue_run, rerun  # noqa: E402,F401 - re-exported: views, the API, commands
