"""Holds: a task that may not start yet waits QUEUED without a delivery, and is released when it may.

The one writer of ``Task.hold``: a claim or a step boundary holds a task back (paused, concurrency, rate,
``tasks.execution.gates`` decides), and a release delivers it again: the run that frees a slot, a resume, a rate
permit's time, and the sweeper's pass over every pipeline with held
tasks, which catches anything the others missed. Every release is re-checked by the claim: a released task
that still cannot start is held again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from tasks.delivery.enqueue import deliver_many, deliver_on_commit
from tasks.exceptions import LeaseLost
from tasks.execution import gates
from tasks.lifecycle.fenced_writes import task_save_guarded
from tasks.models import Task, TaskHold, TaskState
from tasks.models.door import door
from tasks.observability import metrics
from tasks.observability.log_fields import task_fields
from tasks.pipelines.limits import Gate

logger = logging.getLogger(__name__)

TASK_HOLD_FIELDS = [
    "state",
    "hold",
    "retry_at",
    "fencing_token",
    "lease_owner",
    "lease_expires_at",
    "step_attempt",
    "total_attempts",
    "updated_at",
]


@door
def task_hold(task: Task, hold: str, gate: Gate, *, wait: float | None = None) -> bool:
    """Hold ``task`` (QUEUED, or RUNNING at a step boundary) for ``hold``; False when someone else moved it first.

    A rate hold is given its start time in line (``gates.rate_hold_seconds``).
    """
    until = None
    if hold == TaskHold.RATE and gate.rate is not None:
        seconds = gates.rate_hold_seconds(pipeline=task.pipeline, rate=gate.rate, wait=wait or 0.0)
        until = timezone.now() + timedelta(seconds=seconds)
    try:
        task_held(task=task, hold=hold, until=until)
    except LeaseLost:
        return False  # another delivery claimed or held it first, or a canceller moved it
    return True


@door
def task_held(*, task: Task, hold: str, until: datetime | None = None) -> None:
    """Hold ``task`` back: QUEUED without a delivery until it may start (``tasks.execution.gates``), no attempt used.

    From a claim (the task was QUEUED) or at a step boundary (RUNNING: the
    lease is given back). A rate hold comes back by itself at ``until``;
    the others are released by whatever frees them, and the hold looks once
    more after it commits, so a release that ran just before is not missed.
    """
    was_running = task.state == TaskState.RUNNING
    with transaction.atomic():
        task.hold_back(hold=hold, until=until)
        task_save_guarded(task, TASK_HOLD_FIELDS)
        if until is not None:
            deliver_on_commit(task.pk, task.fencing_token, when=until, pipeline=task.pipeline)
        else:
            hold_recheck(task_id=task.pk, pipeline=task.pipeline, hold=hold)
        if was_running:
            run_ended(task)
        metrics.task_held(pipeline=task.pipeline, hold=hold)
    logger.info(
        "task held",
        extra={
            "event": "task_held",
            **task_fields(task),
            "hold": hold,
            "until": until.isoformat() if until else "",
        },
    )


def run_ended(task: Task) -> None:
    """A run of ``task`` left RUNNING: with a concurrency limit, a held task may take its slot (after commit)."""
    gate = getattr(task, "run_gate", None)
    if gate is None:
        gate = gates.gate_of(pipeline=task.pipeline)
    if gate.max_concurrency is not None:
        slot_freed(pipeline=task.pipeline)


@door
def held_tasks_release(
    *,
    pipeline: str,
    holds: Iterable[str],
    limit: int,
    overdue_only: bool = False,
) -> int:
    """Deliver up to ``limit`` of ``pipeline``'s tasks held for ``holds``, longest held first; how many.

    ``overdue_only``: only tasks whose start time (``retry_at``) is ``gates.RATE_RELEASE_GRACE``
    past. Each released task is delivered after commit and claimed as any
    other, so one that still cannot start is held again.
    """
    if limit <= 0:
        return 0
    held = Task.objects.filter(state=TaskState.QUEUED, pipeline=pipeline, hold__in=list(holds))
    if overdue_only:
        held = held.filter(retry_at__lte=Now() - gates.RATE_RELEASE_GRACE)
    with transaction.atomic():
        rows = list(
            held.order_by("updated_at", "pk")
            .select_for_update(skip_locked=True)
            .values_list("pk", "fencing_token")[:limit]
        )
        if not rows:
            return 0
        Task.objects.filter(pk__in=[pk for pk, _ in rows], state=TaskState.QUEUED).update(
            hold=TaskHold.NONE, retry_at=None, updated_at=timezone.now()
        )
        transaction.on_commit(lambda: deliver_many(rows, pipeline=pipeline))
    logger.info(
        "held tasks released",
        extra={"event": "held_tasks_released", "pipeline": pipeline, "count": len(rows)},
    )
    return len(rows)


def slot_freed(*, pipeline: str) -> None:
    """After commit of a run of a concurrency-limited ``pipeline`` that ended: let one held task try the slot."""

    def release() -> None:
        try:
            held_tasks_release(pipeline=pipeline, holds=[TaskHold.CONCURRENCY], limit=1)
        except Exception:  # the sweeper releases it on its next sweep; this run's outcome is committed
            logger.warning("release after a freed slot failed", extra={"event": "release_failed", "pipeline": pipeline})

    transaction.on_commit(release)


def hold_recheck(*, task_id, pipeline: str, hold: str) -> None:
    """After a hold commits: if what held the task is gone already, release it (no wake-up is lost).

    A run that frees a slot (or a resume) after the hold's check but before
    its commit found no held task to wake: this second look, after the
    commit, sees that run's commit, as the run's release would see this hold.
    """

    def recheck() -> None:
        try:
            gate = gates.gate_of(pipeline=pipeline)
            if hold == TaskHold.PAUSED and gate.paused:
                return
            if hold == TaskHold.CONCURRENCY and (gate.paused or not gates.releasable(pipeline=pipeline, gate=gate)):
                return
            held_tasks_release_one(task_id=task_id, pipeline=pipeline, hold=hold)
        except Exception:
            logger.warning(
                "held task recheck failed",
                extra={"event": "release_failed", "task_id": str(task_id), "pipeline": pipeline},
            )

    transaction.on_commit(recheck)


@door
def held_tasks_release_one(*, task_id, pipeline: str, hold: str | None = None) -> bool:
    """Deliver the held task ``task_id`` (if it is still held, for ``hold`` when given); whether it was."""
    held = Task.objects.filter(pk=task_id, state=TaskState.QUEUED).exclude(hold=TaskHold.NONE)
    if hold is not None:
        held = held.filter(hold=hold)
    with transaction.atomic():
        row = held.select_for_update(skip_locked=True).values_list("pk", "fencing_token").first()
        if row is None:
            return False
        Task.objects.filter(pk=task_id).update(hold=TaskHold.NONE, retry_at=None, updated_at=timezone.now())
        transaction.on_commit(lambda: deliver_many([row], pipeline=pipeline))
    return True


@door
def held_tasks_sweep() -> int:
    """The sweeper's pass over held tasks: release what may start now; how many were released.

    Per pipeline with held tasks: those past their deadline (the claim fails
    them, whatever holds the pipeline: deadlines keep running), those
    held for pause or concurrency that the gate lets start, rate-held
    ones whose scheduled delivery is overdue.
    """
    released = 0
    held = Task.objects.filter(state=TaskState.QUEUED).exclude(hold=TaskHold.NONE)
    for pipeline in _pipelines_with_held_tasks():
        urgent = list(
            held.filter(pipeline=pipeline, deadline__lte=Now()).values_list("pk", flat=True)[: gates.RELEASE_BATCH_SIZE]
        )
        for task_id in urgent:
            released += held_tasks_release_one(task_id=task_id, pipeline=pipeline)
        gate = gates.gate_of(pipeline=pipeline)
        released += held_tasks_release(
            pipeline=pipeline,
            holds=[TaskHold.CONCURRENCY, TaskHold.PAUSED],
            limit=gates.releasable(pipeline=pipeline, gate=gate),
        )
        if not gate.paused:
            released += held_tasks_release(
                pipeline=pipeline, holds=[TaskHold.RATE], limit=gates.RELEASE_BATCH_SIZE, overdue_only=True
            )
    return released


def _pipelines_with_held_tasks() -> list[str]:
    """The pipelines that have held tasks: a loose index scan of ``task_held_idx`` (one probe per pipeline)."""
    held = Task.objects.filter(state=TaskState.QUEUED).exclude(hold=TaskHold.NONE)
    found: list[str] = []
    after = None
    while True:
        rows = held if after is None else held.filter(pipeline__gt=after)
        name = rows.order_by("pipeline").values_list("pipeline", flat=True).first()
        if name is None:
            return found
        found.append(name)
        after = name
