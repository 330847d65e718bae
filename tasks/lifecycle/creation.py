"""A task's row comes into being: a submission checked by ``tasks.submission.submit`` (HTTP, Python, Django's Tasks), or
a batch of them checked by ``tasks.submission.batches``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from tasks.conf import engine_settings
from tasks.delivery.enqueue import batch_job_id, deliver_batches, deliver_on_commit
from tasks.delivery.queues import queue_for_pipeline
from tasks.models import ApiClient, Task, TaskState, WaitKind
from tasks.models.door import door
from tasks.observability import tracing
from tasks.observability.log_fields import task_fields
from tasks.pipelines.attributes import attributes_from_input
from tasks.pipelines.pipeline import Pipeline

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewTask:
    """A task to create, checked by ``tasks.submission.submit`` or ``tasks.submission.batches``."""

    spec: Pipeline
    input: Any
    deadline: datetime | None
    client: ApiClient | None
    scope: str
    key: str | None
    fingerprint: str
    callback_url: str = ""
    # Its start, when later than now: the task is created WAITING for it (no job until the sweeper wakes it).
    start_at: datetime | None = None


def _task_values(new: NewTask) -> dict[str, Any]:
    """A new task row's fields, for one submission or each of a batch's.

    A start in the future is a wait with its time (no job, no worker, no attempt used): the sweeper wakes it
    and delivers it when that time has come on the database's clock (``tasks.delivery.sweeper``).
    """
    waiting = {}
    if new.start_at is not None and new.start_at > timezone.now():
        waiting = {"state": TaskState.WAITING, "wait_for": WaitKind.START, "retry_at": new.start_at}
    return {
        **waiting,
        "pipeline": new.spec.name,
        "input": new.input,
        "total_steps": len(new.spec.steps),
        "step_names": [step.name for step in new.spec.steps],
        "deadline": new.deadline,
        "client": new.client,
        "idempotency_scope": new.scope if new.key is not None else "",
        "idempotency_key": new.key,
        "request_fingerprint": new.fingerprint,
        "callback_url": new.callback_url,
        # Checked with the input (tasks.submission.submit.clean_input).
        "attributes": attributes_from_input(new.spec.search_attributes, new.input),
        # The trace its runs continue: the submitter's span, or a new trace (None with tracing off:
        # tasks.observability.tracing).
        "trace_context": tracing.submission_context(new.spec.name),
    }


@door
def task_create(
    *,
    spec: Pipeline,
    input: Any,
    deadline: datetime | None,
    client: ApiClient | None,
    scope: str,
    key: str | None,
    fingerprint: str,
    callback_url: str,
    start_at: datetime | None = None,
) -> Task:
    """Create the task row of a submission (checked by ``tasks.submission.submit``); deliver it after commit unless it
    starts later."""
    new = NewTask(spec, input, deadline, client, scope, key, fingerprint, callback_url, start_at)
    task = Task.objects.create(**_task_values(new))
    delayed = task.state == TaskState.WAITING
    if not delayed:
        deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)
    logger.info(
        "task submitted",
        extra={
            "event": "task_submitted",
            **task_fields(task),
            "start_at": start_at.isoformat() if delayed else None,
        },
    )
    return task


@door
def tasks_create_many(*, new: Sequence[NewTask]) -> list[Task]:
    """Create the task rows of a batch in one statement, in order; deliver them after commit, several per job.

    The tasks of each queue go to it in chunks of ``RELIABILITY_BATCH_DELIVERY_SIZE`` in submission order, one
    RQ job per chunk (``tasks.delivery.enqueue.deliver_batches``); each task records its chunk's job (``batch_job``)
    for the sweeper's lost-delivery check. A chunk of one is an ordinary delivery.
    """
    tasks = [Task(**_task_values(item)) for item in new]
    by_queue: dict[str, list[Task]] = {}
    for task in tasks:
        if task.state != TaskState.WAITING:  # a later start has no job until the sweeper wakes it
            by_queue.setdefault(queue_for_pipeline(task.pipeline), []).append(task)
    size = int(engine_settings.BATCH_DELIVERY_SIZE)
    singles: list[Task] = []
    batches: dict[str, list[tuple[str, list[Task]]]] = {}
    for queued in by_queue.values():
        for start in range(0, len(queued), size):
            chunk = queued[start : start + size]
            if len(chunk) == 1:
                singles += chunk
                continue
            batch = batch_job_id()
            for task in chunk:
                task.batch_job = batch
            # A queue's jobs are enqueued through one of its pipelines (deliver_batches takes the queue from it).
            batches.setdefault(chunk[0].pipeline, []).append((batch, chunk))
    Task.objects.bulk_create(tasks)
    for task in singles:
        deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)
    for pipeline, chunks in batches.items():
        deliveries = [(batch, [task.pk for task in chunk]) for batch, chunk in chunks]
        transaction.on_commit(lambda d=deliveries, p=pipeline: deliver_batches(d, pipeline=p))
    if tasks:
        logger.info(
            "tasks submitted",
            extra={
                "event": "tasks_submitted",
                "count": len(tasks),
                "pipelines": sorted({task.pipeline for task in tasks}),
                "jobs": len(singles) + sum(len(chunks) for chunks in batches.values()),
            },
        )
    return tasks
