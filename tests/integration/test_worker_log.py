"""A worker's log per job: RQ's dequeue line (with its queue) at INFO, its lines after the job at DEBUG.

The engine's own events (``task_claimed``, …) say what became of each task with its ids; RQ's "Job OK" and
"result discarded immediately" after every job were two more records made, formatted and written per task.
"""

from __future__ import annotations

import logging

import pytest

from tasks.delivery.enqueue import get_queue, job_id, redis_client
from tasks.delivery.worker import ReliabilityWorker
from tasks.models import Task, TaskState
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def _lines(caplog, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "rq.worker" and record.levelno == level]


def test_rq_lines_after_a_job_go_to_debug_and_its_dequeue_stays_at_info(clean_redis, caplog):
    task = task_submit(pipeline="t_quiet_1", input={"n": 1})
    worker = ReliabilityWorker([get_queue("default")], connection=redis_client())
    with caplog.at_level(logging.DEBUG, logger="rq.worker"):
        worker.work(burst=True)
    assert Task.objects.get(pk=task.pk).state == TaskState.SUCCEEDED
    job = job_id(task.pk, 0)
    info, debug = _lines(caplog, logging.INFO), _lines(caplog, logging.DEBUG)
    assert [line for line in info if job in line] == [f"Worker {worker.name}: default: {_description(info, job)}"]
    assert f"Worker {worker.name}: default: Job OK ({job})" in debug
    assert f"Worker {worker.name}: job {job} result discarded immediately" in debug
    # RQ's other lines keep their level.
    assert any(line.startswith(f"Worker {worker.name}: started with PID") for line in info)


def test_at_info_the_lines_after_a_job_are_not_written(clean_redis, caplog):
    task = task_submit(pipeline="t_quiet_1", input={"n": 2})
    worker = ReliabilityWorker([get_queue("default")], connection=redis_client())
    with caplog.at_level(logging.INFO, logger="rq.worker"):
        worker.work(burst=True)
    job = job_id(task.pk, 0)
    lines = [record.getMessage() for record in caplog.records if record.name == "rq.worker"]
    written = [line for line in lines if job in line]
    assert len(written) == 1 and "Job OK" not in written[0]
    assert worker.log.level == logging.getLogger("rq.worker").level


def _description(lines: list[str], job: str) -> str:
    """The rest of the dequeue line: the job's description (with the job id) or its id alone."""
    (line,) = [line for line in lines if job in line]
    return line.split(": ", 2)[2]
