"""What an operator does to a failed task: retry it, compensate it, close its dead letter.

The console calls these (its admin actions, its bulk operations); each is one
transaction that locks the task, applies a transition and moves the task's
dead letter with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import transaction
from django_fsm import ConcurrentTransition

from tasks.delivery.enqueue import deliver_on_commit
from tasks.exceptions import LeaseLost, TaskNotActionable
from tasks.lifecycle.dead_letters import dead_letter_resolve, dead_letter_set_status
from tasks.models import Checkpoint, DLQStatus, ResolutionCode, Task, TaskState
from tasks.models.door import door

__all__ = [
    "CLOSABLE_STATES",
    "task_close",
    "task_compensate",
    "task_retry_from_checkpoint",
    "task_retry_from_start",
]

# A failed task whose dead letter an operator may close (the task keeps its state); a cancelled one
# has a dead letter only when its pipeline parks cancels.
CLOSABLE_STATES = (TaskState.FAILED, TaskState.COMPENSATED, TaskState.COMPENSATION_FAILED, TaskState.CANCELLED)


@door
def task_retry_from_checkpoint(*, task_id) -> Task:
    """Re-queue a FAILED or COMPENSATION_FAILED task at its first unfinished step, with a fresh attempt budget."""
    with transaction.atomic():
        task = _locked(task_id)
        if task.state not in (TaskState.FAILED, TaskState.COMPENSATION_FAILED):
            raise TaskNotActionable(
                f"task is {task.state}; only failed tasks can be retried from checkpoint",
                code="retry_not_failed",
                details={"state": task.state},
            )
        if task.is_cancelled:
            raise TaskNotActionable(
                "the task was cancelled: compensate it or close its dead letter", code="retry_cancelled"
            )
        task.retry_from_checkpoint()
        _save(task)
        dead_letter_set_status(task=task, status=DLQStatus.RETRYING)
        deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)
    return task


@door
def task_retry_from_start(*, task_id) -> Task:
    """Start a COMPENSATED task again from step one, with new effect keys, on its pipeline's steps as now declared.

    A task parked because its pipeline changed under it (FAILED with
    ``pipeline_changed``) may start again too, uncompensated: the operator
    chose this over compensating it.
    """
    with transaction.atomic():
        task = _locked(task_id)
        if not task.can_retry_from_start:
            raise TaskNotActionable(
                f"task is {task.state}; only compensated tasks, or tasks parked because their pipeline "
                "changed, can be retried from start",
                code="retry_from_start_not_allowed",
                details={"state": task.state},
            )
        task.retry_from_start()
        _save(task)
        Checkpoint.objects.filter(task_id=task.pk).delete()
        dead_letter_set_status(task=task, status=DLQStatus.RETRYING)
        deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)
    return task


@door
def task_compensate(*, task_id) -> Task:
    """Compensate a parked FAILED task now, or retry a COMPENSATION_FAILED one (done steps are skipped).

    Also a CANCELLED task whose pipeline parks cancels (its dead letter is
    open): its completed steps are undone, and it stays cancelled.
    """
    with transaction.atomic():
        task = _locked(task_id)
        if task.state == TaskState.FAILED:
            task.start_compensation()
        elif task.state == TaskState.COMPENSATION_FAILED:
            task.retry_compensation()
        elif task.state == TaskState.CANCELLED and task.in_dlq:
            task.compensate_cancelled()
        else:
            raise TaskNotActionable(
                f"task is {task.state}; only failed tasks can be compensated",
                code="compensate_not_failed",
                details={"state": task.state},
            )
        _save(task)
        dead_letter_set_status(task=task, status=DLQStatus.COMPENSATING)
        deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)
    return task


@door
def task_close(*, task_id, resolution: ResolutionCode, note: str) -> Task:
    """Resolve a failed task's dead letter by hand; the task keeps its terminal state."""
    with transaction.atomic():
        task = _locked(task_id)
        if task.state not in CLOSABLE_STATES:
            raise TaskNotActionable(
                f"task is {task.state}; only failed tasks can be closed",
                code="close_not_failed",
                details={"state": task.state},
            )
        with _refused_if_changed():
            resolved = dead_letter_resolve(task=task, resolution=resolution, note=note)
        if not resolved:
            raise TaskNotActionable("the task has no open dead letter", code="no_open_dead_letter")
    return task


def _locked(task_id) -> Task:
    task = Task.objects.select_for_update().filter(pk=task_id).first()
    if task is None:
        raise TaskNotActionable("no such task", code="no_such_task")
    return task


def _save(task: Task) -> None:
    with _refused_if_changed():
        task.save()


@contextlib.contextmanager
def _refused_if_changed() -> Iterator[None]:
    """A guarded write that finds the task changed (by a worker or another operator) refuses the action."""
    try:
        yield
    except (ConcurrentTransition, LeaseLost):
        raise TaskNotActionable(
            "the task changed while acting on it; reload and try again", code="task_changed"
        ) from None
