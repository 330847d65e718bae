"""Operator actions on dead letters: retry from checkpoint, retry from start, compensate, close.

Each action is one transaction that locks the DLQ item and its task, applies
the task transition, updates the item and appends the audit entry. Two
operators (or an operator and a worker) racing on one item: the second finds
the item or task changed and is refused with a clear message; nothing runs
twice. Refusals and permission denials are audited too.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils.translation import gettext

from dlq.audit import REASON_MAX_LENGTH, audit_denied, audit_record
from dlq.audit_actions import DEAD_LETTER_ACTION_LABELS
from dlq.audit_details import (
    ITEM_GONE,
    ITEM_RESOLVED,
    ITEM_STATE_CHANGED,
    NO_DETAIL,
    RESOLUTION,
    AuditDetail,
    refusal_detail,
)
from dlq.models import AuditOutcome, DLQItem
from tasks.exceptions import ReliabilityError, TaskNotActionable
from tasks.lifecycle import (
    CLOSABLE_STATES,
    task_close,
    task_compensate,
    task_retry_from_checkpoint,
    task_retry_from_start,
)
from tasks.models import DLQStatus, ResolutionCode, Task, TaskState

# A reason is what the audit log keeps of an action (also the item's resolution note): one limit for both.
MAX_REASON_LENGTH = REASON_MAX_LENGTH


@dataclass(frozen=True)
class OperatorAction:
    name: str
    permission: str  # "app_label.codename"
    allowed_task_states: tuple[str, ...]

    @property
    def label(self) -> str:
        """The action's name in the reader's language (``dlq.audit_actions``, where the audit log words it too)."""
        return DEAD_LETTER_ACTION_LABELS[self.name]

    def allows(self, task: Task) -> bool:
        """Whether the task's state lets this action run (the engine's service checks again)."""
        if self.name == "retry_from_start":
            return task.can_retry_from_start
        return task.state in self.allowed_task_states


ACTIONS: dict[str, OperatorAction] = {
    action.name: action
    for action in (
        OperatorAction("retry", "dlq.retry_dlqitem", (TaskState.FAILED, TaskState.COMPENSATION_FAILED)),
        OperatorAction(
            "retry_from_start",
            "dlq.retry_from_start_dlqitem",
            # And FAILED when parked because its pipeline changed (Task.can_retry_from_start).
            (TaskState.COMPENSATED, TaskState.FAILED),
        ),
        OperatorAction("compensate", "dlq.compensate_dlqitem", (TaskState.FAILED, TaskState.COMPENSATION_FAILED)),
        OperatorAction("close", "dlq.close_dlqitem", CLOSABLE_STATES),
    )
}


class ActionRefused(ReliabilityError):
    """The action is not possible now (another operator or a worker acted first, or a wrong state).

    Its message is in the actor's language; its ``code`` and ``details`` say the same for the audit log,
    worded for each reader (``dlq.audit_details``).
    """

    code = "action_refused"


def action_refused(code: str, **params) -> ActionRefused:
    """The refusal ``code`` (``dlq.audit_details``) with its facts, its message in the active language."""
    detail = AuditDetail(code, params)
    return ActionRefused(detail.sentence(), code=code, details=params)


class ActionDenied(ReliabilityError):
    """The user lacks the permission for this action."""

    code = "permission_denied"


class ReasonRequired(ReliabilityError):
    """Every operator action needs a reason."""

    code = "reason_required"


@dataclass(frozen=True)
class ActionResult:
    item_id: int
    action: str
    state_before: str
    state_after: str


def action_available(*, item: DLQItem, action: str) -> bool:
    spec = ACTIONS[action]
    return item.status != DLQStatus.RESOLVED and spec.allows(item.task)


def dlq_item_act(
    *,
    item_id: int,
    action: str,
    actor,
    reason: str,
    client_ip: str | None = None,
    resolution_code: str = "",
    bulk_operation_id: int | None = None,
) -> ActionResult:
    """Apply ``action`` to one DLQ item for ``actor`` (a user), checking its permission; audit it either way."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise ActionRefused(f"unknown action {action!r}")
    actor_name = actor.get_username()
    if not actor.has_perm(spec.permission):
        audit_denied(
            actor=actor_name,
            action=action,
            target_type="dlq_item",
            target_id=str(item_id),
            client_ip=client_ip,
            reason=reason,
        )
        raise ActionDenied(gettext("you may not do this: %(action)s") % {"action": spec.label})
    reason = (reason or "").strip()
    if not reason:
        raise ReasonRequired(gettext("give a reason: it goes into the audit log"))
    if len(reason) > MAX_REASON_LENGTH:
        raise ReasonRequired(gettext("the reason must be at most %(n)d characters") % {"n": MAX_REASON_LENGTH})
    if action == "close" and resolution_code not in ResolutionCode.values:
        raise ReasonRequired(gettext("choose a resolution code"))
    resolution_code = resolution_code if action == "close" else ""  # only a close has one; never store stray input
    task_id = None  # once known, a refusal's entry names the task too: its page lists the refusal
    try:
        with transaction.atomic():
            item = DLQItem.objects.select_for_update().filter(pk=item_id).first()
            if item is None:
                raise action_refused(ITEM_GONE)
            task = Task.objects.select_for_update().get(pk=item.task_id)
            task_id, before = task.pk, task.state
            if item.status == DLQStatus.RESOLVED:
                raise action_refused(ITEM_RESOLVED)
            if not spec.allows(task):
                raise action_refused(ITEM_STATE_CHANGED, state=before)
            after = _apply(action, task, reason, resolution_code)
            audit_record(
                actor=actor_name,
                action=action,
                target_type="dlq_item",
                target_id=str(item.pk),
                task_id=task.pk,
                state_before=before,
                state_after=after,
                reason=reason,
                outcome=AuditOutcome.SUCCEEDED,
                detail=AuditDetail(RESOLUTION, {"resolution": resolution_code}) if resolution_code else NO_DETAIL,
                client_ip=client_ip,
                bulk_operation_id=bulk_operation_id,
            )
    except (ActionRefused, TaskNotActionable) as exc:
        # The engine's refusal by its code, as the console's own: stored language-neutral, whoever reads it.
        detail = refusal_detail(exc)
        audit_record(
            actor=actor_name,
            action=action,
            target_type="dlq_item",
            target_id=str(item_id),
            task_id=task_id,
            reason=reason,
            outcome=AuditOutcome.REFUSED,
            detail=detail,
            client_ip=client_ip,
            bulk_operation_id=bulk_operation_id,
        )
        if isinstance(exc, TaskNotActionable):
            raise ActionRefused(detail.sentence(), code=exc.code, details=exc.details) from None
        raise
    return ActionResult(item_id=item_id, action=action, state_before=before, state_after=after)


def _apply(action: str, task: Task, reason: str, resolution_code: str) -> str:
    if action == "retry":
        return task_retry_from_checkpoint(task_id=task.pk).state
    if action == "retry_from_start":
        return task_retry_from_start(task_id=task.pk).state
    if action == "compensate":
        return task_compensate(task_id=task.pk).state
    # close: the item is resolved; the task keeps its terminal state.
    return task_close(task_id=task.pk, resolution=ResolutionCode(resolution_code), note=reason).state
