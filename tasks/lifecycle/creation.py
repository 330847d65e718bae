"""A task's row comes into being: a submission checked by ``tasks.submission`` (HTTP, Python, Django's Tasks)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.utils import timezone

from tasks.delivery import deliver_on_commit
from tasks.models import ApiClient, Task, TaskHold
from tasks.models.door import door
from tasks.pipelines import Pipeline

logger = logging.getLogger(__name__)


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
    """Create the task row of a submission (checked by ``tasks.submission``); deliver it after commit unless it
    starts later."""
    # A start in the future is a hold with its time (no job, no worker, no attempt used): the
    # sweeper's pass over held tasks delivers it when that time has come on the database's clock.
    delayed = start_at is not None and start_at > timezone.now()
    task = Task.objects.create(
        pipeline=spec.name,
        input=input,
        total_steps=len(spec.steps),
        step_names=[step.name for step in spec.steps],
        deadline=deadline,
        client=client,
        idempotency_scope=scope if key is not None else "",
        idempotency_key=key,
        request_fingerprint=fingerprint,
        callback_url=callback_url,
        hold=TaskHold.START_TIME if delayed else TaskHold.NONE,
        retry_at=start_at if delayed else None,
    )
    if not delayed:
        deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)
    logger.info(
        "task submitted",
        extra={
            "event": "task_submitted",
            "task_id": str(task.pk),
            "pipeline": spec.name,
            "start_at": start_at.isoformat() if delayed else None,
        },
    )
    return task
