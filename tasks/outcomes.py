"""The transactions that record what happened to a step: one transaction per outcome.

Each function runs in a single ``transaction.atomic()``: the fenced task
update comes first (so a zombie stops before writing anything else), then
the attempt row, checkpoint and ledger rows of the same outcome. A step
that succeeded, the hot path, is one fenced statement that does all of it
(``tasks.fenced_writes``): atomic by itself, one round trip.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from dlq import metrics
from dlq.models import DLQStatus
from dlq.services import dlq_item_open, dlq_item_resolve_retried, dlq_item_set_status
from tasks.classify import Classification
from tasks.delivery import deliver_on_commit
from tasks.fenced_writes import task_save_fenced, task_save_guarded
from tasks.leases import Claim, lease_extend, lease_seconds
from tasks.models import (
    AttemptKind,
    AttemptOutcome,
    Checkpoint,
    EffectStatus,
    SideEffect,
    StepAttempt,
    Task,
    TaskState,
)
from tasks.pipelines import FailurePolicy

logger = logging.getLogger(__name__)

# No indexed column (not updated_at, not lease_expires_at): a step's progress is a HOT update.
TASK_PROGRESS_FIELDS = ["state", "current_step", "step_attempt", "total_attempts"]
TASK_FINISH_FIELDS = [
    "state",
    "current_step",
    "result",
    "in_dlq",
    "lease_owner",
    "lease_expires_at",
    "finished_at",
    "updated_at",
]
TASK_RETRY_FIELDS = ["state", "retry_at", "lease_owner", "lease_expires_at", "updated_at"]
TASK_FAIL_FIELDS = [
    "state",
    "failure_reason",
    "failure_code",
    "failure_message",
    "failed_step",
    "retry_at",
    "finished_at",
    "lease_owner",
    "lease_expires_at",
    "fencing_token",
    "crash_count",
    "in_dlq",
    "updated_at",
]


@dataclass(frozen=True)
class AttemptRecord:
    """What one attempt did, ready to be written."""

    kind: str
    step_index: int
    step_name: str
    attempt: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str
    error: Classification | None = None
    traceback: str = ""
    retry_delay: float | None = None

    def row(self, task: Task) -> StepAttempt:
        error = self.error
        return StepAttempt(
            task_id=task.pk,
            kind=self.kind,
            generation=task.generation,
            step_index=self.step_index,
            step_name=self.step_name,
            attempt=self.attempt,
            worker=self.worker[:200],
            fencing_token=task.fencing_token,
            started_at=self.started_at,
            finished_at=self.finished_at,
            outcome=self.outcome,
            error_code=error.code[:100] if error else "",
            error_class=error.error_class[:200] if error else "",
            error_message=error.message if error else "",
            traceback=self.traceback,
            retry_delay_seconds=self.retry_delay,
            retry_after_seconds=error.retry_after if error else None,
        )


def _ledger_rows(task: Task, step_index: int, step_name: str, keys: dict[str, str], status: str) -> list:
    return [
        SideEffect(
            task_id=task.pk,
            generation=task.generation,
            step_index=step_index,
            step_name=step_name,
            effect_name=name,
            effect_key=key,
            status=status,
        )
        for name, key in keys.items()
    ]


def step_succeeded(
    *, claim: Claim, record: AttemptRecord, output: Any, used_keys: dict[str, str], is_last: bool
) -> None:
    """Commit a step: checkpoint, attempt row, ledger and the task's progress (or its success).

    One fenced statement (see ``tasks.fenced_writes``): a step costs one
    round trip, and a zombie's outcome is rejected whole.
    """
    task = claim.task
    if is_last and task.in_dlq:
        # An operator's retry worked: its DLQ item is resolved in the same transaction.
        with transaction.atomic():
            task.succeed(result=output)
            _save_step(task, TASK_FINISH_FIELDS, record, output, used_keys)
            resolved = dlq_item_resolve_retried(task_id=task.pk)
            metrics.dlq_item_resolved(pipeline=task.pipeline, resolution="retried", count=resolved)
    elif is_last:
        task.succeed(result=output)
        _save_step(task, TASK_FINISH_FIELDS, record, output, used_keys)
    else:
        task.advance()
        _save_step(task, TASK_PROGRESS_FIELDS, record, output, used_keys)
    claim.outputs[record.step_index] = output
    _record_attempt_metrics(task, record)
    if is_last:
        metrics.task_finished(
            pipeline=task.pipeline, state=task.state, created_at=task.created_at, finished_at=task.finished_at
        )


def _save_step(task: Task, fields: list[str], record: AttemptRecord, output: Any, used_keys: dict[str, str]) -> None:
    # The checkpoint and attempt rows belong to the step that just ran.
    checkpoint = Checkpoint(task_id=task.pk, step_index=record.step_index, step_name=record.step_name, output=output)
    task_save_fenced(
        task,
        fields,
        rows=[checkpoint, record.row(task)],
        rows_ignoring_conflicts=_ledger_rows(task, record.step_index, record.step_name, used_keys, EffectStatus.DONE),
    )


def _record_attempt_metrics(task: Task, record: AttemptRecord, *, retried: bool = False) -> None:
    metrics.step_attempt_recorded(
        pipeline=task.pipeline,
        step=record.step_name,
        outcome=record.outcome,
        error_code=record.error.code if record.error else "",
        started_at=record.started_at,
        finished_at=record.finished_at,
        retried=retried,
    )


def step_retry_scheduled(*, claim: Claim, record: AttemptRecord, retry_at: datetime) -> None:
    task = claim.task
    with transaction.atomic():
        token = task.fencing_token
        task.schedule_retry(retry_at=retry_at)
        task_save_guarded(task, TASK_RETRY_FIELDS)
        StepAttempt.objects.bulk_create([record.row(task)])
        deliver_on_commit(task.pk, token, when=retry_at)
    _record_attempt_metrics(task, record, retried=True)
    logger.info(
        "retry scheduled",
        extra={
            "event": "retry_scheduled",
            "task_id": str(task.pk),
            "step": record.step_name,
            "attempt": record.attempt,
            "delay": round(record.retry_delay or 0.0, 3),
            "error_code": record.error.code if record.error else "",
        },
    )


def task_failed(
    *,
    task: Task,
    policy: FailurePolicy,
    reason: str,
    error: Classification,
    step_index: int,
    step_name: str,
    record: AttemptRecord | None = None,
    uncertain_keys: dict[str, str] | None = None,
    keep_lease_for: str | None = None,
) -> None:
    """Fail the task for good, open its DLQ item, and start compensation when the policy says so.

    ``keep_lease_for`` names the worker that goes straight on to compensate
    under the same lease; otherwise the compensation is delivered through RQ.
    """
    with transaction.atomic():
        token = task.fencing_token
        task.fail(reason=reason, code=error.code, message=error.message, step=step_name)
        if policy == FailurePolicy.COMPENSATE:
            task.start_compensation(owner=keep_lease_for or "", lease_seconds=lease_seconds())
        task_save_guarded(task, TASK_FAIL_FIELDS)
        if record is not None:
            StepAttempt.objects.bulk_create([record.row(task)])
        if uncertain_keys:
            SideEffect.objects.bulk_create(
                _ledger_rows(task, step_index, step_name, uncertain_keys, EffectStatus.UNCERTAIN),
                ignore_conflicts=True,
            )
        dlq_item_open(
            task=task,
            reason_code=reason,
            error_code=error.code,
            error_class=error.error_class,
            error_message=error.message,
            failing_step=step_name,
            attempts=task.total_attempts,
            status=DLQStatus.COMPENSATING if policy == FailurePolicy.COMPENSATE else DLQStatus.OPEN,
        )
        if policy == FailurePolicy.COMPENSATE and not keep_lease_for:
            deliver_on_commit(task.pk, token)
    if record is not None:
        _record_attempt_metrics(task, record)
    if task.state == TaskState.FAILED:
        metrics.task_finished(
            pipeline=task.pipeline, state=task.state, created_at=task.created_at, finished_at=task.finished_at
        )
    logger.error(
        "task failed",
        extra={
            "event": "task_failed",
            "task_id": str(task.pk),
            "pipeline": task.pipeline,
            "step": step_name,
            "reason": reason,
            "error_code": error.code,
        },
    )


def compensation_attempt_recorded(*, claim: Claim, record: AttemptRecord, compensated_step: int | None) -> None:
    """Record a compensation or notice attempt; on success mark the step's effects compensated."""
    task = claim.task
    with transaction.atomic():
        lease_extend(task_id=task.pk, fencing_token=task.fencing_token)
        StepAttempt.objects.bulk_create([record.row(task)])
        if compensated_step is not None and record.outcome == AttemptOutcome.SUCCEEDED:
            SideEffect.objects.filter(task_id=task.pk, generation=task.generation, step_index=compensated_step).update(
                status=EffectStatus.COMPENSATED, compensated_at=timezone.now()
            )


def compensation_finished(*, claim: Claim, errors: list[str]) -> None:
    task = claim.task
    with transaction.atomic():
        if errors:
            message = "; ".join(errors)
            task.fail_compensation(code="compensation_failed", message=message)
            task_save_guarded(task, TASK_FAIL_FIELDS)
            dlq_item_set_status(task_id=task.pk, status=DLQStatus.OPEN, compensation_error=message)
        else:
            task.finish_compensation()
            task_save_guarded(task, ["state", "lease_owner", "lease_expires_at", "finished_at", "updated_at"])
            dlq_item_set_status(task_id=task.pk, status=DLQStatus.COMPENSATED)
    metrics.compensation_finished(pipeline=task.pipeline, outcome="failed" if errors else "compensated")
    metrics.task_finished(
        pipeline=task.pipeline, state=task.state, created_at=task.created_at, finished_at=task.finished_at
    )
    logger.log(
        logging.ERROR if errors else logging.INFO,
        "compensation finished",
        extra={
            "event": "compensation_failed" if errors else "task_compensated",
            "task_id": str(task.pk),
            "state": task.state,
        },
    )


def completed_compensations(task: Task) -> set[tuple[str, int]]:
    """(kind, step index) of compensations and notices already done for this generation."""
    return set(
        StepAttempt.objects.filter(
            task_id=task.pk,
            generation=task.generation,
            kind__in=[AttemptKind.COMPENSATION, AttemptKind.FAILURE_NOTICE],
            outcome=AttemptOutcome.SUCCEEDED,
        ).values_list("kind", "step_index")
    )


def uncertain_step_indexes(task: Task) -> set[int]:
    """Steps whose last attempt may have acted on the far side (timeout, crash, 5xx)."""
    return set(
        SideEffect.objects.filter(
            task_id=task.pk, generation=task.generation, status=EffectStatus.UNCERTAIN
        ).values_list("step_index", flat=True)
    ) | set(
        StepAttempt.objects.filter(
            task_id=task.pk,
            generation=task.generation,
            kind=AttemptKind.STEP,
            outcome__in=[AttemptOutcome.TIMEOUT, AttemptOutcome.CRASHED],
            step_index=task.current_step,
        ).values_list("step_index", flat=True)
    )


def state_label(task: Task) -> str:
    return TaskState(task.state).label
