"""The audit of live control: one entry for every accepted cancel and every pause, resume or limit change.

The engine sends ``tasks.lifecycle.cancellation.cancel_requested`` and
``tasks.lifecycle.controls.pipeline_control_changed`` inside the transaction
of the change, whoever asked for it: an operator in the console
(``operator:<username>``), an API client (``client:<name>``), Python code.
The receivers connected here (``DlqConfig.ready()``, so in every process)
write the entry in that transaction: the change and its record commit, or
roll back, together. A repeated cancel sends nothing and writes nothing.
The console's own refusals and denials of these actions are audited where it
refuses them (``dlq.live_actions``).
"""

from __future__ import annotations

from dlq.audit import audit_record
from dlq.audit_actions import PIPELINE_LIMITS_RESET, PIPELINE_LIMITS_SET, TASK_CANCELLED
from dlq.audit_details import CANCEL_AT_BOUNDARY, LIMIT_KEYS, LIMITS_CHANGED, NO_DETAIL, AuditDetail
from dlq.models import AuditOutcome
from tasks.lifecycle import cancel_requested, pipeline_control_changed, schedule_changed
from tasks.models import TaskState

# A pipeline entry's "state" before and after: the words a task state and a bulk status already have.
PIPELINE_RUNNING = TaskState.RUNNING.value
PIPELINE_PAUSED_STATE = "paused"
# The changes whose entry records the limits before and after (a pause leaves them as they are).
LIMIT_ACTIONS = (PIPELINE_LIMITS_SET, PIPELINE_LIMITS_RESET)


# The engine's name for a console user; the audit log names console users by username alone, as in every
# other entry (refusals and denials included), so one search finds all of an operator's actions.
OPERATOR_PREFIX = "operator:"


def audit_actor(actor: str) -> str:
    """The audit log's name for the engine's ``actor``: a console user's username, anyone else as given."""
    return actor.removeprefix(OPERATOR_PREFIX)


def cancel_audited(sender, *, task, actor: str, reason: str, state_before: str, client_ip=None, **kwargs) -> None:
    """``cancel_requested``'s receiver: the accepted cancel's entry, in the cancel's transaction."""
    audit_record(
        actor=audit_actor(actor),
        action=TASK_CANCELLED,
        target_type="task",
        target_id=str(task.pk),
        task_id=task.pk,
        state_before=state_before,
        state_after=task.state,
        reason=reason,
        outcome=AuditOutcome.SUCCEEDED,
        # A running task goes on to its step boundary: the entry says so, the task page shows when it stopped.
        detail=AuditDetail(CANCEL_AT_BOUNDARY) if task.state == TaskState.RUNNING else NO_DETAIL,
        client_ip=client_ip,
    )


def pipeline_change_audited(
    sender, *, control, action: str, actor: str, reason: str, before: dict, after: dict, client_ip=None, **kwargs
) -> None:
    """``pipeline_control_changed``'s receiver: the change's entry, with its limits before and after."""
    audit_record(
        actor=audit_actor(actor),
        action=action,
        target_type="pipeline",
        target_id=control.pipeline,
        state_before=_pipeline_state(before),
        state_after=_pipeline_state(after),
        reason=reason,
        outcome=AuditOutcome.SUCCEEDED,
        detail=limits_detail(before=before, after=after) if action in LIMIT_ACTIONS else NO_DETAIL,
        client_ip=client_ip,
    )


def schedule_change_audited(
    sender, *, schedule, action: str, actor: str, reason: str, before: dict, after: dict, client_ip=None, **kwargs
) -> None:
    """``schedule_changed``'s receiver: the change's entry (paused or running, before and after), in its
    transaction."""
    audit_record(
        actor=audit_actor(actor),
        action=action,
        target_type="schedule",
        target_id=schedule.name,
        state_before=_schedule_state(before) if before else "",
        state_after=_schedule_state(after),
        reason=reason,
        outcome=AuditOutcome.SUCCEEDED,
        client_ip=client_ip,
    )


def _schedule_state(snapshot: dict) -> str:
    return PIPELINE_PAUSED_STATE if snapshot.get("paused") else PIPELINE_RUNNING


def receivers_connect() -> None:
    """Connect the receivers (idempotent: a receiver is connected once, whatever calls it again)."""
    cancel_requested.connect(cancel_audited, dispatch_uid="dlq.control_audit.cancel")
    pipeline_control_changed.connect(pipeline_change_audited, dispatch_uid="dlq.control_audit.pipeline")
    schedule_changed.connect(schedule_change_audited, dispatch_uid="dlq.control_audit.schedule")


def _pipeline_state(snapshot: dict) -> str:
    return PIPELINE_PAUSED_STATE if snapshot.get("paused") else PIPELINE_RUNNING


def limits_detail(*, before: dict, after: dict) -> AuditDetail:
    """The limits before and after a change: language-neutral, worded when shown (stored as compact JSON)."""
    return AuditDetail(
        LIMITS_CHANGED,
        {
            "before": {key: before.get(key) for key in LIMIT_KEYS},
            "after": {key: after.get(key) for key in LIMIT_KEYS},
        },
    )
