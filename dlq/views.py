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

from dlq.activity import OUTCOMES, MinuteActivity
from dlq.audit import audit_denied
from dlq.dashboard import HourlyGrowth, dashboard_snapshot
from dlq.svg_charts import Series, line_chart
from tasks.selectors import queue_states

# The growth chart labels one hour a day, counting back from the current hour.
HOURS_BETWEEN_X_LABELS = 24
CREATED_COLOUR = "#c0392b"
RESOLVED_COLOUR = "#2980b9"
# The per-minute charts label every half hour; outcomes have the colours of the task states' badges.
MINUTES_BETWEEN_X_LABELS = 30
OUTCOME_COLOURS = {
    "succeeded": "#15803d",
    "failed": "#b91c1c",
    "compensated": "#0f766e",
    "compensation_failed": "#7c3aed",
    "cancelled": "#475569",
}
RETRY_COLOUR = "#b45309"
# How often the dashboard reloads its figures (the page's pause button stops it).
REFRESH_SECONDS = 15


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


def _minute_labels(activity: MinuteActivity) -> dict[int, str]:
    return {
        index: date_format(timezone.localtime(minute), "H:i")
        for index, minute in enumerate(activity.minutes)
        if minute.minute % MINUTES_BETWEEN_X_LABELS == 0
    }


def finished_chart(activity: MinuteActivity) -> SafeString:
    """Tasks finished per minute, one line per outcome, as an inline SVG chart."""
    return line_chart(
        title=gettext("Tasks finished per minute, by outcome"),
        description=gettext("%(count)d tasks finished in the last %(hours)d hours.")
        % {"count": activity.total_finished, "hours": activity.hours},
        series=[
            Series(label=state.label, values=activity.finished[state.value], colour=OUTCOME_COLOURS[state.value])
            for state in OUTCOMES
        ],
        x_labels=_minute_labels(activity),
    )


def retries_chart(activity: MinuteActivity) -> SafeString:
    """Retries scheduled per minute as an inline SVG chart."""
    return line_chart(
        title=gettext("Retries per minute"),
        description=gettext("%(count)d retries scheduled in the last %(hours)d hours.")
        % {"count": activity.total_retries, "hours": activity.hours},
        series=[Series(label=gettext("retries"), values=activity.retries, colour=RETRY_COLOUR)],
        x_labels=_minute_labels(activity),
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
        "finished_chart": finished_chart(snapshot.activity),
        "retries_chart": retries_chart(snapshot.activity),
        "refresh_seconds": REFRESH_SECONDS,
    }
    return TemplateResponse(request, "admin/dashboard.html", context)


@staff_member_required
@permission_required("tasks.view_task", raise_exception=True)
@never_cache
def queues(request: HttpRequest) -> HttpResponse:
    """Each RQ queue's depth, oldest job, registries and workers: read-only (no RQ action is offered).

    RQ's own admin views (django-rq's) are not served: they let any staff user empty a queue, requeue or delete
    jobs, unaudited, and Redis only delivers (section 3 of ARCHITECTURE.md): an operator acts on tasks through
    the DLQ, whose actions are audited, never on the jobs that deliver them. The figures come from
    ``tasks.selectors.queue_states``, which changes no queue, registry or job.
    """
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
