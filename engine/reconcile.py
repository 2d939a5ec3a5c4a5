"""Reconciliation: find work that a lost message or a dead worker left behind.

Run by Celery beat every CP_RECONCILE_PERIOD seconds and once when a worker starts. Every
action first wins a compare-and-swap on the run row, so two reconcilers running at once (two
beat processes, a beat and a worker start) act once (docs/field-cases.md C17).

* queued and not claimed for CP_QUEUED_STALE seconds: enqueue again;
* running, handed off between steps, and not picked up for CP_QUEUED_STALE: enqueue again;
* running with a step owner whose heartbeat is older than CP_HEARTBEAT_STALE: confirm the old
  process tree is gone (pid and its start time; kill what is left, found by its marker), remove
  the ``index.lock`` a killed git left in the run's worktree (only when no live process holds
  it: engine/workspace.py ``clear_stale_index_lock``), then
  - when the step was a checkpoint whose commit exists (its journal trailer is on the branch):
    finish that step (index reset to the commit, journal entry done, stage passed) and hand the
    run to its next step: it goes on without a person;
  - else mark the open attempt ``interrupted``, keep completed stages, and stop the run for review;
* a checkpoint journal entry left in ``intent`` (of a run no step owns): the commit carrying its
  id in a trailer tells whether git ran; found -> done, else it stays for a person's Recover;
* a run creation's staging folder (``runs/.creating-*``) older than STAGING_STALE_SECONDS, left by a
  create_run killed between reading the protected files and its transaction: removed
  (``remove_stale_staging``), as are the empty control groups of attempts whose worker died.

Per host (engine/hosts.py; README.md, "Several hosts"): a pass reaps and inspects only this host's
processes and worktrees. A stale run pinned to another host is left to that host's own pass while
that host beats (the beat sends one to its queue each period, controlpanel/beat.py); once that host
has had no heartbeat for CP_HOST_STALE seconds, any pass marks the run interrupted, once (the same
compare-and-swap), saying so, and never resumes it elsewhere (``interrupt_lost_host``). When the
host comes back, its own pass confirms the run's old processes gone before a person may recover it
(``confirm_returned``).

A pass never raises for a run whose repository or worktree is gone: the fact is recorded on that
run (an event) and the pass goes on with the others.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import hosts, machine, notifications, runner, steps, workspace
from .processes import limits, process
from .models import (ATTEMPT_OPEN, Attempt, Check, Host, JournalEntry, Run, RunEvent, RunStatus, StagePhase, StageRun,
                     StageStatus, StartRequest)
from .steps import manifest_excludes, process_marker_prefix, save_manifest, sha256_file, var_path
from .steps.paths import attempt_homes

log = logging.getLogger("engine.reconcile")


def reconcile() -> dict:
    """One pass. Returns counts: ``{"requeued", "handoffs", "interrupted", "resumed",
    "journal_done", "notified"}`` (``resumed``: runs whose interrupted checkpoint was finished and
    which went on; ``notified``: notification tries made, engine/notifications.py ``sweep``).
    Never raises for one run's missing repository or worktree, nor for a fault while taking one run
    over (logged, and said on the run): the other runs are reconciled all the same."""
    now = timezone.now()
    me = hosts.this_host()
    counts = {"requeued": 0, "handoffs": 0, "interrupted": 0, "resumed": 0, "journal_done": 0, "host_lost": 0,
              "host_confirmed": 0}
    queued_cutoff = now - timedelta(seconds=settings.CP_QUEUED_STALE)
    for start in StartRequest.objects.filter(run__status=RunStatus.QUEUED, last_enqueued_at__lt=queued_cutoff):
        if StartRequest.objects.filter(pk=start.pk, last_enqueued_at=start.last_enqueued_at).update(
                last_enqueued_at=now, enqueued_times=start.enqueued_times + 1):
            _enqueue_on_commit(start.run_id, None)
            counts["requeued"] += 1
    for run in Run.objects.filter(status=RunStatus.RUNNING, lease_owner="", heartbeat_at__lt=queued_cutoff):
        if machine.touch_hand_off(run, now):
            _enqueue_on_commit(run.pk, run.lease_token)
            counts["handoffs"] += 1
    stale_cutoff = now - timedelta(seconds=settings.CP_HEARTBEAT_STALE)
    known_hosts = {host.name: host for host in Host.objects.all()}
    for run in Run.objects.filter(status=RunStatus.RUNNING, heartbeat_at__lt=stale_cutoff).exclude(lease_owner=""):
        if run.host and run.host != me:
            host = known_hosts.get(run.host)
            if hosts.is_alive(host, now):
                continue  # its own host's pass takes it over: its processes and worktree are there
            try:
                if interrupt_lost_host(run.pk, run.lease_token, run.heartbeat_at, run.host, hosts.host_age(host, now)):
                    counts["host_lost"] += 1
            except Exception as exc:
                log.exception("reconcile: marking run %s of lost host %s interrupted failed", run.pk, run.host)
                _takeover_failed(run, exc)
            continue
        try:
            taken = interrupt(run.pk, run.lease_token, run.heartbeat_at)
        except Exception as exc:  # this run's takeover failed: said on it, a later pass tries again
            log.exception("reconcile: taking over run %s failed", run.pk)
            _takeover_failed(run, exc)
            continue
        if taken:
            counts["resumed" if taken == RESUMED else "interrupted"] += 1
    for entry in JournalEntry.objects.filter(state=JournalEntry.State.INTENT).select_related("run"):
        if entry.run.status == RunStatus.RUNNING or entry.run.host not in ("", me):
            continue  # another host's repository path means nothing here: its own pass settles it
        try:
            commit = workspace.find_commit_with_trailer(entry.run.repo_path, entry.run.branch, "Control-Panel-Journal",
                                                        str(entry.uid))
        except workspace.WorkspaceError as exc:
            # the run's repository is gone or broken: say so on the run once, settle the other entries
            _journal_unresolved(entry, exc)
            continue
        if commit and machine.journal_found(entry.pk, commit):
            counts["journal_done"] += 1
    counts["host_confirmed"] = confirm_returned()
    counts["notified"] = _deliver_notifications()
    removed = limits.remove_stale_groups()  # the empty control groups of attempts whose worker died
    if removed:
        log.info("reconcile: removed %s empty control group(s) of ended attempts and checks", removed)
    staged = remove_stale_staging()
    if staged:
        log.info("reconcile: removed %s staging folder(s) of run creations that never finished", staged)
    if any(counts.values()):
        log.info("reconcile: %s", counts)
    return counts


#: Seconds after which a run creation's staging folder (``runs/.creating-<uuid>``, engine/operations.py
#: ``create_run``: its protected files, read from git before the transaction, for a few seconds) is
#: one a create_run killed between its snapshot and its rename left behind.
STAGING_STALE_SECONDS = 3600


def remove_stale_staging(now: float | None = None) -> int:
    """Remove the staging folders of run creations older than STAGING_STALE_SECONDS (by their own
    modification time; a link is left alone) under this host's var directory. Returns how many."""
    now = time.time() if now is None else now
    removed = 0
    for folder in (Path(settings.VAR_DIR) / "runs").glob(".creating-*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or now - folder.lstat().st_mtime < STAGING_STALE_SECONDS:
                continue
            shutil.rmtree(folder)
            removed += 1
        except OSError as exc:  # another pass removed it, or it cannot be: the next pass tries again
            log.warning("reconcile: could not remove the staging folder %s: %s", folder, exc)
    return removed


def _deliver_notifications() -> int:
    """The notification outbox's sweep (engine/notifications.py ``sweep``): due deliveries and
    those a dead worker left sending. Never raises: a fault is logged, a later pass tries again."""
    try:
        return notifications.sweep()
    except Exception:
        log.exception("reconcile: the notification sweep failed; a later pass tries again")
        return 0


def _takeover_failed(run: Run, exc: BaseException) -> None:
    """Say once per kind of fault on ``run`` that a reconciler could not take it over."""
    kind = type(exc).__name__
    code = getattr(exc, "code", "") or kind
    if RunEvent.objects.filter(run_id=run.pk, kind="reconcile_failed", data__code=code).exists():
        return
    message = getattr(exc, "message", "") or str(exc)
    machine.event(run, "reconcile_failed",
                  f"Reconciliation could not take this run over after its worker stopped beating ({code}: "
                  f"{message[:500]}); a later pass tries again.", data={"code": code})


def _journal_unresolved(entry: JournalEntry, exc: "workspace.WorkspaceError") -> None:
    """Record once on the entry's run that its checkpoint journal entry cannot be settled (the
    repository cannot be read); the entry stays an intent, settled by a later pass if the
    repository comes back."""
    if RunEvent.objects.filter(run_id=entry.run_id, kind="journal_unresolved", data__journal=entry.pk).exists():
        return
    machine.event(entry.run, "journal_unresolved",
                  f"The checkpoint journal entry {entry.uid} of this run cannot be settled: its repository "
                  f"{entry.run.repo_path} cannot be read ({exc.code}: {exc.message}). It stays an intent; "
                  f"reconciliation settles it once the repository is back.",
                  stage=entry.stage, data={"journal": entry.pk, "code": exc.code})
    log.warning("reconcile: journal entry %s of run %s unresolved: %s", entry.uid, entry.run_id, exc.code)


def _enqueue_on_commit(run_id: int, token: str | None) -> None:
    transaction.on_commit(lambda: runner.enqueue(run_id, token), robust=True)


def reap_run(run: Run) -> dict:
    """Stop every process of ``run`` still alive on this host: the recorded tree of each open
    attempt (pid checked against its start time, so a reused pid is left alone) and every
    process whose ``CP_PROCESS_MARKER`` carries the run's prefix (agents and gates, including
    children that left the session). Looks twice, half a second apart, for a process that was
    starting during the first look.

    Returns ``{"reaped": int (processes signalled), "unconfirmed": [attempt numbers that ran on
    another host, whose processes cannot be seen from here]}``.
    """
    reaped, unconfirmed = 0, []
    for attempt in Attempt.objects.filter(run_id=run.pk, status__in=ATTEMPT_OPEN):
        if attempt.host and attempt.host != hosts.this_host():
            unconfirmed.append(attempt.number)
            continue
        reaped += process.kill_tree(attempt.pid, attempt.pid_create_time, attempt.marker or None, grace_seconds=3.0)
    prefix = process_marker_prefix(run)
    reaped += process.kill_marked_prefix(prefix, grace_seconds=3.0)
    time.sleep(0.5)
    reaped += process.kill_marked_prefix(prefix, grace_seconds=3.0)
    return {"reaped": reaped, "unconfirmed": unconfirmed}


def inspect_effects(run: Run, attempt_ids: list[int] | None = None) -> dict:
    """What the interrupted work left behind, looked at before anything is repeated.

    For each open attempt (or each of ``attempt_ids``, attempts already closed as interrupted by a
    pass on another host: ``confirm_returned``): the worktree's manifest now against the attempt's starting manifest
    (``start_manifest``) and the files that differ; for the run: checkpoint journal entries still
    in ``intent``. The manifest is stored as a control record. Returns ``{"attempts": [{"attempt",
    "number", "start_manifest", "manifest", "changed": [{"path", "status"}] | None, "problem"}],
    "journal_intents": [uid], "sentence": str}``; never raises for a missing or broken worktree
    (``problem`` says why it could not be inspected).
    """
    found, sentences = [], []
    which = (Attempt.objects.filter(run_id=run.pk, pk__in=attempt_ids) if attempt_ids is not None
             else Attempt.objects.filter(run_id=run.pk, status__in=ATTEMPT_OPEN))
    for attempt in which.select_related("stage").order_by("id"):
        item = {"attempt": attempt.pk, "number": attempt.number, "start_manifest": attempt.start_manifest or None,
                "manifest": None, "changed": None, "problem": ""}
        try:
            data = workspace.manifest(run.worktree, attempt.stage.base_commit, manifest_excludes(run))
            row = save_manifest(run, attempt.stage, data)
            item["manifest"] = data["digest"]
            if attempt.start_manifest:
                item["changed"] = workspace.tree_changes(run.worktree, attempt.start_manifest, data["digest"])
                # what the attempt left is its result, unverified: its manifest and its patch are kept
                folder = os.path.dirname(attempt.log_path) if attempt.log_path else ""
                if folder and not attempt.patch_path:
                    rel = os.path.join(folder, "patch.diff")
                    workspace.write_patch(run.worktree, attempt.stage.base_commit, data["tree"], str(var_path(rel)))
                    attempt.patch_path, attempt.patch_sha256 = rel, sha256_file(var_path(rel))
                attempt.result_manifest = row
                attempt.save(update_fields=["patch_path", "patch_sha256", "result_manifest"])
        except workspace.WorkspaceError as exc:
            item["problem"] = exc.message
        except OSError as exc:  # the worktree or a control record folder is gone
            item["problem"] = f"{type(exc).__name__}: {exc}"
        found.append(item)
        if item["problem"]:
            sentences.append(f"The worktree could not be inspected after attempt {attempt.number}: {item['problem']}")
        elif item["changed"] is None:
            sentences.append(f"Attempt {attempt.number} was interrupted before it launched; the worktree holds files "
                             f"{item['manifest'][:12]}.")
        elif item["changed"]:
            paths = ", ".join(c["path"] for c in item["changed"][:8]) + (" ..." if len(item["changed"]) > 8 else "")
            sentences.append(f"Attempt {attempt.number} changed {len(item['changed'])} file(s) in the worktree before "
                             f"it was interrupted ({paths}); they are not verified.")
        else:
            sentences.append(f"Attempt {attempt.number} left the worktree as it found it "
                             f"({item['manifest'][:12]}).")
    intents = [str(uid) for uid in JournalEntry.objects.filter(run=run, state=JournalEntry.State.INTENT)
               .values_list("uid", flat=True)]
    if intents:
        say = "entry still says" if len(intents) == 1 else "entries still say"
        sentences.append(f"{len(intents)} checkpoint journal {say} 'intent': reconciliation looks for its commit "
                         f"by its trailer.")
    return {"attempts": found, "journal_intents": intents, "sentence": " ".join(sentences)}


#: What ``interrupt`` returns when the interrupted step was a checkpoint it finished itself.
RESUMED = "resumed"


def _clear_index_lock(run: Run) -> dict:
    """Remove the ``index.lock`` a killed git left in the run's worktree, when no live process
    holds it (engine/workspace.py ``clear_stale_index_lock``); a live one is left alone (the
    next index operation waits for it). Never raises. Returns the workspace's answer and
    ``sentence`` (empty when there was no lock)."""
    try:
        result = workspace.clear_stale_index_lock(run.worktree, run.repo_path)
    except Exception as exc:  # noqa: BLE001 (a look at the processes must never stop the takeover)
        return {"state": "unknown", "path": None, "holders": [], "sentence": f"git's index lock could not be "
                f"checked ({type(exc).__name__}: {exc})."}
    sentence = ""
    if result["state"] == "removed":
        sentence = (f"git's index lock {result['path']}, left by a git that was killed (no live process held it), "
                    f"was removed.")
    elif result["state"] == "live":
        who = ", ".join(f"pid {h['pid']} ({h['name'] or '?'})" for h in result["holders"][:5]) or "a live process"
        sentence = f"git's index lock {result['path']} is held by {who}; the next index operation waits for it."
    return {**result, "sentence": sentence}


def _interrupted_checkpoint(run: Run) -> tuple | None:
    """``(stage, entry, commit)`` when the run's interrupted step was a checkpoint whose commit
    exists (the newest ``intent`` entry of the running stage in its checkpoint phase whose
    journal trailer is on the branch); else None. No open attempt may exist (a checkpoint step
    has none). A repository that cannot be read is said on the run (``journal_unresolved``)."""
    if Attempt.objects.filter(run_id=run.pk, status__in=ATTEMPT_OPEN).exists():
        return None
    stage = run.stages.filter(status=StageStatus.RUNNING, phase=StagePhase.CHECKPOINT).order_by("order").first()
    if stage is None:
        return None
    for entry in stage.journal.filter(state=JournalEntry.State.INTENT).order_by("-id"):
        try:
            commit = workspace.find_commit_with_trailer(run.repo_path, run.branch, "Control-Panel-Journal",
                                                        str(entry.uid))
        except (workspace.WorkspaceError, ValueError) as exc:
            if isinstance(exc, workspace.WorkspaceError):
                _journal_unresolved(entry, exc)
            return None
        if commit:
            return stage, entry, commit
    return None


def _resume_checkpoint(run: Run, lease: str, found: tuple, notes: str) -> bool:
    """Finish the checkpoint step the dead worker began, with its own journal entry, as the step
    itself would (engine/steps/checkpoint.py ``execute`` and ``finish``: the commit is found by its trailer,
    never made twice; the worktree's index is reset to it; protected files carried; the entry
    done; the stage passed), then hand the run to its next step. ``lease`` is the reconciler's;
    a heartbeat keeps it fresh meanwhile. Returns False when the lease was lost meanwhile."""
    stage, entry, commit = found
    plan = {"kind": "checkpoint", "run_id": run.pk, "lease": lease, "stage_id": stage.pk, "stage_key": stage.key,
            "journal_id": entry.pk}
    beat = runner.Heartbeat(run.pk, lease, settings.CP_HEARTBEAT_INTERVAL)
    beat.start()
    try:
        outcome = steps.execute(plan, should_stop=beat.lost)
    except Exception as exc:  # as the runner records a step whose machinery raised
        log.exception("reconcile: finishing the checkpoint of run %s failed", run.pk)
        outcome = steps.crashed(plan, exc)
    finally:
        beat.stop()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.lease_token != lease or run.status != RunStatus.RUNNING:
            steps.record_late(run, plan, outcome)
            return False
        machine.event(run, "checkpoint_resumed",
                      f"The worker that held this run stopped beating during the checkpoint of stage '{stage.key}', "
                      f"after its commit {commit[:12]} was made (journal entry {entry.uid}); reconciliation finishes "
                      f"that step.{notes}", stage=stage, data={"journal": entry.pk, "commit": commit})
        steps.finish(run, plan, outcome)
        if run.status == RunStatus.RUNNING:
            _enqueue_on_commit(run.pk, machine.hand_off(run))
        else:
            run.save()
    return True


def interrupt(run_id: int, token: str, heartbeat_at):
    """Take over a run whose step owner stopped beating: confirm its processes are gone (reap
    what is left), remove a stale ``index.lock`` a killed git left in its worktree, then

    * when the step was a checkpoint whose commit exists: finish it and let the run go on
      (returns ``RESUMED``);
    * else inspect what it left in the worktree and the journal, mark the open attempts
      ``interrupted`` and stop the run for review (returns True). Completed stages are kept.

    Returns False when another reconciler (or the owner itself) got there first: the takeover is
    a compare-and-swap on the run's lease token and heartbeat (docs/field-cases.md C17). A missing
    repository or worktree does not raise: it is said in the stop's sentence.
    """
    mine = machine.take_over(run_id, token, heartbeat_at, f"reconciler:{hosts.this_host()}")
    if mine is None:
        return False
    run = Run.objects.get(pk=run_id)
    reaping = reap_run(run)
    if not reaping["unconfirmed"]:
        # the attempts' HOMEs (the CLIs' own session and temporary files: their output unredacted),
        # which the dead worker could not remove; nothing of them is evidence
        shutil.rmtree(attempt_homes(run.pk), ignore_errors=True)
    if reaping["unconfirmed"]:  # a git of another host may hold it: its processes are not confirmed gone
        lock = {"state": "unknown", "path": None, "holders": [], "sentence": "git's index lock was left alone: "
                "attempts of another host could not be confirmed stopped."}
    else:
        lock = _clear_index_lock(run)
    found = _interrupted_checkpoint(run)
    if found is not None:
        note = f" Processes reaped: {reaping['reaped']}." if reaping["reaped"] else ""
        note += f" {lock['sentence']}" if lock["sentence"] else ""
        return RESUMED if _resume_checkpoint(run, mine, found, note) else False
    effects = inspect_effects(run)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.lease_token != mine:
            return False
        stage, _ = _cut_open_work(run, heartbeat_at,
                                  "The worker running this attempt stopped beating; the attempt was interrupted.")
        reaped, unconfirmed = reaping["reaped"], reaping["unconfirmed"]
        note = f" Processes reaped: {reaped}." if reaped else " No process of it was left."
        if unconfirmed:
            note += f" Attempts {unconfirmed} ran on another host; their processes could not be confirmed stopped."
        if lock["sentence"]:
            note += " " + lock["sentence"]
        if effects["sentence"]:
            note += " " + effects["sentence"]
        evidence = {"reaped": reaped, "unconfirmed": unconfirmed, "effects": effects["attempts"],
                    "journal_intents": effects["journal_intents"],
                    **({"index_lock": {k: lock[k] for k in ("path", "state", "holders")}} if lock["sentence"] else {})}
        if effects["attempts"]:
            evidence["attempt"] = effects["attempts"][-1]["attempt"]
        machine.stop(run, "interrupted",
                     f"The worker that held this run stopped sending heartbeats; the step was interrupted and "
                     f"completed stages were kept.{note}", stage=stage, evidence=evidence)
    return True


def _cut_open_work(run: Run, heartbeat_at, message: str) -> tuple[StageRun | None, list[Attempt]]:
    """In the caller's transaction, with ``run`` locked and taken over: close its open attempts as
    ``interrupted`` with ``message`` (each known to have run until ``heartbeat_at``, the last
    heartbeat; its partial output's size kept where its log is on this disk) and cut its running
    checks (``failure_kind`` interrupted: cut, not failed). Returns the stage to stop at (the last
    interrupted attempt's, else the first stage neither passed nor pending) and the attempts closed."""
    stage, cut = None, []
    for attempt in Attempt.objects.filter(run_id=run.pk, status__in=ATTEMPT_OPEN).select_related("stage"):
        known = None
        if attempt.started_at:  # known to have run until the last heartbeat
            known = max(0.0, (heartbeat_at - attempt.started_at).total_seconds())
        log_file = var_path(attempt.log_path) if attempt.log_path else None
        if log_file is not None and log_file.is_file():
            attempt.output_bytes = log_file.stat().st_size  # its partial output, kept
        machine.attempt_interrupted(attempt, message, known)
        stage = attempt.stage
        cut.append(attempt)
    Check.objects.filter(run_id=run.pk, ended_at=None).update(ended_at=timezone.now(), failure_kind="interrupted")
    if stage is None:
        stage = run.stages.exclude(status__in=["passed", "pending"]).order_by("order").first()
    return stage, cut


def interrupt_lost_host(run_id: int, token: str, heartbeat_at, host: str, silent_seconds: float | None) -> bool:
    """Mark running run ``run_id``, pinned to ``host`` which has had no heartbeat for
    ``silent_seconds`` (None: it never beat), interrupted: its open attempts ``interrupted``, its
    running checks cut, the run stopped for review with "host X has had no heartbeat for N s". Nothing
    is reaped or inspected (the processes and the worktree are on that host's disk) and the run is not
    resumed here: its evidence says ``host_confirmed: False`` until that host's own pass confirms the
    old processes gone (``confirm_returned``), and a recovery is refused until then
    (engine/operations.py). Returns False when another reconciler got there first (the takeover's
    compare-and-swap on the lease token and heartbeat, as ``interrupt``)."""
    mine = machine.take_over(run_id, token, heartbeat_at, f"reconciler:{hosts.this_host()}")
    if mine is None:
        return False
    silent = f"{silent_seconds:.0f} s" if silent_seconds is not None else "ever (it never beat)"
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.lease_token != mine:
            return False
        stage, cut = _cut_open_work(run, heartbeat_at, f"Host {host} stopped beating; the attempt was interrupted "
                                                       f"(its processes are on that host).")
        numbers, ids = [attempt.number for attempt in cut], [attempt.pk for attempt in cut]
        machine.stop(run, "interrupted",
                     f"Host {host} has had no heartbeat for {silent}: the step it was running was interrupted and "
                     f"completed stages were kept. Its processes and its worktree are on that host, so they could not "
                     f"be confirmed stopped or inspected from here ({hosts.this_host()}), and the run is not resumed on "
                     f"another host. When host {host} is back, its reconciliation confirms the old processes gone; "
                     f"then the run can be recovered (or fail it now).", stage=stage,
                     evidence={"host": host, "host_confirmed": False, "host_silent_seconds": silent_seconds,
                               "unconfirmed": numbers, "interrupted_attempts": ids, "reaped": 0})
    log.warning("reconcile: run %s interrupted: host %s has had no heartbeat for %s", run_id, host, silent)
    return True


def confirm_returned() -> int:
    """For each run of this host that a pass elsewhere marked interrupted while the host was gone
    (``host_confirmed: False``): reap what is left of its processes here (``reap_run``), remove the
    attempts' HOMEs and a stale ``index.lock``, look at what the interrupted attempts left in the
    worktree (``inspect_effects``: the manifest against each attempt's start, its patch kept), then
    record the confirmation with that evidence (engine/machine.py ``host_confirmed``), after which the
    run may be recovered. A run whose worktree is not on this disk is not confirmed (logged). Returns how many runs were confirmed. A run whose reaping fails is left
    unconfirmed (logged); a later pass tries again."""
    confirmed = 0
    for run in Run.objects.filter(host=hosts.this_host(), stop_evidence__host_confirmed=False):
        if run.branch_created and not hosts.on_this_disk(run.worktree):
            # not the disk the run was pinned to (engine/hosts.py disk_conflict refuses such a worker at its
            # start): nothing here can be confirmed of it
            log.error("reconcile: run %s of host %s has no worktree %s on this disk (CP_VAR_DIR %s); its old "
                      "processes are not confirmed gone", run.pk, run.host, run.worktree, settings.VAR_DIR)
            continue
        try:
            reaping = reap_run(run)
            if reaping["unconfirmed"]:
                continue  # an attempt of yet another host: not ours to confirm
            shutil.rmtree(attempt_homes(run.pk), ignore_errors=True)
            lock = _clear_index_lock(run)
            effects = inspect_effects(run, (run.stop_evidence or {}).get("interrupted_attempts") or [])
        except Exception:
            log.exception("reconcile: confirming the processes of run %s gone failed; a later pass tries again",
                          run.pk)
            continue
        sentence = (f"Host {hosts.this_host()} is back: its reconciliation confirmed the processes of this run gone "
                    f"({reaping['reaped']} were still alive and were stopped). {lock['sentence']} "
                    f"{effects['sentence']} The run can be recovered now.").replace("  ", " ").replace("  ", " ")
        if machine.host_confirmed(run.pk, sentence, reaping["reaped"], effects):
            confirmed += 1
    return confirmed


def hosts_to_reconcile(now=None) -> list[Host]:
    """The live hosts other than this one that have work for their own pass: a running run pinned to
    it whose heartbeat is stale (its pool process died while the host beats), or a run of it still
    waiting for the confirmation of ``confirm_returned``. The beat sends each a pass on its queue
    (controlpanel/beat.py). Two queries plus one per host."""
    now = now or timezone.now()
    stale_cutoff = now - timedelta(seconds=settings.CP_HEARTBEAT_STALE)
    found = []
    for host in hosts.live_hosts(now):
        if host.name == hosts.this_host():
            continue
        if (Run.objects.filter(host=host.name, status=RunStatus.RUNNING, heartbeat_at__lt=stale_cutoff)
                .exclude(lease_owner="").exists()
                or Run.objects.filter(host=host.name, stop_evidence__host_confirmed=False).exists()):
            found.append(host)
    return found
