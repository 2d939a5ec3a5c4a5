"""The Control Panel's record pages' bases (controlpanel/admin.py, controlpanel/admin_hosts.py): evidence
is viewable, never added, changed or deleted through the admin, and its values are readable
(controlpanel/readable.py ``Readable``)."""
from __future__ import annotations

from django.contrib import admin

from .readable import Readable


#: The record pages' own CSS (narrow screens, long values wrapped): controlpanel/static/controlpanel/pages.css.
PAGES_CSS = {"all": ("controlpanel/pages.css",)}


class _ReadOnly(Readable):
    """Neither added nor changed through the admin; the record pages' CSS; values readable."""

    class Media:
        css = PAGES_CSS

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(_ReadOnly, admin.ModelAdmin):
    """Evidence: viewable, never added, changed or deleted through the admin; its values readable
    (controlpanel/readable.py)."""

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(_ReadOnly, admin.TabularInline):
    """The records of a page's object, read-only, their values readable (controlpanel/readable.py)."""

    template = "admin/engine/_readonly_tabular.html"  # Django's, its cells labelled for narrow screens
    extra = 0
    can_delete = False
    show_change_link = True
