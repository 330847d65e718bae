"""A busy worker's heartbeat rides in a job's start at most every ``WORKER_HEARTBEAT_SECONDS``, not in every job's.

RQ writes the worker's heartbeat (its ``last_heartbeat`` and two TTLs) into each job's start, and the job's own
``last_heartbeat`` twice; for jobs that take milliseconds that was a fourth of the commands of a job's start. The
worker's key still lives for minutes past its last beat (tests/acceptance/test_lean_worker.py), and each job
still records when and where it started.
"""

from __future__ import annotations

import time

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from tasks.delivery.enqueue import get_queue, job_id, redis_client
from tasks.delivery.worker import WORKER_HEARTBEAT_SECONDS, ReliabilityWorker
from tasks.models import Task, TaskState
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 8


class _RecordingWorker(ReliabilityWorker):
    """Keeps the worker's heartbeats that were written, and each job's record as it was when the job ran."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.beats: list[float] = []
        self.started: dict[str, dict] = {}

    def heartbeat(self, timeout=None, pipeline=None) -> None:
        before = self.last_heartbeat
        super().heartbeat(timeout, pipeline)
        if self.last_heartbeat is not before:  # RQ's heartbeat sets it; a throttled call returns before it does
            self.beats.append(time.monotonic())

    def prepare_job_execution(self, job, *args, **kwargs) -> None:
        super().prepare_job_execution(job, *args, **kwargs)
        # The job's start is written: its record as the console and `rq info` read it while it runs.
        saved = Job.fetch(job.id, connection=self.connection, serializer=JSONSerializer)
        self.started[job.id] = {
            "status": saved.get_status(refresh=False),
            "worker": saved.worker_name,
            "started_at": saved.started_at,
            "last_heartbeat": saved.last_heartbeat,
        }


def test_jobs_back_to_back_beat_the_worker_once_per_interval_and_each_records_its_start(clean_redis):
    tasks = [task_submit(pipeline="t_quiet_1", input={"n": n}) for n in range(JOBS)]
    worker = _RecordingWorker([get_queue("default")], connection=redis_client())
    began = time.monotonic()
    worker.work(burst=True)
    elapsed = time.monotonic() - began
    assert Task.objects.filter(pk__in=[t.pk for t in tasks], state=TaskState.SUCCEEDED).count() == JOBS
    # One beat when the worker registers, then at most one per interval (however slow the machine was).
    assert 1 <= len(worker.beats) <= 2 + int(elapsed / WORKER_HEARTBEAT_SECONDS), (worker.beats, elapsed)
    for task in tasks:
        record = worker.started[job_id(task.pk, 0)]
        assert record["status"] == "started" and record["worker"] == worker.name
        assert record["started_at"] is not None and record["last_heartbeat"] == record["started_at"]
