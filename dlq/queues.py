"""Reads for the Queues page: each RQ queue's depth, oldest job, registries and workers, read-only.

RQ's own admin views (django-rq's) are not served: they let any staff user
empty a queue, requeue or delete jobs, unaudited, and Redis only delivers
(section 3 of ARCHITECTURE.md): an operator acts on tasks through the DLQ,
whose actions are audited, never on the jobs that deliver them. Nothing here
changes a queue, a registry or a job: counts are read with ``cleanup=False``
(cleaning a started registry would fail or retry abandoned jobs; that is the
workers' job). Listing workers drops the registration of a worker whose key
has expired, as RQ does whenever anyone lists them.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from django.utils import timezone
from redis.exceptions import RedisError
from rq import Worker
from rq.utils import utcparse

from tasks.delivery import get_queue
from tasks.queues import queue_names

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerFigures:
    name: str
    state: str
    current_job_id: str
    last_heartbeat: dt.datetime | None


@dataclass(frozen=True)
class QueueState:
    name: str
    available: bool  # False when Redis could not be read: every figure below is then None
    depth: int | None = None
    oldest_enqueued_at: dt.datetime | None = None
    scheduled: int | None = None
    started: int | None = None
    deferred: int | None = None
    failed: int | None = None
    workers: tuple[WorkerFigures, ...] = ()

    def oldest_age(self, now: dt.datetime) -> dt.timedelta | None:
        return None if self.oldest_enqueued_at is None else max(now - self.oldest_enqueued_at, dt.timedelta(0))


def queue_states() -> list[QueueState]:
    """Every engine queue as the Queues page shows it, highest priority first (``critical``, ``default``, ``bulk``)."""
    return [_queue_state(name) for name in queue_names()]


def _queue_state(name: str) -> QueueState:
    queue = get_queue(name)
    try:
        oldest = queue.get_job_ids(0, 1)  # RQ appends at the tail and pops the head: the head waited longest
        enqueued_at = (
            queue.connection.hget(f"{queue.job_class.redis_job_namespace_prefix}{oldest[0]}", "enqueued_at")
            if oldest
            else None
        )
        workers = Worker.all(connection=queue.connection, queue=queue)
        return QueueState(
            name=name,
            available=True,
            depth=queue.count,
            oldest_enqueued_at=_parsed(enqueued_at),
            scheduled=queue.scheduled_job_registry.get_job_count(cleanup=False),
            started=queue.started_job_registry.get_job_count(cleanup=False),
            deferred=queue.deferred_job_registry.get_job_count(cleanup=False),
            failed=queue.failed_job_registry.get_job_count(cleanup=False),
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


def _parsed(value) -> dt.datetime | None:
    if not value:
        return None
    parsed = utcparse(value.decode() if isinstance(value, bytes) else value)
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=dt.UTC)
