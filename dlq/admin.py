"""The DLQ console in Django's admin: triage pages, confirmation pages, bulk actions, the audit log.

Views here parse, check the permission for the page, call one service and
render; the rules live in dlq.actions and dlq.bulk.
"""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import F, Q
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from dlq.actions import ACTIONS, ActionDenied, ActionRefused, ReasonRequired, action_available, dlq_item_act
from dlq.audit import audit_denied
from dlq.bulk import (
    BULK_PERMISSION,
    BulkRefused,
    bulk_operation_approve,
    bulk_operation_control,
    bulk_operation_request,
)
from dlq.models import (
    AlertChannel,
    AlertDelivery,
    AlertEvent,
    AlertRule,
    AuditEntry,
    BulkOperation,
    BulkStatus,
    DLQItem,
    DLQStatus,
    ResolutionCode,
)
from dlq.selectors import GROUP_SCAN_LIMIT, audit_entries_for_item, failure_groups, retry_preview
from reliability_console.admin_mixins import AgeFilter, DistinctValueFilter, PipelineFilter, ReadOnlyAdminMixin
from reliability_console.paginator import CappedCountPaginator
from tasks.models import TaskState
from tasks.redaction import redact

# Selected-rows actions run at once; more than this must go through "bulk by filter".
MAX_SELECTED = 200
FILTER_PARAMS_IGNORED = ("p", "o", "_changelist_filters")


def client_ip(request) -> str | None:
    return request.META.get("REMOTE_ADDR") or None


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
class DLQItemAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "pipeline", "failing_step", "reason_code", "error_code", "status_badge", "age", "task_link")
    # Choices come from loose index scans, not SELECT DISTINCT over a million rows.
    list_filter = ("status", PipelineFilter, ReasonCodeFilter, ErrorClassFilter, FailingStepFilter, AgeFilter)
    search_fields = ("error_message",)
    search_help_text = _("task id, idempotency key, error code, or words from the error message")
    list_select_related = ("task",)
    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    ordering = ("-created_at",)
    change_list_template = "admin/dlq/dlqitem/change_list.html"
    change_form_template = "admin/dlq/dlqitem/change_form.html"
    actions = ["act_retry", "act_retry_from_start", "act_compensate", "act_close"]
    exclude = ("input_snapshot",)

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
        from django.utils.timesince import timesince

        return timesince(obj.created_at)

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

    def get_actions(self, request):
        actions = super().get_actions(request)
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
        context = {
            "item": item,
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

    def _spec_or_404(self, action):
        spec = ACTIONS.get(action)
        if spec is None:
            from django.http import Http404

            raise Http404("unknown action")
        return spec

    def _deny(self, request, action, target_id, target_type="dlq_item"):
        if request.method == "POST":
            audit_denied(
                actor=request.user.get_username(),
                action=action,
                target_type=target_type,
                target_id=str(target_id),
                client_ip=client_ip(request),
                reason=request.POST.get("reason", ""),
            )
        raise PermissionDenied

    def act_view(self, request, item_id, action):
        """GET: what will happen and a reason form. POST: act, then message and redirect."""
        spec = self._spec_or_404(action)
        if not request.user.has_perm(spec.permission):
            self._deny(request, action, item_id)
        item = get_object_or_404(DLQItem.objects.select_related("task"), pk=item_id)
        item_url = reverse("admin:dlq_dlqitem_change", args=[item.pk])
        error = ""
        if request.method == "POST":
            try:
                result = dlq_item_act(
                    item_id=item.pk,
                    action=action,
                    actor=request.user,
                    reason=request.POST.get("reason", ""),
                    client_ip=client_ip(request),
                    resolution_code=request.POST.get("resolution_code", ""),
                )
            except ActionDenied:
                raise PermissionDenied from None
            except ReasonRequired as exc:
                error = exc.message
            except ActionRefused as exc:
                self.message_user(request, _("Not done: %(why)s") % {"why": exc.message}, messages.ERROR)
                return HttpResponseRedirect(item_url)
            else:
                self.message_user(
                    request,
                    _("%(action)s done: task %(before)s → %(after)s.")
                    % {
                        "action": spec.label,
                        "before": TaskState(result.state_before).label,
                        "after": TaskState(result.state_after).label,
                    },
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(item_url)
        return self._confirm_page(
            request,
            spec,
            items=[item],
            error=error,
            cancel_url=item_url,
            preview=retry_preview(item=item, action=action) if action.startswith("retry") else None,
            available=action_available(item=item, action=action),
        )

    def selected_view(self, request, action):
        """Confirm and apply an action to the selected items, counting what succeeded and what was refused."""
        spec = self._spec_or_404(action)
        if not request.user.has_perm(spec.permission):
            self._deny(request, action, "selected")
        raw_ids = request.GET.get("ids", "")
        try:
            ids = [int(part) for part in raw_ids.split(",") if part][:MAX_SELECTED]
        except ValueError:
            ids = []
        items = list(DLQItem.objects.select_related("task").filter(pk__in=ids))
        changelist_url = reverse("admin:dlq_dlqitem_changelist")
        error = ""
        if request.method == "POST":
            reason = request.POST.get("reason", "")
            counts = {"done": 0, "refused": 0}
            try:
                for item in items:
                    try:
                        dlq_item_act(
                            item_id=item.pk,
                            action=action,
                            actor=request.user,
                            reason=reason,
                            client_ip=client_ip(request),
                            resolution_code=request.POST.get("resolution_code", ""),
                        )
                        counts["done"] += 1
                    except ActionRefused:
                        counts["refused"] += 1
            except ActionDenied:
                raise PermissionDenied from None
            except ReasonRequired as exc:
                error = exc.message
            else:
                level = messages.SUCCESS if not counts["refused"] else messages.WARNING
                self.message_user(
                    request,
                    _("%(action)s: %(done)d done, %(refused)d refused (already acted on or not possible).")
                    % {"action": spec.label, **counts},
                    level,
                )
                return HttpResponseRedirect(changelist_url)
        return self._confirm_page(request, spec, items=items, error=error, cancel_url=changelist_url)

    def bulk_filter_view(self, request, action):
        """Act on every item matching the list's current filter, in the background."""
        spec = self._spec_or_404(action)
        if not (request.user.has_perm(spec.permission) and request.user.has_perm(BULK_PERMISSION)):
            self._deny(request, f"bulk_{action}", "new", target_type="bulk_operation")
        changelist = self._changelist_for_query(request)
        matching = changelist.queryset.order_by("-created_at")
        error = ""
        if request.method == "POST":
            try:
                operation = bulk_operation_request(
                    actor=request.user,
                    action=action,
                    item_ids=list(matching.values_list("pk", flat=True)[:100_001]),
                    filter_query=_filter_query(request),
                    reason=request.POST.get("reason", ""),
                    resolution_code=request.POST.get("resolution_code", ""),
                    client_ip=client_ip(request),
                )
            except ActionDenied:
                raise PermissionDenied from None
            except (ReasonRequired, BulkRefused) as exc:
                error = exc.message
            else:
                if operation.status == BulkStatus.AWAITING_APPROVAL:
                    note = _("It covers %(n)d items and waits for a supervisor's approval.") % {"n": operation.total}
                else:
                    note = _("It started with a canary batch of %(n)d items.") % {"n": operation.canary_size}
                self.message_user(request, _("Bulk action #%(id)d created. ") % {"id": operation.pk} + note)
                return HttpResponseRedirect(reverse("admin:dlq_bulkoperation_change", args=[operation.pk]))
        return self._confirm_page(
            request,
            spec,
            items=list(matching.select_related("task")[:20]),
            error=error,
            cancel_url=f"{reverse('admin:dlq_dlqitem_changelist')}?{_filter_query(request)}",
            title=_("%(action)s: every matching item") % {"action": spec.label},
            matching_count=matching[:100_001].count(),
            bulk=True,
        )

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
            "reason": request.POST.get("reason", ""),
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


def _filter_query(request) -> str:
    params = request.GET.copy()
    for key in FILTER_PARAMS_IGNORED:
        params.pop(key, None)
    return params.urlencode()


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "action", "status", "progress", "requested_by", "approved_by", "created_at")
    list_filter = ("status", "action")
    change_form_template = "admin/dlq/bulkoperation/change_form.html"
    exclude = ("item_ids",)

    @admin.display(description=_("progress"))
    def progress(self, obj: BulkOperation):
        return f"{obj.processed}/{obj.total} ({obj.succeeded} ok, {obj.failed} failed)"

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path(
                "<int:operation_id>/control/<str:command>/", view(self.control_view), name="dlq_bulkoperation_control"
            ),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        operation = get_object_or_404(BulkOperation, pk=object_id)
        commands = []
        if request.user.has_perm(BULK_PERMISSION):
            if operation.status == BulkStatus.RUNNING:
                commands += [("pause", _("Pause")), ("cancel", _("Cancel"))]
            elif operation.status == BulkStatus.PAUSED:
                commands += [("resume", _("Resume")), ("cancel", _("Cancel"))]
            elif operation.status == BulkStatus.AWAITING_APPROVAL:
                commands += [("cancel", _("Cancel"))]
        if (
            operation.status == BulkStatus.AWAITING_APPROVAL
            and request.user.has_perm("dlq.approve_bulk_dlqitem")
            and request.user.get_username() != operation.requested_by
        ):
            commands.insert(0, ("approve", _("Approve (four eyes)")))
        context = {
            "operation": operation,
            "commands": [
                (name, label, reverse("admin:dlq_bulkoperation_control", args=[operation.pk, name]))
                for name, label in commands
            ],
            "refresh": operation.status == BulkStatus.RUNNING,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def control_view(self, request, operation_id, command):
        url = reverse("admin:dlq_bulkoperation_change", args=[operation_id])
        if request.method != "POST":
            return HttpResponseRedirect(url)
        try:
            if command == "approve":
                bulk_operation_approve(actor=request.user, operation_id=operation_id, client_ip=client_ip(request))
            else:
                bulk_operation_control(
                    actor=request.user, operation_id=operation_id, command=command, client_ip=client_ip(request)
                )
        except ActionDenied:
            raise PermissionDenied from None
        except BulkRefused as exc:
            self.message_user(request, _("Not done: %(why)s") % {"why": exc.message}, messages.ERROR)
        else:
            self.message_user(request, _("Done: %(command)s.") % {"command": command}, messages.SUCCESS)
        return HttpResponseRedirect(url)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "created_at",
        "actor",
        "action",
        "target_type",
        "target_id",
        "outcome",
        "state_before",
        "state_after",
    )
    list_filter = ("outcome", "action", "target_type")
    search_fields = ("=actor", "=target_id", "=task_id")
    paginator = CappedCountPaginator
    show_full_result_count = False


# --- alerting --------------------------------------------------------------------------


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "pipeline", "threshold", "state", "last_value", "firing_since", "enabled")
    list_filter = ("state", "kind", "enabled")
    search_fields = ("name", "pipeline")
    filter_horizontal = ("channels",)
    readonly_fields = ("state", "last_value", "last_evaluated_at", "firing_since", "last_notified_at", "recent_events")
    fieldsets = (
        (None, {"fields": ("name", "kind", "pipeline", "enabled")}),
        (_("Condition"), {"fields": ("threshold", "window_seconds", "lookback_days")}),
        (_("Notifications"), {"fields": ("channels", "renotify_seconds")}),
        (
            _("State"),
            {
                "fields": (
                    "state",
                    "last_value",
                    "last_evaluated_at",
                    "firing_since",
                    "last_notified_at",
                    "recent_events",
                )
            },
        ),
    )

    @admin.display(description=_("recent history"))
    def recent_events(self, obj):
        if obj.pk is None:
            return "-"
        events = AlertEvent.objects.filter(rule=obj)[:10]
        return (
            format_html_join(
                "",
                '<div><a href="{}">{}</a> {} — {}</div>',
                (
                    (
                        reverse("admin:dlq_alertevent_change", args=[e.pk]),
                        e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                        e.get_kind_display(),
                        e.summary,
                    )
                    for e in events
                ),
            )
            or "-"
        )

    def save_model(self, request, obj, form, change):
        if not change:
            super().save_model(request, obj, form, change)
            return
        # Save only what the form changed and bump the version, so an evaluator that
        # read the rule before this edit loses its transition instead of undoing the edit.
        fields = [name for name in form.changed_data if name != "channels"]
        if fields:
            obj.save(update_fields=fields)
        AlertRule.objects.filter(pk=obj.pk).update(version=F("version") + 1)


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "enabled", "consecutive_failures", "total_failures", "last_failure_at", "health")
    list_filter = ("kind", "enabled")
    search_fields = ("name",)
    readonly_fields = ("consecutive_failures", "total_failures", "last_error", "last_failure_at", "last_success_at")
    fields = ("name", "kind", "enabled", "url", "secret", "email_to", *readonly_fields)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "url":
            kwargs["assume_scheme"] = "https"  # Django 6's default, stated now
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    @admin.display(description=_("health"))
    def health(self, obj):
        if obj.consecutive_failures:
            return format_html(
                '<strong style="color:#ba2121">{}</strong>', _("failing: %(error)s") % {"error": obj.last_error[:120]}
            )
        return _("ok")


class AlertDeliveryInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = AlertDelivery
    extra = 0
    fields = ("channel", "status", "attempts", "last_error", "delivered_at", "task")
    readonly_fields = fields


@admin.register(AlertEvent)
class AlertEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("created_at", "rule", "kind", "value", "threshold", "delivery_status")
    list_filter = ("kind", "rule")
    list_select_related = ("rule",)
    inlines = [AlertDeliveryInline]
    fields = ("rule", "kind", "value", "threshold", "summary", "created_at", "dlq_items")
    readonly_fields = fields

    @admin.display(description=_("notifications"))
    def delivery_status(self, obj):
        statuses = [d.status for d in obj.deliveries.all()]
        return ", ".join(statuses) or "-"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("deliveries")

    @admin.display(description=_("dead letters"))
    def dlq_items(self, obj):
        return (
            format_html_join(
                ", ",
                '<a href="{}">{}</a>',
                ((reverse("admin:dlq_dlqitem_change", args=[pk]), pk) for pk in obj.dlq_item_ids),
            )
            or "-"
        )
