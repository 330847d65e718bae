"""The audit log: one append-only entry per operator action, denied and refused ones included."""

from __future__ import annotations

from dlq.models import AuditEntry, AuditOutcome


def audit_record(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    outcome: str,
    task_id=None,
    state_before: str = "",
    state_after: str = "",
    reason: str = "",
    detail: str = "",
    client_ip: str | None = None,
    bulk_operation_id: int | None = None,
) -> AuditEntry:
    """Append one entry. Call it inside the transaction of the change it records."""
    return AuditEntry.objects.create(
        actor=actor[:150],
        action=action[:50],
        target_type=target_type[:50],
        target_id=str(target_id)[:64],
        task_id=task_id,
        state_before=state_before or "",
        state_after=state_after or "",
        reason=reason,
        outcome=outcome,
        detail=detail,
        client_ip=client_ip,
        bulk_operation_id=bulk_operation_id,
    )


def audit_denied(
    *, actor: str, action: str, target_type: str, target_id: str, client_ip: str | None, reason: str = ""
) -> AuditEntry:
    """Record an attempt the actor had no permission for."""
    return audit_record(
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        outcome=AuditOutcome.DENIED,
        reason=reason,
        detail="permission denied",
        client_ip=client_ip,
    )
