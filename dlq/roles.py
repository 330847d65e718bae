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
    "tasks.view_pipelineschedule",
]
OPERATE = [
    "dlq.retry_dlqitem",
    "dlq.close_dlqitem",
    "dlq.cancel_task",
    # The approval inbox: approve or reject a task waiting at an approval wait (viewers see the inbox only).
    "dlq.decide_approval",
]
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
    # Schedules submit tasks by the clock: supervisors add, change, pause and resume them.
    "tasks.add_pipelineschedule",
    "tasks.change_pipelineschedule",
    "tasks.pause_pipelineschedule",
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
        permissions = _permissions({code for codes in ROLES.values() for code in codes})
        for name, codes in ROLES.items():
            group, _ = Group.objects.get_or_create(name=name)
            group.permissions.set([permissions[code] for code in codes])
            result[name] = len(codes)
    return result


def _permissions(codes: set[str]) -> dict[str, Permission]:
    """Each of ``codes`` (``app_label.codename``) and its permission, read in one query rather than one per code."""
    candidates = Permission.objects.filter(codename__in={code.split(".", 1)[1] for code in codes})
    found = {
        f"{permission.content_type.app_label}.{permission.codename}": permission
        for permission in candidates.select_related("content_type")
    }
    missing = sorted(codes - found.keys())
    if missing:
        raise Permission.DoesNotExist(f"no permission {', '.join(missing)}")
    return found
