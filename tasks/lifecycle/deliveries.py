"""Deliveries: a retry or a wait whose time has come and a delivery lost on the way to Redis (the sweeper's), the
rest of a batch its job did not reach, and a job of another app's registered entry point (the console's bulk
operations)."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from tasks import registry
from tasks.delivery.enqueue import NO_JOB_TIMEOUT, deliver_on_commit, get_queue
from tasks.models import Task, TaskState
from tasks.models.door import door


@door
def retry_made_due(*, task: Task) -> None:
    """RETRY_SCHEDULED -> QUEUED for ``task`` (locked by the caller), delivered after commit."""
    task.make_due()
    task.save(update_fields=["state", "retry_at", "updated_at"])
    deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)


@door
def wait_ended(*, task: Task) -> None:
    """WAITING -> QUEUED for ``task`` (locked by the caller): its time came, or its deadline passed (the claim then
    fails it); delivered after commit."""
    task.wake()
    task.save(update_fields=["state", "wait_for", "retry_at", "updated_at"])
    deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)


@door
def delivery_repeated(*, task: Task) -> None:
    """Deliver ``task`` (locked by the caller, waiting for a worker) again: its job is not in Redis."""
    # Touch the row so the next sweep waits a grace period before checking it again. Its own job carries it now,
    # not its batch's (whose loss made this delivery).
    Task.objects.filter(pk=task.pk).update(updated_at=timezone.now(), batch_job="")
    deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)


@door
def batch_rest_deliver(*, task_ids: list[str]) -> int:
    """Deliver on its own each task of ``task_ids`` that its batch's job has not reached, in their order; how many.

    Only tasks still waiting for that job (queued, never claimed or held, their batch job recorded) move: one
    the job did reach, or that was delivered again meanwhile, is left as it is.
    """
    position = {Task._meta.pk.to_python(task_id): index for index, task_id in enumerate(task_ids)}
    with transaction.atomic():
        rest = Task.objects.filter(pk__in=task_ids, state=TaskState.QUEUED, fencing_token=0).exclude(batch_job="")
        # The rows come in the database's order; the jobs go in the batch's (its submission order).
        waiting = sorted(rest.select_for_update().values_list("pk", "pipeline"), key=lambda row: position[row[0]])
        Task.objects.filter(pk__in=[pk for pk, _ in waiting]).update(batch_job="", updated_at=timezone.now())
        for pk, pipeline in waiting:
            deliver_on_commit(pk, 0, pipeline=pipeline)
    return len(waiting)


def entry_point_deliver(name: str, *args, delay: float = 0.0) -> None:
    """Enqueue one job of the registered entry point ``name`` with ``args`` on the default queue, now or after
    ``delay`` seconds: no result kept, no job timeout (the function bounds its own work). Raises ``RedisError``
    when Redis cannot take it; ``ValueError`` for a name workers would refuse."""
    if not registry.entry_point_allowed(name):
        raise ValueError(f"{name!r} is not a registered entry point (tasks.registry.entry_point_register)")
    queue = get_queue()
    if delay > 0:
        queue.enqueue_in(timedelta(seconds=delay), name, *args, result_ttl=0, job_timeout=NO_JOB_TIMEOUT)
    else:
        queue.enqueue_call(name, args=args, result_ttl=0, timeout=NO_JOB_TIMEOUT)
