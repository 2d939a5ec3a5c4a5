"""Admin registration of the Run Engine's records: the Control Panel's pages.

Definitions (pipelines, profiles) are edited through load_pipelines; evidence (attempts,
checks, manifests, the journal, events) is read-only: nobody edits evidence by hand.
"""
from django.contrib import admin
from django.utils.html import format_html

from .models import (
    Attempt,
    Check,
    Decision,
    JournalEntry,
    Manifest,
    Pipeline,
    Profile,
    Run,
    RunEvent,
    RunStatus,
    StageRun,
    StartRequest,
)

STATUS_COLOURS = {
    RunStatus.PENDING: "#6b7280",
    RunStatus.QUEUED: "#2563eb",
    RunStatus.RUNNING: "#0891b2",
    RunStatus.WAITING_REVIEW: "#d97706",
    RunStatus.WAITING_APPROVAL: "#7c3aed",
    RunStatus.SUCCEEDED: "#16a34a",
    RunStatus.FAILED: "#dc2626",
}


class ReadOnlyAdmin(admin.ModelAdmin):
    """Evidence: viewable, never added, changed or deleted through the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ProfileInline(ReadOnlyInline):
    model = Profile
    fields = ("name", "adapter", "settings")
    readonly_fields = fields


@admin.register(Pipeline)
class PipelineAdmin(ReadOnlyAdmin):
    """Pipelines change only through validated YAML (python manage.py load_pipelines FILE)."""

    list_display = ("name", "version", "stage_count", "source_path", "updated_at")
    search_fields = ("name", "description", "source_path")
    readonly_fields = ("sha256", "version", "created_at", "updated_at", "definition")
    fields = ("name", "description", "source_path", "version", "sha256", "definition", "created_at", "updated_at")
    inlines = [ProfileInline]

    @admin.display(description="stages")
    def stage_count(self, obj):
        return len(obj.definition.get("stages", []))


@admin.register(Profile)
class ProfileAdmin(ReadOnlyAdmin):
    list_display = ("name", "pipeline", "adapter", "simulated")
    list_filter = ("adapter",)
    list_select_related = ("pipeline",)

    @admin.display(boolean=True)
    def simulated(self, obj):
        return obj.simulated


class StageInline(ReadOnlyInline):
    model = StageRun
    fields = ("order", "key", "status", "phase", "base_commit", "checkpoint_commit", "repairs_used")
    readonly_fields = fields


class EventInline(ReadOnlyInline):
    model = RunEvent
    fields = ("at", "kind", "message")
    readonly_fields = fields
    show_change_link = False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "pipeline_name", "coloured_status", "simulated_badge", "current_stage", "active_time",
                    "stop_reason", "commit_short", "created_at")
    list_filter = ("status", "pipeline", "simulated")
    search_fields = ("id", "pipeline_name", "repo_path", "commit", "branch", "stop_reason")
    list_select_related = ("pipeline",)
    readonly_fields = [f.name for f in Run._meta.fields]
    inlines = [StageInline, EventInline]

    @admin.display(description="status", ordering="status")
    def coloured_status(self, obj):
        return format_html('<b style="color:{}">{}</b>', STATUS_COLOURS.get(obj.status, "#000"),
                           obj.get_status_display())

    @admin.display(description="simulated", ordering="simulated")
    def simulated_badge(self, obj):
        if obj.simulated:
            return format_html('<span style="background:#fde68a;padding:1px 6px;border-radius:3px">{}</span>',
                               "SIMULATED")
        return "real"

    @admin.display(description="stage")
    def current_stage(self, obj):
        stage = obj.stages.exclude(status="passed").order_by("order").first()
        return stage.key if stage else "-"

    @admin.display(description="active time")
    def active_time(self, obj):
        return f"{obj.active_seconds:.0f} s"

    @admin.display(description="commit")
    def commit_short(self, obj):
        return obj.commit[:12]


@admin.register(StageRun)
class StageRunAdmin(ReadOnlyAdmin):
    list_display = ("run", "order", "key", "status", "phase", "checkpoint_commit")
    list_filter = ("status",)
    list_select_related = ("run",)


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "stage", "number", "operation", "adapter", "simulated", "status", "failure_kind",
                    "exit_code", "elapsed_seconds")
    list_filter = ("status", "operation", "adapter", "simulated")
    list_select_related = ("run", "stage")


@admin.register(Check)
class CheckAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "stage", "kind", "name", "passed", "exit_code", "failure_kind", "stale",
                    "manifest_digest")
    list_filter = ("passed", "kind", "stale")
    list_select_related = ("run", "stage")


@admin.register(Manifest)
class ManifestAdmin(ReadOnlyAdmin):
    list_display = ("digest", "run", "stage", "files", "added", "modified", "deleted", "created_at")
    list_select_related = ("run", "stage")


@admin.register(Decision)
class DecisionAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "stage", "kind", "state", "reason", "artifact", "decided_by", "decided_at")
    list_filter = ("kind", "state")
    list_select_related = ("run", "stage")


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = ("uid", "run", "stage", "operation", "state", "commit", "created_at")
    list_filter = ("state",)
    list_select_related = ("run", "stage")


@admin.register(StartRequest)
class StartRequestAdmin(ReadOnlyAdmin):
    list_display = ("run", "requested_by", "source", "requested_at", "enqueued_times", "claimed_at")
    list_select_related = ("run",)


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "run", "kind", "message")
    list_filter = ("kind",)
    list_select_related = ("run",)
