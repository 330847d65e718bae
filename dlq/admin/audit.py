"""The audit log: every operator action, denied and refused ones included, read-only."""

from __future__ import annotations

from django.contrib import admin

from dlq.models import AuditEntry
from reliability_console.admin_mixins import ReadOnlyAdminMixin
from reliability_console.paginator import CappedCountPaginator


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
