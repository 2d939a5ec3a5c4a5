"""A run's record as people and programs read it: the DRF serializers of ``run_status --json``, the JSON
API's answers (controlpanel/api.py) and their OpenAPI schema (controlpanel/api_schema.py), one shape.

``RunRecord`` is a run's whole record (engine/operations.py ``run_status``), ``RunSummary`` one line of a
run list (``run_summary``); ``StageRecord``, ``AttemptRecord``, ``CheckRecord`` and ``SetupRecord`` their
parts. The shape is a contract (docs/run-status.md; tests/test_api_contract.py keeps the keys): later
versions add keys, never rename one. Its conventions: a moment is ISO 8601 as Python writes it (``+00:00``,
never DRF's ``Z``), an empty text is null, and a record file (a log, a prompt, a patch) is its path on its
host's disk (engine/steps/paths.py ``var_path``: CP_OTHER_VAR_DIRS too).

The engine writes no web page: the serializers read models and engine/answers.py, nothing of controlpanel/.
"""
from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers

from . import answers, hosts, workers
from .models import Check, Decision, RunStatus
from .steps.paths import var_path
from .text import tool_outcomes


class Moment(serializers.DateTimeField):
    """A datetime as ``isoformat()`` writes it (``+00:00``, where DRF would write ``Z``), or null."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, allow_null=True, **kwargs)

    def to_representation(self, value) -> str:
        return value.isoformat()


class Text(serializers.CharField):
    """A text attribute, null when it is empty."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, allow_null=True, **kwargs)

    def to_representation(self, value):
        return str(value) if value else None


class RecordFile(serializers.CharField):
    """A record file's path relative to the var directory, given as its path on its host's disk; null when none."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, allow_null=True, **kwargs)

    def to_representation(self, value):
        return str(var_path(value)) if value else None


def _json(**kwargs):
    return serializers.JSONField(read_only=True, **kwargs)


class AttemptRecord(serializers.Serializer):
    """One attempt of a stage (engine/models.py ``Attempt``)."""

    id = serializers.IntegerField(source="pk", read_only=True)
    operation = serializers.CharField(read_only=True)
    number = serializers.IntegerField(read_only=True)
    status = serializers.CharField(read_only=True)
    adapter = serializers.CharField(read_only=True)
    profile = serializers.CharField(source="profile_name", read_only=True)
    simulated = serializers.BooleanField(read_only=True)
    exit_code = serializers.IntegerField(read_only=True, allow_null=True)
    signal = serializers.IntegerField(read_only=True, allow_null=True)
    elapsed_seconds = serializers.FloatField(read_only=True, allow_null=True)
    usage = _json(help_text="tokens and cost as the engine's gateway saw them (null where not reported)")
    failure_kind = Text()
    failure_message = Text()
    session_id = Text()
    final_message = Text(help_text="what the agent said at the end: a claim, shown as such")
    structured = serializers.BooleanField(read_only=True)
    cli_version = Text()
    prompt = RecordFile(source="prompt_path")
    prompt_sha256 = Text()
    log = RecordFile(source="log_path")
    raw = RecordFile(source="raw_path")
    stderr = RecordFile(source="stderr_path")
    patch = RecordFile(source="patch_path")
    patch_sha256 = Text()
    start_commit = Text()
    start_manifest = Text()
    manifest = serializers.SerializerMethodField()
    deadline_seconds = serializers.FloatField(read_only=True, allow_null=True)
    late = serializers.BooleanField(read_only=True)
    redactions = serializers.IntegerField(read_only=True, help_text="credentials redacted from its logs")
    refusals = _json()
    tool_outcomes = serializers.SerializerMethodField()
    network = _json(allow_null=True)
    verdict = _json(allow_null=True)
    verdict_problem = Text()
    started_at = Moment()
    ended_at = Moment()

    def get_manifest(self, attempt) -> str | None:
        """The digest of the manifest of the files the attempt left (null before it ended)."""
        return attempt.result_manifest.digest if attempt.result_manifest_id else None

    def get_tool_outcomes(self, attempt) -> dict:
        """How many of its tool calls ended each way (engine/text/tool_outcomes.py ``counts``)."""
        return tool_outcomes.counts(attempt.refusals)


class CheckRecord(serializers.Serializer):
    """One check: a gate, a baseline check or the setup step (engine/models.py ``Check``)."""

    id = serializers.IntegerField(source="pk", read_only=True)
    name = serializers.CharField(read_only=True)
    kind = serializers.CharField(read_only=True)
    command = serializers.CharField(read_only=True)
    cwd = serializers.CharField(read_only=True)
    exit_code = serializers.IntegerField(read_only=True, allow_null=True)
    signal = serializers.IntegerField(read_only=True, allow_null=True)
    passed = serializers.BooleanField(read_only=True, allow_null=True)
    failure_kind = Text()
    stale = serializers.BooleanField(read_only=True)
    log = RecordFile(source="log_path")
    manifest = Text(source="manifest_digest")
    started_at = Moment()
    ended_at = Moment()
    elapsed_seconds = serializers.FloatField(read_only=True, allow_null=True)
    network = _json(allow_null=True)
    tests = serializers.SerializerMethodField()

    def get_tests(self, check) -> dict | None:
        """The test runner's record (engine/checks/test_reports): counts and ids, its file as a path; null
        for an exit-status gate."""
        if not check.tests:
            return None
        shown = {key: value for key, value in check.tests.items() if key != "record_path"}
        shown["record"] = str(var_path(check.tests["record_path"])) if check.tests.get("record_path") else None
        return shown


class SetupCheckRecord(CheckRecord):
    """The setup step's check, with what it built or reused (``Check.setup``)."""

    setup = _json(allow_null=True)


class StageRecord(serializers.Serializer):
    """One stage of the run, its attempts and checks in order."""

    key = serializers.CharField(read_only=True)
    status = serializers.CharField(read_only=True)
    phase = serializers.CharField(read_only=True)
    base_commit = Text()
    checkpoint = Text(source="checkpoint_commit")
    accepted_manifest = Text()
    repairs_used = serializers.IntegerField(read_only=True)
    repair_allowance = serializers.SerializerMethodField()
    last_defect = Text()
    started_at = Moment()
    finished_at = Moment()
    totals = serializers.SerializerMethodField()
    attempts = AttemptRecord(many=True, read_only=True, source="_record_attempts")
    checks = CheckRecord(many=True, read_only=True, source="_record_checks")

    def to_representation(self, stage):
        # one query each for the stage's attempts and checks, read by totals, attempts and checks alike
        stage._record_attempts = list(stage.attempts.select_related("result_manifest").order_by("number"))
        stage._record_checks = list(stage.checks.order_by("id"))
        return super().to_representation(stage)

    def get_repair_allowance(self, stage) -> int:
        return stage.spec.get("repair_allowance", 0)

    def get_totals(self, stage) -> dict:
        """The stage's time, spend and counts (engine/answers.py ``stage_totals``)."""
        return answers.stage_totals(stage, stage._record_attempts, stage._record_checks)


class SetupRecord(serializers.Serializer):
    """The run's setup step (engine/steps/setup.py): its commands, its latest check, whether it passed or
    reused an environment, and the environment the run's agents and gates see."""

    commands = serializers.ListField(child=serializers.CharField(), read_only=True)
    check = SetupCheckRecord(read_only=True, allow_null=True)
    passed = serializers.BooleanField(read_only=True)
    reused = serializers.BooleanField(read_only=True)
    environment = _json(allow_null=True)

    @staticmethod
    def facts(run) -> dict | None:
        """What this serializer shows of ``run``'s setup; None for a pipeline without setup."""
        if not (run.definition.get("pipeline") or {}).get("setup"):
            return None
        check = run.checks.filter(kind=Check.Kind.SETUP).order_by("-id").first()
        return {"commands": run.definition["pipeline"]["setup"]["commands"], "check": check,
                "passed": bool(check and check.passed), "reused": bool(check and (check.setup or {}).get("reused")),
                "environment": run.environment or None}


class PendingDecision(serializers.Serializer):
    id = serializers.IntegerField(source="pk", read_only=True)
    kind = serializers.CharField(read_only=True)
    reason = serializers.CharField(read_only=True)
    artifact = Text()


class _RunAnswers:
    """The keys a run list's line and a run's whole record both answer from engine/answers.py."""

    def get_waiting_for(self, run) -> str | None:
        """'start', 'worker', 'review', 'approval' or null (engine/answers.py ``waiting_for``)."""
        return answers.waiting_for(run)

    def get_waiting_sentence(self, run) -> str | None:
        return answers.waiting_sentence(run) or None

    def get_current_stage(self, run) -> str | None:
        current = answers.current_stage(run)
        return current.key if current else None

    def get_totals(self, run) -> dict:
        """The run's time, spend and counts (engine/answers.py ``totals``)."""
        return answers.totals(run)


class RunSummary(_RunAnswers, serializers.Serializer):
    """One line of a run list (``GET /api/runs/``), each key as in ``RunRecord``."""

    id = serializers.IntegerField(source="pk", read_only=True)
    uid = serializers.UUIDField(read_only=True)
    status = serializers.CharField(read_only=True)
    simulated = serializers.BooleanField(read_only=True)
    pipeline = serializers.CharField(source="pipeline_name", read_only=True)
    repo = serializers.CharField(source="repo_path", read_only=True)
    revision = serializers.CharField(read_only=True)
    commit = serializers.CharField(read_only=True)
    stop_reason = Text()
    waiting_for = serializers.SerializerMethodField()
    waiting_sentence = serializers.SerializerMethodField()
    current_stage = serializers.SerializerMethodField()
    rerun_of = serializers.IntegerField(source="rerun_of_id", read_only=True, allow_null=True)
    created_at = Moment()
    started_at = Moment()
    finished_at = Moment()
    totals = serializers.SerializerMethodField()


class RunRecord(_RunAnswers, serializers.Serializer):
    """A run's whole record: ``run_status --json``, ``GET /api/runs/<id>/`` and the answers of the API's
    verbs that make or change a run (docs/run-status.md says what each key means)."""

    id = serializers.IntegerField(source="pk", read_only=True)
    uid = serializers.CharField(read_only=True)
    status = serializers.CharField(read_only=True)
    simulated = serializers.BooleanField(read_only=True)
    simulated_reason = Text()
    pipeline = serializers.CharField(source="pipeline_name", read_only=True)
    repo = serializers.CharField(source="repo_path", read_only=True)
    revision = serializers.CharField(read_only=True)
    commit = serializers.CharField(read_only=True)
    branch = serializers.CharField(read_only=True)
    worktree = serializers.CharField(read_only=True)
    host = serializers.SerializerMethodField()
    host_alive = serializers.SerializerMethodField()
    host_beat_age_seconds = serializers.SerializerMethodField()
    stop_reason = Text()
    stop_message = Text()
    stop_evidence = serializers.SerializerMethodField()
    waiting_for = serializers.SerializerMethodField()
    active_seconds = serializers.SerializerMethodField()
    heartbeat_age_seconds = serializers.SerializerMethodField()
    heartbeat_stale = serializers.SerializerMethodField()
    definition_sha256 = serializers.CharField(read_only=True)
    control_records = RecordFile(source="control_dir")
    not_included = _json()
    roles = serializers.SerializerMethodField()
    rerun_of = serializers.IntegerField(source="rerun_of_id", read_only=True, allow_null=True)
    reruns = serializers.SerializerMethodField()
    protected_files = serializers.SerializerMethodField()
    budgets = serializers.SerializerMethodField()
    pending_decision = PendingDecision(read_only=True, allow_null=True, source="_record_pending")
    created_at = Moment()
    finished_at = Moment()
    started_at = Moment()
    current_stage = serializers.SerializerMethodField()
    waiting_sentence = serializers.SerializerMethodField()
    host_unconfirmed = serializers.SerializerMethodField()
    queued_without_worker = serializers.SerializerMethodField()
    actions = serializers.SerializerMethodField()
    totals = serializers.SerializerMethodField()
    setup = SetupRecord(read_only=True, allow_null=True, source="_record_setup",
                        help_text="the setup step; null for a pipeline without setup")
    stages = StageRecord(many=True, read_only=True, source="_record_stages")

    def to_representation(self, run):
        run._record_host = hosts.run_host_facts(run)  # one query for the three host keys
        run._record_pending = run.decisions.filter(state=Decision.State.PENDING).order_by("-id").first()
        run._record_setup = SetupRecord.facts(run)
        run._record_stages = run.stages.order_by("order")
        running = run.heartbeat_at and run.status == RunStatus.RUNNING
        run._record_heartbeat_age = (timezone.now() - run.heartbeat_at).total_seconds() if running else None
        return super().to_representation(run)

    def get_host(self, run) -> str | None:
        """The host the run's first claim pinned it to (engine/hosts.py ``run_host_facts``)."""
        return run._record_host["host"]

    def get_host_alive(self, run) -> bool | None:
        return run._record_host["host_alive"]

    def get_host_beat_age_seconds(self, run) -> float | None:
        return run._record_host["host_beat_age_seconds"]

    def get_stop_evidence(self, run) -> dict | None:
        return run.stop_evidence or None

    def get_active_seconds(self, run) -> float:
        return round(run.active_seconds, 3)

    def get_heartbeat_age_seconds(self, run) -> float | None:
        """Seconds since the running run's last heartbeat; null unless it is running."""
        return run._record_heartbeat_age

    def get_heartbeat_stale(self, run) -> bool:
        """Running, but no heartbeat for longer than CP_HEARTBEAT_STALE: its worker may be gone, and
        reconciliation will interrupt it (the same age as ``heartbeat_age_seconds``, read once)."""
        age = run._record_heartbeat_age
        return age is not None and age > settings.CP_HEARTBEAT_STALE

    def get_roles(self, run) -> dict:
        return run.definition["roles"]

    def get_reruns(self, run) -> list[int]:
        return list(run.reruns.order_by("id").values_list("id", flat=True))

    def get_protected_files(self, run) -> list[dict]:
        return [{"path": p["path"], "sha256": p["sha256"], "why": p["why"]} for p in run.protected_files]

    def get_budgets(self, run) -> dict:
        return run.definition["pipeline"].get("budgets") or {}

    def get_host_unconfirmed(self, run) -> str | None:
        return answers.waits_for_host(run) or None

    def get_queued_without_worker(self, run) -> str | None:
        return workers.queued_without_worker(run) or None

    def get_actions(self, run) -> list[dict]:
        """What a person may do now, each with why not when it is refused (engine/answers.py ``actions``)."""
        return [action.as_dict() for action in answers.actions(run).values()]


def plain(data):
    """``data`` from a serializer as plain dicts and lists (what json, equality and pickling expect)."""
    if isinstance(data, dict):
        return {key: plain(value) for key, value in data.items()}
    if isinstance(data, list):
        return [plain(value) for value in data]
    return data
