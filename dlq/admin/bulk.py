"""Bulk actions: their progress page, with the commands the user may give (approve, pause, resume, cancel)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.translation import gettext_lazy as _

from dlq.admin.common import ActionFilter, DenialsAuditedMixin, ServiceViewMixin, action_label, client_ip
from dlq.bulk import bulk_operation_command, bulk_operation_commands
from dlq.models import BulkOperation, BulkStatus
from reliability_console.admin_mixins import ReadOnlyAdminMixin
from tasks.models import resolution_label


@admin.register(BulkOperation)
class BulkOperationAdmin(DenialsAuditedMixin, ServiceViewMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "action_label", "status", "progress", "requested_by", "approved_by", "created_at")
    list_filter = ("status", ActionFilter)
    change_form_template = "admin/dlq/bulkoperation/change_form.html"
    fields = (
        "action_label",
        "filter_query",
        "reason",
        "resolution_label",
        "requested_by",
        "approved_by",
        "status",
        "total",
        "processed",
        "succeeded",
        "failed",
        "canary_size",
        "canary_max_failure_rate",
        "rate_per_second",
        "client_ip",
        "created_at",
        "updated_at",
        "finished_at",
    )
    readonly_fields = fields

    @admin.display(description=_("action"), ordering="action")
    def action_label(self, obj: BulkOperation):
        return action_label(obj.action)

    @admin.display(description=_("resolution"))
    def resolution_label(self, obj: BulkOperation):
        return resolution_label(obj.resolution_code)

    @admin.display(description=_("progress"))
    def progress(self, obj: BulkOperation):
        return _("%(done)s/%(total)s (%(ok)s succeeded, %(failed)s failed)") % {
            "done": obj.processed,
            "total": obj.total,
            "ok": obj.succeeded,
            "failed": obj.failed,
        }

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
        context = {
            "operation": operation,
            "commands": [
                (name, label, reverse("admin:dlq_bulkoperation_control", args=[operation.pk, name]))
                for name, label in bulk_operation_commands(operation=operation, actor=request.user)
            ],
            "refresh": operation.status == BulkStatus.RUNNING,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def control_view(self, request, operation_id, command):
        """POST: approve, pause, resume or cancel, then message and redirect to the operation's page."""
        url = reverse("admin:dlq_bulkoperation_change", args=[operation_id])
        if request.method != "POST":
            return HttpResponseRedirect(url)
        return self.perform(
            request,
            lambda: bulk_operation_command(
                actor=request.user, operation_id=operation_id, command=command, client_ip=client_ip(request)
            ),
            done_url=url,
            done_message=lambda _operation: (messages.SUCCESS, _("Done: %(command)s.") % {"command": command}),
            refused_url=url,
        )
