from django.contrib import admin
from django.urls import path, re_path

from dlq.pipeline_pages import pipeline_action_page, pipelines
from dlq.views import dashboard, metrics, queues, rq_views_removed
from tasks.api.views import api, not_found

urlpatterns = [
    path("api/v1/", api.urls),
    re_path(r"^api/", not_found),
    path("admin/dashboard/", dashboard, name="dashboard"),
    path("metrics", metrics, name="metrics"),
    path("admin/queues/", queues, name="queues"),
    path("admin/pipelines/", pipelines, name="pipelines"),
    path("admin/pipelines/<str:pipeline>/act/<str:action>/", pipeline_action_page, name="pipeline_act"),
    # django-rq's views are not served (dlq.queues says why); their old addresses answer 404, POSTs audited.
    re_path(r"^admin/(?:rq|django_rq)/(?P<rest>.*)$", rq_views_removed),
    path("admin/", admin.site.urls),
]
