"""Writes to the dead-letter queue. Called inside the transaction that fails the task."""

from __future__ import annotations

from django.utils import timezone

from dlq import metrics
from dlq.models import UNRESOLVED_STATUSES, DLQItem, DLQStatus
from tasks.redaction import redact

REASON_TEXT = {
    "permanent_error": "Step {step!r} failed with a permanent error ({code}): {message}",
    "attempts_exhausted": "Step {step!r} kept failing with transient errors; all {attempts} attempts used. "
    "Last error ({code}): {message}",
    "deadline_exceeded": "The task's deadline passed before step {step!r} could run again. Last error ({code}): "
    "{message}",
    "crash_loop": "Workers died {crashes} times while running step {step!r}; stopped to avoid a crash loop.",
    "compensation_failed": "Compensation could not finish: {message}",
}


def describe(*, reason_code: str, step: str, code: str, message: str, attempts: int, crashes: int = 0) -> str:
    template = REASON_TEXT.get(reason_code, "Step {step!r} failed ({code}): {message}")
    return template.format(step=step, code=code or "-", message=message or "-", attempts=attempts, crashes=crashes)


def dlq_item_open(
    *,
    task,
    reason_code: str,
    error_code: str,
    error_class: str,
    error_message: str,
    failing_step: str,
    attempts: int,
    status: str = DLQStatus.OPEN,
) -> DLQItem:
    """Open the task's one unresolved DLQ item (a partial unique index forbids a second).

    A task that fails again after an operator's retry re-opens its item with
    the new failure rather than adding another.
    """
    values = {
        "pipeline": task.pipeline,
        "reason_code": reason_code,
        "reason": describe(
            reason_code=reason_code,
            step=failing_step,
            code=error_code,
            message=error_message,
            attempts=attempts,
            crashes=task.crash_count,
        ),
        "error_code": error_code,
        "error_class": error_class,
        "error_message": error_message,
        "failing_step": failing_step,
        "attempts": attempts,
        "input_snapshot": redact(task.input),
        "fingerprint": f"{task.pipeline}:{failing_step}:{error_code}"[:300],
        "status": status,
        "compensation_error": "",
    }
    existing = DLQItem.objects.filter(task=task, status__in=UNRESOLVED_STATUSES).first()
    if existing is not None:
        for field, value in values.items():
            setattr(existing, field, value)
        existing.save()
        return existing
    metrics.dlq_item_created(pipeline=task.pipeline, reason=reason_code, step=failing_step, error_code=error_code)
    return DLQItem.objects.create(task=task, **values)


def dlq_item_resolve_retried(*, task_id) -> int:
    """Resolve the item of a task that succeeded after an operator's retry."""
    return DLQItem.objects.filter(task_id=task_id, status__in=UNRESOLVED_STATUSES).update(
        status=DLQStatus.RESOLVED,
        resolution_code="retried",
        resolution_note="the task succeeded after a retry",
        resolved_at=timezone.now(),
        updated_at=timezone.now(),
    )


def dlq_item_set_status(*, task_id, status: str, compensation_error: str | None = None) -> int:
    """Move the task's unresolved item to ``status`` (compensating, compensated, open…)."""
    values: dict = {"status": status, "updated_at": timezone.now()}
    if compensation_error is not None:
        values["compensation_error"] = compensation_error
    return DLQItem.objects.filter(task_id=task_id, status__in=UNRESOLVED_STATUSES).update(**values)


PURGE_BATCH_SIZE = 1000


def dlq_items_purge_resolved(*, batch_size: int = PURGE_BATCH_SIZE) -> int:
    """Delete resolved items older than RELIABILITY_DLQ_RETENTION_DAYS (never when it is 0)."""
    from datetime import timedelta

    from django.conf import settings

    days = settings.RELIABILITY_DLQ_RETENTION_DAYS
    if not days:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    old = DLQItem.objects.filter(status=DLQStatus.RESOLVED, resolved_at__lt=cutoff).values_list("pk", flat=True)
    ids = list(old[:batch_size])
    if not ids:
        return 0
    deleted, _ = DLQItem.objects.filter(pk__in=ids, status=DLQStatus.RESOLVED).delete()
    return deleted
