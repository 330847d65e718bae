"""Deliveries that Redis lost track of are made again by the sweeper, and only those."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rq.utils import utcformat, utcparse

from tasks.delivery import enqueue
from tasks.delivery.queues import queue_names
from tasks.delivery.sweeper import sweep_once
from tasks.lifecycle.claims import task_claim
from tasks.models import Task
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(clean_redis, settings):
    settings.RELIABILITY_REDELIVERY_GRACE_SECONDS = 0
    return enqueue.get_queue()


def test_a_job_a_worker_took_but_never_started_is_delivered_again(queue):
    task = task_submit(pipeline="t_local", input={})
    job_id = enqueue.job_id(task.pk, task.fencing_token)
    # A worker dequeues (RQ moves the job to its intermediate list) and is killed before it starts the job.
    assert queue.connection.lmove(queue.key, queue.intermediate_queue_key) == job_id.encode()
    assert queue.get_job_ids() == []

    report = sweep_once()

    assert report.redelivered == 1
    assert queue.get_job_ids() == [job_id]
    assert queue.connection.lrange(queue.intermediate_queue_key, 0, -1) == []


def pop_like_a_worker_of_every_queue(queue) -> str:
    """What ``rqworker critical default bulk`` does first: BLPOP over its queues (RQ keeps no intermediate list)."""
    keys = [enqueue.get_queue(name).key for name in queue_names()]
    _, job_id = queue.connection.blpop(keys, timeout=1)
    return job_id.decode()


def age_job(queue, job_id: str, seconds: float) -> None:
    """Make ``job_id`` look enqueued ``seconds`` earlier (as if the queue had moved on since)."""
    key = queue.job_class.key_for(job_id)
    enqueued = utcparse(queue.connection.hget(key, "enqueued_at").decode()) - timedelta(seconds=seconds)
    queue.connection.hset(key, "enqueued_at", utcformat(enqueued))


def test_a_job_a_worker_of_several_queues_popped_but_never_started_is_delivered_again(queue):
    task = task_submit(pipeline="t_local", input={})
    job_id = enqueue.job_id(task.pk, task.fencing_token)
    # The worker is killed (or its Redis fails over) between the pop and the start: the job says "queued" and is
    # in no list.
    assert pop_like_a_worker_of_every_queue(queue) == job_id
    assert queue.fetch_job(job_id).get_status() == "queued"

    assert enqueue.delivery_pending(task.pk, task.fencing_token) is False
    assert sweep_once().redelivered == 1
    assert queue.get_job_ids() == [job_id]
    assert enqueue.delivery_pending(task.pk, task.fencing_token) is True


def test_a_popped_job_behind_a_busy_queue_is_lost_once_the_head_is_clearly_newer(queue):
    popped = task_submit(pipeline="t_local", input={})
    waiting = task_submit(pipeline="t_local", input={})
    popped_job = pop_like_a_worker_of_every_queue(queue)
    assert popped_job == enqueue.job_id(popped.pk, popped.fencing_token)

    # The next job in line was enqueued a moment later: it could be another host's clock, so not yet.
    assert sweep_once().redelivered == 0
    age_job(queue, popped_job, enqueue.POPPED_JOB_MARGIN_SECONDS + 5)

    assert sweep_once().redelivered == 1
    assert queue.get_job_ids() == [enqueue.job_id(waiting.pk, waiting.fencing_token), popped_job]


def test_a_job_in_its_queue_behind_one_stamped_by_a_faster_clock_still_counts_as_waiting(queue):
    first = task_submit(pipeline="t_local", input={})
    second = task_submit(pipeline="t_local", input={})
    # The second job's host runs half a minute behind the first's.
    age_job(queue, enqueue.job_id(second.pk, second.fencing_token), enqueue.POPPED_JOB_MARGIN_SECONDS / 2)

    assert sweep_once().redelivered == 0
    assert queue.get_job_ids() == [enqueue.job_id(task.pk, task.fencing_token) for task in (first, second)]


def test_a_job_still_waiting_in_the_queue_is_not_delivered_twice(queue):
    task = task_submit(pipeline="t_local", input={})

    report = sweep_once()

    assert report.redelivered == 0
    assert queue.get_job_ids() == [enqueue.job_id(task.pk, task.fencing_token)]


def test_a_job_redis_forgot_is_delivered_again(queue, clean_redis):
    task = task_submit(pipeline="t_local", input={})
    clean_redis.flushall()

    report = sweep_once()

    assert report.redelivered == 1
    assert queue.get_job_ids() == [enqueue.job_id(task.pk, task.fencing_token)]


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
    queue.connection.hset(queue.job_class.key_for(enqueue.job_id(task.pk, task.fencing_token)), "status", status)

    assert enqueue.delivery_pending(task.pk, task.fencing_token) is pending
    assert sweep_once().redelivered == (0 if pending else 1)


def test_a_job_rq_could_not_read_is_delivered_again(queue):
    task = task_submit(pipeline="t_local", input={})
    # RQ's Job.fetch refuses a hash without its payload: no worker would run it.
    queue.connection.hdel(queue.job_class.key_for(enqueue.job_id(task.pk, task.fencing_token)), "data")

    assert sweep_once().redelivered == 1
    assert enqueue.delivery_pending(task.pk, task.fencing_token)


def test_with_redis_down_the_sweep_says_so_and_does_the_rest(queue, redis_server):
    crashed = task_submit(pipeline="t_local", input={})
    assert task_claim(task_id=str(crashed.pk), owner="gone") is not None
    with door_forced():
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
    assert sorted(queue.get_job_ids()) == sorted(enqueue.job_id(task.pk, task.fencing_token) for task in tasks)
