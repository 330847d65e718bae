"""Leases: who may work on a task right now, fenced by a monotonically increasing token.

A claim is one transaction: read the row, apply the transition, save it
conditionally on (state, fencing token), read the checkpoints. Every later
write by the holder is conditional on the token it got; a worker whose lease
was taken over (a zombie) finds its writes rejected and stops.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now
from django_fsm import ConcurrentTransition

from reliability_console.exceptions import LeaseLost
from tasks.models import LEASED_STATES, Checkpoint, Task, TaskState, lease_expiry

logger = logging.getLogger(__name__)


@dataclass
class Claim:
    """A task this worker holds, with the outputs of its completed steps."""

    task: Task
    owner: str
    outputs: dict[int, Any] = field(default_factory=dict)

    @property
    def token(self) -> int:
        return self.task.fencing_token


def lease_seconds() -> float:
    return float(settings.RELIABILITY_LEASE_SECONDS)


def task_claim(*, task_id: str, owner: str) -> Claim | None:
    """Claim ``task_id`` for ``owner``; None when there is nothing for this delivery to do.

    Duplicate deliveries and jobs for finished tasks end here without effects:
    only one claim can win the conditional update.
    """
    for _ in range(2):
        try:
            return _claim_once(task_id=task_id, owner=owner)
        except _TooEarly as early:
            # RQ's scheduler works in whole seconds and clocks drift a little:
            # a retry delivered slightly early waits for its time instead of
            # being dropped. A much earlier job is a stray duplicate.
            if early.seconds > MAX_EARLY_WAIT_SECONDS:
                return None
            time.sleep(early.seconds)
    return None


class _TooEarly(Exception):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


# The longest a worker waits for a retry that was delivered before its time.
MAX_EARLY_WAIT_SECONDS = 5.0


def _claim_once(*, task_id: str, owner: str) -> Claim | None:
    try:
        with transaction.atomic():
            task = Task.objects.annotate(db_now=Now()).filter(pk=task_id).first()
            if task is None:
                return None
            if task.state == TaskState.RETRY_SCHEDULED:
                deadline_passed = task.deadline is not None and task.deadline <= task.db_now
                if task.retry_at is not None and task.retry_at > task.db_now and not deadline_passed:
                    raise _TooEarly((task.retry_at - task.db_now).total_seconds())
                task.make_due()
            if task.state == TaskState.QUEUED:
                task.claim(owner=owner, lease_seconds=lease_seconds())
            elif task.state == TaskState.COMPENSATING and not task.lease_owner:
                task.claim_compensation(owner=owner, lease_seconds=lease_seconds())
            else:
                return None
            task.save(
                update_fields=[
                    "state",
                    "retry_at",
                    "fencing_token",
                    "lease_owner",
                    "lease_expires_at",
                    "step_attempt",
                    "total_attempts",
                    "updated_at",
                ]
            )
            outputs = dict(Checkpoint.objects.filter(task_id=task.pk).values_list("step_index", "output"))
    except ConcurrentTransition:
        return None
    logger.info(
        "task claimed",
        extra={
            "event": "task_claimed",
            "task_id": str(task.pk),
            "step": task.current_step,
            "attempt": task.step_attempt,
            "fencing_token": task.fencing_token,
            "worker": owner,
        },
    )
    return Claim(task=task, owner=owner, outputs=outputs)


def lease_extend(*, task_id, fencing_token: int) -> None:
    """Push the lease forward, or raise ``LeaseLost`` when the token no longer holds it."""
    extended = Task.objects.filter(pk=task_id, fencing_token=fencing_token, state__in=LEASED_STATES).update(
        lease_expires_at=lease_expiry(lease_seconds())
    )
    if not extended:
        raise LeaseLost(f"task {task_id}: lease with token {fencing_token} was taken over")


class Heartbeat:
    """Extends a lease from a background thread while a long step runs.

    Fast steps never trigger it (each step's checkpoint already pushes the
    lease), so it costs nothing on the hot path.
    """

    def __init__(self, *, task_id, fencing_token: int, interval: float | None = None) -> None:
        self.task_id = task_id
        self.fencing_token = fencing_token
        self.interval = interval if interval is not None else max(lease_seconds() / 3.0, 0.2)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{task_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    lease_extend(task_id=self.task_id, fencing_token=self.fencing_token)
                except LeaseLost:
                    self.lost.set()
                    logger.warning(
                        "lease lost",
                        extra={
                            "event": "lease_lost",
                            "task_id": str(self.task_id),
                            "fencing_token": self.fencing_token,
                        },
                    )
                    return
                except Exception:  # a database blip must not kill the heartbeat thread
                    logger.warning(
                        "heartbeat failed", extra={"event": "heartbeat_failed", "task_id": str(self.task_id)}
                    )
        finally:
            connection.close()
