"""Writes on tasks from outside the workers: submission and operator actions."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition

from dlq.models import UNRESOLVED_STATUSES, DLQItem, DLQStatus
from dlq.services import dlq_item_set_status
from reliability_console.exceptions import (
    InvalidTaskInput,
    ReliabilityError,
)
from tasks import registry
from tasks.delivery import deliver_on_commit
from tasks.idempotency import idempotency_abandon, idempotency_begin, idempotency_complete
from tasks.models import ApiClient, Checkpoint, Task, TaskState
from tasks.pipelines import Pipeline

logger = logging.getLogger(__name__)

PYTHON_SCOPE = "python"
MAX_IDEMPOTENCY_KEY_LENGTH = 255
MAX_DEADLINE_SECONDS = 365 * 86400


class TaskNotActionable(ReliabilityError):
    """The task is not in a state that allows this action (someone else acted first)."""

    code = "task_not_actionable"


def canonical_json(value: Any) -> str:
    """Sorted keys, fixed separators: the one form in which payloads are hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def request_fingerprint(*, pipeline: str, input: Any, deadline_seconds: float | None = None) -> str:
    body = {"pipeline": pipeline, "input": input, "deadline_seconds": deadline_seconds}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def task_submit(
    *,
    pipeline: str,
    input: Any,
    idempotency_key: str | None = None,
    deadline: datetime | timedelta | float | None = None,
    scope: str = PYTHON_SCOPE,
) -> Task:
    """Create a task and deliver it after commit; return it.

    The same ``idempotency_key`` with the same pipeline, input and deadline
    returns the task the first call created; with a different request it
    raises ``IdempotencyKeyReused`` and changes nothing. ``deadline`` is an
    aware datetime, or seconds / a timedelta from now. If Redis is down the
    task is still created (QUEUED) and the sweeper delivers it later.
    """
    spec = registry.get(pipeline)
    cleaned = clean_input(spec, input)
    deadline_at, deadline_seconds = resolve_deadline(deadline)
    if idempotency_key is None:
        with transaction.atomic():
            return task_create(spec=spec, input=cleaned, deadline=deadline_at)
    check_idempotency_key(idempotency_key)
    fingerprint = request_fingerprint(pipeline=pipeline, input=cleaned, deadline_seconds=deadline_seconds)
    reservation = idempotency_begin(scope=scope, key=idempotency_key, fingerprint=fingerprint)
    if not reservation.owned:
        return Task.objects.get(pk=reservation.record.task_id)
    try:
        with transaction.atomic():
            task = task_create(
                spec=spec,
                input=cleaned,
                deadline=deadline_at,
                scope=scope,
                key=idempotency_key,
                fingerprint=fingerprint,
            )
            idempotency_complete(record=reservation.record, task=task, status=None, body=None)
    except BaseException:
        idempotency_abandon(record=reservation.record)
        raise
    return task


def task_create(
    *,
    spec: Pipeline,
    input: Any,
    deadline: datetime | None,
    client: ApiClient | None = None,
    scope: str = "",
    key: str | None = None,
    fingerprint: str = "",
) -> Task:
    """Insert a QUEUED task and deliver it when the surrounding transaction commits."""
    task = Task.objects.create(
        pipeline=spec.name,
        input=input,
        total_steps=len(spec.steps),
        deadline=deadline,
        client=client,
        idempotency_scope=scope if key is not None else "",
        idempotency_key=key,
        request_fingerprint=fingerprint,
    )
    deliver_on_commit(task.pk, task.fencing_token)
    logger.info("task submitted", extra={"event": "task_submitted", "task_id": str(task.pk), "pipeline": spec.name})
    return task


def clean_input(spec: Pipeline, data: Any) -> Any:
    """Run the pipeline's own validation; the result must be storable as JSON."""
    cleaned = spec.clean_input(data)
    try:
        canonical_json(cleaned)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskInput(f"input is not JSON: {exc}") from None
    return cleaned


def check_idempotency_key(key: str) -> None:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidTaskInput("idempotency key must be 1 to 255 characters", details={"idempotency_key": key})
    if not all(32 <= ord(ch) < 127 for ch in key):
        raise InvalidTaskInput("idempotency key must be printable ASCII", details={"idempotency_key": key})


def resolve_deadline(deadline) -> tuple[datetime | None, float | None]:
    if deadline is None:
        return None, None
    if isinstance(deadline, datetime):
        if timezone.is_naive(deadline):
            raise InvalidTaskInput("deadline must be timezone-aware")
        return deadline, deadline.timestamp()
    seconds = deadline.total_seconds() if isinstance(deadline, timedelta) else deadline
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_DEADLINE_SECONDS:
        raise InvalidTaskInput("deadline must be a positive number of seconds (at most one year)")
    return timezone.now() + timedelta(seconds=seconds), float(seconds)


# --- operator actions (the console's admin calls these) -----------------------


def task_retry_from_checkpoint(*, task_id) -> Task:
    """Re-queue a FAILED or COMPENSATION_FAILED task at its first unfinished step, with a fresh attempt budget."""
    with transaction.atomic():
        task = _locked(task_id)
        if task.state not in (TaskState.FAILED, TaskState.COMPENSATION_FAILED):
            raise TaskNotActionable(f"task is {task.state}; only failed tasks can be retried from checkpoint")
        task.retry_from_checkpoint()
        _save(task)
        dlq_item_set_status(task_id=task.pk, status=DLQStatus.RETRYING)
        deliver_on_commit(task.pk, task.fencing_token)
    return task


def task_retry_from_start(*, task_id) -> Task:
    """Start a COMPENSATED task again from step one, with new effect keys."""
    with transaction.atomic():
        task = _locked(task_id)
        if task.state != TaskState.COMPENSATED:
            raise TaskNotActionable(f"task is {task.state}; only compensated tasks can be retried from start")
        task.retry_from_start()
        _save(task)
        Checkpoint.objects.filter(task_id=task.pk).delete()
        dlq_item_set_status(task_id=task.pk, status=DLQStatus.RETRYING)
        deliver_on_commit(task.pk, task.fencing_token)
    return task


def task_compensate(*, task_id) -> Task:
    """Compensate a parked FAILED task now, or retry a COMPENSATION_FAILED one (done steps are skipped)."""
    with transaction.atomic():
        task = _locked(task_id)
        if task.state == TaskState.FAILED:
            task.start_compensation()
        elif task.state == TaskState.COMPENSATION_FAILED:
            task.retry_compensation()
        else:
            raise TaskNotActionable(f"task is {task.state}; only failed tasks can be compensated")
        _save(task)
        dlq_item_set_status(task_id=task.pk, status=DLQStatus.COMPENSATING)
        deliver_on_commit(task.pk, task.fencing_token)
    return task


def _locked(task_id) -> Task:
    task = Task.objects.select_for_update().filter(pk=task_id).first()
    if task is None:
        raise TaskNotActionable("no such task")
    return task


def _save(task: Task) -> None:
    try:
        task.save()
    except ConcurrentTransition:
        raise TaskNotActionable("the task changed while acting on it; reload and try again") from None


def task_has_open_dlq_item(task: Task) -> bool:
    return DLQItem.objects.filter(task_id=task.pk, status__in=UNRESOLVED_STATUSES).exists()
