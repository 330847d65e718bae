from django.contrib import admin
from django.urls import include, path, re_path

from dlq.views import dashboard, metrics
from tasks.api.views import api, not_found

urlpatterns = [
    path("api/v1/", api.urls),
    re_path(r"^api/", not_found),
    path("admin/dashboard/", dashboard, name="dashboard"),
    path("metrics", metrics, name="metrics"),
    path("admin/rq/", include("django_rq.urls")),
    path("admin/", admin.site.urls),
]
