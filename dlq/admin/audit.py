"""The audit log: every operator action, denied and refused ones included, read-only."""

from __future__ import annotations

from django.contrib import admin
from django.db.models.functions import Left, Length
from django.utils.translation import gettext_lazy as _

from dlq.admin.common import (
    ActionFilter,
    DenialsAuditedMixin,
    TargetTypeFilter,
    action_label,
    detail_label,
    target_label,
)
from dlq.audit import DETAIL_MAX_LENGTH, REASON_MAX_LENGTH, text_bounded
from dlq.audit_details import state_label
from dlq.models import AuditEntry
from reliability_console.admin_mixins import ReadOnlyAdminMixin
from reliability_console.paginator import CappedCountPaginator

# The list shows the start of each reason; an entry's page shows what the log stores now (older entries may
# hold more: they are cut on display, never loaded whole).
LIST_REASON_LENGTH = 80


@admin.register(AuditEntry)
class AuditEntryAdmin(DenialsAuditedMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "created_at",
        "actor",
        "action_label",
        "target_type_label",
        "target_id",
        "outcome",
        "state_before_label",
        "state_after_label",
        "reason_start",
    )
    list_filter = ("outcome", ActionFilter, TargetTypeFilter)
    search_fields = ("=actor", "=target_id", "=task_id")
    paginator = CappedCountPaginator
    show_full_result_count = False
    # The entry's page: codes (action, states, a close's resolution) by name in the reader's language.
    fields = (
        "created_at",
        "actor",
        "action_label",
        "target_type_label",
        "target_id",
        "task_id",
        "state_before_label",
        "state_after_label",
        "outcome",
        "reason_text",
        "detail_text",
        "client_ip",
        "bulk_operation",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .defer("reason", "detail")
            .annotate(
                reason_first=Left("reason", REASON_MAX_LENGTH),
                reason_length=Length("reason"),
                detail_first=Left("detail", DETAIL_MAX_LENGTH),
                detail_length=Length("detail"),
            )
        )

    @admin.display(description=_("reason"))
    def reason_start(self, obj):
        start = obj.reason_first[:LIST_REASON_LENGTH]
        return start + "…" if obj.reason_length > LIST_REASON_LENGTH else start

    @admin.display(description=_("reason"))
    def reason_text(self, obj):
        return text_bounded(obj.reason_first, REASON_MAX_LENGTH, length=obj.reason_length)

    @admin.display(description=_("detail"))
    def detail_text(self, obj):
        return detail_label(obj, stored=text_bounded(obj.detail_first, DETAIL_MAX_LENGTH, length=obj.detail_length))

    @admin.display(description=_("action"), ordering="action")
    def action_label(self, obj: AuditEntry) -> str:
        return action_label(obj.action)

    @admin.display(description=_("target type"), ordering="target_type")
    def target_type_label(self, obj: AuditEntry) -> str:
        return target_label(obj.target_type)

    @admin.display(description=_("state before"))
    def state_before_label(self, obj: AuditEntry) -> str:
        return state_label(obj.state_before)

    @admin.display(description=_("state after"))
    def state_after_label(self, obj: AuditEntry) -> str:
        return state_label(obj.state_after)
