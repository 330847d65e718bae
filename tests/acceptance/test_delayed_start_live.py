"""A later start on a real worker and a real sweeper: it holds no worker, starts not before its time, and survives a
SIGKILL of the sweeper while it waits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from tasks.models import AttemptKind, StepAttempt, Task, TaskState
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

SWEEP_INTERVAL = 0.5


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def state(task) -> str:
    return Task.objects.get(pk=task.pk).state


def test_a_later_start_holds_no_worker_and_starts_after_its_time_across_a_sweeper_crash(
    start_workers, start_sweeper, clean_redis
):
    pool = start_workers(1)
    sweeper = start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
    delayed = task_submit(pipeline="t_local", input={}, run_at=3)
    run_at = Task.objects.get(pk=delayed.pk).retry_at
    # The only worker is free: a task submitted now runs at once, while the other waits.
    now = task_submit(pipeline="t_local", input={})
    wait_for(lambda: state(now) == TaskState.SUCCEEDED, timeout=30, message="the plain task to finish")
    if db_now() < run_at:
        assert state(delayed) == TaskState.WAITING
    # The sweeper dies while the task waits; another starts (a restart, or a second host's).
    sweeper.kill()
    start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
    try:
        wait_for(lambda: state(delayed) == TaskState.SUCCEEDED, timeout=30, message="the delayed task to finish")
    except AssertionError:
        print(pool.logs())
        raise
    attempt = StepAttempt.objects.filter(task_id=delayed.pk, kind=AttemptKind.STEP).earliest("started_at")
    assert attempt.started_at >= run_at
    # Woken by a sweep soon after its time: a bound for liveness, generous for a loaded machine.
    assert attempt.started_at - run_at < timedelta(seconds=SWEEP_INTERVAL + 10)
    assert Task.objects.get(pk=delayed.pk).total_attempts == 2  # local_a and local_b, once each
