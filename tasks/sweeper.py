"""The sweeper: rebuilds delivery from the database.

It re-queues tasks whose lease expired (counting crashes, failing crash
loops), starts due retries even without an RQ scheduler, re-delivers QUEUED
tasks whose job was never enqueued or was lost, and purges expired
idempotency records. Running several
sweepers at once is safe: each task is handled under a row lock taken with
SKIP LOCKED, and every change is a conditional transition.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone
from django_fsm import ConcurrentTransition

from dlq import metrics
from dlq.bulk import bulk_operations_redeliver_stale
from dlq.models import DLQStatus
from dlq.services import dlq_item_open, dlq_item_set_status, dlq_items_purge_resolved
from reliability_console.exceptions import UnknownPipeline
from tasks import registry
from tasks.delivery import deliver_on_commit, delivery_pending
from tasks.idempotency import idempotency_purge_expired
from tasks.models import AttemptKind, AttemptOutcome, StepAttempt, SweeperHeartbeat, Task, TaskState
from tasks.outcomes import TASK_FAIL_FIELDS
from tasks.pipelines import FailurePolicy

logger = logging.getLogger(__name__)

BATCH_SIZE = 200
# A retry the RQ scheduler should have started this long ago is started by the sweeper.
DUE_RETRY_GRACE = timedelta(seconds=1)


@dataclass
class SweepReport:
    requeued: int = 0
    crash_loops: int = 0
    compensation_crash_loops: int = 0
    retries_started: int = 0
    redelivered: int = 0
    idempotency_records_purged: int = 0
    bulk_redelivered: int = 0
    dlq_items_purged: int = 0
    redis_unavailable: bool = False
    errors: list[str] = field(default_factory=list)

    def as_log(self) -> dict:
        return {
            "requeued": self.requeued,
            "crash_loops": self.crash_loops + self.compensation_crash_loops,
            "retries_started": self.retries_started,
            "redelivered": self.redelivered,
            "idempotency_records_purged": self.idempotency_records_purged,
            "bulk_redelivered": self.bulk_redelivered,
            "dlq_items_purged": self.dlq_items_purged,
            "redis_unavailable": self.redis_unavailable,
        }

    @property
    def did_something(self) -> bool:
        return (
            bool(self.requeued or self.crash_loops or self.compensation_crash_loops)
            or bool(self.retries_started or self.redelivered or self.idempotency_records_purged)
            or bool(self.bulk_redelivered or self.dlq_items_purged)
        )


def sweep_once() -> SweepReport:
    report = SweepReport()
    _expired_leases(report)
    _due_retries(report)
    _lost_deliveries(report)
    report.idempotency_records_purged = idempotency_purge_expired()
    report.bulk_redelivered = bulk_operations_redeliver_stale()
    report.dlq_items_purged = dlq_items_purge_resolved()
    if report.did_something or report.redis_unavailable:
        logger.info("sweep", extra={"event": "sweep", **report.as_log()})
    return report


def _lock(queryset, pk):
    # SKIP LOCKED: a second sweeper moves on to other rows instead of waiting.
    return queryset.select_for_update(skip_locked=True).filter(pk=pk).first()


def _expired_leases(report: SweepReport) -> None:
    expired = Task.objects.filter(state__in=[TaskState.RUNNING, TaskState.COMPENSATING], lease_expires_at__lt=Now())
    for pk in list(expired.values_list("pk", flat=True)[:BATCH_SIZE]):
        try:
            with transaction.atomic():
                task = _lock(expired, pk)
                if task is None:
                    continue
                _record_crash(task)
                if task.state == TaskState.RUNNING:
                    _expired_running(task, report)
                else:
                    _expired_compensating(task, report)
        except ConcurrentTransition:
            continue


def _record_crash(task: Task) -> None:
    kind = AttemptKind.STEP if task.state == TaskState.RUNNING else AttemptKind.COMPENSATION
    step_name = ""
    try:
        steps = registry.get(task.pipeline).steps
        if kind == AttemptKind.STEP and task.current_step < len(steps):
            step_name = steps[task.current_step].name
    except UnknownPipeline:
        pass
    StepAttempt.objects.create(
        task=task,
        kind=kind,
        generation=task.generation,
        step_index=task.current_step if kind == AttemptKind.STEP else -1,
        step_name=step_name or "(compensation)",
        attempt=task.step_attempt,
        worker=task.lease_owner,
        fencing_token=task.fencing_token,
        started_at=None,
        finished_at=timezone.now(),
        outcome=AttemptOutcome.CRASHED,
        error_code="lease_expired",
        error_message=f"worker {task.lease_owner!r} stopped renewing its lease",
    )
    pipeline, step, finished_at = task.pipeline, step_name or "(compensation)", timezone.now()

    def record() -> None:
        metrics.lease_expired(pipeline=pipeline)
        if kind == AttemptKind.STEP:
            metrics.step_attempt_recorded(
                pipeline=pipeline,
                step=step,
                outcome=AttemptOutcome.CRASHED,
                error_code="lease_expired",
                started_at=None,
                finished_at=finished_at,
            )

    metrics.on_commit(record)


def _expired_running(task: Task, report: SweepReport) -> None:
    token = task.fencing_token
    if task.crash_count + 1 < settings.RELIABILITY_MAX_CRASHES:
        task.requeue_after_lease_expiry()
        task.save()
        deliver_on_commit(task.pk, task.fencing_token)
        report.requeued += 1
        logger.warning(
            "lease expired; task re-queued",
            extra={"event": "lease_expired", "task_id": str(task.pk), "crashes": task.crash_count},
        )
        return
    try:
        pipeline = registry.get(task.pipeline)
        policy = pipeline.failure_policy
        step_name = pipeline.steps[task.current_step].name
    except (UnknownPipeline, IndexError):
        policy, step_name = FailurePolicy.PARK, ""
    task.crash_count += 1
    task.fencing_token += 1  # fence off the vanished worker
    message = f"the worker running this step was lost {task.crash_count} times"
    task.fail(reason="crash_loop", code="crash_loop", message=message, step=step_name)
    if policy == FailurePolicy.COMPENSATE:
        task.start_compensation()
    task.save(update_fields=TASK_FAIL_FIELDS)
    dlq_item_open(
        task=task,
        reason_code="crash_loop",
        error_code="crash_loop",
        error_class="",
        error_message=message,
        failing_step=step_name,
        attempts=task.total_attempts,
        status=DLQStatus.COMPENSATING if policy == FailurePolicy.COMPENSATE else DLQStatus.OPEN,
    )
    if policy == FailurePolicy.COMPENSATE:
        deliver_on_commit(task.pk, task.fencing_token)
    else:
        _finished_on_commit(task)
    report.crash_loops += 1
    logger.error(
        "crash loop", extra={"event": "task_failed", "reason": "crash_loop", "task_id": str(task.pk), "token": token}
    )


def _expired_compensating(task: Task, report: SweepReport) -> None:
    if task.crash_count + 1 < settings.RELIABILITY_MAX_CRASHES:
        task.release_after_lease_expiry()
        task.save()
        deliver_on_commit(task.pk, task.fencing_token)
        report.requeued += 1
        return
    task.crash_count += 1
    task.fencing_token += 1
    message = f"the worker compensating this task was lost {task.crash_count} times"
    task.fail_compensation(code="crash_loop", message=message)
    task.save(update_fields=TASK_FAIL_FIELDS)
    dlq_item_set_status(task_id=task.pk, status=DLQStatus.OPEN, compensation_error=message)
    pipeline = task.pipeline
    metrics.on_commit(lambda: metrics.COMPENSATIONS.labels(pipeline, "failed").inc())
    _finished_on_commit(task)
    report.compensation_crash_loops += 1


def _finished_on_commit(task: Task) -> None:
    pipeline, state, created_at, finished_at = task.pipeline, task.state, task.created_at, task.finished_at
    metrics.on_commit(
        lambda: metrics.task_finished(pipeline=pipeline, state=state, created_at=created_at, finished_at=finished_at)
    )


def _due_retries(report: SweepReport) -> None:
    due = Task.objects.filter(state=TaskState.RETRY_SCHEDULED).filter(
        Q(retry_at__lte=Now() - DUE_RETRY_GRACE) | Q(deadline__lte=Now())
    )
    for pk in list(due.values_list("pk", flat=True)[:BATCH_SIZE]):
        try:
            with transaction.atomic():
                task = _lock(due, pk)
                if task is None:
                    continue
                task.make_due()
                task.save(update_fields=["state", "retry_at", "updated_at"])
                deliver_on_commit(task.pk, task.fencing_token)
                report.retries_started += 1
        except ConcurrentTransition:
            continue


def _lost_deliveries(report: SweepReport) -> None:
    grace = timedelta(seconds=settings.RELIABILITY_REDELIVERY_GRACE_SECONDS)
    waiting = Task.objects.filter(
        Q(state=TaskState.QUEUED) | Q(state=TaskState.COMPENSATING, lease_owner=""),
        updated_at__lte=Now() - grace,
    )
    for pk, token in list(waiting.values_list("pk", "fencing_token")[:BATCH_SIZE]):
        pending = delivery_pending(pk, token)
        if pending is None:
            report.redis_unavailable = True
            return
        if pending:
            continue
        with transaction.atomic():
            task = _lock(waiting, pk)
            if task is None or task.fencing_token != token:
                continue
            # Touch the row so the next sweep waits a grace period before checking again.
            Task.objects.filter(pk=pk).update(updated_at=timezone.now())
            deliver_on_commit(task.pk, token)
            report.redelivered += 1


def sweeper_heartbeat(*, name: str) -> None:
    """Record that sweeper ``name`` completed a sweep now."""
    updated = SweeperHeartbeat.objects.filter(name=name).update(last_run_at=timezone.now(), runs=F("runs") + 1)
    if not updated:
        SweeperHeartbeat.objects.get_or_create(name=name, defaults={"last_run_at": timezone.now(), "runs": 1})
