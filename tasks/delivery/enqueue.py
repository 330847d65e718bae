"""Delivery of "run task X now" through RQ. Redis only delivers; losing a job loses nothing.

Every enqueue happens after the database commit. When Redis is down at that
moment the task stays QUEUED and the sweeper delivers it later. A job goes to
its task's pipeline's queue (``tasks.delivery.queues``), whoever enqueues it.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import django_rq
from django.db import transaction
from django_rq.connection_utils import filter_connection_params
from redis import Redis
from redis.exceptions import RedisError
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from tasks.conf import engine_settings
from tasks.delivery.queues import default_queue, queue_for_pipeline, queue_names
from tasks.registry import RUN_TASK_ENTRY_POINT, RUN_TASKS_ENTRY_POINT

if TYPE_CHECKING:
    from rq import Queue

logger = logging.getLogger(__name__)

# A task's delivery names the engine's entry point (tasks.registry.RUN_TASK_ENTRY_POINT; tasks.delivery.worker runs
# nothing unregistered), every job this job class (a dotted path: tasks.delivery.worker imports the engine's runner
# side).
RELIABILITY_JOB_CLASS = "tasks.delivery.worker.ReliabilityJob"
NO_JOB_TIMEOUT = -1
# Job results are worthless (the database has the outcome); failed jobs are
# kept for a day so the failed-jobs count (the Queues page) still shows them.
JOB_RESULT_TTL = 0
JOB_FAILURE_TTL = 86400
# The statuses of a job RQ will still run: waiting in the queue, in the scheduler, or behind a dependency.
PENDING_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED})


def job_id(task_id, fencing_token: int) -> str:
    """Deterministic per (task, delivery): a delivery is identified by the fencing token it will claim."""
    return f"task-{task_id}-d{fencing_token}"


def delivery_job_id(task_id, fencing_token: int, batch_job: str = "") -> str:
    """The job that delivers (task, token): the batch's job until the task's first claim or hold, else its own."""
    return batch_job if batch_job and fencing_token == 0 else job_id(task_id, fencing_token)


def batch_job_id() -> str:
    """A new batch job's id (its tasks record it as ``Task.batch_job``)."""
    return f"batch-{uuid.uuid4().hex}"


# One Redis client per connection setting and process. django-rq builds a new
# client (and a new TCP connection, and under Sentinel a new discovery of the
# primary) on every get_queue(); the client's pool reconnects by itself, and
# under Sentinel asks for the new primary after a failover.
_clients: dict[str, Redis] = {}


def redis_client() -> Redis:
    """The process's client of the engine's Redis (as configured in ``RQ_QUEUES``, directly or through Sentinel)."""
    # Every queue has the same connection settings (a worker's queues share one connection).
    config = engine_settings.RQ_QUEUES[default_queue()]
    key = repr(sorted(filter_connection_params(config).items()))
    client = _clients.get(key)
    if client is None:
        client = _clients.setdefault(key, django_rq.get_connection(default_queue()))
    return client


def get_queue(name: str | None = None):
    """The engine's RQ queue ``name`` (the default queue when None), on the process's Redis client.

    JSON, the engine's job class and no RQ job timeout whatever ``RQ_QUEUES`` says: the workers read only
    JSON (``ReliabilityWorker``), a pickled payload would be code, and RQ's timeout would kill a healthy
    long pipeline between two steps (the engine times each step itself).
    """
    return django_rq.get_queue(
        name or default_queue(),
        connection=redis_client(),
        serializer=JSONSerializer,
        job_class=RELIABILITY_JOB_CLASS,
        default_timeout=NO_JOB_TIMEOUT,
    )


def deliver_now(task_id, fencing_token: int, *, pipeline: str) -> bool:
    """Enqueue a run of ``task_id`` on its ``pipeline``'s queue; return False (and log) when Redis is unavailable."""
    return _enqueue(
        {"task_id": str(task_id)},
        pipeline,
        lambda queue: queue.enqueue_call(
            RUN_TASK_ENTRY_POINT, args=(str(task_id),), **_job_options(task_id, fencing_token)
        ),
    )


# Jobs enqueued per Redis round trip by deliver_many.
DELIVER_MANY_CHUNK = 500


def deliver_many(deliveries: Sequence[tuple[Any, int]], *, pipeline: str) -> bool:
    """Enqueue runs of many (task id, fencing token) of one ``pipeline`` on its queue, a chunk per round trip.

    False (and logged) when Redis is unavailable: the tasks are QUEUED and
    the sweeper delivers them after its grace period.
    """

    def enqueue(queue) -> None:
        for start in range(0, len(deliveries), DELIVER_MANY_CHUNK):
            chunk = deliveries[start : start + DELIVER_MANY_CHUNK]
            queue.enqueue_many(
                [
                    queue.prepare_data(RUN_TASK_ENTRY_POINT, args=(str(task_id),), **_job_options(task_id, token))
                    for task_id, token in chunk
                ]
            )

    if not deliveries:
        return True
    return _enqueue({"count": len(deliveries)}, pipeline, enqueue)


def deliver_at(task_id, fencing_token: int, when: datetime, *, pipeline: str) -> bool:
    """Schedule a run (a due retry) in RQ's scheduler, for its ``pipeline``'s queue; the sweeper is the fallback."""
    # RQ's scheduler keeps whole seconds and would truncate: round up so a
    # retry is never delivered before its backoff has ended.
    when = datetime.fromtimestamp(math.ceil(when.timestamp()), tz=UTC)
    options = _job_options(task_id, fencing_token)
    options["job_timeout"] = options.pop("timeout")
    return _enqueue(
        {"task_id": str(task_id)},
        pipeline,
        lambda queue: queue.enqueue_at(when, RUN_TASK_ENTRY_POINT, str(task_id), **options),
    )


def _job_options(task_id, fencing_token: int) -> dict:
    return {
        "job_id": job_id(task_id, fencing_token),
        "result_ttl": JOB_RESULT_TTL,
        "failure_ttl": JOB_FAILURE_TTL,
        "timeout": -1,
    }


def _enqueue(fields: dict, pipeline: str, enqueue) -> bool:
    """Run ``enqueue`` on ``pipeline``'s queue; False (logged with ``fields``) if Redis is down."""
    try:
        enqueue(get_queue(queue_for_pipeline(pipeline)))
    except RedisError as exc:
        logger.warning(
            "delivery postponed: Redis unavailable",
            extra={"event": "delivery_failed", **fields, "pipeline": pipeline, "error": type(exc).__name__},
        )
        return False
    return True


def deliver_on_commit(task_id, fencing_token: int, when: datetime | None = None, *, pipeline: str) -> None:
    """Deliver once the current transaction commits (never for a rolled-back write), on ``pipeline``'s queue."""
    if when is None:
        transaction.on_commit(lambda: deliver_now(task_id, fencing_token, pipeline=pipeline))
    else:
        transaction.on_commit(lambda: deliver_at(task_id, fencing_token, when, pipeline=pipeline))


def deliver_batches(batches: Sequence[tuple[str, Sequence[Any]]], *, pipeline: str) -> bool:
    """Enqueue one job per (batch job id, task ids) of ``pipeline``: each runs its tasks in turn (``run_tasks``).

    False (and logged) when Redis is unavailable: the tasks are QUEUED and the sweeper delivers each of them on
    its own after its grace period (their batch's job is lost to it).
    """

    def enqueue(queue) -> None:
        for start in range(0, len(batches), DELIVER_MANY_CHUNK):
            queue.enqueue_many(
                [
                    queue.prepare_data(
                        RUN_TASKS_ENTRY_POINT,
                        args=([str(task_id) for task_id in task_ids],),
                        job_id=batch,
                        result_ttl=JOB_RESULT_TTL,
                        failure_ttl=JOB_FAILURE_TTL,
                        timeout=NO_JOB_TIMEOUT,
                    )
                    for batch, task_ids in batches[start : start + DELIVER_MANY_CHUNK]
                ]
            )

    if not batches:
        return True
    return _enqueue({"count": sum(len(task_ids) for _, task_ids in batches)}, pipeline, enqueue)


def jobs_waiting(queues: Sequence[str]) -> bool:
    """Whether a job waits in any of ``queues``: their lengths, in one round trip; False when Redis is unreachable.

    A batch's job asks between its tasks (``tasks.delivery.jobs.run_tasks``). Unanswered, it runs on: its tasks are in
    the database whatever Redis says, and handing them back would need Redis too.
    """
    try:
        with redis_client().pipeline(transaction=False) as pipeline:
            for name in queues:
                pipeline.llen(get_queue(name).key)
            return any(pipeline.execute())
    except RedisError:
        return False


def delivery_pending(task_id, fencing_token: int) -> bool | None:
    """Whether Redis still holds a live job for this delivery (None when Redis is unreachable)."""
    lost = deliveries_lost([(task_id, fencing_token)])
    return None if lost is None else not lost


def deliveries_lost(deliveries: Sequence[tuple], *, queue: Queue | None = None) -> list[tuple] | None:
    """Those of ``deliveries`` (task id, fencing token[, batch job]) that no job in Redis will run, in their order.

    None when Redis is unreachable. A job will run while RQ holds it waiting:
    queued (and neither stuck in the intermediate list of a dead worker nor
    popped by one that died before starting it, see ``_LOST_JOBS``),
    scheduled or deferred. One whose hash is gone or
    incomplete (RQ's ``Job.fetch`` refuses a hash without its payload) or
    that started, finished, failed, stopped or was cancelled will not. One
    round trip for all the deliveries, answered by a script in Redis, on
    whichever queue each job waits (a job's hash is the same on every queue;
    the intermediate lists of all of them are read). A task submitted in a
    batch is carried by its batch's job until it is first claimed or held
    (``delivery_job_id``): that job's state answers for it. A caller that asks
    many times may pass a ``queue`` it holds (any of the engine's).
    """
    queue = queue or get_queue()
    intermediate = [get_queue(name).intermediate_queue_key for name in queue_names()]
    keys = [queue.job_class.key_for(delivery_job_id(*delivery)) for delivery in deliveries]
    try:
        lost_jobs = queue.connection.register_script(_LOST_JOBS)
        positions = lost_jobs(
            keys=[*intermediate, *keys],
            args=[
                len(intermediate),
                queue.job_class.redis_job_namespace_prefix,
                queue.redis_queue_namespace_prefix,
                POPPED_JOB_MARGIN_SECONDS,
                JobStatus.QUEUED.value,
                *(status.value for status in PENDING_STATUSES),
            ],
        )
    except RedisError:
        return None
    return [deliveries[position - 1] for position in positions]


# How much newer than a queued job the job at the head of its queue must be
# before the job counts as popped by a worker that died (see _LOST_JOBS): RQ
# stamps enqueued_at with the enqueuing host's clock, and hosts' clocks differ.
POPPED_JOB_MARGIN_SECONDS = 60

# KEYS[1..n]: the queues' intermediate lists; KEYS[n+1..]: job hashes. ARGV[1]:
# n; ARGV[2]: the job key prefix; ARGV[3]: the queue key prefix; ARGV[4]:
# POPPED_JOB_MARGIN_SECONDS; ARGV[5]: "queued"; ARGV[6..]: PENDING_STATUSES.
# Returns the positions (1 for KEYS[n+1]) of the jobs that will not run.
#
# A worker of one queue moves a job from the queue to the intermediate list as
# it dequeues, and off it a moment later as it starts. One killed in between
# leaves the job there with status "queued" and in no list a worker reads;
# RQ's own clean-up fails it only after 10 minutes or more. The caller asks
# once the task has waited its grace period, so such a job is lost: it is
# taken off the list (RQ's clean-up would later fail the re-delivery, which
# reuses the job id) and delivered again. Should its worker only have been
# paused, two deliveries meet one conditional claim. A script runs alone, so
# no worker moves a job between the read of the list and the removal.
#
# A worker of several queues (critical default bulk) dequeues with BLPOP,
# which has no intermediate list: one killed between the pop and the start,
# or whose connection broke there (a Sentinel failover: the pop reached the
# replica, the reply never reached the worker), leaves a "queued" job in no
# list at all. Whether a job is in a list costs a scan of it, too much for
# every job of a deep backlog; but a queue is first in, first out (the
# engine never enqueues at the front), so a queued job older than the job at
# the head of its queue has left it, and a queued job of an empty queue too.
# The margin keeps a job of a host whose clock runs behind from counting as
# lost; should one count anyway, its second delivery meets the same claim.
_LOST_JOBS = """
local lists = tonumber(ARGV[1])
local margin = tonumber(ARGV[4])
local pending = {}
for i = 6, #ARGV do pending[ARGV[i]] = true end
local taken = {}
for l = 1, lists do
    for _, id in ipairs(redis.call('LRANGE', KEYS[l], 0, -1)) do taken[id] = KEYS[l] end
end

-- RQ's enqueued_at, "2026-12-01T23:22:45.481000Z", as seconds since 1970 (days from the civil date).
local function seconds(stamp)
    local y, m, d, hh, mm, ss = string.match(stamp or '', '^(%d+)-(%d+)-(%d+)T(%d+):(%d+):([%d%.]+)')
    if not y then return nil end
    y, m = tonumber(y), tonumber(m)
    if m <= 2 then y = y - 1 end
    local era = math.floor(y / 400)
    local yoe = y - era * 400
    local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + tonumber(d) - 1
    local days = era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
    return days * 86400 + tonumber(hh) * 3600 + tonumber(mm) * 60 + tonumber(ss)
end

-- The enqueued_at of the job at the head of each queue (false: the queue is empty), read once per queue.
local heads = {}
local function head_of(origin)
    if heads[origin] == nil then
        local id = redis.call('LINDEX', ARGV[3] .. origin, 0)
        heads[origin] = id and (seconds(redis.call('HGET', ARGV[2] .. id, 'enqueued_at')) or -1) or false
    end
    return heads[origin]
end

local lost = {}
for i = lists + 1, #KEYS do
    local job = redis.call('HMGET', KEYS[i], 'status', 'data', 'origin', 'enqueued_at')
    if not job[2] or not pending[job[1]] then
        lost[#lost + 1] = i - lists
    elseif job[1] == ARGV[5] then
        local id = string.sub(KEYS[i], #ARGV[2] + 1)
        if taken[id] then
            redis.call('LREM', taken[id], 0, id)
            lost[#lost + 1] = i - lists
        elseif job[3] then
            local head, enqueued = head_of(job[3]), seconds(job[4])
            if head == false or (enqueued and head - enqueued > margin) then
                lost[#lost + 1] = i - lists
            end
        end
    end
end
return lost
"""
