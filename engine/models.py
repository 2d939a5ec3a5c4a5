"""The Run Engine's records: definitions, runs, their steps and the evidence they leave.

The database is the truth. Files (prompts, logs, patches, manifests, the frozen definition)
live under the run's control records, ``<CP_VAR_DIR>/runs/<run-id>/``; rows refer to them by
a path relative to ``CP_VAR_DIR`` and, where it matters, their sha256.

Nothing here assigns a status: ``engine.machine`` is the only place that does.
"""
from __future__ import annotations

import uuid

from django.db import models

from .simulation import simulation
from .vocabulary import EVENT_KINDS, STOP_REASONS


class RunStatus(models.TextChoices):
    """A run's status. ACTIVE runs own (or wait for) a worker; TERMINAL runs accept no action."""

    PENDING = "pending", "pending (needs Start)"
    QUEUED = "queued", "queued (waiting for a worker)"
    RUNNING = "running", "running"
    WAITING_REVIEW = "waiting_review", "waiting for review"
    WAITING_APPROVAL = "waiting_approval", "waiting for approval"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"


RUN_ACTIVE = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})
RUN_WAITING = frozenset({RunStatus.WAITING_REVIEW, RunStatus.WAITING_APPROVAL})
RUN_TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED})
#: A run in one of these has stopped moving until a person acts (or for good).
RUN_STOPPED = RUN_WAITING | RUN_TERMINAL


class StageStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    WAITING_REVIEW = "waiting_review", "waiting for review"
    WAITING_APPROVAL = "waiting_approval", "waiting for approval"
    PASSED = "passed", "passed (checkpointed)"
    FAILED = "failed", "failed"


class StagePhase(models.TextChoices):
    """Where a stage is: implement -> verify -> review -> document -> (verify -> review) -> checkpoint;
    a defect sends it to repair -> verify."""

    IMPLEMENT = "implement", "implement"
    VERIFY = "verify", "verify"
    REVIEW = "review", "review"
    REPAIR = "repair", "repair"
    DOCUMENT = "document", "document"
    CHECKPOINT = "checkpoint", "checkpoint"
    DONE = "done", "done"


class AttemptStatus(models.TextChoices):
    PREPARING = "preparing", "preparing"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    TIMEOUT = "timeout", "timeout"
    CANCELLED = "cancelled", "cancelled"
    INTERRUPTED = "interrupted", "interrupted"


ATTEMPT_OPEN = frozenset({AttemptStatus.PREPARING, AttemptStatus.RUNNING})


class Operation(models.TextChoices):
    IMPLEMENT = "implement", "implement"
    REVIEW = "review", "review"
    REPAIR = "repair", "repair"
    DOCUMENT = "document", "document"


class Pipeline(models.Model):
    """A saved pipeline: the validated definition loaded from a YAML file.

    ``definition`` has the normalized shape of ``engine.pipeline.format`` (docs/pipeline-format.md).
    """

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    definition = models.JSONField()
    sha256 = models.CharField(max_length=64, help_text="sha256 of the canonical JSON definition")
    source_path = models.CharField(max_length=1000, blank=True)
    version = models.PositiveIntegerField(default=1, help_text="raised each time the definition changes")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        count = len(self.definition.get("stages", []))
        return f"{self.name} (v{self.version}, {count} stage{'s' * (count != 1)})"


class Profile(models.Model):
    """An agent profile of a pipeline: which adapter runs a role, and how (model, turns, flags)."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=100)
    adapter = models.CharField(max_length=40)
    settings = models.JSONField(default=dict)

    class Meta:
        ordering = ["pipeline__name", "name"]
        constraints = [models.UniqueConstraint(fields=["pipeline", "name"], name="profile_unique_per_pipeline")]

    @property
    def simulated(self) -> bool:
        """True for the scripted test adapter and for a real CLI against a scripted model endpoint
        (engine/simulation.py decides, for every page)."""
        return bool(simulation(self.adapter, self.settings))

    def __str__(self):
        label = " (simulated)" if self.simulated else ""
        return f"{self.pipeline.name}/{self.name}: {self.adapter}{label}"


class Run(models.Model):
    """One execution of a frozen pipeline definition on one commit of one repository."""

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    pipeline = models.ForeignKey(Pipeline, on_delete=models.PROTECT, related_name="runs")
    pipeline_name = models.CharField(max_length=100)
    repo_path = models.CharField(max_length=1000, help_text="top level of the original checkout")
    revision = models.CharField(max_length=255, help_text="the revision as the person gave it")
    commit = models.CharField(max_length=40, help_text="the revision resolved to a full commit id")
    definition = models.JSONField(help_text="frozen definition and profiles at creation")
    definition_sha256 = models.CharField(max_length=64)
    profile_override = models.JSONField(default=dict, blank=True)
    rerun_of = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="reruns",
                                 help_text="the ended run this run re-runs (its frozen inputs, or the latest pipeline)")
    rerun_count = models.PositiveIntegerField(
        default=0, help_text="re-runs made of this run: a re-run asks for the count it saw (a double click makes one)")
    carried = models.JSONField(
        null=True, blank=True,
        help_text="a run continuing one its budget stopped (engine/runs_again.py): {run, stage, attempt, stop_reason, "
                  "stop_message, stages carried over}")
    simulated = models.BooleanField(default=False, help_text="uses the scripted test adapter or a scripted model")
    simulated_reason = models.CharField(max_length=200, blank=True)
    not_included = models.JSONField(
        default=list, blank=True, help_text="uncommitted changes of the original checkout, not in the run"
    )
    protected_files = models.JSONField(
        default=list, blank=True,
        help_text="agreed checks copied at creation: [{path, mode, blob, sha256, why}] (engine.checks.protected)",
    )

    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING)
    stop_reason = models.CharField(max_length=60, blank=True)  # one of STOP_REASONS (its constraint below)
    stop_message = models.TextField(blank=True)
    stop_evidence = models.JSONField(default=dict, blank=True)
    environment = models.JSONField(default=dict, blank=True, help_text="the setup step's environment once it passed "
                                   "(engine/environments.py): {key, keep, reused, check}")

    branch = models.CharField(max_length=255, blank=True)
    worktree = models.CharField(max_length=1000, blank=True)
    branch_created = models.BooleanField(default=False)
    port_base = models.PositiveIntegerField(null=True, blank=True)

    host = models.CharField(max_length=255, blank=True, help_text="the host whose disk holds the worktree: set by "
                            "the first claim, every later step goes to its queue (engine/hosts.py)")
    lease_owner = models.CharField(max_length=200, blank=True, help_text="host:pid of the worker in a step")
    lease_token = models.CharField(max_length=64, blank=True, help_text="fencing token of the current step")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    active_seconds = models.FloatField(default=0.0, help_text="seconds of execution, kept across restarts")
    steps = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status"])]
        # the closed choices, held by the database too: a write that bypasses the state machine cannot store
        # a state or reason nobody can read (engine/vocabulary.py)
        constraints = [
            models.CheckConstraint(condition=models.Q(status__in=RunStatus.values), name="run_status_known"),
            models.CheckConstraint(condition=models.Q(stop_reason__in=["", *STOP_REASONS]),
                                   name="run_stop_reason_known"),
        ]
        # the operations a person may be allowed, one by one (the API and the admin check them)
        permissions = [
            ("start_run", "Can start a run"),
            ("approve_run", "Can approve a human gate"),
            ("recheck_run", "Can ask for a recheck"),
            ("recover_run", "Can recover a run"),
            ("fail_run", "Can fail a run"),
        ]

    def __str__(self):
        sim = " [simulated]" if self.simulated else ""
        return f"run {self.pk} of {self.pipeline_name} on {self.commit[:12]}: {self.status}{sim}"

    @property
    def control_dir(self) -> str:
        """Control records folder, relative to CP_VAR_DIR."""
        return f"runs/{self.pk}"


class StartRequest(models.Model):
    """The durable record of a Start: at most one per run (the unique key refuses a second)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="start_request")
    requested_at = models.DateTimeField(auto_now_add=True)
    requested_by = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=40, default="api")
    enqueued_times = models.PositiveIntegerField(default=0)
    last_enqueued_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"start request for run {self.run_id} by {self.requested_by or 'unknown'} via {self.source}"


class StageRun(models.Model):
    """One stage of one run: its phase, its starting commit and its checkpoint."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="stages")
    key = models.CharField(max_length=100)
    order = models.PositiveIntegerField()
    status = models.CharField(max_length=20, choices=StageStatus.choices, default=StageStatus.PENDING)
    phase = models.CharField(max_length=20, choices=StagePhase.choices, default=StagePhase.IMPLEMENT)
    base_commit = models.CharField(max_length=40, blank=True, help_text="the checkpoint this stage started from")
    checkpoint_commit = models.CharField(max_length=40, blank=True)
    accepted_manifest = models.CharField(max_length=64, blank=True, help_text="digest of the files verified")
    repairs_used = models.PositiveIntegerField(default=0, help_text="repair attempts consumed; never reset")
    documented_manifest = models.CharField(
        max_length=64, blank=True, help_text="digest of the reviewed files the documentation agent started from")
    last_defect = models.JSONField(
        default=dict, blank=True,
        help_text="the defect that asked for the last repair: {kind, name, digest, message, evidence}",
    )
    agreed_tests = models.JSONField(
        default=dict, blank=True,
        help_text="by gate name, the test ids its runner must report passed again: {ids, from, check} "
                  "(engine/steps/agreed.py)")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "order"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="stage_unique_per_run"),
                       models.CheckConstraint(condition=models.Q(status__in=StageStatus.values),
                                              name="stage_status_known")]

    def __str__(self):
        return f"run {self.run_id} stage {self.order + 1} '{self.key}': {self.status}"

    @property
    def spec(self) -> dict:
        """This stage's frozen definition from the run's snapshot."""
        for stage in self.run.definition["pipeline"]["stages"]:
            if stage["key"] == self.key:
                return stage
        raise KeyError(self.key)


class Manifest(models.Model):
    """A content manifest of the deliverable files: git tree id as digest, file list on disk."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="manifests")
    stage = models.ForeignKey(StageRun, on_delete=models.CASCADE, null=True, blank=True, related_name="manifests")
    digest = models.CharField(max_length=64, help_text="git tree id of the deliverable files")
    base_commit = models.CharField(max_length=40)
    path = models.CharField(max_length=1000, help_text="JSON file, relative to CP_VAR_DIR")
    sha256 = models.CharField(max_length=64)
    files = models.PositiveIntegerField(default=0)
    added = models.PositiveIntegerField(default=0)
    modified = models.PositiveIntegerField(default=0)
    deleted = models.PositiveIntegerField(default=0)
    excluded = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"manifest {self.digest[:12]} (+{self.added} ~{self.modified} -{self.deleted})"


class Attempt(models.Model):
    """One agent session: persisted before launch, completed with its outcome and evidence."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    stage = models.ForeignKey(StageRun, on_delete=models.CASCADE, related_name="attempts")
    operation = models.CharField(max_length=20, choices=Operation.choices)
    number = models.PositiveIntegerField(help_text="1, 2, ... within the stage, across operations")
    role = models.CharField(max_length=20)
    profile_name = models.CharField(max_length=100)
    adapter = models.CharField(max_length=40)
    simulated = models.BooleanField(default=False)
    status = models.CharField(max_length=20, choices=AttemptStatus.choices, default=AttemptStatus.PREPARING)
    failure_kind = models.CharField(max_length=60, blank=True)
    failure_message = models.TextField(blank=True)

    deadline_seconds = models.FloatField()
    deadline_at = models.DateTimeField(null=True, blank=True)
    start_commit = models.CharField(max_length=40, blank=True)
    start_manifest = models.CharField(max_length=64, blank=True)
    lease_token = models.CharField(max_length=64, blank=True)

    host = models.CharField(max_length=255, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    pid_create_time = models.FloatField(null=True, blank=True)
    marker = models.CharField(max_length=64, blank=True)

    prompt_path = models.CharField(max_length=1000, blank=True)
    prompt_sha256 = models.CharField(max_length=64, blank=True)
    log_path = models.CharField(max_length=1000, blank=True)
    raw_path = models.CharField(max_length=1000, blank=True, help_text="the CLI's stdout (redacted bytes)")
    stderr_path = models.CharField(max_length=1000, blank=True, help_text="the CLI's stderr, kept apart (redacted bytes)")
    patch_path = models.CharField(max_length=1000, blank=True)
    patch_sha256 = models.CharField(max_length=64, blank=True)
    result_manifest = models.ForeignKey(
        Manifest, on_delete=models.SET_NULL, null=True, blank=True, related_name="attempts"
    )

    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.IntegerField(null=True, blank=True)
    elapsed_seconds = models.FloatField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True, help_text="tokens and cost; null fields are unknown")
    session_id = models.CharField(max_length=200, blank=True)
    final_message = models.TextField(blank=True)
    structured = models.BooleanField(
        null=True, blank=True,
        help_text="whether the CLI's documented output (its JSON stream) was read; false: it printed text, kept as "
                  "the final message; unknown for the scripted test adapter")
    cli_version = models.CharField(max_length=200, blank=True)
    output_bytes = models.BigIntegerField(default=0)
    redactions = models.PositiveIntegerField(default=0)
    refusals = models.JSONField(default=list, blank=True,
                                help_text="tool calls the CLI refused or that failed: [{tool, message}]")
    network = models.JSONField(null=True, blank=True,
                               help_text="its egress proxy: {allow: [host], connected: [{host, port, at}], "
                                         "refused: [{host, port, why, at}]}")
    limits = models.JSONField(null=True, blank=True,
                              help_text="what bounded it (engine/processes/limits.py): {limits, mechanism, reached, "
                                        "written_bytes, peak_processes}")
    gateway = models.JSONField(
        null=True, blank=True,
        help_text="what its model gateway saw (engine/model_gateway): {upstream, calls, usage, meter, stop_kind, "
                  "ledger[], cli_usage (the CLI's own claim)}; null: the CLI's own login, not metered")
    spend = models.JSONField(
        null=True, blank=True,
        help_text="what it spent against the budgets (engine/model_gateway/meter.py spend_of): {tokens, cost_usd, "
                  "unpriced_calls}")
    late = models.BooleanField(default=False, help_text="its result arrived after the run moved on")
    verdict = models.JSONField(null=True, blank=True,
                               help_text="a reviewer's validated verdict: {verdict, findings[{file, line, severity, text}]}")
    verdict_problem = models.TextField(blank=True, help_text="why the reviewer's answer was not a valid verdict")

    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["stage__order", "number"]
        constraints = [models.UniqueConstraint(fields=["stage", "number"], name="attempt_number_unique_per_stage"),
                       models.CheckConstraint(condition=models.Q(status__in=AttemptStatus.values),
                                              name="attempt_status_known")]

    def __str__(self):
        sim = " [simulated]" if self.simulated else ""
        return f"run {self.run_id} {self.stage.key} attempt {self.number} ({self.operation}, {self.adapter}): {self.status}{sim}"


class Check(models.Model):
    """One gate command's execution: what ran, where, when, its exit status and the files it tested."""

    class Kind(models.TextChoices):
        BASELINE = "baseline", "baseline check"
        GATE = "gate", "stage gate"
        HEALTH = "health", "health check"
        FINAL = "final", "final verification"
        SETUP = "setup", "setup"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checks")
    stage = models.ForeignKey(StageRun, on_delete=models.CASCADE, null=True, blank=True, related_name="checks")
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.GATE)
    name = models.CharField(max_length=100)
    command = models.TextField(help_text="the frozen command as defined")
    argv = models.JSONField(default=list, help_text="what was executed")
    cwd = models.CharField(max_length=1000)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    elapsed_seconds = models.FloatField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.IntegerField(null=True, blank=True)
    passed = models.BooleanField(default=False, help_text="true only for an actual exit status 0")
    failure_kind = models.CharField(max_length=60, blank=True)
    log_path = models.CharField(max_length=1000, blank=True)
    manifest = models.ForeignKey(Manifest, on_delete=models.SET_NULL, null=True, blank=True, related_name="checks")
    manifest_digest = models.CharField(max_length=64, blank=True)
    stale = models.BooleanField(default=False, help_text="the files changed after it ran; it no longer counts")
    network = models.JSONField(null=True, blank=True,
                               help_text="a gate with network_allow: {allow, connected, refused} of its egress proxy")
    limits = models.JSONField(null=True, blank=True,
                              help_text="what bounded its command (engine/processes/limits.py): {limits, mechanism, reached, "
                                        "written_bytes, peak_processes}")
    setup = models.JSONField(null=True, blank=True,
                             help_text="a setup check: {key, reused, made_by: {run, check}, size_bytes} of its environment")
    tests = models.JSONField(null=True, blank=True,
                             help_text="what its test runner recorded (engine/checks/test_reports): sessions, counts, failed "
                                       "and unreported ids, record_path; null: no runner record (an exit-status gate)")

    class Meta:
        ordering = ["id"]

    def __str__(self):
        outcome = "passed" if self.passed else (f"exit {self.exit_code}" if self.exit_code is not None else "failed")
        return f"run {self.run_id} check '{self.name}': {outcome}"


class Decision(models.Model):
    """A point where a person decides: approve a human gate, or recover a stopped run."""

    class Kind(models.TextChoices):
        APPROVAL = "approval", "approval"
        REVIEW = "review", "review (recover or fail)"

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        APPROVED = "approved", "approved"
        CHANGES_REQUESTED = "changes_requested", "changes requested"
        RECOVERED = "recovered", "recovered"
        SUPERSEDED = "superseded", "superseded"

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="decisions")
    stage = models.ForeignKey(StageRun, on_delete=models.CASCADE, null=True, blank=True, related_name="decisions")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    reason = models.CharField(max_length=60, blank=True, help_text="the stop reason that asked for it")
    artifact = models.CharField(max_length=64, blank=True, help_text="manifest digest it is about")
    decided_by = models.CharField(max_length=150, blank=True)
    note = models.TextField(blank=True)
    comments = models.JSONField(
        default=list, blank=True,
        help_text="a request for changes' comments on the diff: [{file, line (or null), text}]")
    action = models.CharField(max_length=20, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"decision {self.pk} ({self.kind}) on run {self.run_id}: {self.state}"


class JournalEntry(models.Model):
    """Checkpoint journal: the intent is recorded before git runs, so recovery can find the truth."""

    class State(models.TextChoices):
        INTENT = "intent", "intent"
        DONE = "done", "done"
        ABANDONED = "abandoned", "abandoned"

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="journal")
    stage = models.ForeignKey(StageRun, on_delete=models.CASCADE, related_name="journal")
    operation = models.CharField(max_length=40, default="checkpoint")
    state = models.CharField(max_length=20, choices=State.choices, default=State.INTENT)
    parent_commit = models.CharField(max_length=40)
    expected_tree = models.CharField(max_length=64)
    commit = models.CharField(max_length=40, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "journal entries"

    def __str__(self):
        return f"journal {self.uid} {self.operation} of run {self.run_id} stage {self.stage.key}: {self.state}"


class RunEvent(models.Model):
    """A sentence in the run's story: why it continued or stopped, pointing at the evidence."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=40)  # one of EVENT_KINDS (its constraint below)
    message = models.TextField()
    stage = models.ForeignKey(StageRun, on_delete=models.SET_NULL, null=True, blank=True)
    attempt = models.ForeignKey(Attempt, on_delete=models.SET_NULL, null=True, blank=True)
    gate_check = models.ForeignKey(Check, on_delete=models.SET_NULL, null=True, blank=True)
    decision = models.ForeignKey(Decision, on_delete=models.SET_NULL, null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.CheckConstraint(condition=models.Q(kind__in=list(EVENT_KINDS)), name="event_kind_known")]

    def __str__(self):
        return f"run {self.run_id} [{self.kind}] {self.message}"


class Notification(models.Model):
    """One delivery of one notice through one channel (an outbox row, written in the transaction
    that made the notice): a run started waiting for a person (``key`` ``decision:ID``, once per
    decision) or ended (``key`` ``end:RUN_UID``). ``state`` moves pending -> sending -> delivered,
    or back to pending with ``next_attempt_at`` (backoff) after a failed try, or to failed when
    its tries are used up (engine/machine.py NOTIFICATION_TRANSITIONS; engine/notifications.py
    delivers)."""

    class Channel(models.TextChoices):
        EMAIL = "email", "email"
        WEBHOOK = "webhook", "webhook"

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        SENDING = "sending", "sending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False,
                           help_text="the delivery id a receiver can de-duplicate on")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="notifications")
    decision = models.ForeignKey(Decision, on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="notifications")
    key = models.CharField(max_length=100, help_text="decision:ID or end:RUN_UID: one notice, once per channel")
    kind = models.CharField(max_length=20, help_text="waiting or ended")
    channel = models.CharField(max_length=20, choices=Channel.choices)
    target = models.CharField(max_length=1000, help_text="the webhook URL or the email addresses")
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    tries = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status = models.IntegerField(null=True, blank=True, help_text="the webhook's last HTTP status")
    last_error = models.TextField(blank=True)
    log = models.JSONField(default=list, blank=True, help_text="each try: {at, status, error, seconds}")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["key", "channel"], name="notification_once_per_channel")]
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self):
        return f"notification {self.pk} ({self.kind}, {self.channel}) of run {self.run_id}: {self.state}"


class Worker(models.Model):
    """A Run Engine worker (``celery -A controlpanel worker``) as its main process last described
    itself: one row per Celery node name, upserted every ``CP_WORKER_BEAT`` seconds while it runs
    (engine/workers.py ``WorkerBeat``) and marked ``stopped_at`` on a clean shutdown.

    It is alive while ``beat_at`` is less than ``CP_WORKER_STALE`` seconds old and ``stopped_at`` is
    null; a worker killed outright (``kill -9``) keeps its row, whose beat goes stale. The runs it
    holds are not stored: a run's ``lease_owner`` is ``host:pid`` of the pool process in its step
    (engine/runner.py ``worker_identity``), joined with ``host`` and ``pool_pids`` when read
    (engine/workers.py ``runs_in_hand``). Nothing here is a status: the row is a report, which the
    engine never acts on (reconciliation judges a run by the run's own heartbeat).
    """

    name = models.CharField(max_length=255, unique=True, help_text="the Celery node name (-n), e.g. celery@host")
    host = models.CharField(max_length=255, help_text="the worker's host (CP_HOST_NAME), as in a run's lease owner")
    pid = models.IntegerField(help_text="the worker's main process")
    queues = models.JSONField(default=list, blank=True, help_text="the queues it consumes: [name]")
    concurrency = models.PositiveIntegerField(default=0, help_text="its pool's size (processes)")
    pool_pids = models.JSONField(default=list, blank=True,
                                 help_text="its pool processes at the last beat: [pid] (a run's lease owner is one)")
    started_at = models.DateTimeField(help_text="when this process began beating")
    beat_at = models.DateTimeField(help_text="its last beat")
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="set on a clean shutdown; null while it runs")

    class Meta:
        ordering = ["-beat_at"]
        indexes = [models.Index(fields=["beat_at"])]

    def __str__(self):
        return f"worker {self.name} (pid {self.pid} on {self.host})"


class Host(models.Model):
    """A machine of the Run Engine (engine/hosts.py): its disk holds the worktrees of the runs it
    claimed, and its workers consume its own queue, where every step of those runs goes.

    Upserted by each of its workers' beats (engine/workers.py ``WorkerBeat``), so the host beats
    while any of its workers does. A host whose last beat is older than ``CP_HOST_STALE`` seconds is
    gone: reconciliation marks its running runs interrupted, once, and never resumes them elsewhere;
    when it comes back, its own reconciliation confirms their old processes gone before any recovery
    (engine/reconcile.py ``confirm_returned``).
    """

    name = models.CharField(max_length=255, unique=True, help_text="CP_HOST_NAME of its workers")
    queue = models.CharField(max_length=255, help_text="the queue its workers consume for its runs' steps")
    repo_roots = models.JSONField(default=list, blank=True,
                                  help_text="folders under which it reaches repositories (CP_HOST_REPOS); [] = any")
    var_dir = models.CharField(max_length=1000, blank=True, help_text="its var directory (worktrees, logs)")
    started_at = models.DateTimeField(help_text="its first beat")
    beat_at = models.DateTimeField(help_text="the last beat of any of its workers")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"host {self.name}"
