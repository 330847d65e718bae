"""Triage of dead letters: the DLQ list with failure groups, an item's page, and the confirmation pages.

Each view checks the page's permission, calls one service (``dlq.actions``
for one item, ``dlq.bulk`` for the selected rows and for a bulk action by
filter) and renders; the rules live in those services.
"""

from __future__ import annotations

import uuid
from functools import partial
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import FieldError
from django.db.models import Q
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _

from dlq.actions import ACTIONS, MAX_REASON_LENGTH, ActionResult, OperatorAction, action_available, dlq_item_act
from dlq.admin.common import DenialsAuditedMixin, ServiceViewMixin, client_ip, deny, operator_form
from dlq.admin.task_pages import attribute_searched
from dlq.audit import audit_denied
from dlq.bulk import BULK_PERMISSION, MAX_ITEMS, bulk_operation_request, dlq_selection_act
from dlq.models import BulkOperation, BulkStatus, DLQItem
from dlq.selectors import (
    GROUP_SCAN_LIMIT,
    attempt_log_shown,
    audit_entries_for_item,
    failing_attempt,
    failure_groups,
    retry_preview,
)
from reliability_console.admin_mixins import AgeFilter, DistinctValueFilter, PipelineFilter, ReadOnlyAdminMixin
from reliability_console.paginator import CappedCountPaginator
from tasks.models import DLQStatus, ResolutionCode, TaskState
from tasks.redaction import redact
from tasks.selectors import attribute_search

# The most rows a selection carries (their ids travel in the URL); more must go through "bulk by filter".
MAX_SELECTED = 200
FILTER_PARAMS_IGNORED = ("p", "o", "_changelist_filters")


class ReasonCodeFilter(DistinctValueFilter):
    title = _("reason code")
    parameter_name = "reason_code"


class ErrorClassFilter(DistinctValueFilter):
    title = _("error class")
    parameter_name = "error_class"


class FailingStepFilter(DistinctValueFilter):
    title = _("failing step")
    parameter_name = "failing_step"


STATUS_COLOURS = {
    DLQStatus.OPEN: "#ba2121",
    DLQStatus.RETRYING: "#b06f00",
    DLQStatus.COMPENSATING: "#b06f00",
    DLQStatus.COMPENSATED: "#417690",
    DLQStatus.RESOLVED: "#2e7d32",
}


@admin.register(DLQItem)
class DLQItemAdmin(DenialsAuditedMixin, ServiceViewMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "pipeline", "failing_step", "reason_code", "error_code", "status_badge", "age", "task_link")
    # Choices come from loose index scans, not SELECT DISTINCT over a million rows.
    list_filter = ("status", PipelineFilter, ReasonCodeFilter, ErrorClassFilter, FailingStepFilter, AgeFilter)
    search_fields = ("error_message",)
    search_help_text = _(
        "task id, idempotency key, error code, words from the error message, or a search attribute as "
        "name:value (customer_id:C42)"
    )
    list_select_related = ("task",)
    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    ordering = ("-created_at",)
    change_list_template = "admin/dlq/dlqitem/change_list.html"
    change_form_template = "admin/dlq/dlqitem/change_form.html"
    actions = ["act_retry", "act_retry_from_start", "act_compensate", "act_close"]
    # The item page: the reason and the resolution in the reader's language (the input is shown as JSON below).
    fields = (
        "task",
        "pipeline",
        "status",
        "reason_code",
        "reason_text",
        "error_code",
        "error_class",
        "error_message",
        "failing_step",
        "attempts",
        "fingerprint",
        "compensation_error",
        "resolution_text",
        "resolution_note",
        "created_at",
        "updated_at",
        "resolved_at",
    )
    readonly_fields = fields

    # --- list ----------------------------------------------------------------------
    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: DLQItem):
        colour = STATUS_COLOURS.get(obj.status, "#666")
        return format_html(
            '<span style="color:#fff;background:{};padding:1px 6px;border-radius:3px">{}</span>',
            colour,
            obj.get_status_display(),
        )

    @admin.display(description=_("age"), ordering="created_at")
    def age(self, obj: DLQItem):
        return timesince(obj.created_at)

    @admin.display(description=_("reason"))
    def reason_text(self, obj: DLQItem) -> str:
        return obj.reason_shown

    @admin.display(description=_("resolution"))
    def resolution_text(self, obj: DLQItem) -> str:
        return obj.resolution_shown

    @admin.display(description=_("task"))
    def task_link(self, obj: DLQItem):
        url = reverse("admin:tasks_task_change", args=[obj.task_id])
        return format_html('<a href="{}">{}</a>', url, str(obj.task_id)[:8])

    def lookup_allowed(self, lookup, value, request=None):
        # Failure groups link to ?fingerprint=…; the column is indexed.
        if lookup in ("fingerprint", "fingerprint__exact"):
            return True
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        attribute = attribute_search(term)
        if attribute is not None:
            return attribute_searched(request, queryset, *attribute, of_task=True), False
        try:
            return queryset.filter(task_id=uuid.UUID(term)), False
        except ValueError:
            pass
        matches = Q(task__idempotency_key=term) | Q(error_code=term) | Q(error_message__icontains=term)
        return queryset.filter(matches), False

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        if not isinstance(response, TemplateResponse) or "cl" not in (response.context_data or {}):
            return response
        changelist = response.context_data["cl"]
        filters = _filter_query(request)
        response.context_data.update(
            failure_groups=failure_groups(items=changelist.queryset),
            group_scan_limit=GROUP_SCAN_LIMIT,
            filter_query=filters,
            capped=getattr(changelist.paginator, "capped", False),
            bulk_actions=[
                (name, spec.label, f"{reverse('admin:dlq_dlqitem_bulk_filter', args=[name])}?{filters}")
                for name, spec in ACTIONS.items()
                if request.user.has_perm(spec.permission) and request.user.has_perm(BULK_PERMISSION)
            ],
        )
        return response

    def get_actions(self, request, action_location=None):
        # Django 6.1 asks for a location (the change list's or the change form's actions); 5.2 and 6.0 do not.
        location = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **location)
        for name, spec in ACTIONS.items():
            if not request.user.has_perm(spec.permission):
                actions.pop(f"act_{name}", None)
        actions.pop("delete_selected", None)
        return actions

    def _selected(self, request, queryset, action):
        ids = list(queryset.values_list("pk", flat=True)[: MAX_SELECTED + 1])
        if len(ids) > MAX_SELECTED:
            self.message_user(
                request, _("Select at most %(n)d items, or use a bulk action by filter.") % {"n": MAX_SELECTED}
            )
            return None
        if len(ids) > 1 and not request.user.has_perm(BULK_PERMISSION):
            # Told here rather than by a 403 on the confirmation page; still an attempt the log records.
            audit_denied(
                actor=request.user.get_username(),
                action=f"bulk_{action}",
                target_type="bulk_operation",
                target_id="selected",
                client_ip=client_ip(request),
            )
            self.message_user(
                request,
                _("Acting on several items at once is a bulk action, which you may not start: select one item."),
                messages.ERROR,
            )
            return None
        url = reverse("admin:dlq_dlqitem_selected", args=[action])
        return HttpResponseRedirect(f"{url}?{urlencode({'ids': ','.join(map(str, ids))})}")

    @admin.action(description=_("Retry selected from checkpoint…"))
    def act_retry(self, request, queryset):
        return self._selected(request, queryset, "retry")

    @admin.action(description=_("Retry selected from start…"))
    def act_retry_from_start(self, request, queryset):
        return self._selected(request, queryset, "retry_from_start")

    @admin.action(description=_("Compensate selected…"))
    def act_compensate(self, request, queryset):
        return self._selected(request, queryset, "compensate")

    @admin.action(description=_("Close selected…"))
    def act_close(self, request, queryset):
        return self._selected(request, queryset, "close")

    # --- item page -----------------------------------------------------------------
    def change_view(self, request, object_id, form_url="", extra_context=None):
        item = get_object_or_404(DLQItem.objects.select_related("task"), pk=object_id)
        buttons = [
            (name, spec.label, reverse("admin:dlq_dlqitem_act", args=[item.pk, name]))
            for name, spec in ACTIONS.items()
            if request.user.has_perm(spec.permission) and action_available(item=item, action=name)
        ]
        attempt = failing_attempt(item=item)
        context = {
            "item": item,
            "failing_attempt": attempt,
            "failing_attempt_log": attempt_log_shown(attempt.log, attempt.log_dropped) if attempt else None,
            "input_snapshot": redact(item.input_snapshot),
            "action_buttons": buttons,
            "audit_entries": audit_entries_for_item(item=item),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    # --- confirmation pages ----------------------------------------------------------
    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<int:item_id>/act/<str:action>/", view(self.act_view), name="dlq_dlqitem_act"),
            path("selected/<str:action>/", view(self.selected_view), name="dlq_dlqitem_selected"),
            path("bulk/<str:action>/", view(self.bulk_filter_view), name="dlq_dlqitem_bulk_filter"),
            *super().get_urls(),
        ]

    def act_view(self, request, item_id, action):
        """GET: what will happen and a reason form. POST: act, then message and redirect."""
        spec = self._permitted_spec(request, action, item_id)
        item = get_object_or_404(DLQItem.objects.select_related("task"), pk=item_id)
        item_url = reverse("admin:dlq_dlqitem_change", args=[item.pk])
        error = ""
        if request.method == "POST":
            act = partial(dlq_item_act, item_id=item.pk, action=action, actor=request.user, **operator_form(request))
            error = self.perform(request, act, done_url=item_url, done_message=_acted_message, refused_url=item_url)
            if not isinstance(error, str):
                return error
        preview = retry_preview(item=item, action=action) if action.startswith("retry") else None
        available = action_available(item=item, action=action)
        return self._confirm_page(
            request, spec, items=[item], error=error, cancel_url=item_url, preview=preview, available=available
        )

    def selected_view(self, request, action):
        """Confirm and apply an action to the selected rows: one is a single action, more are a bulk action."""
        ids = _selected_ids(request)
        several = len(ids) > 1
        spec = self._permitted_spec(request, action, "selected", bulk=several)
        items = list(DLQItem.objects.select_related("task").filter(pk__in=ids))
        changelist_url = reverse("admin:dlq_dlqitem_changelist")
        error = ""
        if request.method == "POST":
            act = partial(
                dlq_selection_act,
                item_ids=[item.pk for item in items],
                action=action,
                actor=request.user,
                query=request.GET.urlencode(),
                **operator_form(request),
            )
            done_url = partial(_selection_done_url, changelist_url)
            error = self.perform(request, act, done_url=done_url, done_message=_selection_message)
            if not isinstance(error, str):
                return error
        extra = {"bulk": True, "selection": True, "matching_count": len(items)} if several else {}
        return self._confirm_page(request, spec, items=items, error=error, cancel_url=changelist_url, **extra)

    def bulk_filter_view(self, request, action):
        """Act on every item matching the list's current filter, in the background."""
        spec = self._permitted_spec(request, action, "new", bulk=True)
        try:
            matching = self._changelist_for_query(request).queryset.order_by("-created_at")
        except (IncorrectLookupParameters, FieldError):
            # As the list itself answers a filter it cannot apply: back to the list, with a message.
            messages.error(request, _("That filter is not valid; nothing was selected."))
            return HttpResponseRedirect(f"{reverse('admin:dlq_dlqitem_changelist')}?{ERROR_FLAG}=1")
        error = ""
        if request.method == "POST":
            ids = list(matching.values_list("pk", flat=True)[: MAX_ITEMS + 1])
            form = {"filter_query": _filter_query(request), **operator_form(request)}
            start = partial(bulk_operation_request, actor=request.user, action=action, item_ids=ids, **form)
            error = self.perform(request, start, **BULK_REQUESTED)
            if not isinstance(error, str):
                return error
        return self._confirm_page(request, spec, error=error, **_bulk_page(request, spec, matching))

    def _permitted_spec(self, request, action: str, target_id, *, bulk: bool = False) -> OperatorAction:
        """The action's spec, after checking the user's permission for it (and for bulk actions)."""
        spec = ACTIONS.get(action)
        if spec is None:
            raise Http404("unknown action")
        allowed = request.user.has_perm(spec.permission) and (not bulk or request.user.has_perm(BULK_PERMISSION))
        if not allowed:
            target_type = "bulk_operation" if bulk else "dlq_item"
            deny(request, action=f"bulk_{action}" if bulk else action, target_type=target_type, target_id=target_id)
        return spec

    def _confirm_page(self, request, spec, *, items, error, cancel_url, **extra):
        """GET (or a refused POST): what will happen, and the reason form. 400 when the form was wrong."""
        context = {
            **self.admin_site.each_context(request),
            "title": spec.label,
            "opts": self.model._meta,
            "action": spec.name,
            "spec": spec,
            "items": items,
            "preview": None,
            "available": True,
            "resolution_codes": ResolutionCode.choices,
            "error": error,
            # Shown again after a form error: never more than may be stored (a refused reason may be longer).
            "reason": request.POST.get("reason", "")[:MAX_REASON_LENGTH],
            "cancel_url": cancel_url,
            **extra,
        }
        template = "admin/dlq/dlqitem/confirm_action.html"
        return TemplateResponse(request, template, context, status=400 if error else 200)

    def _changelist_for_query(self, request):
        # Rebuild the list's own filtering (filters and search) from the query string.
        get = request.GET.copy()
        for key in FILTER_PARAMS_IGNORED:
            get.pop(key, None)
        request.GET = get
        return self.get_changelist_instance(request)


def _acted_message(result: ActionResult) -> tuple[int, str]:
    states = {"before": TaskState(result.state_before).label, "after": TaskState(result.state_after).label}
    label = ACTIONS[result.action].label
    return messages.SUCCESS, _("%(action)s done: task %(before)s → %(after)s.") % {"action": label, **states}


def _selection_message(result: ActionResult | BulkOperation) -> tuple[int, str]:
    return _bulk_requested_message(result) if isinstance(result, BulkOperation) else _acted_message(result)


def _selection_done_url(changelist_url: str, result: ActionResult | BulkOperation) -> str:
    if isinstance(result, BulkOperation):
        return reverse("admin:dlq_bulkoperation_change", args=[result.pk])
    return changelist_url


def _bulk_requested_message(operation: BulkOperation) -> tuple[int, str]:
    if operation.status == BulkStatus.AWAITING_APPROVAL:
        note = _("It covers %(n)d items and waits for a supervisor's approval.") % {"n": operation.total}
    else:
        note = _("It started with a canary batch of %(n)d items.") % {"n": operation.canary_size}
    return messages.INFO, _("Bulk action #%(id)d created. ") % {"id": operation.pk} + note


BULK_REQUESTED = {
    "done_url": lambda operation: reverse("admin:dlq_bulkoperation_change", args=[operation.pk]),
    "done_message": _bulk_requested_message,
}


def _bulk_page(request, spec: OperatorAction, matching) -> dict:
    """What the confirmation page of a bulk action shows: how many items match, the first of them."""
    return {
        "items": list(matching.select_related("task")[:20]),
        "cancel_url": f"{reverse('admin:dlq_dlqitem_changelist')}?{_filter_query(request)}",
        "title": _("%(action)s: every matching item") % {"action": spec.label},
        "matching_count": matching[: MAX_ITEMS + 1].count(),
        "bulk": True,
    }


def _selected_ids(request) -> list[int]:
    try:
        return [int(part) for part in request.GET.get("ids", "").split(",") if part][:MAX_SELECTED]
    except ValueError:
        return []


def _filter_query(request) -> str:
    params = request.GET.copy()
    for key in FILTER_PARAMS_IGNORED:
        params.pop(key, None)
    return params.urlencode()
