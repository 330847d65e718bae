"""A running task that waits without a worker: a sleep step (``Pipeline.sleep``).

The task goes RUNNING -> WAITING (``wait_for`` "time", its wake time in ``retry_at`` and ``slept_until``), its
lease and its concurrency slot given back, and no job: the sweeper wakes it at its time
(``tasks.lifecycle.deliveries.wait_ended``), the claim that follows finds the sleep over and writes its
checkpoint, and the task goes on with its next step.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from tasks.claim import Claim
from tasks.lifecycle.fenced_writes import task_save_guarded
from tasks.lifecycle.holds import run_ended
from tasks.models.door import door

logger = logging.getLogger(__name__)

TASK_SLEEP_FIELDS = [
    "state",
    "wait_for",
    "retry_at",
    "slept_until",
    "lease_owner",
    "lease_expires_at",
    "step_attempt",
    "total_attempts",
    "updated_at",
]


@door
def task_slept(*, claim: Claim, until: datetime) -> None:
    """The claimed task reached a sleep step that ends at ``until``: it waits without a worker until then.

    ``LeaseLost`` (nothing written) when a newer lease holder or state exists.
    """
    task = claim.task
    with transaction.atomic():
        task.sleep(until=until)
        task_save_guarded(task, TASK_SLEEP_FIELDS)
        run_ended(task)
    logger.info(
        "task sleeping",
        extra={
            "event": "task_sleeping",
            "task_id": str(task.pk),
            "pipeline": task.pipeline,
            "step": task.current_step,
            "until": until.isoformat(),
        },
    )
