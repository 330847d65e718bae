"""A deep backlog for tests and benchmarks: many QUEUED tasks, each with its RQ job waiting in the queue.

``backlog_create`` makes the tasks with one ``INSERT … SELECT generate_series``
and their jobs as a delivery leaves them, without one enqueue per task (RQ
builds and packs each job in Python: 100,000 take about 25 s here, this
takes a few). The first job is enqueued by the engine itself
(``tasks.delivery.enqueue.deliver_now``); every other job is a server-side ``COPY``
of that job's hash with its own task id written into its payload and
description (the same JSON, compressed as RQ compresses it), and its id
pushed onto the pipeline's queue in task order. So each job hash holds every field a
real enqueue writes, and the queue holds one entry per job.

Tasks are created oldest first, ``spacing`` apart, the newest ``age`` old;
the tasks whose ordinals are in ``lost`` get no job (a job Redis lost).
PostgreSQL only.
"""

from __future__ import annotations

import hashlib
import json
import uuid
import zlib
from collections.abc import Collection
from datetime import timedelta

from django.db import connection

from tasks import registry
from tasks.delivery import enqueue
from tasks.delivery.queues import queue_for_pipeline
from tasks.models import Task, TaskState

# Jobs per round trip to Redis.
REDIS_CHUNK = 5000
# KEYS: the template job's hash, the queue, then each new job's hash; ARGV: (job id, payload, description) per job.
# One command per chunk: redis-py's packing of one command per job is what makes a plain pipeline slow.
_COPY_JOBS = """
for i = 3, #KEYS do
    local at = (i - 3) * 3
    redis.call('COPY', KEYS[1], KEYS[i])
    redis.call('HSET', KEYS[i], 'data', ARGV[at + 2], 'description', ARGV[at + 3])
    redis.call('RPUSH', KEYS[2], ARGV[at + 1])
end
"""

_INSERT = """
INSERT INTO tasks_task (
    id, pipeline, input, state, current_step, total_steps, step_names, step_attempt, total_attempts, generation,
    lease_owner, fencing_token, crash_count, in_dlq, failure_reason, failure_code, failure_message, failed_step,
    idempotency_scope, request_fingerprint, created_at, updated_at
)
SELECT md5(%(salt)s || i)::uuid, %(pipeline)s, jsonb_build_object('backlog', i), %(state)s, 0, %(total_steps)s,
    %(step_names)s::jsonb, 0, 0, 0, '', 0, 0, false, '', '', '', '', '', '', at, at
FROM generate_series(0, %(count)s - 1) AS i
CROSS JOIN LATERAL (
    SELECT now() - %(age)s - (%(count)s - 1 - i) * %(spacing)s AS at
) AS times
"""


def backlog_task_id(salt: str, ordinal: int) -> uuid.UUID:
    """The id the INSERT gives task ``ordinal``: ``md5(salt || ordinal)::uuid`` in SQL."""
    return uuid.UUID(hashlib.md5(f"{salt}{ordinal}".encode()).hexdigest())


def backlog_create(
    *,
    count: int,
    pipeline: str,
    age: timedelta,
    lost: Collection[int] = (),
    spacing: timedelta = timedelta(milliseconds=1),
) -> list[uuid.UUID]:
    """Create ``count`` QUEUED tasks of ``pipeline`` with their jobs (none for ``lost``); their ids, oldest first."""
    if connection.vendor != "postgresql":
        raise RuntimeError("backlog_create needs PostgreSQL")
    lost = set(lost)
    salt = uuid.uuid4().hex
    names = [step.name for step in registry.get(pipeline).steps]
    with connection.cursor() as cursor:
        cursor.execute(
            _INSERT,
            {
                "salt": salt,
                "pipeline": pipeline,
                "state": TaskState.QUEUED,
                "total_steps": len(names),
                # As submission records them: a worker then finds nothing changed (no extra write per task).
                "step_names": json.dumps(names),
                "count": count,
                "age": age,
                "spacing": spacing,
            },
        )
    task_ids = [backlog_task_id(salt, ordinal) for ordinal in range(count)]
    _jobs_create([task_id for ordinal, task_id in enumerate(task_ids) if ordinal not in lost], pipeline=pipeline)
    return task_ids


def _jobs_create(task_ids: list[uuid.UUID], *, pipeline: str) -> None:
    if not task_ids:
        return
    # A new task's first delivery is its fencing token 0 (tasks.submission.submit).
    token = Task._meta.get_field("fencing_token").default
    first, *others = task_ids
    if not enqueue.deliver_now(first, token, pipeline=pipeline):
        raise RuntimeError("Redis is unavailable")
    # The queue the engine delivered the first job to: the pipeline's own.
    queue = enqueue.get_queue(queue_for_pipeline(pipeline))
    template_key = queue.job_class.key_for(enqueue.job_id(first, token))
    payload, description = queue.connection.hmget(template_key, "data", "description")
    payload = zlib.decompress(payload)
    placeholder = str(first).encode()
    copy_jobs = queue.connection.register_script(_COPY_JOBS)
    for start in range(0, len(others), REDIS_CHUNK):
        chunk = others[start : start + REDIS_CHUNK]
        job_ids = [enqueue.job_id(task_id, token) for task_id in chunk]
        values = []
        for task_id, job_id in zip(chunk, job_ids, strict=True):
            own_id = str(task_id).encode()
            own_payload = zlib.compress(payload.replace(placeholder, own_id))
            values += [job_id, own_payload, description.replace(placeholder, own_id)]
        copy_jobs(keys=[template_key, queue.key, *map(queue.job_class.key_for, job_ids)], args=values)
