"""The audit log: every operator action, denied and refused ones included, read-only."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from dlq.admin.common import ActionFilter, action_label, detail_label, state_label
from dlq.models import AuditEntry
from reliability_console.admin_mixins import ReadOnlyAdminMixin
from reliability_console.paginator import CappedCountPaginator


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "created_at",
        "actor",
        "action_label",
        "target_type",
        "target_id",
        "outcome",
        "state_before_label",
        "state_after_label",
    )
    list_filter = ("outcome", ActionFilter, "target_type")
    search_fields = ("=actor", "=target_id", "=task_id")
    paginator = CappedCountPaginator
    show_full_result_count = False
    # The entry's page: codes (action, states, a close's resolution) by name in the reader's language.
    fields = (
        "created_at",
        "actor",
        "action_label",
        "target_type",
        "target_id",
        "task_id",
        "state_before_label",
        "state_after_label",
        "outcome",
        "reason",
        "detail_text",
        "client_ip",
        "bulk_operation",
    )
    readonly_fields = fields

    @admin.display(description=_("action"), ordering="action")
    def action_label(self, obj: AuditEntry) -> str:
        return action_label(obj.action)

    @admin.display(description=_("detail"))
    def detail_text(self, obj: AuditEntry) -> str:
        return detail_label(obj.detail)

    @admin.display(description=_("state before"))
    def state_before_label(self, obj: AuditEntry) -> str:
        return state_label(obj.state_before)

    @admin.display(description=_("state after"))
    def state_after_label(self, obj: AuditEntry) -> str:
        return state_label(obj.state_after)
