"""A deep backlog starves nothing.

100,000 QUEUED tasks whose jobs wait in Redis (made set-based by
``devtools.backlog``, as deliveries leave them): a task whose job Redis lost,
wherever it sits in the backlog, is delivered again by the sweeps that follow
its grace, and no other task gets a second job. The smaller cases pin the
order: each kind of sweeper work hands on the oldest tasks first when there
are more than a batch of them, and the walk over waiting tasks loses none
at its page boundaries.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from devtools.backlog import backlog_create
from tasks.delivery import enqueue, sweeper
from tasks.delivery.sweeper import sweep_once
from tasks.execution.runner import task_run
from tasks.lifecycle.claims import task_claim
from tasks.models import Task, TaskState
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 100_000
GRACE_SECONDS = 10
# The acceptance bound: a lost delivery is made again within the grace plus two sweeps.
SWEEPS = 2


@pytest.fixture
def queue(clean_redis, settings):
    settings.RELIABILITY_REDELIVERY_GRACE_SECONDS = GRACE_SECONDS
    queue = enqueue.get_queue()
    yield queue
    # Freeing 100,000 jobs takes Redis over a second on a busy machine: in the background,
    # so the next test's blocking FLUSHALL (clean_redis) finds an empty keyspace.
    queue.connection.flushall(asynchronous=True)


def _backlog(count: int, lost=()) -> list:
    # The newest task has waited its grace and one second more: every one is due for a check.
    return backlog_create(count=count, pipeline="t_local", age=timedelta(seconds=GRACE_SECONDS + 1), lost=lost)


def _sweep_until_delivered(task_ids) -> int:
    """Sweep until every one of ``task_ids`` has a live job again, at most SWEEPS times; how many it took."""
    for sweeps in range(1, SWEEPS + 1):
        report = sweep_once()
        assert not report.redis_unavailable
        if all(enqueue.delivery_pending(task_id, 0) for task_id in task_ids):
            return sweeps
    raise AssertionError(f"not delivered again within {SWEEPS} sweeps")


def _assert_one_job_each(queue, task_ids) -> None:
    job_ids = queue.get_job_ids()
    assert len(job_ids) == len(set(job_ids)), "a task was delivered twice"
    assert set(job_ids) == {enqueue.job_id(task_id, 0) for task_id in task_ids}


@pytest.mark.slow
def test_a_job_lost_among_the_oldest_of_100000_queued_is_delivered_again_within_two_sweeps(queue, settings):
    task_ids = _backlog(BACKLOG, lost=[7])
    lost = task_ids[7]
    assert not enqueue.delivery_pending(lost, 0)

    # Within its grace (the oldest task waited 100 s: one per millisecond) a task is left to its job.
    settings.RELIABILITY_REDELIVERY_GRACE_SECONDS = 3600
    assert sweep_once().redelivered == 0
    assert not enqueue.delivery_pending(lost, 0)

    settings.RELIABILITY_REDELIVERY_GRACE_SECONDS = GRACE_SECONDS
    # Within two sweeps, the acceptance bound; the sweeper does it in the first (ARCHITECTURE, "Sweeps at depth").
    assert _sweep_until_delivered([lost]) == 1

    _assert_one_job_each(queue, task_ids)
    assert Task.objects.filter(state=TaskState.QUEUED, fencing_token=0).count() == BACKLOG


@pytest.mark.slow
def test_jobs_lost_in_the_middle_and_at_the_newest_end_of_the_backlog_are_delivered_again_too(queue):
    ordinals = [BACKLOG // 2, BACKLOG - 1]
    task_ids = _backlog(BACKLOG, lost=ordinals)

    assert _sweep_until_delivered([task_ids[ordinal] for ordinal in ordinals]) == 1

    _assert_one_job_each(queue, task_ids)


def test_more_lost_deliveries_than_a_batch_are_made_oldest_first(queue, monkeypatch):
    monkeypatch.setattr(sweeper, "BATCH_SIZE", 2)
    task_ids = _backlog(10, lost=[1, 3, 4, 8])

    assert sweep_once().redelivered == 2
    assert [enqueue.delivery_pending(task_ids[ordinal], 0) for ordinal in (1, 3, 4, 8)] == [True, True, False, False]
    assert sweep_once().redelivered == 2
    _assert_one_job_each(queue, task_ids)


def test_the_walk_over_waiting_tasks_loses_none_at_page_boundaries_or_ties(queue, monkeypatch):
    # Pages of 3 rows, Redis checks of 2 jobs; one time for every task (as a set-based write leaves them).
    monkeypatch.setattr(sweeper, "WAITING_PAGE_SIZE", 3)
    monkeypatch.setattr(sweeper, "DELIVERY_CHECK_SIZE", 2)
    task_ids = _backlog(10)
    with door_forced():
        Task.objects.update(updated_at=timezone.now() - timedelta(seconds=GRACE_SECONDS + 1))
    # A compensating task nobody holds waits too: the walk merges both states.
    by_walk = sorted(task_ids)
    # Not the last one by the walk, whose job is lost too: two different lost jobs (task_ids[4] was the last
    # one in one run out of ten, and the test then counted one).
    compensating = by_walk[4]
    with door_forced():
        Task.objects.filter(pk=compensating).update(state=TaskState.COMPENSATING)
    for task_id in (by_walk[-1], compensating):
        job_id = enqueue.job_id(task_id, 0)
        queue.connection.lrem(queue.key, 0, job_id)
        queue.connection.delete(queue.job_class.key_for(job_id))

    assert [row[1] for row in sweeper._waiting_oldest_first()] == [str(task_id) for task_id in by_walk]
    assert sweep_once().redelivered == 2
    _assert_one_job_each(queue, task_ids)


def test_more_expired_leases_than_a_batch_are_handed_on_oldest_first(clean_redis, monkeypatch):
    monkeypatch.setattr(sweeper, "BATCH_SIZE", 2)
    tasks = [task_submit(pipeline="t_local", input={}) for _ in range(4)]
    now = timezone.now()
    for age, task in zip((40, 30, 20, 10), tasks, strict=True):
        assert task_claim(task_id=str(task.pk), owner="gone") is not None
        with door_forced():
            Task.objects.filter(pk=task.pk).update(lease_expires_at=now - timedelta(seconds=age))

    assert sweep_once().requeued == 2
    assert _states(tasks) == ["queued", "queued", "running", "running"]


def test_more_due_retries_than_a_batch_are_started_oldest_first(clean_redis, monkeypatch):
    monkeypatch.setattr(sweeper, "BATCH_SIZE", 2)
    tasks = [task_submit(pipeline="t_local", input={"fail_b": "transient"}) for _ in range(4)]
    now = timezone.now()
    for age, task in zip((40, 30, 20, 10), tasks, strict=True):
        assert task_run(task_id=str(task.pk), worker="w1") == "retry_scheduled"
        with door_forced():
            Task.objects.filter(pk=task.pk).update(retry_at=now - timedelta(seconds=age))

    assert sweep_once().retries_started == 2
    assert _states(tasks) == ["queued", "queued", "retry_scheduled", "retry_scheduled"]


def _states(tasks) -> list[str]:
    states = dict(Task.objects.filter(pk__in=[task.pk for task in tasks]).values_list("pk", "state"))
    return [states[task.pk] for task in tasks]
