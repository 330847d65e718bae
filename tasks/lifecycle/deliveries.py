"""The sweeper's deliveries: a retry whose time has come, and a delivery that was lost on the way to Redis."""

from __future__ import annotations

from django.utils import timezone

from tasks.delivery import deliver_on_commit
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
