"""The console's roles, as Django groups with permissions.

The role table of docs/operate-dlq.md lists these permission codes role by role
(tests/integration/test_roles_docs.py compares the two and the groups).
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission
from django.db import transaction

VIEW = [
    "tasks.view_task",
    "tasks.view_stepattempt",
    "tasks.view_checkpoint",
    "tasks.view_sideeffect",
    "dlq.view_dlqitem",
    "dlq.view_auditentry",
    "dlq.view_bulkoperation",
    "dlq.view_alertrule",
    "dlq.view_alertchannel",
    "dlq.view_alertevent",
    "dlq.view_alertdelivery",
]
OPERATE = ["dlq.retry_dlqitem", "dlq.close_dlqitem", "dlq.cancel_task"]
SUPERVISE = [
    "dlq.compensate_dlqitem",
    "dlq.retry_from_start_dlqitem",
    "dlq.bulk_dlqitem",
    "dlq.approve_bulk_dlqitem",
    # Pausing a pipeline or changing its limits holds back every task of it: a supervisor's call.
    "tasks.pause_pipeline",
    "tasks.limit_pipeline",
    # Supervisors see which clients exist (a task names its client); creating, revoking and re-keying one
    # (tasks.manage_apiclient) stops or lets in all of its traffic: no role holds it, only superusers.
    "tasks.view_apiclient",
    # Alert rules and channels are configuration: supervisors edit them.
    "dlq.add_alertrule",
    "dlq.change_alertrule",
    "dlq.add_alertchannel",
    "dlq.change_alertchannel",
]

ROLES: dict[str, list[str]] = {
    "viewer": VIEW,
    "operator": VIEW + OPERATE,
    "supervisor": VIEW + OPERATE + SUPERVISE,
}


def roles_setup() -> dict[str, int]:
    """Create or update the viewer, operator and supervisor groups; return permissions per group."""
    result = {}
    with transaction.atomic():
        for name, codes in ROLES.items():
            group, _ = Group.objects.get_or_create(name=name)
            permissions = [_permission(code) for code in codes]
            group.permissions.set(permissions)
            result[name] = len(permissions)
    return result


def _permission(code: str) -> Permission:
    app_label, codename = code.split(".", 1)
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)
