"""The console's pages beside a project's own admin, and the engine's HTTP API: one include() for all of them.

An embedding project mounts it where it likes, e.g. ``path("ops/", include("dlq.urls"))`` next to its own
``path("admin/", admin.site.urls)``; the standalone project mounts it at the root, before the admin, which gives
its addresses (``/admin/dashboard/``, ``/api/v1/``, ``/metrics``). The pages are named (``dashboard``,
``queues``, ``pipelines``, ``pipeline_act``, ``schedules``, ``schedule_add``, ``schedule_change``, ``schedule_act``,
``approvals``, ``approval_decide``, ``metrics``) and every link to them is reversed by name, so they work
under any prefix. The models and actions are not here: they are registered on the project's own ``admin.site``.
"""

from django.urls import include, path, re_path

from dlq.approval_pages import approval_decide_page, approvals
from dlq.pipeline_pages import pipeline_action_page, pipelines
from dlq.schedule_pages import schedule_action_page, schedule_edit_page, schedules
from dlq.views import dashboard, metrics, queues, rq_views_removed

urlpatterns = [
    path("api/", include("tasks.api.urls")),
    path("metrics", metrics, name="metrics"),
    path("admin/dashboard/", dashboard, name="dashboard"),
    path("admin/queues/", queues, name="queues"),
    path("admin/pipelines/", pipelines, name="pipelines"),
    path("admin/pipelines/<str:pipeline>/act/<str:action>/", pipeline_action_page, name="pipeline_act"),
    path("admin/schedules/", schedules, name="schedules"),
    path("admin/schedules/add/", schedule_edit_page, name="schedule_add"),
    path("admin/schedules/<int:schedule_id>/change/", schedule_edit_page, name="schedule_change"),
    path("admin/schedules/<int:schedule_id>/act/<str:action>/", schedule_action_page, name="schedule_act"),
    path("admin/approvals/", approvals, name="approvals"),
    path("admin/approvals/<uuid:task_id>/<str:wait>/<str:decision>/", approval_decide_page, name="approval_decide"),
    # django-rq's views are not served (dlq.views.queues says why); their old addresses answer 404, POSTs audited.
    re_path(r"^admin/(?:rq|django_rq)/(?P<rest>.*)$", rq_views_removed),
]
