"""A durable sleep on a real worker and real sweepers: the task holds no worker while it sleeps, goes on not before
its time, and survives a SIGKILL of the sweeper while it sleeps."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tasks.models import AttemptKind, Checkpoint, StepAttempt, Task, TaskState, WaitKind
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

SWEEP_INTERVAL = 0.5


def row(task) -> Task:
    return Task.objects.get(pk=task.pk)


def test_a_sleeping_task_holds_no_worker_and_goes_on_after_its_time_across_a_sweeper_crash(
    start_workers, start_sweeper, clean_redis
):
    pool = start_workers(1)
    sweeper = start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
    sleeper = task_submit(pipeline="t_sleep_seconds", input={"n": 3})
    try:
        wait_for(lambda: row(sleeper).state == TaskState.WAITING, timeout=30, message="the task to fall asleep")
        asleep = row(sleeper)
        assert asleep.wait_for == WaitKind.TIME and asleep.lease_owner == ""
        until = asleep.wait_until
        # The only worker is free while the task sleeps: a task submitted now runs at once.
        plain = task_submit(pipeline="t_local", input={})
        wait_for(lambda: row(plain).state == TaskState.SUCCEEDED, timeout=30, message="the plain task to finish")
        # The sweeper dies while the task sleeps; another starts (a restart, or a second host's).
        sweeper.kill()
        start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
        wait_for(lambda: row(sleeper).state == TaskState.SUCCEEDED, timeout=30, message="the task to go on")
    except AssertionError:
        print(pool.logs())
        raise
    checkpoints = {c.step_name: c.output for c in Checkpoint.objects.filter(task_id=sleeper.pk)}
    assert datetime.fromisoformat(checkpoints["cool_off"]["slept_until"]) == until
    after = StepAttempt.objects.get(task_id=sleeper.pk, kind=AttemptKind.STEP, step_name="after_sleep")
    assert after.started_at >= until
    # Woken by a sweep soon after its time: a bound for liveness, generous for a loaded machine.
    assert after.started_at - until < timedelta(seconds=SWEEP_INTERVAL + 10)
    # Each step ran once, the sleep's attempt included.
    steps = StepAttempt.objects.filter(task_id=sleeper.pk, kind=AttemptKind.STEP)
    assert sorted(a.step_name for a in steps) == ["after_sleep", "before_sleep", "cool_off"]
    assert row(sleeper).total_attempts == 3
