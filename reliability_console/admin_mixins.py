"""Admin building blocks shared by the project's apps."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db import connections, router
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

MAX_FILTER_CHOICES = 200


def distinct_values(model, column: str, limit: int = MAX_FILTER_CHOICES) -> list[str]:
    """The distinct non-empty values of an indexed column, in order.

    A loose index scan (one index probe per distinct value) instead of
    ``SELECT DISTINCT``, which reads the whole table: millions of rows share
    a few pipelines, steps and error codes.
    """
    connection = connections[router.db_for_read(model)]
    quote = connection.ops.quote_name
    table, field = quote(model._meta.db_table), quote(model._meta.get_field(column).column)
    sql = (
        f"WITH RECURSIVE found(value) AS ("
        f" SELECT MIN({field}) FROM {table} WHERE {field} > %s"
        f" UNION ALL"
        f" SELECT (SELECT MIN({field}) FROM {table} WHERE {field} > found.value) FROM found"
        f" WHERE found.value IS NOT NULL"
        f") SELECT value FROM found WHERE value IS NOT NULL LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, ["", limit])
        return [row[0] for row in cursor.fetchall()]


class DistinctValueFilter(admin.SimpleListFilter):
    """A filter on an indexed text column whose choices are the values present in the table."""

    def lookups(self, request, model_admin):
        return [(value, value) for value in distinct_values(model_admin.model, self.parameter_name)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(**{self.parameter_name: self.value()})
        return queryset


class ReadOnlyAdminMixin:
    """Pages that show records but never add, edit or delete them: writes go through services."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class PipelineFilter(DistinctValueFilter):
    title = _("pipeline")
    parameter_name = "pipeline"


AGE_WINDOWS = {
    "1h": (_("Last hour"), timedelta(hours=1)),
    "24h": (_("Last 24 hours"), timedelta(hours=24)),
    "7d": (_("Last 7 days"), timedelta(days=7)),
}
OLDER_THAN_7_DAYS = "older_7d"


class AgeFilter(admin.SimpleListFilter):
    """Filter by ``created_at``: recent windows (index range scans) or older than a week."""

    title = _("age")
    parameter_name = "age"

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _window) in AGE_WINDOWS.items()] + [
            (OLDER_THAN_7_DAYS, _("Older than 7 days"))
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value in AGE_WINDOWS:
            return queryset.filter(created_at__gte=timezone.now() - AGE_WINDOWS[value][1])
        if value == OLDER_THAN_7_DAYS:
            return queryset.filter(created_at__lt=timezone.now() - timedelta(days=7))
        return queryset
