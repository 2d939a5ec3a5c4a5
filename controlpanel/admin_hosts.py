"""The Run Engine's workers and hosts in the Control Panel (``/admin/engine/worker/``, ``/admin/engine/host/``):
what each worker and host last reported of itself (engine/workers.py, engine/hosts.py), read-only; a host
gone for good can be forgotten. controlpanel/admin.py imports this module, which registers both.
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join

from engine import hosts as host_records
from engine import operations
from engine import workers as worker_records
from engine.models import Host, Worker

from .admin_base import ReadOnlyAdmin


class WorkerChangeList(ChangeList):
    """The worker list, which reads the runs in the hands of the page's workers once for all
    (engine/workers.py ``runs_in_hand``: two queries, whatever the number of workers)."""

    def get_results(self, request):
        super().get_results(request)
        page = list(self.result_list)
        held = worker_records.runs_in_hand(page)
        for worker in page:
            worker.cp_runs_in_hand = held[worker.pk]


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    """The Run Engine's workers as they last reported themselves (engine/workers.py): read-only, written
    only by each worker's main process (its beat). Alive: a beat less than CP_WORKER_STALE seconds old
    and no clean stop. Runs in hand: the running runs whose lease a pool process of the worker holds."""

    list_display = ("name", "host", "pid", "queue_list", "beat_age", "alive", "runs_in_hand")
    search_fields = ("name", "host")
    readonly_fields = [f.name for f in Worker._meta.fields] + ["alive", "runs_in_hand"]

    def get_changelist(self, request, **kwargs):
        return WorkerChangeList

    @admin.display(description="queues")
    def queue_list(self, obj):
        return ", ".join(obj.queues or []) or "-"

    @admin.display(description="last beat", ordering="-beat_at")
    def beat_age(self, obj):
        seconds = max(0.0, (timezone.now() - obj.beat_at).total_seconds())
        return f"{seconds:.0f} s ago"

    @admin.display(description="alive", boolean=True)
    def alive(self, obj):
        return worker_records.is_alive(obj)

    @admin.display(description="runs in hand")
    def runs_in_hand(self, obj):
        runs = getattr(obj, "cp_runs_in_hand", None)
        if runs is None:  # the change page: one worker
            runs = worker_records.runs_in_hand([obj])[obj.pk]
        if not runs:
            return "-"
        return format_html_join(", ", '<a href="{}">run {}</a>{}', (
            (reverse("admin:engine_run_detail", args=[run["id"]]), run["id"],
             f" ({run['stage']}, {run['phase']})" if run["stage"] else "") for run in runs))




@admin.register(Host)
class HostAdmin(ReadOnlyAdmin):
    """The Run Engine's hosts (engine/hosts.py): read-only, upserted by their workers' beats. Alive: a
    beat less than CP_HOST_STALE seconds old. A run pinned to a host has every step on its queue."""

    list_display = ("name", "queue", "roots", "beat_age", "alive")
    search_fields = ("name",)
    readonly_fields = [f.name for f in Host._meta.fields] + ["alive"]
    actions = ["forget"]

    def has_forget_permission(self, request):
        return request.user.has_perm("engine.delete_host")

    @admin.action(description="Forget the selected hosts (gone for good, no unfinished run)", permissions=["forget"])
    def forget(self, request, queryset):
        """engine/operations.py ``forget_host`` for each selected host; each refusal is said."""
        for host in queryset:
            try:
                operations.forget_host(host.name)
                messages.success(request, f"Host {host.name} forgotten.")
            except operations.OperationError as exc:
                messages.error(request, f"Host {host.name}: {exc.message}")

    @admin.display(description="reaches")
    def roots(self, obj):
        return ", ".join(obj.repo_roots or []) or "any repository path"

    @admin.display(description="last beat", ordering="-beat_at")
    def beat_age(self, obj):
        return f"{host_records.host_age(obj):.0f} s ago"

    @admin.display(description="alive", boolean=True)
    def alive(self, obj):
        return host_records.is_alive(obj)
