"""The one writer of dead-letter items and of ``Task.in_dlq``.

Every function here runs inside the transaction that writes the task's
outcome (the runner's, the sweeper's or an operator's), after the task's own
guarded save: the item and the task change together or not at all. A task
has at most one unresolved item (a partial unique index); a task that fails
again after a retry re-opens it rather than adding another.

``Task.in_dlq`` mirrors "has an unresolved item" so that a worker finishing a
task knows, without a query, whether an item is waiting to be resolved. It
is written here and nowhere else, through the task's guarded save (the state
it was read in and the fencing token it holds).
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from tasks.conf import engine_settings
from tasks.execution.classify import Classification
from tasks.lifecycle.fenced_writes import task_save_guarded
from tasks.models import (
    UNRESOLVED_STATUSES,
    DeadLetter,
    DLQStatus,
    FailureReason,
    ResolutionCode,
    Task,
    TaskState,
)
from tasks.models.door import door
from tasks.observability import metrics
from tasks.reason_texts import reason_params, reason_sentence_english
from tasks.redaction import task_redactor

PURGE_BATCH_SIZE = 1000


def reason_text(*, reason: str, step: str, code: str, message: str, attempts: int, crashes: int = 0) -> str:
    """The English explanation an item stores for a failure ``reason`` (a ``FailureReason``)."""
    params = reason_params(step=step, code=code, message=message, attempts=attempts, crashes=crashes)
    return reason_sentence_english(reason=reason, params=params)


@door
def dead_letter_open(*, task: Task, reason: FailureReason, error: Classification, step: str) -> DeadLetter:
    """Open the task's one unresolved item for its failure, or re-open it with this failure.

    Its status follows the task: compensating when the task goes on to
    compensate, open when it waits for an operator. Its texts and the task's
    input are stored redacted.
    """
    redactor = task_redactor(task)
    message = redactor.text(error.message)
    params = reason_params(
        step=step, code=error.code, message=message, attempts=task.total_attempts, crashes=task.crash_count
    )
    values = {
        "pipeline": task.pipeline,
        "reason_code": reason,
        "reason": reason_sentence_english(reason=reason, params=params),
        "reason_params": params,
        "error_code": error.code,
        "error_class": error.error_class,
        "error_message": message,
        "failing_step": step,
        "attempts": task.total_attempts,
        "input_snapshot": redactor.value(task.input),
        "fingerprint": f"{task.pipeline}:{step}:{error.code}"[:300],
        "status": DLQStatus.COMPENSATING if task.state == TaskState.COMPENSATING else DLQStatus.OPEN,
        "compensation_error": "",
    }
    item = DeadLetter.objects.filter(task=task, status__in=UNRESOLVED_STATUSES).first()
    if item is None:
        item = DeadLetter.objects.create(task=task, **values)
        metrics.dlq_item_created(pipeline=task.pipeline, reason=reason, step=step, error_code=error.code)
    else:
        for field, value in values.items():
            setattr(item, field, value)
        item.save()
    _set_in_dlq(task, True)
    return item


@door
def dead_letter_set_status(*, task: Task, status: DLQStatus, compensation_error: str | None = None) -> int:
    """Move the task's unresolved item to ``status`` (retrying, compensating, compensated, open)."""
    values: dict = {"status": status, "updated_at": timezone.now()}
    if compensation_error is not None:
        values["compensation_error"] = task_redactor(task).text(compensation_error)
    return DeadLetter.objects.filter(task_id=task.pk, status__in=UNRESOLVED_STATUSES).update(**values)


@door
def dead_letter_resolve(*, task: Task, resolution: ResolutionCode, note: str) -> int:
    """Resolve the task's unresolved item: it succeeded after a retry, or an operator closed it."""
    now = timezone.now()
    resolved = DeadLetter.objects.filter(task_id=task.pk, status__in=UNRESOLVED_STATUSES).update(
        status=DLQStatus.RESOLVED, resolution_code=resolution, resolution_note=note, resolved_at=now, updated_at=now
    )
    metrics.dlq_item_resolved(pipeline=task.pipeline, resolution=resolution, count=resolved)
    _set_in_dlq(task, False)
    return resolved


@door
def dead_letters_purge_resolved(*, batch_size: int = PURGE_BATCH_SIZE) -> int:
    """Delete resolved items older than ``RELIABILITY_DLQ_RETENTION_DAYS`` (never when it is 0)."""
    days = engine_settings.DLQ_RETENTION_DAYS
    if not days:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    old = DeadLetter.objects.filter(status=DLQStatus.RESOLVED, resolved_at__lt=cutoff).values_list("pk", flat=True)
    ids = list(old[:batch_size])
    if not ids:
        return 0
    deleted, _ = DeadLetter.objects.filter(pk__in=ids, status=DLQStatus.RESOLVED).delete()
    return deleted


def _set_in_dlq(task: Task, value: bool) -> None:
    if task.in_dlq != value:
        task.in_dlq = value
        task_save_guarded(task, ["in_dlq"])
