"""Deliveries that Redis lost track of are made again by the sweeper, and only those."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks import delivery
from tasks.leases import task_claim
from tasks.models import Task
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


@pytest.mark.parametrize(
    ("status", "pending"),
    [
        ("queued", True),
        ("scheduled", True),
        ("deferred", True),
        ("started", False),
        ("finished", False),
        ("failed", False),
        ("stopped", False),
        ("canceled", False),
    ],
)
def test_a_job_counts_as_waiting_only_while_rq_will_still_run_it(queue, status, pending):
    task = task_submit(pipeline="t_local", input={})
    queue.connection.hset(queue.job_class.key_for(delivery.job_id(task.pk, task.fencing_token)), "status", status)

    assert delivery.delivery_pending(task.pk, task.fencing_token) is pending
    assert sweep_once().redelivered == (0 if pending else 1)


def test_a_job_rq_could_not_read_is_delivered_again(queue):
    task = task_submit(pipeline="t_local", input={})
    # RQ's Job.fetch refuses a hash without its payload: no worker would run it.
    queue.connection.hdel(queue.job_class.key_for(delivery.job_id(task.pk, task.fencing_token)), "data")

    assert sweep_once().redelivered == 1
    assert delivery.delivery_pending(task.pk, task.fencing_token)


def test_with_redis_down_the_sweep_says_so_and_does_the_rest(queue, redis_server):
    crashed = task_submit(pipeline="t_local", input={})
    assert task_claim(task_id=str(crashed.pk), owner="gone") is not None
    Task.objects.filter(pk=crashed.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    waiting = task_submit(pipeline="t_local", input={})
    redis_server.stop()
    try:
        report = sweep_once()
    finally:
        redis_server.start()

    assert report.redis_unavailable and report.redelivered == 0
    assert report.requeued == 1
    # Redis came back empty: the waiting task's job is gone, the re-queued task's delivery failed. Both go again.
    assert sweep_once().redelivered == 2
    tasks = Task.objects.filter(pk__in=[crashed.pk, waiting.pk])
    assert sorted(queue.get_job_ids()) == sorted(delivery.job_id(task.pk, task.fencing_token) for task in tasks)
