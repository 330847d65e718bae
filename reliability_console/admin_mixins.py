"""Admin building blocks shared by the project's apps."""

from __future__ import annotations


class ReadOnlyAdminMixin:
    """Pages that show records but never add, edit or delete them: writes go through services."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
