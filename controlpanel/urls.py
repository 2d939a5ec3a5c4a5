"""URLs of the Control Panel: the admin site is the product's user interface; /api/ is its JSON API."""
from django.contrib import admin
from django.urls import path, re_path
from django.views.generic import RedirectView

from . import api
from .api_errors import not_found

api_patterns = [
    path("api/runs/", api.RunCreate.as_view(), name="api-run-create"),
    path("api/runs/<str:run_id>/", api.RunDetail.as_view(), name="api-run"),
    path("api/runs/<str:run_id>/start/", api.RunStart.as_view(), name="api-run-start"),
    path("api/runs/<str:run_id>/approve/", api.RunApprove.as_view(), name="api-run-approve"),
    path("api/runs/<str:run_id>/recheck/", api.RunRecheck.as_view(), name="api-run-recheck"),
    path("api/runs/<str:run_id>/recover/", api.RunRecover.as_view(), name="api-run-recover"),
    path("api/runs/<str:run_id>/fail/", api.RunFail.as_view(), name="api-run-fail"),
    re_path(r"^api(/.*)?$", not_found),  # any other path under /api/: a JSON 404, not the HTML page
]

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    *api_patterns,
]
