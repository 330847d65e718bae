"""Operator pages outside the model admin: the dashboard, the queues page, and the refusal of RQ's old views."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache

from dlq.audit import audit_denied
from dlq.dashboard import HourlyGrowth, dashboard_snapshot
from dlq.queues import queue_states
from dlq.svg_charts import Series, line_chart

# The growth chart labels one hour a day, counting back from the current hour.
HOURS_BETWEEN_X_LABELS = 24
CREATED_COLOUR = "#c0392b"
RESOLVED_COLOUR = "#2980b9"


def growth_chart(growth: HourlyGrowth) -> SafeString:
    """The DLQ growth figures as an inline SVG line chart."""
    last = len(growth.hours) - 1
    x_labels = {
        index: date_format(timezone.localtime(hour), "D H:i")
        for index, hour in enumerate(growth.hours)
        if (last - index) % HOURS_BETWEEN_X_LABELS == 0
    }
    return line_chart(
        title=gettext("Dead letters per hour, last 7 days"),
        description=gettext("%(created)d new and %(resolved)d resolved items in the last 7 days.")
        % {"created": growth.total_created, "resolved": growth.total_resolved},
        series=[
            Series(label=gettext("new"), values=growth.created, colour=CREATED_COLOUR),
            Series(label=gettext("resolved"), values=growth.resolved, colour=RESOLVED_COLOUR),
        ],
        x_labels=x_labels,
    )


@staff_member_required
@permission_required("dlq.view_dlqitem", raise_exception=True)
@never_cache
def dashboard(request: HttpRequest) -> HttpResponse:
    """Task states, dead letters, queues, workers, the sweeper and operator actions on one page."""
    snapshot = dashboard_snapshot()
    context = {
        **admin.site.each_context(request),
        "title": _("Dashboard"),
        "dashboard": snapshot,
        "growth_chart": growth_chart(snapshot.growth),
    }
    return TemplateResponse(request, "admin/dashboard.html", context)


@staff_member_required
@permission_required("tasks.view_task", raise_exception=True)
@never_cache
def queues(request: HttpRequest) -> HttpResponse:
    """Each RQ queue's depth, oldest job, registries and workers: read-only (no RQ action is offered)."""
    context = {
        **admin.site.each_context(request),
        "title": _("Queues"),
        "queues": queue_states(),
        "now": timezone.now(),
    }
    return TemplateResponse(request, "admin/queues.html", context)


# What is left of django-rq's admin views (they emptied queues, requeued and deleted jobs for any staff user).
RQ_VIEWS_REMOVED = "rq_admin_removed"


@never_cache
def rq_views_removed(request: HttpRequest, rest: str = "") -> HttpResponse:
    """A 404 for every former django-rq admin URL; a signed-in user's POST to one is audited as denied."""
    if request.method == "POST" and request.user.is_authenticated:
        audit_denied(
            actor=request.user.get_username(),
            action=RQ_VIEWS_REMOVED,
            target_type="rq",
            target_id=request.path,
            client_ip=request.META.get("REMOTE_ADDR") or None,
        )
    raise Http404("RQ's admin views are not served: see the Queues page")


@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus scrape endpoint (token and/or network protected; see dlq.metrics_export)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from dlq.metrics_export import metrics_access, metrics_render

    status, reason = metrics_access(
        authorization=request.headers.get("Authorization", ""), remote_addr=request.META.get("REMOTE_ADDR", "")
    )
    if status != 200:
        response = HttpResponse(reason + "\n", status=status, content_type="text/plain; charset=utf-8")
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(metrics_render(), content_type=CONTENT_TYPE_LATEST)
