"""Admin registration of the Run Engine's records: the Control Panel's pages.

The models are the engine's (engine/models.py), so their admin URLs are ``/admin/engine/<model>/``
and their URL names ``admin:engine_<model>_...``; this module is found by Django's admin
autodiscovery because the ``controlpanel`` app is installed (controlpanel/settings.py).

Definitions (pipelines, profiles) are edited through load_pipelines; evidence (attempts,
checks, manifests, the journal, events) is read-only: nobody edits evidence by hand. A
pipeline's page has a "Create a run" button (``engine.add_run``): a small form that calls
``engine.operations.create_run`` and leads to the new run's page.

Every record page shows its values readably (controlpanel/readable.py ``Readable``): JSON as YAML,
times with their seconds, durations to the tenth of a second, an attempt's usage as a table, a
run's ``not_included`` as a list of paths. An attempt's page links back to its run's page, its stage
and its result manifest, its stored files (prompt, output log, raw output, patch) and the logs of
the stage's earlier attempts. They are served by ``AttemptAdmin.file_view``, to staff
with view permission only, and only from the attempt's own recorded paths when they resolve
inside its run's control records (controlpanel/attempt_files.py): never an arbitrary path.
"""
from pathlib import Path

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import FileResponse, Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from engine import answers, operations
from engine.models import (
    Attempt,
    Check,
    Decision,
    JournalEntry,
    Manifest,
    Notification,
    Pipeline,
    Profile,
    Run,
    RunEvent,
    RunStatus,
    StageRun,
    StartRequest,
)
from engine.steps import sha256_file
from engine.vocabulary import EVENT_KINDS, STOP_REASONS
from engine.workers import age_text

from .admin_base import ReadOnlyAdmin, ReadOnlyInline
from .attempt_files import ATTEMPT_FILES, attempt_file
from .forms import CreateRunForm, PipelineDefinitionForm
from .home import spend_text
from .readable import moment_html, path_list, refusals_html, usage_table, verdict_html, yaml_block
from .views import RunPages, exit_text

#: The admin's app list beside every page takes 300 px a list of runs needs: the home page and the breadcrumbs lead
#: everywhere it does (issue 22: nothing scrolls sideways at 1280 or 390 px).
admin.site.enable_nav_sidebar = False

STATUS_COLOURS = {
    RunStatus.PENDING: "#6b7280",
    RunStatus.QUEUED: "#2563eb",
    RunStatus.RUNNING: "#0891b2",
    RunStatus.WAITING_REVIEW: "#d97706",
    RunStatus.WAITING_APPROVAL: "#7c3aed",
    RunStatus.SUCCEEDED: "#16a34a",
    RunStatus.FAILED: "#dc2626",
}


class ProfileInline(ReadOnlyInline):
    """A pipeline's profiles, one block each (a table is too narrow for a profile's YAML)."""

    model = Profile
    template = "admin/edit_inline/stacked.html"
    fields = ("name", "adapter", "settings")
    readonly_fields = fields
    readable_formats = {"settings": yaml_block}


@admin.register(Pipeline)
class PipelineAdmin(ReadOnlyAdmin):
    """Pipelines change only through validated YAML: a file (python manage.py load_pipelines FILE)
    or the "Edit the definition" page (``engine.change_pipeline``), both checked by
    ``engine.pipeline.format.validate`` and saved by ``operations.save_pipeline``.

    A pipeline's page has a "Create a run" button (``engine.add_run``) leading to
    ``create_run_view`` (``<pipeline>/create-run/``, name ``engine_pipeline_create_run``).
    """

    list_display = ("name", "version", "stage_count", "source_path", "updated_at")
    search_fields = ("name", "description", "source_path")
    readonly_fields = ("sha256", "version", "created_at", "updated_at", "definition_yaml")
    fields = ("name", "description", "source_path", "version", "sha256", "definition_yaml", "created_at", "updated_at")
    inlines = [ProfileInline]

    @admin.display(description="definition")
    def definition_yaml(self, obj):
        """The saved definition as YAML, as a person reads a pipeline file."""
        return yaml_block(obj.definition)

    @admin.display(description="stages")
    def stage_count(self, obj):
        return len(obj.definition.get("stages", []))

    def get_urls(self):
        view = self.admin_site.admin_view(self.create_run_view)
        edit = self.admin_site.admin_view(self.edit_definition_view)
        return [path("<int:object_id>/create-run/", view, name="engine_pipeline_create_run"),
                path("<int:object_id>/edit-definition/", edit, name="engine_pipeline_edit_definition"),
                ] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"can_create_run": request.user.has_perm("engine.add_run"),
                 "can_edit_definition": request.user.has_perm("engine.change_pipeline"), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def edit_definition_view(self, request, object_id):
        """GET: the definition as YAML in a form; POST: validated as ``load_pipelines`` validates a
        file (``PipelineDefinitionForm``), then saved with ``operations.save_pipeline`` (a new version
        when it changed). Needs ``engine.change_pipeline`` (403 otherwise). Every problem is shown
        with its field inside the document; nothing is saved while one remains."""
        pipeline = Pipeline.objects.filter(pk=object_id).first()
        if pipeline is None:
            raise Http404("No such pipeline.")
        if not request.user.has_perm("engine.change_pipeline"):
            raise PermissionDenied
        if request.method == "POST":
            form = PipelineDefinitionForm(request.POST, name=pipeline.name, current_version=pipeline.version)
            saved = None
            if form.is_valid():
                try:  # the form compared the version it was opened on; the save compares it again under the lock
                    saved, outcome = operations.save_pipeline(form.cleaned_data["definition"], pipeline.source_path,
                                                              expected_version=form.cleaned_data["version"])
                except operations.OperationError as exc:
                    form.add_error(exc.field or None, exc.message)
            if saved is not None:
                if outcome == "unchanged":
                    messages.info(request, f"Pipeline {saved.name}: nothing changed (still version {saved.version}).")
                else:
                    self.log_change(request, saved, f"Definition edited in the admin: version {saved.version}.")
                    messages.success(request, f"Pipeline {saved.name} saved as version {saved.version} by "
                                              f"{request.user.get_username()}; new runs use it.")
                return redirect("admin:engine_pipeline_change", saved.pk)
        else:
            form = PipelineDefinitionForm(initial={"definition": PipelineDefinitionForm.initial_text(pipeline.definition),
                                                   "version": pipeline.version}, name=pipeline.name)
        context = {**self.admin_site.each_context(request), "opts": Pipeline._meta, "app_label": "engine",
                   "original": pipeline, "form": form, "title": f"Edit the definition of {pipeline.name}",
                   "subtitle": None, "has_view_permission": True}
        return TemplateResponse(request, "admin/engine/pipeline/edit_definition.html", context)

    def create_run_view(self, request, object_id):
        """GET: the form; POST: ``operations.create_run``, then the new run's detail page.

        Needs view permission on the pipeline and ``engine.add_run`` (403 otherwise). A refusal
        (the form's or the operation's) is an error message naming the field, over the form
        again with what was typed; success is a success message on the run's page.
        """
        pipeline = Pipeline.objects.filter(pk=object_id).first()
        if pipeline is None:
            raise Http404("No such pipeline.")
        if not self.has_view_permission(request, pipeline) or not request.user.has_perm("engine.add_run"):
            raise PermissionDenied
        form = CreateRunForm(request.POST if request.method == "POST" else None, pipeline=pipeline)
        start = request.method == "POST" and "_start" in request.POST  # "Create and start"
        if start and not request.user.has_perm("engine.start_run"):
            raise PermissionDenied
        if request.method == "POST":
            if not form.is_valid():
                where, problem = next(((f, str(e[0])) for f, e in form.errors.items()), ("", "The form is not valid."))
                messages.error(request, f"Create run refused: field “{where}”: {problem}")
            else:
                try:
                    run = operations.create_run(pipeline, form.cleaned_data["repo"].strip(),
                                                form.cleaned_data["rev"].strip(), form.profile_override() or None,
                                                start=start, requested_by=request.user.get_username(),
                                                source="admin")
                except operations.OperationError as exc:
                    where = f"field “{exc.field}”" if exc.field else "no single field"
                    messages.error(request, f"Create run refused ({exc.code}; {where}): {exc.message}")
                else:
                    sim = f" It is simulated ({run.simulated_reason})." if run.simulated else ""
                    self.log_addition(request, run, f"Created from pipeline {pipeline.name!r} in the admin.")
                    messages.success(request, f"Run {run.pk} created from pipeline {pipeline.name} at commit "
                                              f"{run.commit[:12]} by {request.user.get_username()}.{sim} "
                                              + _after_create(start))
                    return redirect("admin:engine_run_detail", run.pk)
        context = {**self.admin_site.each_context(request), "opts": Pipeline._meta, "app_label": "engine",
                   "original": pipeline, "form": form, "title": f"Create a run of {pipeline.name}",
                   "subtitle": None, "has_view_permission": True,
                   "can_start_run": request.user.has_perm("engine.start_run")}
        return TemplateResponse(request, "admin/engine/pipeline/create_run.html", context)


def _after_create(started: bool) -> str:
    """What the create form's success message says comes next: Start, or (Create and start) the worker."""
    return "Its start is requested: it is queued for a worker." if started else "Press Start to run it."


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


class AttemptInline(ReadOnlyInline):
    model = Attempt
    fields = ("stage", "number", "operation", "profile_name", "simulated", "status", "failure_kind", "exit_code",
              "elapsed_seconds")
    readonly_fields = fields


class RunChangeList(ChangeList):
    """The run list, whose links lead to each run's detail page (controlpanel.views). Each run's stages come
    with the page's runs (one query for all: ``current_stage`` reads them), not one query per row."""

    def get_queryset(self, request, exclude_parameters=None):
        stages = Prefetch("stages", queryset=StageRun.objects.order_by("order"), to_attr="ordered_stages")
        spends = Prefetch("attempts", queryset=Attempt.objects.only("id", "run", "spend", "usage", "simulated"),
                          to_attr="spend_attempts")
        return super().get_queryset(request, exclude_parameters).prefetch_related(stages, spends)

    def url_for_result(self, result):
        return reverse("admin:engine_run_detail", args=[result.pk], current_app=self.model_admin.admin_site.name)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    """Runs: the list leads to each run's detail page (timeline, evidence, actions: controlpanel.views);
    the change page stays the read-only record of every field, with a link to the detail page."""

    list_display = ("id", "pipeline_name", "coloured_status", "simulated_badge", "repository", "branch",
                    "current_stage", "started_at", "took", "spend", "stop_reason_code")
    list_filter = ("status", "stop_reason", "pipeline", "repo_path", "simulated")
    search_fields = ("id", "pipeline_name", "repo_path", "commit", "branch", "stop_reason")
    list_select_related = ("pipeline",)
    readonly_fields = [f.name for f in Run._meta.fields]
    readable_formats = {"not_included": path_list}
    inlines = [StageInline, AttemptInline, EventInline]

    def get_urls(self):
        return RunPages(self).urls() + super().get_urls()

    def get_changelist(self, request, **kwargs):
        return RunChangeList

    @admin.display(description="status", ordering="status")
    def coloured_status(self, obj):
        age = (timezone.now() - obj.heartbeat_at).total_seconds() if obj.heartbeat_at else None
        if obj.status == "running" and age is not None and age > settings.CP_HEARTBEAT_STALE:
            # never "running" alone when nobody is known to be running it (docs/field-cases.md C20)
            return format_html('<b style="color:#b45309">running: no heartbeat for {} s</b>', f"{age:.0f}")
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
        stage = answers.current_stage(obj, getattr(obj, "ordered_stages", None))
        return stage.key if stage else "-"

    @admin.display(description="stop reason", ordering="stop_reason")
    def stop_reason_code(self, obj):
        """The code (what run_status and the API say), its meaning on hover (engine/vocabulary.py)."""
        if not obj.stop_reason:
            return "-"
        return format_html('<code title="{}">{}</code>', STOP_REASONS.get(obj.stop_reason, ""), obj.stop_reason)

    @admin.display(description="repository", ordering="repo_path")
    def repository(self, obj):
        """The repository's folder name, its whole path on hover."""
        return format_html('<span title="{}">{}</span>', obj.repo_path, Path(obj.repo_path).name or obj.repo_path)

    @admin.display(description="took")
    def took(self, obj):
        """From its start to its end (or until now while it goes on), and the time a worker was on it."""
        if not obj.started_at:
            return "-"
        until = obj.finished_at or timezone.now()
        return f"{age_text((until - obj.started_at).total_seconds())} ({obj.active_seconds:.0f} s active)"

    @admin.display(description="spend")
    def spend(self, obj):
        """Tokens and money its model calls spent (controlpanel/home.py ``spend_text``: no money for a simulated
        run); '-' before any."""
        attempts = getattr(obj, "spend_attempts", None)  # the list's, read with the page's runs
        return spend_text(obj, list(obj.attempts.all()) if attempts is None else attempts) or "-"


@admin.register(StageRun)
class StageRunAdmin(ReadOnlyAdmin):
    list_display = ("run", "order", "key", "status", "phase", "checkpoint_commit")
    list_filter = ("status",)
    list_select_related = ("run",)


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    """An attempt's page: where it belongs (links to its run's page, its stage, its result manifest), its
    stored files, then every field of the record in groups, readable (durations to 0.1 s, usage as a
    table, the verdict, refusals and network as lists or YAML)."""

    list_display = ("id", "run", "stage", "number", "operation", "adapter", "simulated", "status", "failure_kind",
                    "exit_code", "elapsed_seconds")
    list_filter = ("status", "operation", "adapter", "simulated")
    list_select_related = ("run", "stage")
    readonly_fields = ["links", "stored_files", "older_attempts", "exit_status"] + [
        f.name for f in Attempt._meta.fields if f.name != "id"]
    readable_formats = {"usage": usage_table, "verdict": verdict_html, "refusals": refusals_html}
    #: The page's groups of fields (model field names; any field not named here goes to "The rest of the record").
    GROUPS = (
        ("Outcome", ["status", "failure_kind", "failure_message", "exit_status", "elapsed_seconds", "late",
                     "usage", "final_message", "verdict", "verdict_problem", "refusals"]),
        ("Agent", ["operation", "number", "role", "profile_name", "adapter", "simulated", "cli_version",
                   "session_id", "output_bytes", "redactions", "network", "limits"]),
        ("Times", ["deadline_seconds", "deadline_at", "created_at", "started_at", "ended_at"]),
        ("Starting point and process", ["start_commit", "start_manifest", "result_manifest", "host", "pid",
                                        "pid_create_time", "marker", "lease_token"]),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the list's elapsed time to 0.1 s too (the display made by Readable, sortable by the field)
        self.list_display = self.readable(self.list_display)

    def get_fieldsets(self, request, obj=None):
        named = {name for _, names in self.GROUPS for name in names}
        rest = [f.name for f in Attempt._meta.fields if f.name not in named and f.name not in ("id", "exit_code",
                                                                                                  "signal")]
        groups = [(title, {"fields": self.readable(names)}) for title, names in self.GROUPS]
        return [("Where it belongs", {"fields": ["links"]}),
                ("Stored files", {"fields": ["stored_files", "older_attempts"]}),
                *groups, ("The rest of the record", {"fields": self.readable(rest)})]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The page, with "back to the run" (its run's page, at this attempt) among its tools."""
        attempt = Attempt.objects.filter(pk=object_id).only("pk", "run_id").first()
        extra = dict(extra_context or {})
        if attempt is not None:
            extra["run_page_url"] = reverse("admin:engine_run_detail", args=[attempt.run_id]) + f"#attempt-{attempt.pk}"
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @admin.display(description="links")
    def links(self, obj):
        """Back to its run's page (at this attempt), its stage there and its record, its result manifest."""
        detail = reverse("admin:engine_run_detail", args=[obj.run_id])
        items = [format_html('<li><a href="{}#attempt-{}" class="cp-back-link">back to the run</a>: run {} of {}{}'
                             '</li>', detail, obj.pk, obj.run_id, obj.run.pipeline_name,
                             " (simulated)" if obj.run.simulated else ""),
                 format_html('<li><a href="{}#stage-{}">stage {} ‘{}’</a> on the run\'s page '
                             '(<a href="{}">its record</a>)</li>', detail, obj.stage_id, obj.stage.order + 1,
                             obj.stage.key, reverse("admin:engine_stagerun_change", args=[obj.stage_id]))]
        if obj.result_manifest_id:
            manifest = obj.result_manifest
            items.append(format_html(
                '<li>result manifest <a href="{}#manifest-{}"><code>{}</code></a> (+{} ~{} -{}; '
                '<a href="{}">its record</a>)</li>', detail, manifest.pk, manifest.digest[:12], manifest.added,
                manifest.modified, manifest.deleted, reverse("admin:engine_manifest_change", args=[manifest.pk])))
        else:
            items.append(format_html("<li>{}</li>", "no result manifest recorded"))
        return format_html('<ul class="cp-links">{}</ul>', format_html_join("", "{}", ((i,) for i in items)))

    @admin.display(description="exit status")
    def exit_status(self, obj):
        """``exit 0``, ``signal 9`` or "—"."""
        return exit_text(obj.exit_code, obj.signal)

    def get_urls(self):
        view = self.admin_site.admin_view(self.file_view)
        return [path("<int:object_id>/file/<str:kind>/", view, name="engine_attempt_file")] + super().get_urls()

    def file_view(self, request, object_id, kind):
        """One stored file of an attempt, as text (staff with view permission; recorded paths only)."""
        attempt = Attempt.objects.select_related("run").filter(pk=object_id).first()
        if attempt is None or kind not in ATTEMPT_FILES:
            raise Http404("No such attempt file.")
        if not self.has_view_permission(request, attempt):
            raise PermissionDenied
        found = attempt_file(attempt, kind)
        if found is None:
            raise Http404("This attempt has no such file in its run's control records.")
        response = FileResponse(open(found, "rb"), content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="attempt-{attempt.pk}-{found.name}"'
        return response

    @admin.display(description="files")
    def stored_files(self, obj):
        items = []
        for kind, (field, label, sha_field) in ATTEMPT_FILES.items():
            found = attempt_file(obj, kind)
            if found is None:
                why = "missing from the control records" if getattr(obj, field) else "not stored"
                items.append(format_html("<li>{}: {}</li>", label, why))
                continue
            check = ""
            recorded = getattr(obj, sha_field) if sha_field else ""
            if recorded:
                same = sha256_file(found) == recorded
                check = f"sha256 {recorded} ({'matches the file' if same else 'DIFFERS from the file now'})"
            items.append(format_html('<li><a href="{}">view the {}</a> ({} bytes) {}</li>',
                                     reverse("admin:engine_attempt_file", args=[obj.pk, kind]), label,
                                     found.stat().st_size, check))
        return format_html("<ul>{}</ul>", format_html_join("", "{}", ((i,) for i in items)))

    @admin.display(description="earlier attempts of this stage")
    def older_attempts(self, obj):
        older = list(Attempt.objects.select_related("run").filter(stage_id=obj.stage_id, number__lt=obj.number)
                     .order_by("number"))
        if not older:
            return "none"
        items = []
        for attempt in older:
            page = reverse("admin:engine_attempt_change", args=[attempt.pk])
            if attempt_file(attempt, "log") is not None:
                log = format_html(' &middot; <a href="{}">its output log</a>',
                                  reverse("admin:engine_attempt_file", args=[attempt.pk, "log"]))
            else:
                log = " (no output log stored)"
            items.append(format_html('<li><a href="{}">attempt {}</a> ({}, {}){}</li>', page, attempt.number,
                                     attempt.operation, attempt.status, log))
        return format_html("<ul>{}</ul>", format_html_join("", "{}", ((i,) for i in items)))


@admin.register(Check)
class CheckAdmin(ReadOnlyAdmin):
    """Checks; each one's page (what ran, where, its log) is the run's check page (``engine_run_check_log``)."""

    list_display = ("id", "run", "stage", "kind", "name", "passed", "exit_code", "failure_kind", "stale",
                    "manifest_digest", "check_page")
    list_filter = ("passed", "kind", "stale")
    list_select_related = ("run", "stage")

    @admin.display(description="page")
    def check_page(self, obj):
        """A link to the check's page (its command, exit status and log)."""
        return format_html('<a href="{}">command and log</a>',
                           reverse("admin:engine_run_check_log", args=[obj.run_id, obj.pk]))


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
    """The events ("all events" of a run's page: ``?run__id__exact=N``): each with its time to the
    millisecond, its kind, its whole message and links to the run's page and the stage, attempt, check and
    decision it names. A run's events read oldest first, like its story; unfiltered, newest first."""

    list_display = ("time", "kind_code", "whole_message", "evidence", "run_page")
    list_display_links = ("time",)
    list_filter = ("kind",)
    search_fields = ("message",)
    list_select_related = ("run", "stage", "attempt", "gate_check")
    list_per_page = 500
    list_max_show_all = 5000
    RUN_FILTER = "run__id__exact"

    def get_ordering(self, request):
        """Oldest first for one run's events, newest first otherwise."""
        return ("id",) if request.GET.get(self.RUN_FILTER) else ("-id",)

    def changelist_view(self, request, extra_context=None):
        """The list, naming the run it is filtered on (with a link back to its page)."""
        extra = dict(extra_context or {})
        run_id = request.GET.get(self.RUN_FILTER, "")
        run = Run.objects.filter(pk=run_id).only("pk", "pipeline_name").first() if run_id.isdigit() else None
        if run is not None:
            extra.update(events_run=run, title=f"Events of run {run.pk} ({run.pipeline_name}), oldest first",
                         run_page_url=reverse("admin:engine_run_detail", args=[run.pk]))
        return super().changelist_view(request, extra_context=extra)

    @admin.display(description="kind", ordering="kind")
    def kind_code(self, obj):
        """The kind as the run page, the API and run_status name it; its meaning on hover (engine/vocabulary.py)."""
        return format_html('<code title="{}">{}</code>', EVENT_KINDS.get(obj.kind, ""), obj.kind)

    @admin.display(description=f"time ({settings.TIME_ZONE})", ordering="at")
    def time(self, obj):
        """Its time to the millisecond, in the site's time zone."""
        return moment_html(obj.at, zone=False)

    @admin.display(description="message")
    def whole_message(self, obj):
        """The whole message, wrapped."""
        return format_html('<div class="cp-message">{}</div>', obj.message)

    @admin.display(description="names")
    def evidence(self, obj):
        """Links to what it names: its stage (on the run's page), attempt (its page), check (its page) and
        decision (on the run's page)."""
        detail = reverse("admin:engine_run_detail", args=[obj.run_id])
        links = []
        if obj.stage_id:
            links.append(format_html('<a href="{}#stage-{}">stage ‘{}’</a>', detail, obj.stage_id, obj.stage.key))
        if obj.attempt_id:
            links.append(format_html('<a href="{}">attempt {} ({})</a>',
                                     reverse("admin:engine_attempt_change", args=[obj.attempt_id]),
                                     obj.attempt.number, obj.attempt.operation))
        if obj.gate_check_id:
            links.append(format_html('<a href="{}">check ‘{}’</a>',
                                     reverse("admin:engine_run_check_log", args=[obj.run_id, obj.gate_check_id]),
                                     obj.gate_check.name))
        if obj.decision_id:
            links.append(format_html('<a href="{}#decision-{}">decision {}</a>', detail, obj.decision_id,
                                     obj.decision_id))
        if not links:
            return "—"
        return format_html('<span class="cp-event-links">{}</span>',
                           format_html_join("", "{}", ((link,) for link in links)))

    @admin.display(description="run", ordering="run")
    def run_page(self, obj):
        """A link to its run's page, at this event."""
        return format_html('<a href="{}#event-{}">run {}</a>', reverse("admin:engine_run_detail", args=[obj.run_id]),
                           obj.pk, obj.run_id)


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """The notification outbox (engine/notifications.py): one row per notice and channel, with
    every try in its log. Read-only: deliveries are made by the engine, never edited by hand."""

    list_display = ("uid", "run", "decision", "kind", "channel", "state", "tries", "last_status", "delivered_at",
                    "created_at")
    list_filter = ("kind", "channel", "state")
    list_select_related = ("run", "decision")
    readonly_fields = [f.name for f in Notification._meta.fields]


# the workers' and hosts' pages (registered on import)
from . import admin_hosts  # noqa: E402,F401
