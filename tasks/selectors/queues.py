"""Reads of the RQ queues and workers: depth and the oldest job's age, registries, live workers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from redis.exceptions import RedisError
from rq import Worker
from rq.utils import utcparse

from tasks.delivery.enqueue import get_queue, redis_client
from tasks.delivery.queues import queue_names

logger = logging.getLogger(__name__)

#
# Read only: counts are read with ``cleanup=False`` (cleaning a started registry would fail or retry abandoned
# jobs; that is the workers' job). Listing workers drops the registration of a worker whose key has expired,
# as RQ does whenever anyone lists them. Each read below raises ``RedisError`` when Redis cannot be read, except
# ``queue_states``, which says so per queue.


@dataclass(frozen=True)
class QueueBacklog:
    """One engine queue's jobs waiting for a worker: how many, and since when the oldest has waited."""

    name: str
    depth: int
    oldest_enqueued_at: datetime | None  # None when the queue is empty

    def oldest_age(self, now: datetime) -> float:
        """Seconds the oldest waiting job has waited (0 for an empty queue)."""
        if self.oldest_enqueued_at is None:
            return 0.0
        return max((now - self.oldest_enqueued_at).total_seconds(), 0.0)


def queue_backlogs() -> list[QueueBacklog]:
    """Every engine queue's backlog, highest priority first.

    Two round trips whatever the depth: each queue's ``LLEN`` and head (RQ
    appends at the tail and pops the head, so the head waited longest), then
    the heads' ``enqueued_at``.
    """
    queues = [get_queue(name) for name in queue_names()]
    client = redis_client()
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue.key)
            pipe.lindex(queue.key, 0)
        replies = pipe.execute()
    depths, heads = replies[0::2], [_text(head) for head in replies[1::2]]
    with client.pipeline(transaction=False) as pipe:
        for queue, head in zip(queues, heads, strict=True):
            if head:
                pipe.hget(queue.job_class.key_for(head), "enqueued_at")
        enqueued = iter(pipe.execute())
    return [
        QueueBacklog(name=queue.name, depth=depth, oldest_enqueued_at=_rq_time(next(enqueued)) if head else None)
        for queue, depth, head in zip(queues, depths, heads, strict=True)
    ]


@dataclass(frozen=True)
class RegistryCounts:
    """One engine queue's jobs in RQ's registries: waiting for their time, running, waiting on others, failed."""

    scheduled: int
    started: int
    deferred: int
    failed: int


def queue_registry_counts() -> dict[str, RegistryCounts]:
    """Every engine queue's registry counts, by queue name, highest priority first."""
    return {name: _registry_counts(get_queue(name)) for name in queue_names()}


def _registry_counts(queue) -> RegistryCounts:
    return RegistryCounts(
        scheduled=queue.scheduled_job_registry.get_job_count(cleanup=False),
        started=queue.started_job_registry.get_job_count(cleanup=False),
        deferred=queue.deferred_job_registry.get_job_count(cleanup=False),
        failed=queue.failed_job_registry.get_job_count(cleanup=False),
    )


def live_workers() -> tuple[str, ...]:
    """The names of the RQ workers registered now, in order."""
    return tuple(sorted(worker.name for worker in Worker.all(connection=redis_client())))


def live_worker_count() -> int:
    """How many RQ workers are registered now (one round trip)."""
    return Worker.count(connection=redis_client())


@dataclass(frozen=True)
class WorkerFigures:
    name: str
    state: str
    current_job_id: str
    last_heartbeat: datetime | None


@dataclass(frozen=True)
class QueueState:
    name: str
    available: bool  # False when Redis could not be read: every figure below is then None
    depth: int | None = None
    oldest_enqueued_at: datetime | None = None
    scheduled: int | None = None
    started: int | None = None
    deferred: int | None = None
    failed: int | None = None
    workers: tuple[WorkerFigures, ...] = ()

    def oldest_age(self, now: datetime) -> timedelta | None:
        return None if self.oldest_enqueued_at is None else max(now - self.oldest_enqueued_at, timedelta(0))


def queue_states() -> list[QueueState]:
    """Every engine queue as the Queues page shows it, highest priority first (``critical``, ``default``, ``bulk``)."""
    return [_queue_state(name) for name in queue_names()]


def _queue_state(name: str) -> QueueState:
    queue = get_queue(name)
    try:
        oldest = queue.get_job_ids(0, 1)  # RQ appends at the tail and pops the head: the head waited longest
        enqueued_at = queue.connection.hget(queue.job_class.key_for(oldest[0]), "enqueued_at") if oldest else None
        counts = _registry_counts(queue)
        workers = Worker.all(connection=queue.connection, queue=queue)
        return QueueState(
            name=name,
            available=True,
            depth=queue.count,
            oldest_enqueued_at=_rq_time(enqueued_at),
            scheduled=counts.scheduled,
            started=counts.started,
            deferred=counts.deferred,
            failed=counts.failed,
            workers=tuple(
                sorted(
                    (
                        WorkerFigures(
                            name=worker.name,
                            state=str(worker.get_state()),
                            current_job_id=worker.get_current_job_id() or "",
                            last_heartbeat=worker.last_heartbeat,
                        )
                        for worker in workers
                    ),
                    key=lambda figures: figures.name,
                )
            ),
        )
    except RedisError as exc:
        logger.warning("queues page redis unavailable", extra={"event": "queues_redis_unavailable", "error": str(exc)})
        return QueueState(name=name, available=False)


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _rq_time(value) -> datetime | None:
    # A head whose hash is gone (expired, deleted) has no time: the queue still counts it.
    value = _text(value)
    if not value:
        return None
    parsed = utcparse(value)
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)
