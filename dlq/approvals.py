"""The approval inbox's decision: approve or reject a task waiting at an approval wait
(``Pipeline.wait(name, timeout=..., approval=True)``).

A decision is the wait's signal, sent through the engine's one sender (``tasks.lifecycle.signals.task_signal``)
with the payload ``{"approved": true|false, "by": <username>, "reason": <text>}``, which the wait's step records
as its output for the steps after it. The console writes no task row: it locks the task's row, checks that the
task still waits at that approval wait (a decision on a task that moved on, was cancelled or timed out would be a
signal nobody reads, or one a retried task would take as its answer), sends the signal and appends the audit
entry, all in one transaction. A missing permission is audited as denied, a task no longer waiting as refused,
a missing reason writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from dlq.actions import ActionRefused
from dlq.audit import audit_record
from dlq.audit_actions import APPROVAL_APPROVED, APPROVAL_REJECTED
from dlq.audit_details import APPROVAL_DECIDED, APPROVAL_NOT_WAITING, AuditDetail, refusal_detail
from dlq.live_actions import operator_permitted
from dlq.models import AuditOutcome
from tasks.exceptions import SignalAlreadyReceived, TaskFinished, TaskNotActionable, UnknownSignal
from tasks.lifecycle import SignalResult, task_signal
from tasks.models import Task
from tasks.selectors import approval_wait_of

logger = logging.getLogger(__name__)

DECIDE_PERMISSION = "dlq.decide_approval"


@dataclass(frozen=True)
class Decision:
    name: str  # in the URL: /admin/approvals/<task>/<wait>/<name>/
    approved: bool
    audit_action: str
    label: object


DECISIONS = {
    decision.name: decision
    for decision in (
        Decision("approve", True, APPROVAL_APPROVED, _("Approve")),
        Decision("reject", False, APPROVAL_REJECTED, _("Reject")),
    )
}


def approval_payload(*, approved: bool, by: str, reason: str) -> dict:
    """The signal a decision sends: what the steps after the wait read as the wait's output."""
    return {"approved": approved, "by": by, "reason": reason}


def approval_decide(
    *, task_id, wait: str, decision: str, actor, reason: str, client_ip: str | None = None
) -> SignalResult:
    """Approve or reject (``decision``) the task ``task_id`` waiting at its approval wait ``wait``, for ``actor``
    (a user) with ``reason``; checks ``dlq.decide_approval``. Every outcome but a missing reason is audited.

    ``ActionDenied`` without the permission, ``ReasonRequired`` without a reason (nothing written),
    ``ActionRefused`` when the task no longer waits there (someone decided first, it was cancelled, it timed out).
    """
    spec = DECISIONS.get(decision)
    if spec is None:
        raise ActionRefused(f"unknown decision {decision!r}")
    name = actor.get_username()
    target = {"action": spec.audit_action, "target_type": "task", "target_id": str(task_id), "client_ip": client_ip}
    reason = operator_permitted(actor, permission=DECIDE_PERMISSION, label=spec.label, reason=reason, target=target)
    refusal = None
    with transaction.atomic():
        # Locked first, so the check and the signal see the same row (task_signal locks it again, in this
        # transaction): a decision cannot land on a task that left the wait between the two.
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is None:
            refusal = (AuditDetail("no_such_task"), "", gettext("this task no longer exists"))
        elif approval_wait_of(task) != wait:
            detail = AuditDetail(APPROVAL_NOT_WAITING, {"state": task.state})
            refusal = (detail, task.state, detail.sentence())
        else:
            payload = approval_payload(approved=spec.approved, by=name, reason=reason)
            try:
                result = task_signal(task_id=task.pk, name=wait, payload=payload, sent_by=f"operator:{name}")
            except (SignalAlreadyReceived, TaskFinished, UnknownSignal, TaskNotActionable) as exc:
                detail = refusal_detail(exc)
                refusal = (detail, task.state, detail.sentence())
            else:
                after = Task.objects.filter(pk=task.pk).values_list("state", flat=True).first() or ""
                audit_record(
                    actor=name,
                    reason=reason,
                    detail=AuditDetail(APPROVAL_DECIDED, {"wait": wait}),
                    outcome=AuditOutcome.SUCCEEDED,
                    task_id=task.pk,
                    state_before=task.state,
                    state_after=after,
                    **target,
                )
    if refusal is not None:
        detail, state, message = refusal
        audit_record(
            actor=name,
            reason=reason,
            detail=detail,
            outcome=AuditOutcome.REFUSED,
            task_id=task.pk if task is not None else None,
            state_before=state,
            state_after=state,
            **target,
        )
        raise ActionRefused(message, code=detail.code, details=detail.params)
    logger.info(
        "approval decided",
        extra={
            "event": "approval_decided",
            "task_id": str(task.pk),
            "wait": wait,
            "approved": spec.approved,
            "actor": name,
            "woke": result.woke,
        },
    )
    return result
