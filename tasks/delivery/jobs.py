"""The engine's RQ entry point. Thin: parse, call one service. Only names in tasks.registry run in a worker."""

from __future__ import annotations

import logging
import os
import socket
import time

from django.db import DatabaseError, close_old_connections, connection, connections
from rq import get_current_job

from tasks.delivery import worker
from tasks.delivery.enqueue import jobs_waiting
from tasks.delivery.queues import queues_above
from tasks.delivery.worker import STOPPING
from tasks.execution.runner import task_run
from tasks.lifecycle.deliveries import batch_rest_deliver

# run_task and run_tasks are the engine's entry points (tasks.registry); other apps register theirs with
# tasks.registry.entry_point_register, and tasks.delivery.worker refuses a job naming any other function.

logger = logging.getLogger(__name__)

# Django's health check (CONN_HEALTH_CHECKS) is a SELECT 1 before the first query after close_old_connections():
# a round trip per job, a third of a 1-step task's. A worker draining a queue used its connection milliseconds
# ago, so there the check is skipped; it stays where it finds something: after the worker waited longer than
# this (a database restart or a pooler's idle timeout while it waited), and after an error (Django checks a
# connection that raised before it reuses it). A connection the server dropped between two busy jobs fails the
# job's first statement instead: the job reconnects and runs once more (a claim that did win then finds its task
# held and skips; the lease hands it on, as for any job that dies mid-way).
STEADY_USE_SECONDS = 1.0
_last_job_ended: float | None = None

# How often, at most, a batch's job asks between two of its tasks whether a queue of higher priority than its own
# has a job waiting (one pipelined LLEN of those queues): a critical job then waits for the task in hand and at
# most this long more, instead of the whole batch, and a batch of quick tasks pays one Redis round trip per
# interval, not one per task.
PRIORITY_CHECK_SECONDS = 0.05


def worker_identity() -> str:
    """``<worker name>@<host>:<pid>``: the lease owner a worker writes into the tasks it holds."""
    job = get_current_job()
    worker = job.worker_name if job is not None and job.worker_name else "worker"
    return f"{worker}@{socket.gethostname()}:{os.getpid()}"


def run_task(task_id: str) -> str:
    global _last_job_ended
    steady = _connections_prepared()
    try:
        try:
            return task_run(task_id=str(task_id), worker=worker_identity())
        except DatabaseError:
            if not steady or connection.connection is None or connection.is_usable():
                raise
            connection.close()
            return task_run(task_id=str(task_id), worker=worker_identity())
    finally:
        _last_job_ended = time.monotonic()


def run_tasks(task_ids: list[str]) -> list[str]:
    """A batch's job: each task claimed and run in turn, as its own job would; one's failure is only its own.

    A task whose run raised (its claim or a bookkeeping write failed) is left as it stands: queued, it is
    delivered again on its own once this job is gone (the sweeper's lost-delivery check reads the batch's job),
    held by a lease, its lease hands it on. The tasks it has not reached are handed back, each delivered on its
    own, when the worker is stopping or a job waits on a queue of higher priority (``_PriorityWatch``).
    """
    if not isinstance(task_ids, list) or not all(isinstance(task_id, str) for task_id in task_ids):
        raise TypeError("run_tasks takes a list of task ids")
    outcomes = []
    watch = _PriorityWatch()
    for position, task_id in enumerate(task_ids):
        stopping = STOPPING.is_set()
        if stopping or watch.outranked():
            # A warm shutdown waits for this job, and so does a job on a higher queue (the worker takes its next
            # job when this one returns): the tasks it has not reached are delivered on their own now, for
            # another worker or for this one after the other job, instead of holding either (or waiting for the
            # sweeper's grace).
            handed_back = batch_rest_deliver(task_ids=task_ids[position:])
            logger.info(
                "batch handed back",
                extra={
                    "event": "batch_handed_back",
                    "reason": "stopping" if stopping else "higher_priority_waiting",
                    "count": handed_back,
                },
            )
            outcomes += ["handed_back"] * (len(task_ids) - position)
            break
        try:
            outcomes.append(run_task(task_id))
        except Exception:
            logger.exception("task run failed in its batch", extra={"event": "batch_task_failed", "task_id": task_id})
            outcomes.append("error")
    return outcomes


class _PriorityWatch:
    """Whether a job waits on a queue above the current job's, asked at most every ``PRIORITY_CHECK_SECONDS``.

    The worker chose this job because the queues above its own were empty when it dequeued, so the first
    question waits an interval too. A direct call (no current job) and a job on the highest queue never ask;
    nor does a worker about queues it does not take jobs from (``tasks.delivery.worker.listened_queues``).
    """

    def __init__(self) -> None:
        job = get_current_job()
        above = queues_above(job.origin) if job is not None else ()
        listened = worker.listened_queues
        self._above = tuple(name for name in above if listened is None or name in listened)
        self._asked_at = time.monotonic()

    def outranked(self) -> bool:
        if not self._above:
            return False
        now = time.monotonic()
        if now - self._asked_at < PRIORITY_CHECK_SECONDS:
            return False
        self._asked_at = now
        return jobs_waiting(self._above)


def _connections_prepared() -> bool:
    """Drop connections Django would drop between requests; True when the health check was skipped (steady use)."""
    # Workers live long: a connection past its CONN_MAX_AGE, or one that raised, is closed or checked here.
    close_old_connections()
    steady = _last_job_ended is not None and time.monotonic() - _last_job_ended < STEADY_USE_SECONDS
    if not steady:
        return False
    for alias_connection in connections.all(initialized_only=True):
        if alias_connection.connection is not None and not alias_connection.errors_occurred:
            # What close_if_health_check_failed() would set after its SELECT 1 (Django's own flag).
            alias_connection.health_check_done = True
    return True
