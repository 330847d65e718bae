"""Deliveries that Redis lost track of are made again by the sweeper, and only those."""

from __future__ import annotations

import pytest

from tasks import delivery
from tasks.services import task_submit
from tasks.sweeper import sweep_once

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(clean_redis, settings):
    settings.RELIABILITY_REDELIVERY_GRACE_SECONDS = 0
    return delivery.get_queue()


def test_a_job_a_worker_took_but_never_started_is_delivered_again(queue):
    task = task_submit(pipeline="t_local", input={})
    job_id = delivery.job_id(task.pk, task.fencing_token)
    # A worker dequeues (RQ moves the job to its intermediate list) and is killed before it starts the job.
    assert queue.connection.lmove(queue.key, queue.intermediate_queue_key) == job_id.encode()
    assert queue.get_job_ids() == []

    report = sweep_once()

    assert report.redelivered == 1
    assert queue.get_job_ids() == [job_id]
    assert queue.connection.lrange(queue.intermediate_queue_key, 0, -1) == []


def test_a_job_still_waiting_in_the_queue_is_not_delivered_twice(queue):
    task = task_submit(pipeline="t_local", input={})

    report = sweep_once()

    assert report.redelivered == 0
    assert queue.get_job_ids() == [delivery.job_id(task.pk, task.fencing_token)]


def test_a_job_redis_forgot_is_delivered_again(queue, clean_redis):
    task = task_submit(pipeline="t_local", input={})
    clean_redis.flushall()

    report = sweep_once()

    assert report.redelivered == 1
    assert queue.get_job_ids() == [delivery.job_id(task.pk, task.fencing_token)]
