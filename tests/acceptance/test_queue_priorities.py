"""Queues with priorities, against real workers: a critical task overtakes a bulk backlog queued before it.

No wall-clock assertion: the order is read from the step start times the
workers recorded. With N bulk tasks queued and the workers started after a
critical task was submitted, the critical task's step starts before at least
N - k of the bulk tasks' (k: the workers times a small constant, for a job a
worker had already taken when the critical one arrived).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from rq import Worker

from devtools.backlog import backlog_create
from tasks.delivery.enqueue import redis_client
from tasks.models import StepAttempt, Task
from tasks.submission.submit import task_submit
from tests.support import ManagedProcess, manage, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

BULK_TASKS = 300
WORKERS = 2
# Jobs a worker may take per worker before it sees the critical one (none here, as it was queued first;
# a margin for a worker's registration racing its first dequeue).
OVERTAKEN_PER_WORKER = 2


def test_a_critical_task_starts_before_a_bulk_backlog_queued_ahead_of_it(start_workers):
    bulk_ids = backlog_create(count=BULK_TASKS, pipeline="t_bulk", age=timedelta(seconds=0))
    critical = task_submit(pipeline="t_critical", input={})

    pool = start_workers(WORKERS)
    wait_for(
        lambda: Task.objects.filter(pk=critical.pk, state="succeeded").exists(),
        timeout=60,
        message="the critical task to succeed",
    )
    # Every bulk task runs too: the order below compares the critical task with all of them.
    wait_for(
        lambda: Task.objects.filter(pk__in=bulk_ids, state="succeeded").count() == BULK_TASKS,
        timeout=180,
        message="the bulk backlog to drain",
    )

    critical_start = StepAttempt.objects.get(task=critical).started_at
    bulk_starts = list(StepAttempt.objects.filter(task_id__in=bulk_ids).values_list("started_at", flat=True))
    assert len(bulk_starts) == BULK_TASKS
    started_before = sum(start < critical_start for start in bulk_starts)
    assert started_before <= WORKERS * OVERTAKEN_PER_WORKER, pool.logs()[-3000:]
    # The pool's workers listen to every queue, highest priority first.
    workers = Worker.all(connection=redis_client())
    assert len(workers) == WORKERS
    assert all(worker.queue_names() == ["critical", "default", "bulk"] for worker in workers)


def test_a_worker_started_without_queue_names_listens_to_every_queue_in_priority_order(engine_env):
    worker = ManagedProcess("worker-no-queues", manage("rqworker"), engine_env())
    try:
        registered = wait_for(
            lambda: Worker.all(connection=redis_client()), timeout=60, message="the worker to register"
        )
        assert [w.queue_names() for w in registered] == [["critical", "default", "bulk"]]
    finally:
        worker.stop()
