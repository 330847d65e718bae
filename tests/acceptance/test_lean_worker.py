"""The lean worker loop (``tasks.delivery.worker.ReliabilityWorker``) keeps what RQ and its tools read of a worker true.

Fewer heartbeats and state writes, and a job finished in one pipeline, must
not change what ``rq info``, the console's queue page and RQ's registries
say: busy while a job runs, idle after it, its counts, no key of a finished
job left behind.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings
from redis import Redis
from rq import Worker
from rq.registry import StartedJobRegistry

from tasks import task_submit
from tasks.delivery.worker import WORKER_HEARTBEAT_SECONDS
from tasks.models import Task, TaskState
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]


def _the_worker(connection: Redis) -> Worker | None:
    workers = Worker.all(connection=connection)
    return workers[0] if len(workers) == 1 else None


def _rq_info(connection_url: str) -> str:
    argv = [sys.executable, "-m", "rq.cli", "info", "--url", connection_url, "--only-workers"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def test_rq_and_its_tools_see_a_lean_worker_busy_idle_and_counted(start_workers):
    redis = Redis.from_url(settings.REDIS_URL)
    pool = start_workers(1)
    worker = wait_for(lambda: _the_worker(redis), timeout=60, message="the worker to register")
    wait_for(lambda: _the_worker(redis).get_state() == "idle", timeout=30, message="the worker to be idle")
    born = _the_worker(redis).last_heartbeat

    slow = task_submit(pipeline="t_long", input={"seconds": 2})
    wait_for(lambda: _the_worker(redis).get_state() == "busy", timeout=30, message="the worker to be busy")
    busy = _the_worker(redis)
    assert busy.get_current_job_id() is not None, pool.logs()
    assert " busy" in _rq_info(settings.REDIS_URL)
    assert busy.last_heartbeat >= born  # the job's own pipeline beat

    quick = [task_submit(pipeline="t_quiet_1", input={"n": n}) for n in range(5)]
    done = [slow, *quick]
    wait_for(
        lambda: Task.objects.filter(pk__in=[t.pk for t in done], state=TaskState.SUCCEEDED).count() == len(done),
        timeout=60,
        message="every task to succeed",
    )
    wait_for(lambda: _the_worker(redis).get_state() == "idle", timeout=30, message="the worker to be idle again")
    idle = _the_worker(redis)
    assert idle.name == worker.name
    assert idle.successful_job_count == len(done), pool.logs()
    assert idle.failed_job_count == 0
    assert idle.total_working_time >= 2  # the slow task's two seconds, counted
    assert " idle" in _rq_info(settings.REDIS_URL)
    # The worker's key outlives many heartbeat intervals: it is never about to expire between two beats.
    assert redis.ttl(idle.key) > 10 * WORKER_HEARTBEAT_SECONDS
    # A finished job (kept 0 seconds, as the engine enqueues them) leaves nothing behind in Redis.
    assert redis.keys("rq:job:*") == [], redis.keys("rq:job:*")
    assert redis.keys("rq:execution:*") == []
    assert redis.keys("rq:executions:*") == []
    for queue in settings.RQ_QUEUES:
        assert StartedJobRegistry(queue, connection=redis).count == 0
