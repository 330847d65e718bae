"""Read-only DLQ pages (operator actions arrive with the console issue, as service calls)."""

from __future__ import annotations

from django.contrib import admin

from dlq.models import DLQItem
from reliability_console.admin_mixins import ReadOnlyAdminMixin


@admin.register(DLQItem)
class DLQItemAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "pipeline", "failing_step", "reason_code", "error_code", "status", "created_at")
    list_filter = ("status", "pipeline", "reason_code", "failing_step")
    search_fields = ("=task__id", "error_message", "reason")
    show_full_result_count = False
    list_select_related = ("task",)
    readonly_fields = [field.name for field in DLQItem._meta.fields]
