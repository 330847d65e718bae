"""Durable sleep (``Pipeline.sleep``): a task at a sleep step waits WAITING without a job, a lease or a slot; the
sweeper wakes it at its time, not before; the claim after the wake finds the sleep over and goes on."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tasks import Pipeline
from tasks.delivery.enqueue import get_queue
from tasks.delivery.queues import queue_names
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import ConfigurationError
from tasks.execution import runner
from tasks.execution.runner import task_run
from tasks.lifecycle.cancellation import task_cancel
from tasks.models import AttemptKind, Checkpoint, StepAttempt, Task, TaskState, WaitKind
from tasks.selectors import task_representation
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean(clean_redis):
    yield


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def jobs_waiting() -> int:
    return sum(get_queue(name).count + get_queue(name).scheduled_job_registry.count for name in queue_names())


def delivered(task) -> Task:
    """As a worker would: the submission's job taken from its queue (the test then runs the task in-process)."""
    for name in queue_names():
        get_queue(name).empty()
    return task


def outputs(task) -> dict:
    return {row.step_name: row.output for row in Checkpoint.objects.filter(task_id=task.pk)}


def test_a_task_at_a_sleep_waits_without_a_worker_and_says_until_when():
    task = delivered(task_submit(pipeline="t_sleep_seconds", input={"n": 7}))
    before = db_now()
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.wait_for, row.current_step) == (TaskState.WAITING, WaitKind.TIME, 1)
    assert row.retry_at == row.wait_until
    assert before + timedelta(seconds=2.5) < row.retry_at < db_now() + timedelta(seconds=3.5)
    # No lease, and the attempt counted for the sleep given back: the claim after the wake counts it.
    assert (row.lease_owner, row.lease_expires_at) == ("", None)
    assert (row.step_attempt, row.total_attempts) == (0, 1)
    assert outputs(task) == {"before_sleep": {"prepared": 7}}
    assert jobs_waiting() == 0
    assert task_representation(row)["waiting"] == {"for": "time", "name": "cool_off", "until": row.retry_at}
    # A sweep before its time leaves it; so does a stray delivery reaching a worker.
    assert sweep_once().waits_ended == 0
    assert task_run(task_id=str(task.pk), worker="w2") == "skipped"
    assert Task.objects.get(pk=task.pk).state == TaskState.WAITING


def test_the_sweeper_wakes_it_at_its_time_and_it_goes_on_after_the_sleep():
    until = db_now() + timedelta(seconds=1.5)
    task = delivered(task_submit(pipeline="t_sleep_until", input={"until": until.isoformat()}))
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    assert Task.objects.get(pk=task.pk).retry_at == until
    assert jobs_waiting() == 0

    def woken() -> bool:
        report = sweep_once()
        return report.waits_ended == 1

    wait_for(woken, timeout=10, message="a sweep to wake the sleeping task")
    assert db_now() >= until
    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.wait_for, row.retry_at) == (TaskState.QUEUED, WaitKind.NONE, None)
    assert jobs_waiting() == 1

    assert task_run(task_id=str(task.pk), worker="w2") == TaskState.SUCCEEDED
    row.refresh_from_db()
    assert row.wait_until is None
    assert outputs(task)["cool_off"] == {"slept_until": until.isoformat()}
    assert row.result == {"slept_until": until.isoformat(), "prepared": {"prepared": 0}}
    sleep_attempts = StepAttempt.objects.filter(task_id=task.pk, kind=AttemptKind.STEP, step_name="cool_off")
    assert [(a.attempt, a.worker) for a in sleep_attempts] == [(1, "w2")]
    assert row.total_attempts == 3  # one attempt per step: the sleep's first one was given back


def test_a_sleep_as_the_last_step_ends_the_task_when_it_wakes():
    until = db_now() + timedelta(seconds=1)
    task = task_submit(pipeline="t_sleep_last", input={"until": until.isoformat()})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    wait_for(lambda: sweep_once().waits_ended == 1, timeout=10, message="a sweep to wake the sleeping task")
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    assert Task.objects.get(pk=task.pk).result == {"slept_until": until.isoformat()}


def test_a_time_already_past_does_not_wait():
    until = db_now() - timedelta(minutes=1)
    task = task_submit(pipeline="t_sleep_until", input={"until": until.isoformat()})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    assert outputs(task)["cool_off"] == {"slept_until": until.isoformat()}


def test_an_until_without_a_time_zone_fails_the_step_for_good():
    task = task_submit(pipeline="t_sleep_until", input={"until": "2030-01-01T03:00:00"})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.FAILED
    row = Task.objects.get(pk=task.pk)
    assert (row.failure_code, row.failed_step) == ("sleep_until_invalid", "cool_off")
    assert "time zone" in row.failure_message


def test_a_sleeping_task_is_cancelled_at_once_and_never_woken():
    task = task_submit(pipeline="t_sleep_until", input={"until": (db_now() + timedelta(seconds=1)).isoformat()})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    wake_at = Task.objects.get(pk=task.pk).retry_at
    result = task_cancel(task_id=task.pk, actor="operator:test", reason="not needed")
    row = Task.objects.get(pk=task.pk)
    assert (result.requested_now, result.state_before) == (True, TaskState.WAITING)
    assert row.state == TaskState.CANCELLED  # on_cancel PARK: the task ends here, its steps as they are
    assert row.wait_for == WaitKind.NONE
    assert (row.retry_at, row.wait_until) == (None, wake_at)
    wait_for(lambda: db_now() > wake_at, timeout=5, message="the wake time to pass")
    assert sweep_once().waits_ended == 0
    assert Task.objects.get(pk=task.pk).state == TaskState.CANCELLED


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give seconds or until"),
        ({"seconds": 5, "until": lambda ctx: None}, "give seconds or until"),
        ({"seconds": 0}, "positive number"),
        ({"seconds": -1}, "positive number"),
        ({"seconds": True}, "positive number"),
        ({"seconds": "5"}, "positive number"),
        ({"until": "tomorrow"}, "must be a callable"),
        ({"seconds": 5, "timeout": 0}, "timeouts must be positive"),
    ],
)
def test_a_sleep_declared_wrong_is_refused_at_declaration(options, message):
    pipeline = Pipeline("t_sleep_declared_wrong", register=False)
    with pytest.raises(ConfigurationError, match=message):
        pipeline.sleep("pause", **options)
    assert pipeline.steps == []


def test_a_sleep_takes_a_step_name_of_its_own():
    pipeline = Pipeline("t_sleep_names", register=False)
    pipeline.step(lambda ctx: None, name="first")
    with pytest.raises(ConfigurationError, match="already has a step 'first'"):
        pipeline.sleep("first", seconds=1)
    with pytest.raises(ConfigurationError, match="must match"):
        pipeline.sleep("Not A Name", seconds=1)


def test_the_api_and_the_task_page_say_the_task_sleeps_until_when(client, token, role_users):
    response = client.generic(
        "POST",
        "/api/v1/tasks",
        json.dumps({"pipeline": "t_sleep_seconds", "input": {"n": 1}}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 201, response.content
    task_id = response.json()["id"]
    delivered(None)
    assert task_run(task_id=task_id, worker="w1") == TaskState.WAITING
    until = Task.objects.get(pk=task_id).retry_at
    body = client.get(f"/api/v1/tasks/{task_id}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["state"] == "waiting"
    assert body["waiting"]["for"] == "time" and body["waiting"]["name"] == "cool_off"
    said = datetime.fromisoformat(body["waiting"]["until"].replace("Z", "+00:00"))
    assert abs(said - until) < timedelta(milliseconds=1)  # the API writes milliseconds

    client.force_login(role_users["viewer"])
    page = client.get(f"/admin/tasks/task/{task_id}/change/").content.decode()
    assert "asleep at step cool_off" in page


def test_a_worker_whose_clock_is_behind_the_database_does_not_put_a_woken_task_back_to_sleep(monkeypatch):
    until = db_now() + timedelta(seconds=1)
    task = delivered(task_submit(pipeline="t_sleep_until", input={"until": until.isoformat()}))
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    wait_for(lambda: sweep_once().waits_ended == 1, timeout=10, message="a sweep to wake the sleeping task")
    # The worker that claims it next has a clock ten minutes behind the database's (the sweeper woke the task on
    # the database's clock): the sleep is over all the same.
    behind = timezone.now() - timedelta(minutes=10)
    monkeypatch.setattr(runner.timezone, "now", lambda: behind)
    assert task_run(task_id=str(task.pk), worker="w2") == TaskState.SUCCEEDED
