"""Cancelling a task: the one service behind the API's ``POST /tasks/{id}/cancel``, the console and Python.

A cancel is written once, on the task's row (``cancel_requested_at``, by
whom, why), in a transaction that holds the row lock:

- a QUEUED (held or not), RETRY_SCHEDULED or WAITING task is cancelled at once
  (``tasks.lifecycle.outcomes.task_cancelled``): no step of it runs again, and its
  completed steps are compensated (or it is parked, as its pipeline's
  ``on_cancel`` says); a job still in Redis for it finds nothing to do;
- a RUNNING task keeps running to its next step boundary, where its worker
  reads the request with the step's write and stops. If it is waiting (a
  socket read, a sleep), it is interrupted sooner, through its time limit
  (``tasks.execution.interrupts``): the worker holding the lease is told over Redis
  after commit, and its heartbeat sees the request on the row as well.

A second cancel of the same task is the same cancel: nothing is written, and
the caller gets the task as it stands. A task that finished, or is already
undoing a failure (COMPENSATING without a cancel), is not cancellable.
Every accepted cancel sends ``cancel_requested`` inside its transaction, so
the console audits it in the same commit, whoever asked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone
from redis.exceptions import RedisError
from rq.command import PUBSUB_CHANNEL_TEMPLATE

from tasks.delivery.enqueue import redis_client
from tasks.exceptions import TaskNotActionable, TaskNotCancellable
from tasks.lifecycle.outcomes import on_cancel_policy, task_cancelled
from tasks.models import Task, TaskState
from tasks.models.door import door
from tasks.observability.log_fields import task_fields

logger = logging.getLogger(__name__)

# Sent inside the cancel's transaction: sender=Task, task=, actor=, reason=, state_before=, client_ip=.
cancel_requested = Signal()
# The RQ worker command a cancel of a running task sends its lease holder (tasks.delivery.worker handles it).
CANCEL_COMMAND = "cancel-task"
CANCEL_REASON_MAX_LENGTH = 1000
# Cancelled right away: nothing of the task is running.
CANCELLED_AT_ONCE = (TaskState.QUEUED, TaskState.RETRY_SCHEDULED, TaskState.WAITING)


@dataclass(frozen=True)
class CancelResult:
    task: Task
    # False when this was a repeat of an earlier cancel: nothing was written.
    requested_now: bool
    state_before: str


@door
def task_cancel(*, task_id, actor: str, reason: str = "", client=None, client_ip: str | None = None) -> CancelResult:
    """Cancel ``task_id`` for ``actor`` (``client:<name>``, ``operator:<username>``, ...); idempotent.

    ``client``: only that API client's task (another's is "no such task").
    Raises ``TaskNotCancellable`` (with the state) for a finished task, and
    ``TaskNotActionable`` for one that does not exist.
    """
    reason = (reason or "").strip()
    if len(reason) > CANCEL_REASON_MAX_LENGTH:
        raise ValueError(f"a reason is at most {CANCEL_REASON_MAX_LENGTH} characters")
    with transaction.atomic():
        tasks = Task.objects.select_for_update()
        if client is not None:
            tasks = tasks.filter(client=client)
        task = tasks.filter(pk=task_id).first()
        if task is None:
            raise TaskNotActionable("no such task", code="no_such_task")
        state_before = task.state
        if task.is_cancelled:
            return CancelResult(task=task, requested_now=False, state_before=state_before)
        if task.state not in (*CANCELLED_AT_ONCE, TaskState.RUNNING):
            raise TaskNotCancellable(f"the task is {task.state}: there is nothing left to cancel", state=task.state)
        task.cancel_requested_at = timezone.now()
        task.cancel_requested_by = actor[:150]
        task.cancel_reason = reason
        # Written alone, without the state or the token: a worker holding the lease keeps writing its
        # steps (fenced on state and token) and reads the request at its next boundary.
        Task.objects.filter(pk=task.pk).update(
            cancel_requested_at=task.cancel_requested_at,
            cancel_requested_by=task.cancel_requested_by,
            cancel_reason=reason,
            updated_at=task.cancel_requested_at,
        )
        if task.state in CANCELLED_AT_ONCE:
            task_cancelled(task=task, policy=on_cancel_policy(task))
        else:
            owner = task.lease_owner
            transaction.on_commit(lambda: _tell_lease_holder(task=task, owner=owner))
        cancel_requested.send(
            sender=Task, task=task, actor=actor, reason=reason, state_before=state_before, client_ip=client_ip
        )
    logger.info(
        "cancel requested",
        extra={"event": "cancel_requested", **task_fields(task), "state": state_before, "by": actor},
    )
    return CancelResult(task=task, requested_now=True, state_before=state_before)


def _tell_lease_holder(*, task: Task, owner: str) -> None:
    """Ask the worker holding the task to stop its waiting step (best effort: its heartbeat sees it too)."""
    worker_name = owner.rsplit("@", 1)[0] if owner else ""
    if not worker_name:
        return
    payload = {"command": CANCEL_COMMAND, "task_id": str(task.pk)}
    try:
        redis_client().publish(PUBSUB_CHANNEL_TEMPLATE % worker_name, json.dumps(payload))
    except RedisError as exc:
        logger.warning(
            "could not tell the worker of a cancel; its heartbeat will see it",
            extra={"event": "cancel_notify_failed", **task_fields(task), "error": type(exc).__name__},
        )
