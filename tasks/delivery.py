"""Delivery of "run task X now" through RQ. Redis only delivers; losing a job loses nothing.

Every enqueue happens after the database commit. When Redis is down at that
moment the task stays QUEUED and the sweeper delivers it later.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime

import django_rq
from django.conf import settings
from django.db import transaction
from django_rq.connection_utils import filter_connection_params
from redis import Redis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

# The one RQ entry point of the engine (tasks.jobs.run_task; see tasks.worker: nothing unregistered runs).
RUN_TASK_ENTRY_POINT = "tasks.jobs.run_task"
# Job results are worthless (the database has the outcome); failed jobs are
# kept for a day so an operator can still see one in django-rq's pages.
JOB_RESULT_TTL = 0
JOB_FAILURE_TTL = 86400


def job_id(task_id, fencing_token: int) -> str:
    """Deterministic per (task, delivery): a delivery is identified by the fencing token it will claim."""
    return f"task-{task_id}-d{fencing_token}"


# One Redis client per connection setting and process. django-rq builds a new
# client (and a new TCP connection, and under Sentinel a new discovery of the
# primary) on every get_queue(); the client's pool reconnects by itself, and
# under Sentinel asks for the new primary after a failover.
_clients: dict[str, Redis] = {}


def redis_client() -> Redis:
    """The process's client of the engine's Redis (as configured in ``RQ_QUEUES``, directly or through Sentinel)."""
    config = settings.RQ_QUEUES[settings.RELIABILITY_QUEUE]
    key = repr(sorted(filter_connection_params(config).items()))
    client = _clients.get(key)
    if client is None:
        client = _clients.setdefault(key, django_rq.get_connection(settings.RELIABILITY_QUEUE))
    return client


def get_queue():
    """The engine's RQ queue, on the process's Redis client."""
    return django_rq.get_queue(settings.RELIABILITY_QUEUE, connection=redis_client())


def deliver_now(task_id, fencing_token: int) -> bool:
    """Enqueue a run of ``task_id``; return False (and log) when Redis is unavailable."""
    return _enqueue(
        task_id,
        lambda queue: queue.enqueue_call(
            RUN_TASK_ENTRY_POINT, args=(str(task_id),), **_job_options(task_id, fencing_token)
        ),
    )


def deliver_at(task_id, fencing_token: int, when: datetime) -> bool:
    """Schedule a run (a due retry) in RQ's scheduler; the sweeper is the fallback."""
    # RQ's scheduler keeps whole seconds and would truncate: round up so a
    # retry is never delivered before its backoff has ended.
    when = datetime.fromtimestamp(math.ceil(when.timestamp()), tz=UTC)
    options = _job_options(task_id, fencing_token)
    options["job_timeout"] = options.pop("timeout")
    return _enqueue(task_id, lambda queue: queue.enqueue_at(when, RUN_TASK_ENTRY_POINT, str(task_id), **options))


def _job_options(task_id, fencing_token: int) -> dict:
    return {
        "job_id": job_id(task_id, fencing_token),
        "result_ttl": JOB_RESULT_TTL,
        "failure_ttl": JOB_FAILURE_TTL,
        "timeout": -1,
    }


def _enqueue(task_id, enqueue) -> bool:
    try:
        enqueue(get_queue())
    except RedisError as exc:
        logger.warning(
            "delivery postponed: Redis unavailable",
            extra={"event": "delivery_failed", "task_id": str(task_id), "error": type(exc).__name__},
        )
        return False
    return True


def deliver_on_commit(task_id, fencing_token: int, when: datetime | None = None) -> None:
    """Deliver once the current transaction commits (never for a rolled-back write)."""
    if when is None:
        transaction.on_commit(lambda: deliver_now(task_id, fencing_token))
    else:
        transaction.on_commit(lambda: deliver_at(task_id, fencing_token, when))


def delivery_pending(task_id, fencing_token: int) -> bool | None:
    """Whether Redis still holds a live job for this delivery (None when Redis is unreachable)."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job, JobStatus

    queue = get_queue()
    try:
        job = Job.fetch(job_id(task_id, fencing_token), connection=queue.connection, serializer=queue.serializer)
        status = job.get_status(refresh=False)
        if status == JobStatus.QUEUED and _taken_out_by_dead_worker(queue, job.id):
            return False
    except NoSuchJobError:
        return False
    except RedisError:
        return None
    return status in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED)


def _taken_out_by_dead_worker(queue, job_id: str) -> bool:
    """A queued job in RQ's intermediate list was taken by a worker that never started it.

    A worker moves a job from the queue to the intermediate list as it
    dequeues, and off it a moment later as it starts. One killed in between
    leaves the job there with status "queued" and in no list a worker reads;
    RQ's own clean-up fails it only after 10 minutes or more. The caller
    asks once the task has waited its grace period, so such a job is lost:
    it is taken off the list (RQ's clean-up would later fail the
    re-delivery, which reuses the job id) and delivered again. Should its
    worker only have been paused, two deliveries meet one conditional claim.
    """
    return bool(queue.connection.lrem(queue.intermediate_queue_key, 0, job_id))
