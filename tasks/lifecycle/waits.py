"""A running task that waits without a worker: a sleep step (``Pipeline.sleep``), a wait for a signal
(``Pipeline.wait``).

The task goes RUNNING -> WAITING (``wait_for`` "time" or "signal", the wait's end in ``retry_at`` and
``wait_until``), its lease and its concurrency slot given back, and no job: the sweeper wakes it at that time
(``tasks.lifecycle.deliveries.wait_ended``), a signal's sender when the signal comes
(``tasks.lifecycle.signals``); the claim that follows finds the wait begun and writes the step's checkpoint (or,
a wait's timeout passed, fails it), and the task goes on.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from tasks.execution.claim import Claim
from tasks.lifecycle.deliveries import wait_ended
from tasks.lifecycle.fenced_writes import task_save_guarded
from tasks.lifecycle.holds import run_ended
from tasks.models import Signal, WaitKind
from tasks.models.door import door
from tasks.observability.log_fields import task_fields

logger = logging.getLogger(__name__)

TASK_WAIT_FIELDS = [
    "state",
    "wait_for",
    "retry_at",
    "wait_until",
    "lease_owner",
    "lease_expires_at",
    "step_attempt",
    "total_attempts",
    "updated_at",
]


@door
def task_waits(*, claim: Claim, step: str, until: datetime, signal: bool) -> None:
    """The claimed task reached the waiting step ``step``: it waits without a worker until ``until`` (a sleep's
    end), or for the signal ``step`` and at most until ``until`` (its timeout).

    ``LeaseLost`` (nothing written) when a newer lease holder or state exists.
    """
    task = claim.task
    woken = False
    with transaction.atomic():
        task.begin_wait(wait_for=WaitKind.SIGNAL if signal else WaitKind.TIME, until=until)
        task_save_guarded(task, TASK_WAIT_FIELDS)
        run_ended(task)
        if signal and Signal.objects.filter(task_id=task.pk, name=step).exists():
            # Sent after the attempt looked for it and before this write locked the row: its sender found the task
            # running and left it. Looked for again now that this transaction holds the row (a sender after it
            # finds the task waiting and wakes it), and delivered again at once.
            wait_ended(task=task)
            woken = True
    logger.info(
        "task waiting",
        extra={
            "event": "task_waiting",
            **task_fields(task, step=step),
            "for": "signal" if signal else "time",
            "until": until.isoformat(),
            "woken": woken,
        },
    )
