"""URLs of the Control Panel: the admin site is the product's user interface; /api/ is its JSON API.

``/admin/`` is the home page (controlpanel/home.py: the admin's index with a dashboard), and
``/admin/home/`` its dashboard alone, which the page refreshes itself with; both come before the
admin's own routes, behind the admin's login (``admin_view``)."""
from django.contrib import admin
from django.urls import path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView

from . import api, home
from .api_errors import not_found

#: The API's routes (controlpanel/api.py ``router``: api-run-create, api-run, api-run-<action>), then
#: any other path under /api/: a JSON 404, not the HTML page.
api_patterns = [
    *api.router.urls,
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    re_path(r"^api(/.*)?$", not_found),
]

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.admin_view(home.index), name="cp-home"),
    path("admin/home/", admin.site.admin_view(home.fragment), name="cp-home-fragment"),
    path("admin/", admin.site.urls),
    *api_patterns,
]
