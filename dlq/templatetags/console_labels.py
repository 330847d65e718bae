"""``action_label``, ``state_label``, ``audit_detail``: an audit entry's stored codes by name, translated."""

from __future__ import annotations

from django import template

from dlq.admin.common import action_label as _action_label
from dlq.admin.common import detail_label as _detail_label
from dlq.audit_details import state_label as _state_label

register = template.Library()


@register.filter
def action_label(code: str) -> str:
    return _action_label(code)


@register.filter
def state_label(code: str) -> str:
    return _state_label(code)


@register.filter
def audit_detail(entry) -> str:
    """An audit entry's detail (give it the entry: its code and parameters are worded, else its stored text)."""
    return _detail_label(entry)
