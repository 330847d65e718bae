"""The one writer of each task outcome, used by the runner, the compensation runner and the sweeper alike.

Each function writes one outcome in one transaction: the fenced task update
first (so a zombie stops before writing anything else), then the attempt
row, checkpoint, ledger rows and dead-letter item of the same outcome, and
the delivery that follows it on commit, and the completion callback of a
terminal state (``tasks.outbound.callback_events``). A step that succeeded, the hot path,
is one fenced statement that does all of it (``tasks.lifecycle.fenced_writes``):
atomic by itself, one round trip. Metrics count an outcome once it commits.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from tasks import registry
from tasks.conf import engine_settings
from tasks.delivery.enqueue import deliver_on_commit
from tasks.exceptions import UnknownPipeline
from tasks.execution.attempts import AttemptRecord
from tasks.execution.claim import Claim, lease_seconds
from tasks.execution.classify import Classification
from tasks.execution.compensation_plan import compensation_targets
from tasks.lifecycle.dead_letters import dead_letter_open, dead_letter_resolve, dead_letter_set_status
from tasks.lifecycle.fenced_writes import NewRow, task_save_fenced, task_save_guarded
from tasks.lifecycle.holds import run_ended
from tasks.lifecycle.leases import lease_extend
from tasks.models import (
    AttemptKind,
    AttemptOutcome,
    Checkpoint,
    DLQStatus,
    EffectStatus,
    FailureReason,
    ResolutionCode,
    SideEffect,
    StepAttempt,
    Task,
    TaskState,
)
from tasks.models.door import door
from tasks.observability import metrics
from tasks.observability.log_fields import task_fields
from tasks.outbound.callback_events import callback_submit
from tasks.pipelines.attributes import attributes_changed
from tasks.pipelines.pipeline import FailurePolicy
from tasks.redaction import task_redactor

logger = logging.getLogger(__name__)

# No indexed column (not updated_at, not lease_expires_at): a step's progress is a HOT update.
TASK_PROGRESS_FIELDS = ["state", "current_step", "step_attempt", "total_attempts"]
TASK_FINISH_FIELDS = ["state", "current_step", "result", "lease_owner", "lease_expires_at", "finished_at", "updated_at"]
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
    "updated_at",
]
TASK_REQUEUE_FIELDS = ["state", "fencing_token", "crash_count", "lease_owner", "lease_expires_at", "updated_at"]
TASK_STEPS_FIELDS = ["step_names", "total_steps"]
TASK_COMPENSATED_FIELDS = ["state", "lease_owner", "lease_expires_at", "finished_at", "updated_at"]
TASK_CANCEL_FIELDS = [
    "state",
    "failure_reason",
    "failure_code",
    "failure_message",
    "retry_at",
    "hold",
    "wait_for",
    "finished_at",
    "lease_owner",
    "lease_expires_at",
    "step_attempt",
    "total_attempts",
    "updated_at",
]
# Error codes the engine itself records (a step's own errors carry the step's codes).
LEASE_EXPIRED_CODE = "lease_expired"
CRASH_LOOP_CODE = FailureReason.CRASH_LOOP.value
COMPENSATION_FAILED_CODE = FailureReason.COMPENSATION_FAILED.value
CANCELLED_CODE = FailureReason.CANCELLED.value


class LeaseExpiry(enum.StrEnum):
    """What became of a task whose lease expired."""

    REQUEUED = "requeued"
    CRASH_LOOP = "crash_loop"
    COMPENSATION_CRASH_LOOP = "compensation_crash_loop"


@door
def step_succeeded(
    *,
    claim: Claim,
    record: AttemptRecord,
    output: Any,
    used_keys: dict[str, str],
    is_last: bool,
    has_compensation: bool = False,
    attributes: Mapping[str, str | None] | None = None,
) -> None:
    """Commit a step: checkpoint, attempt row, ledger and the task's progress (or its success).

    One fenced statement (see ``tasks.lifecycle.fenced_writes``): a step costs one
    round trip, and a zombie's outcome is rejected whole. The output is
    stored redacted, and the later steps and compensations of this run see
    what was stored, as a resumed run would. ``attributes``: the search
    attributes the step set (``ctx.set_attributes``, checked then), written
    in the same statement.
    """
    task = claim.task
    output = task_redactor(task).value(output)
    # A sleep step's end clears the task's sleep, a step's attributes change them (the write's shape has these
    # columns only then).
    extra_fields = ["wait_until"] if task.wait_until is not None else []
    if attributes:
        task.attributes = attributes_changed(registry.get(task.pipeline).search_attributes, task.attributes, attributes)
        extra_fields.append("attributes")
    if is_last and (task.in_dlq or task.callback_url):
        # An operator's retry worked: its dead letter is resolved in the same transaction;
        # a callback is created in it too (a crash can lose neither).
        with transaction.atomic():
            task.succeed(result=output)
            _save_step(task, TASK_FINISH_FIELDS + extra_fields, record, output, used_keys, has_compensation)
            if task.in_dlq:
                dead_letter_resolve(
                    task=task, resolution=ResolutionCode.RETRIED, note="the task succeeded after a retry"
                )
            callback_submit(task=task)
    elif is_last:
        task.succeed(result=output)
        _save_step(task, TASK_FINISH_FIELDS + extra_fields, record, output, used_keys, has_compensation)
    else:
        task.advance()
        # The write also says whether a cancel or a pause came in: read at the step boundary (tasks.execution.runner).
        _save_step(task, TASK_PROGRESS_FIELDS + extra_fields, record, output, used_keys, has_compensation, signals=True)
    if is_last:
        run_ended(task)
    claim.outputs[record.step_name] = output
    claim.completed.append(record.step_name)
    _attempt_metrics(task, record)
    if is_last:
        _finished_metrics(task)


def _save_step(
    task: Task,
    fields: list[str],
    record: AttemptRecord,
    output: Any,
    used_keys: dict[str, str],
    has_compensation: bool,
    *,
    signals: bool = False,
) -> None:
    # The checkpoint and attempt rows belong to the step that just ran; written as values (no model instances:
    # building them was the largest part of a step's own Python time, `make profile`).
    checkpoint = NewRow(
        Checkpoint,
        {
            "task_id": task.pk,
            "step_index": record.step_index,
            "step_name": record.step_name,
            "output": output,
            "has_compensation": has_compensation,
        },
    )
    ledger = [
        NewRow(
            SideEffect,
            {
                "task_id": task.pk,
                "generation": task.generation,
                "step_index": record.step_index,
                "step_name": record.step_name,
                "effect_name": name,
                "effect_key": key,
                "status": EffectStatus.DONE,
            },
        )
        for name, key in used_keys.items()
    ]
    task_save_fenced(
        task,
        fields,
        rows=[checkpoint, NewRow(StepAttempt, record.values(task))],
        rows_ignoring_conflicts=ledger,
        signals=signals,
    )


@door
def task_steps_redeclared(*, claim: Claim, step_names: list[str]) -> None:
    """Record that the claimed task goes on with its pipeline's steps as now declared (``tasks.pipelines.changes``)."""
    task = claim.task
    task.step_names = list(step_names)
    task.total_steps = len(step_names)
    task_save_fenced(task, TASK_STEPS_FIELDS)
    logger.info(
        "task follows its pipeline's new steps",
        extra={"event": "task_steps_redeclared", **task_fields(task), "steps": ", ".join(step_names)},
    )


@door
def step_retry_scheduled(*, claim: Claim, record: AttemptRecord, retry_at: datetime) -> None:
    task = claim.task
    with transaction.atomic():
        token = task.fencing_token
        task.schedule_retry(retry_at=retry_at)
        task_save_guarded(task, TASK_RETRY_FIELDS + _retry_of_recorded(task, record))
        StepAttempt.objects.bulk_create([record.row(task)])
        deliver_on_commit(task.pk, token, when=retry_at, pipeline=task.pipeline)
        run_ended(task)
        _attempt_metrics(task, record, retried=True)
    logger.info(
        "retry scheduled",
        extra={
            "event": "retry_scheduled",
            **task_fields(task, step_index=record.step_index, step=record.step_name, attempt=record.attempt),
            "delay": round(record.retry_delay or 0.0, 3),
            "error_code": record.error.code if record.error else "",
        },
    )


def _retry_of_recorded(task: Task, record: AttemptRecord | None) -> list[str]:
    """With tracing on, the failed attempt's span becomes the task's ``retry_of`` (the step's next attempt of this
    generation, in a later run, a retry's or an operator's, links to it: ``tasks.observability.tracing``); the fields
    this adds to the write."""
    if record is None or not record.traceparent:
        return []
    retry_of = {
        "step": record.step_name,
        "generation": task.generation,
        "attempt": record.attempt,
        "traceparent": record.traceparent,
    }
    task.trace_context = {**(task.trace_context or {}), "retry_of": retry_of}
    return ["trace_context"]


@door
def task_failed(
    *,
    task: Task,
    policy: FailurePolicy,
    reason: FailureReason,
    error: Classification,
    step_index: int,
    step_name: str,
    record: AttemptRecord | None = None,
    uncertain_keys: dict[str, str] | None = None,
    keep_lease_for: str | None = None,
) -> None:
    """Fail the task for good, open its dead letter, and start compensation when the policy says so.

    ``keep_lease_for`` names the worker that goes straight on to compensate
    under the same lease; otherwise the compensation is delivered through RQ.
    """
    if task.state in (TaskState.QUEUED, TaskState.RUNNING) and _cancel_request_read(task):
        # A cancel came in while the step ran and failed: the client asked to stop, and it stops as a
        # cancel (compensated or parked as on_cancel says), never as a failure too.
        task_cancelled(
            task=task,
            policy=on_cancel_policy(task),
            record=record,
            uncertain_keys=uncertain_keys,
            keep_lease_for=keep_lease_for,
        )
        return
    error = dataclasses.replace(error, message=task_redactor(task).text(error.message))
    was_running = task.state == TaskState.RUNNING
    with transaction.atomic():
        token = task.fencing_token
        task.fail(reason=reason, code=error.code, message=error.message, step=step_name)
        if policy == FailurePolicy.COMPENSATE:
            task.start_compensation(owner=keep_lease_for or "", lease_seconds=lease_seconds())
        task_save_guarded(task, TASK_FAIL_FIELDS + _retry_of_recorded(task, record))
        if record is not None:
            StepAttempt.objects.bulk_create([record.row(task)])
            _attempt_metrics(task, record)
        _uncertain_effects(task, step_index, step_name, uncertain_keys)
        dead_letter_open(task=task, reason=reason, error=error, step=step_name)
        _ended(task, token, finished=TaskState.FAILED, keep_lease_for=keep_lease_for, was_running=was_running)
    logger.error(
        "task failed",
        extra={
            "event": "task_failed",
            **task_fields(task, step_index=step_index, step=step_name),
            "reason": reason,
            "error_code": error.code,
        },
    )


@door
def lease_expired(*, task: Task) -> LeaseExpiry:
    """A worker stopped renewing ``task``'s lease: record the lost attempt, then re-queue the task.

    Past ``RELIABILITY_MAX_CRASHES`` lost leases the task fails as a crash
    loop instead (a compensating one ends COMPENSATION_FAILED). The caller
    holds the task's row lock; every write is the sweeper's, in its
    transaction.
    """
    running = task.state == TaskState.RUNNING
    pipeline = _pipeline_or_none(task)
    step_name = task.step_name_at(task.current_step) if running else ""
    if running and not step_name and pipeline is not None and task.current_step < len(pipeline.steps):
        step_name = pipeline.steps[task.current_step].name
    record = AttemptRecord(
        kind=AttemptKind.STEP if running else AttemptKind.COMPENSATION,
        step_index=task.current_step if running else -1,
        step_name=step_name or ("(unknown step)" if running else "(compensation)"),
        attempt=task.step_attempt,
        worker=task.lease_owner,
        started_at=None,
        finished_at=timezone.now(),
        outcome=AttemptOutcome.CRASHED,
        error=Classification(True, LEASE_EXPIRED_CODE, f"worker {task.lease_owner!r} stopped renewing its lease", ""),
    )
    StepAttempt.objects.bulk_create([record.row(task)])
    metrics.lease_expired(pipeline=task.pipeline)
    if running:
        _attempt_metrics(task, record)
    if task.crash_count + 1 < engine_settings.MAX_CRASHES:
        if running:
            task.requeue_after_lease_expiry()
            run_ended(task)
        else:
            task.release_after_lease_expiry()
        task_save_guarded(task, TASK_REQUEUE_FIELDS)
        deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)
        logger.warning(
            "lease expired; task re-queued",
            extra={
                "event": "lease_expired",
                **task_fields(task, step_index=record.step_index, step=record.step_name, attempt=record.attempt),
                "crashes": task.crash_count,
            },
        )
        return LeaseExpiry.REQUEUED
    task.count_lost_lease()
    if not running:
        message = f"the worker compensating this task was lost {task.crash_count} times"
        compensation_finished(task=task, errors=[message], code=CRASH_LOOP_CODE)
        return LeaseExpiry.COMPENSATION_CRASH_LOOP
    message = f"the worker running this step was lost {task.crash_count} times"
    task_failed(
        task=task,
        policy=pipeline.failure_policy if pipeline is not None and step_name else FailurePolicy.PARK,
        reason=FailureReason.CRASH_LOOP,
        error=Classification(False, CRASH_LOOP_CODE, message, ""),
        step_index=task.current_step,
        step_name=step_name,
    )
    return LeaseExpiry.CRASH_LOOP


@door
def compensation_attempt_recorded(*, claim: Claim, record: AttemptRecord, compensated_step: str | None) -> None:
    """Record a compensation or notice attempt; on success mark the step's effects compensated."""
    task = claim.task
    with transaction.atomic():
        lease_extend(task_id=task.pk, fencing_token=task.fencing_token)
        StepAttempt.objects.bulk_create([record.row(task)])
        if compensated_step is not None and record.outcome == AttemptOutcome.SUCCEEDED:
            SideEffect.objects.filter(task_id=task.pk, generation=task.generation, step_name=compensated_step).update(
                status=EffectStatus.COMPENSATED, compensated_at=timezone.now()
            )


@door
def compensation_finished(*, task: Task, errors: list[str], code: str = COMPENSATION_FAILED_CODE) -> None:
    """End a compensation: COMPENSATED, or COMPENSATION_FAILED with the task's dead letter open again.

    ``errors`` says what could not be undone (empty: everything was); ``code``
    is the failure's error code (a compensation that failed, or a crash loop).
    """
    with transaction.atomic():
        if errors:
            message = task_redactor(task).text("; ".join(errors))
            task.fail_compensation(code=code, message=message)
            task_save_guarded(task, TASK_FAIL_FIELDS)
            if task.is_cancelled and not task.in_dlq:
                # A cancel opened no dead letter; the compensation that could not finish does.
                error = Classification(False, code, message, "")
                dead_letter_open(task=task, reason=FailureReason.CANCELLED, error=error, step=task.failed_step)
            dead_letter_set_status(task=task, status=DLQStatus.OPEN, compensation_error=message)
        elif task.is_cancelled:
            task.finish_cancel()
            task_save_guarded(task, TASK_COMPENSATED_FIELDS)
            if task.in_dlq:  # an operator retried the compensation that had failed, or compensated a parked cancel
                dead_letter_resolve(
                    task=task, resolution=ResolutionCode.COMPENSATED, note="compensated after the task was cancelled"
                )
        else:
            task.finish_compensation()
            task_save_guarded(task, TASK_COMPENSATED_FIELDS)
            dead_letter_set_status(task=task, status=DLQStatus.COMPENSATED)
        callback_submit(task=task)
        metrics.compensation_finished(pipeline=task.pipeline, outcome="failed" if errors else "compensated")
        _finished_metrics(task)
    logger.log(
        logging.ERROR if errors else logging.INFO,
        "compensation finished",
        extra={
            "event": "compensation_failed" if errors else "task_compensated",
            **task_fields(task),
            "state": task.state,
        },
    )


@door
def task_cancelled(
    *,
    task: Task,
    policy: FailurePolicy,
    record: AttemptRecord | None = None,
    uncertain_keys: dict[str, str] | None = None,
    keep_lease_for: str | None = None,
    step_not_started: bool = False,
) -> None:
    """Carry out ``task``'s cancel: undo its completed steps, or park it, or just end it.

    QUEUED, RETRY_SCHEDULED or WAITING (the canceller, holding the row lock) or
    RUNNING at a step boundary or after its attempt was interrupted
    (``record``, with the keys it used: their effects are uncertain). With
    nothing that may need undoing the task ends CANCELLED; otherwise the
    pipeline's ``on_cancel`` decides: COMPENSATE (COMPENSATING, then
    CANCELLED or COMPENSATION_FAILED) or PARK (CANCELLED with a dead letter
    for an operator). ``step_not_started``: the attempt counted for the next
    step was never made. ``keep_lease_for`` compensates in the same worker.
    """
    was_running = task.state == TaskState.RUNNING
    _cancel_request_read(task)
    message = task_redactor(task).text(cancel_message(task))
    step_name = task.step_name_at(task.current_step)
    with transaction.atomic():
        token = task.fencing_token
        undo = _may_need_undo(task, record, uncertain_keys)
        if undo and policy == FailurePolicy.COMPENSATE:
            task.cancel_with_compensation(
                message=message, owner=keep_lease_for or "", lease_seconds=lease_seconds(), at_boundary=step_not_started
            )
        else:
            task.cancel(message=message, at_boundary=step_not_started)
        task.failed_step = step_name[:100]
        task_save_guarded(task, [*TASK_CANCEL_FIELDS, "failed_step"])
        if record is not None:
            StepAttempt.objects.bulk_create([record.row(task)])
            _attempt_metrics(task, record)
        _uncertain_effects(task, record.step_index if record else task.current_step, step_name, uncertain_keys)
        if task.state == TaskState.CANCELLED and undo:
            note = f"{message}; not compensated: the pipeline parks cancels (on_cancel=PARK)"
            dead_letter_open(
                task=task,
                reason=FailureReason.CANCELLED,
                error=Classification(False, CANCELLED_CODE, note, ""),
                step=step_name,
            )
        _ended(task, token, finished=TaskState.CANCELLED, keep_lease_for=keep_lease_for, was_running=was_running)
    logger.info(
        "task cancelled",
        extra={
            "event": "task_cancelled",
            **task_fields(task, step=step_name),
            "state": task.state,
            "by": task.cancel_requested_by,
        },
    )


def cancel_message(task: Task) -> str:
    """What a cancelled task's failure message says: who cancelled it, and why."""
    who = task.cancel_requested_by or "unknown"
    return f"cancelled by {who}: {task.cancel_reason}" if task.cancel_reason else f"cancelled by {who}"


def _cancel_request_read(task: Task) -> bool:
    """Read the task's cancel request from its row into ``task``; whether there is one.

    A worker learns of a cancel from a flag (boundary, interrupt) or not at
    all (a step that failed meanwhile): the request itself is on the row.
    """
    row = (
        Task.objects.filter(pk=task.pk)
        .values_list("cancel_requested_at", "cancel_requested_by", "cancel_reason")
        .first()
    )
    if row is not None and row[0] is not None:
        task.cancel_requested_at, task.cancel_requested_by, task.cancel_reason = row
    return task.is_cancelled


def on_cancel_policy(task: Task) -> FailurePolicy:
    pipeline = _pipeline_or_none(task)
    # A pipeline this process does not know cannot be compensated here: leave it to an operator.
    return pipeline.on_cancel if pipeline is not None else FailurePolicy.PARK


def _may_need_undo(task: Task, record: AttemptRecord | None, uncertain_keys: dict[str, str] | None) -> bool:
    """Whether anything of the task ran that compensation would look at: a checkpoint, an uncertain step."""
    if uncertain_keys or (record is not None and record.error is not None and record.error.effect_uncertain):
        return True
    return bool(compensation_targets(task))


def _uncertain_effects(task: Task, step_index: int, step_name: str, keys: dict[str, str] | None) -> None:
    """Record in the ledger the effects a step that did not complete may have made (compensation covers it)."""
    if keys:
        SideEffect.objects.bulk_create(
            _ledger_rows(task, step_index, step_name, keys, EffectStatus.UNCERTAIN), ignore_conflicts=True
        )


def _ended(task: Task, token: int, *, finished: str, keep_lease_for: str | None, was_running: bool) -> None:
    """What follows a failure or a cancel in its transaction: the compensation's delivery, or the finish."""
    if task.state == TaskState.COMPENSATING and not keep_lease_for:
        deliver_on_commit(task.pk, token, pipeline=task.pipeline)
    if task.state == finished:
        callback_submit(task=task)
        _finished_metrics(task)
    if was_running:
        run_ended(task)


def _pipeline_or_none(task: Task):
    try:
        return registry.get(task.pipeline)
    except UnknownPipeline:
        return None


def _ledger_rows(task: Task, step_index: int, step_name: str, keys: dict[str, str], status: str) -> list[SideEffect]:
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


def _attempt_metrics(task: Task, record: AttemptRecord, *, retried: bool = False) -> None:
    metrics.step_attempt_recorded(
        pipeline=task.pipeline,
        step=record.step_name,
        outcome=record.outcome,
        error_code=record.error.code if record.error else "",
        started_at=record.started_at,
        finished_at=record.finished_at,
        retried=retried,
    )


def _finished_metrics(task: Task) -> None:
    metrics.task_finished(
        pipeline=task.pipeline, state=task.state, created_at=task.created_at, finished_at=task.finished_at
    )
