"""A submission that starts later: created WAITING (no job, no worker), woken by the sweeper at its time, not before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tasks.delivery.enqueue import get_queue, job_id
from tasks.delivery.queues import queue_names
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import IdempotencyKeyReused, InvalidTaskInput
from tasks.execution.runner import task_run
from tasks.lifecycle.cancellation import task_cancel
from tasks.models import StepAttempt, Task, TaskState, WaitKind
from tasks.selectors import task_representation
from tasks.submission.batches import BatchItem, task_submit_many
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean(clean_redis):
    yield


def jobs_waiting() -> int:
    return sum(get_queue(name).count for name in queue_names())


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_a_later_start_waits_without_a_job_and_says_what_for():
    task = task_submit(pipeline="t_local", input={}, run_at=timedelta(minutes=5))
    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.wait_for, row.fencing_token) == (TaskState.WAITING, WaitKind.START, 0)
    assert row.retry_at == task.retry_at and row.retry_at > db_now() + timedelta(minutes=4)
    assert jobs_waiting() == 0
    waiting = task_representation(row)["waiting"]
    assert waiting == {"for": "start", "name": None, "until": row.retry_at}
    # A sweep before its time leaves it waiting; so does a stray delivery (a duplicate job) reaching a worker.
    assert sweep_once().waits_ended == 0
    assert task_run(task_id=str(task.pk), worker="w") == "skipped"
    row.refresh_from_db()
    assert (row.state, row.total_attempts) == (TaskState.WAITING, 0)
    assert not StepAttempt.objects.filter(task=row).exists()
    # Every other task's JSON says it waits for nothing.
    assert task_representation(task_submit(pipeline="t_local", input={}))["waiting"] is None


def test_the_sweeper_wakes_it_at_its_time_and_not_before():
    run_at = db_now() + timedelta(seconds=1.5)
    task = task_submit(pipeline="t_local", input={}, run_at=run_at)

    def woken():
        sweep_once()
        swept_by = db_now()
        row = Task.objects.get(pk=task.pk)
        if row.state == TaskState.WAITING:
            return None
        assert swept_by >= run_at, f"woken by a sweep that ended at {swept_by}, before {run_at}"
        return row

    row = wait_for(woken, timeout=15, interval=0.1, message="the sweeper to wake the task")
    assert (row.state, row.wait_for, row.retry_at) == (TaskState.QUEUED, "", None)
    assert get_queue().fetch_job(job_id(task.pk, 0)) is not None  # its first delivery
    assert task_run(task_id=str(task.pk), worker="w") == "succeeded"
    assert StepAttempt.objects.filter(task=row).earliest("started_at").started_at >= run_at


def test_a_start_already_past_or_zero_seconds_away_starts_at_once():
    for run_at in (datetime(2020, 1, 1, tzinfo=UTC), 0):
        task = task_submit(pipeline="t_local", input={}, run_at=run_at)
        assert Task.objects.get(pk=task.pk).state == TaskState.QUEUED
    assert jobs_waiting() == 2


def test_a_waiting_task_is_cancelled_at_once_and_never_starts():
    task = task_submit(pipeline="t_local", input={}, run_at=60)
    result = task_cancel(task_id=task.pk, actor="operator:ana", reason="not needed")
    assert result.requested_now and result.state_before == TaskState.WAITING
    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.wait_for, row.retry_at) == (TaskState.CANCELLED, "", None)
    assert sweep_once().waits_ended == 0 and jobs_waiting() == 0


def test_a_deadline_that_passes_while_it_waits_fails_it_without_a_step():
    task = task_submit(pipeline="t_local", input={}, run_at=1.0, deadline=1.2)
    wait_for(lambda: Task.objects.get(pk=task.pk).deadline <= db_now(), timeout=10, interval=0.05)
    # The deadline passed before (or as) the start came: the sweeper wakes it either way, the claim fails it.
    wait_for(lambda: sweep_once().waits_ended or Task.objects.get(pk=task.pk).state != TaskState.WAITING, timeout=10)
    # t_local compensates its failures: with no step done there is nothing to undo.
    assert task_run(task_id=str(task.pk), worker="w") == TaskState.COMPENSATED
    row = Task.objects.get(pk=task.pk)
    assert row.failure_reason == "deadline_exceeded"
    assert not StepAttempt.objects.filter(task=row, kind="step").exists()


@pytest.mark.parametrize(
    ("run_at", "deadline", "message"),
    [
        (datetime(2030, 1, 1), None, "timezone-aware"),
        (-1, None, "0 to 31,536,000 seconds"),
        (float("nan"), None, "0 to 31,536,000 seconds"),
        (True, None, "0 to 31,536,000 seconds"),
        (timedelta(days=400), None, "0 to 31,536,000 seconds"),
        (datetime(2099, 1, 1, tzinfo=UTC), None, "at most one year ahead"),
        (120, 60, "not before the deadline"),
    ],
)
def test_a_bad_start_is_refused_and_changes_nothing(run_at, deadline, message):
    with pytest.raises(InvalidTaskInput, match=message):
        task_submit(pipeline="t_local", input={}, run_at=run_at, deadline=deadline, idempotency_key="k")
    assert not Task.objects.exists()


def test_the_fingerprint_holds_the_start_as_submitted():
    first = task_submit(pipeline="t_local", input={}, run_at=60, idempotency_key="later")
    # The same request again (seconds from now, as sent): the same task, though "now" moved on.
    assert task_submit(pipeline="t_local", input={}, run_at=60, idempotency_key="later").pk == first.pk
    for other in (None, 61, first.retry_at):
        with pytest.raises(IdempotencyKeyReused):
            task_submit(pipeline="t_local", input={}, run_at=other, idempotency_key="later")
    assert Task.objects.count() == 1


def test_a_batch_item_may_start_later_and_only_the_others_are_delivered():
    outcomes = task_submit_many(
        [
            BatchItem(pipeline="t_local", input={"n": 0}, run_at=300),
            BatchItem(pipeline="t_local", input={"n": 1}),
            {"pipeline": "t_local", "input": {"n": 2}, "run_at": timedelta(minutes=5)},
            BatchItem(pipeline="t_local", input={"n": 3}, run_at=-5),
        ]
    )
    states = [Task.objects.get(pk=outcome.task_id).state for outcome in outcomes[:3]]
    assert states == [TaskState.WAITING, TaskState.QUEUED, TaskState.WAITING]
    assert isinstance(outcomes[3].error, InvalidTaskInput)
    assert jobs_waiting() == 1
