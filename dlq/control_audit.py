"""The audit of live control: one entry for every accepted cancel and every pause, resume or limit change.

The engine sends ``tasks.cancellation.cancel_requested`` and
``tasks.pipeline_controls.pipeline_control_changed`` inside the transaction
of the change, whoever asked for it: an operator in the console
(``operator:<username>``), an API client (``client:<name>``), Python code.
The receivers connected here (``DlqConfig.ready()``, so in every process)
write the entry in that transaction: the change and its record commit, or
roll back, together. A repeated cancel sends nothing and writes nothing.
The console's own refusals and denials of these actions are audited where it
refuses them (``dlq.live_actions``).
"""

from __future__ import annotations

import json

from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from dlq.audit import audit_record
from dlq.models import AuditOutcome
from tasks.cancellation import cancel_requested
from tasks.models import TaskState
from tasks.pipeline_controls import pipeline_control_changed

TASK_CANCELLED = "task_cancelled"
PIPELINE_PAUSED = "pipeline_paused"
PIPELINE_RESUMED = "pipeline_resumed"
PIPELINE_LIMITS_SET = "pipeline_limits_set"
PIPELINE_LIMITS_RESET = "pipeline_limits_reset"
# The audited actions' names in the reader's language (the audit log, the dashboard, the task page).
LIVE_ACTION_LABELS = {
    TASK_CANCELLED: _("Cancel task"),
    PIPELINE_PAUSED: _("Pause pipeline"),
    PIPELINE_RESUMED: _("Resume pipeline"),
    PIPELINE_LIMITS_SET: _("Set pipeline limits"),
    PIPELINE_LIMITS_RESET: _("Reset pipeline limits"),
}
# A pipeline entry's "state" before and after: the words a task state and a bulk status already have.
PIPELINE_RUNNING = TaskState.RUNNING.value
PIPELINE_PAUSED_STATE = "paused"
# Fixed details, shown translated (dlq.admin.common.DETAIL_LABELS).
CANCEL_AT_BOUNDARY_DETAIL = "stops at its next step boundary"
CANCEL_REPEATED_DETAIL = "a cancel was already requested"
# A limit the engine's snapshot names this way follows the pipeline's declaration.
DECLARED = "declared"
LIMIT_KEYS = ("max_concurrency", "rate_limit")
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
        detail=CANCEL_AT_BOUNDARY_DETAIL if task.state == TaskState.RUNNING else "",
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
        detail=limits_detail(before=before, after=after) if action in LIMIT_ACTIONS else "",
        client_ip=client_ip,
    )


def receivers_connect() -> None:
    """Connect the receivers (idempotent: a receiver is connected once, whatever calls it again)."""
    cancel_requested.connect(cancel_audited, dispatch_uid="dlq.control_audit.cancel")
    pipeline_control_changed.connect(pipeline_change_audited, dispatch_uid="dlq.control_audit.pipeline")


def _pipeline_state(snapshot: dict) -> str:
    return PIPELINE_PAUSED_STATE if snapshot.get("paused") else PIPELINE_RUNNING


def limits_detail(*, before: dict, after: dict) -> str:
    """The limits before and after a change, as compact JSON: language-neutral, worded when shown."""
    limits = {
        "before": {key: before.get(key) for key in LIMIT_KEYS},
        "after": {key: after.get(key) for key in LIMIT_KEYS},
    }
    return json.dumps(limits, separators=(",", ":"), sort_keys=True)


def limits_detail_text(detail: str) -> str | None:
    """A limits detail worded in the reader's language ("max concurrency: as declared → 2"); None if not one."""
    if not detail.startswith('{"after":'):
        return None
    try:
        limits = json.loads(detail)
        before, after = limits["before"], limits["after"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    names = {"max_concurrency": gettext("max concurrency"), "rate_limit": gettext("rate limit")}
    changed = [key for key in LIMIT_KEYS if before.get(key) != after.get(key)] or list(LIMIT_KEYS)
    return "; ".join(f"{names[key]}: {_limit_text(before.get(key))} → {_limit_text(after.get(key))}" for key in changed)


def _limit_text(value) -> str:
    if value == DECLARED:
        return gettext("as declared")
    if value is None or value == "":
        return gettext("no limit")
    return str(value)
