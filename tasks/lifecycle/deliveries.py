"""Deliveries: a retry whose time has come and a delivery lost on the way to Redis (the sweeper's), and a job
of another app's registered entry point (the console's bulk operations)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from tasks import registry
from tasks.delivery import NO_JOB_TIMEOUT, deliver_on_commit, get_queue
from tasks.models import Task
from tasks.models.door import door


@door
def retry_made_due(*, task: Task) -> None:
    """RETRY_SCHEDULED -> QUEUED for ``task`` (locked by the caller), delivered after commit."""
    task.make_due()
    task.save(update_fields=["state", "retry_at", "updated_at"])
    deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)


@door
def delivery_repeated(*, task: Task) -> None:
    """Deliver ``task`` (locked by the caller, waiting for a worker) again: its job is not in Redis."""
    # Touch the row so the next sweep waits a grace period before checking it again.
    Task.objects.filter(pk=task.pk).update(updated_at=timezone.now())
    deliver_on_commit(task.pk, task.fencing_token, pipeline=task.pipeline)


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
