"""Every prompt an agent is given, assembled in one place: the implementer's and the
documenter's from the stage's context (engine/context.py reads the documents and lays out the
sections; here: the dependencies' accepted output and the initial specification index), a
repair's defect and current patch, the documenter's task and knowledge base, and the reviewer's
(engine/checks/review.py writes its text from the reviewed patch and the checks)."""
from __future__ import annotations

import json
import os
import tempfile
from datetime import timezone as dt_timezone

from django.db import transaction

from .. import context, diff_comments, machine, workspace
from ..checks import globs
from ..processes import process
from ..checks import review as verdicts
from ..models import Attempt, AttemptStatus, Check, Manifest, Run, RunEvent, StageRun
from ..redaction import redact_text
from . import agreed
from .common import fenced
from .paths import control_path, var_path
from .plans import AgentPlan


def build_prompt(run: Run, stage: StageRun, plan: AgentPlan, start: dict) -> str:
    """The prompt of an implement, repair or review session (raises context.ContextError)."""
    pipeline = run.definition["pipeline"]
    if plan["operation"] == "review":
        patch_rel = control_path(run, plan["folder"], "reviewed.diff")
        workspace.write_patch(run.worktree, stage.base_commit, start["tree"], str(var_path(patch_rel)))
        checks = []
        for c in stage.checks.filter(manifest_digest=start["digest"], stale=False).order_by("id"):
            ledger = (stage.agreed_tests or {}).get(c.name) or {}
            seen = agreed.outcomes(c) if c.tests else {}
            others = {test: how for test, how in seen.items() if test not in set(ledger.get("ids") or [])}
            checks.append({"name": c.name, "command": c.command, "exit_code": c.exit_code, "passed": c.passed,
                           "tests": c.tests, "new_tests": sorted(t for t, how in others.items() if how == "passed"),
                           "other_tests": {t: how for t, how in sorted(others.items()) if how != "passed"}})
        return verdicts.prompt(pipeline=pipeline, stage=stage.spec, worktree=run.worktree,
                             patch=var_path(patch_rel).read_text(encoding="utf-8", errors="replace"), checks=checks,
                             reviewer=f"reviewer '{plan['profile_name']}'") + people_section(run, stage)
    text = context.assemble_prompt(pipeline=pipeline, stage=stage.spec, worktree=run.worktree,
                                   operation=plan["operation"], dependencies=_dependency_summaries(run, stage.spec),
                                   spec_index_text=_initial_spec_index(run, stage, plan),
                                   changed=frozenset(c["path"] for c in start.get("changes") or []))
    text += people_section(run, stage)
    if plan["operation"] == "implement" and plan.get("operation_attempt") == 1:
        text += carried_section(run, stage)
    if plan["operation"] == "repair":
        text += _repair_section(run, stage, plan, start)
    elif plan["operation"] == "document":
        text += _document_section(run, stage, plan, start)
    return text


#: What each kind of person's decision is called in a prompt (``Decision.action``).
_DECIDED = {"retry": "recovered the stopped run with a retry", "verify": "recovered the stopped run with a verification",
            "recheck": "asked for a recheck", "request_changes": "requested changes at the human gate"}


def people_section(run: Run, stage: StageRun) -> str:
    """What people wrote about ``stage``, for every later prompt of it: each recovery, recheck and
    request for changes with a note, oldest first, under a heading naming who wrote it and when
    (UTC); a stop it answered comes first (the stop's sentence and, for a reviewer's escalation
    or repair request, its findings); a request for changes lists its comments on the diff.
    '' when nobody wrote anything. The text is redacted with the rest of the prompt
    (engine/steps/attempts.py)."""
    decided = [d for d in stage.decisions.exclude(note="").order_by("decided_at", "id") if d.action in _DECIDED]
    if not decided:
        return ""
    stops = {e.decision_id: e for e in RunEvent.objects.filter(run=run, kind="stopped",
                                                                decision__in=[d.pk for d in decided])}
    lines = ["", "## From a person (read this first: it answers questions and sets what must change)"]
    for decision in decided:
        when = decision.decided_at.astimezone(dt_timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") \
            if decision.decided_at else "(time unknown)"
        who = " ".join((decision.decided_by or "an operator").split())  # one line: it is in a heading
        lines += ["", f"### Written by {who} on {when} ({_DECIDED[decision.action]})"]
        stopped = stops.get(decision.pk)
        if stopped is not None:
            said = stopped.message.removeprefix(f"Stopped ({decision.reason}): ")
            lines += [f"The run had stopped ({decision.reason}):", *[f"> {line}" for line in said.splitlines()]]
            for finding in (stopped.data or {}).get("findings") or []:
                lines.append(f"- {_where(finding)}: {' '.join(str(finding.get('text')).splitlines())}")
        elif decision.action == "request_changes":
            lines += [f"They read the diff of files {decision.artifact[:12]} waiting for approval and sent it back."]
        lines += ["", f"{who} wrote:", "", *[f"> {line}" for line in decision.note.splitlines()]]
        if decision.comments:
            lines += ["", "Comments on the diff:"]
            for comment in decision.comments:
                # one line each: a comment's own line breaks cannot start a heading of the section
                lines.append(f"- {_where(comment)}: {' '.join(str(comment.get('text')).splitlines())}")
                if comment.get("file") and comment.get("line") and decision.artifact:
                    code = diff_comments.code_around(run, decision.artifact, comment["file"], comment["line"])
                    if code:
                        lines += [f"  The code there (line {comment['line']} marked >), in the files they read:",
                                  *[f"  {row}" for row in code]]
    return "\n".join(lines) + "\n"


def _where(finding: dict) -> str:
    where = finding.get("file") or "(general)"
    if finding.get("line"):
        where += f":{finding['line']}"
    return f"[{finding['severity']}] {where}" if finding.get("severity") else where


#: Bytes of a dependency's accepted patch given in a prompt; the rest by reference (the git command).
DEPENDENCY_PATCH_BYTES = 48 * 1024


def _accepted_patch(run: Run, dep: StageRun) -> list[str]:
    """The prompt lines of a dependency's accepted patch: its diff from the stage's base commit to its
    checkpoint (workspace.write_patch: no user diff configuration, no textconv), the first
    DEPENDENCY_PATCH_BYTES bytes of it fenced, and when it is longer, the git command that shows it
    whole in the worktree. [] when the stage has no checkpoint."""
    if not (dep.checkpoint_commit and dep.base_commit):
        return []
    with tempfile.TemporaryDirectory(prefix="cp-dep-patch-") as tmp:
        out = os.path.join(tmp, "accepted.diff")
        info = workspace.write_patch(run.worktree, dep.base_commit, dep.checkpoint_commit, out)
        with open(out, "rb") as fh:
            head = fh.read(DEPENDENCY_PATCH_BYTES + 1)
    whole = f"git diff {dep.base_commit} {dep.checkpoint_commit}"
    lines = ["", f"The accepted patch ({info['files']} file{'s' if info['files'] != 1 else ''}, {info['bytes']:,} "
                 f"bytes; `{whole}` shows it):", "```diff",
             head[:DEPENDENCY_PATCH_BYTES].decode("utf-8", "replace").rstrip("\n").replace("```", "`\u200b``"), "```"]
    if len(head) > DEPENDENCY_PATCH_BYTES:
        lines.append(f"[... cut at {DEPENDENCY_PATCH_BYTES:,} of {info['bytes']:,} bytes; the rest: `{whole}`]")
    return lines


def _dependency_summaries(run: Run, stage_def: dict) -> list[dict]:
    """The accepted output of the stages ``stage_def`` depends on: the files of the manifest its
    checkpoint committed, the final message of the implementer (or repairer) that wrote them, the
    accepted patch (``_accepted_patch``, bounded) and the documentation notes as checkpointed."""
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
        if accepted is not None:
            lines += _accepted_patch(run, dep)
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


def _initial_spec_index(run: Run, stage: StageRun, plan: AgentPlan) -> str | None:
    """The engine's initial specification index when the repository has none at the pipeline's
    ``spec_index`` (None otherwise); kept with the attempt (``spec-index.md``), announced once per run."""
    rel = run.definition["pipeline"].get("spec_index")
    if not rel or os.path.isfile(context.resolve_inside(run.worktree, rel)):
        return None
    text = redact_text(context.initial_spec_index(run.worktree, rel))[0]
    record = control_path(run, plan["folder"], "spec-index.md")
    var_path(record).write_text(text, encoding="utf-8")
    with transaction.atomic():
        locked = fenced(run.pk, plan["lease"])
        if locked is not None and not locked.events.filter(kind="spec_index_created").exists():
            listed = sum(1 for line in text.splitlines() if line.startswith("- `"))
            machine.event(locked, "spec_index_created",
                          f"The repository has no specification index at {rel}: the engine created an initial one "
                          f"listing its {listed} documentation file(s), gave it to the agents and kept it at "
                          f"{record}. It is not written into the repository.",
                          stage=stage, data={"path": record, "spec_index": rel, "files": listed})
    return text


def _document_section(run: Run, stage: StageRun, plan: AgentPlan, start: dict) -> str:
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


def carried_section(run: Run, stage: StageRun) -> str:
    """What the first attempt of a stage is told when its run continues one its budget stopped on that stage
    (``Run.carried``, engine/runs_again.py): why it stopped, the stopped attempt's last model calls (its
    gateway's ledger) and final message (a claim), and its patch. '' for any other stage or run."""
    carried = run.carried or {}
    if carried.get("stage") != stage.key or not carried.get("attempt"):
        return ""
    attempt = Attempt.objects.filter(pk=carried["attempt"]).first()
    if attempt is None:
        return ""
    lines = ["", f"## Where run {carried['run']} stopped", f"This run continues run {carried['run']}, which stopped on "
             f"this stage at its budget ({carried.get('stop_reason')}): {carried.get('stop_message', '')}",
             f"Its attempt {attempt.number} ({attempt.operation}) was working; what it did is below as evidence, "
             "not as a result: nothing of it was verified, and its files are not in this worktree."]
    calls = [call for entry in ((attempt.gateway or {}).get("ledger") or [])
             for call in entry.get("tool_calls") or []][-20:]
    if calls:
        lines += ["", "### Its last tool calls (as its model gateway saw them)"]
        lines += [f"- {call.get('name')} {str(call.get('input'))[:300]}" for call in calls]
    if attempt.final_message:
        lines += ["", "### Its last message (its own claim)", attempt.final_message[:4000]]
    patch = var_path(attempt.patch_path) if attempt.patch_path else None
    if patch is not None and patch.is_file():
        text = patch.read_text(encoding="utf-8", errors="replace")
        if len(text) > 100_000:
            text = text[:100_000] + "\n[... cut]\n"
        lines += ["", "### Its patch (against its stage's start)", "```diff", text.rstrip() or "(empty)", "```"]
    return "\n".join(lines) + "\n"


def _repair_section(run: Run, stage: StageRun, plan: AgentPlan, start: dict) -> str:
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
        lines.append(f"- {_where(finding)}: {finding.get('text')}")
    patch_rel = control_path(run, plan["folder"], "current.diff")
    workspace.write_patch(run.worktree, stage.base_commit, start["tree"], str(var_path(patch_rel)))
    patch = var_path(patch_rel).read_text(encoding="utf-8", errors="replace")
    if len(patch) > 100_000:
        patch = patch[:100_000] + "\n[... cut; read the files for the rest]\n"
    lines += ["", "### The current patch (against the stage's starting checkpoint)", "```diff",
              patch.rstrip() or "(empty)", "```"]
    return "\n".join(lines) + "\n"
