"""Django's Tasks framework on the engine (tasks.backends.ReliabilityBackend): in-process, real PostgreSQL, Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction

from tasks.backends import (
    InvalidTaskBackendError,
    ReliabilityBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from tasks.delivery.enqueue import get_queue
from tasks.delivery.queues import queue_names
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import InvalidTaskInput
from tasks.execution.runner import task_run
from tasks.models import AttemptKind, DeadLetter, StepAttempt, Task, TaskState, WaitKind
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests import task_functions
from tests.support import wait_for

try:
    from django.tasks.exceptions import InvalidTask
except ImportError:  # Django 5.2: the backport
    from django_tasks.exceptions import InvalidTaskError as InvalidTask

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "tasks.backends.ReliabilityBackend"
FAST_RETRIES = {"RETRY_BASE_SECONDS": 0.01, "RETRY_MAX_SECONDS": 0.02}


@pytest.fixture(autouse=True)
def reliability_tasks(settings, clean_redis):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "reports"], "OPTIONS": FAST_RETRIES}}


def jobs_waiting() -> int:
    return sum(get_queue(name).count for name in queue_names())


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def run(result) -> str:
    return task_run(task_id=result.id, worker="w1")


def test_an_enqueued_task_runs_on_the_engine_and_its_result_is_the_return_value():
    enqueued = task_functions.add.enqueue(2, b=3)
    row = Task.objects.get(pk=enqueued.id)
    assert row.pipeline == "django_task_default_default" and row.state == TaskState.QUEUED
    assert enqueued.status == TaskResultStatus.READY and enqueued.enqueued_at == row.created_at
    assert get_queue("default").count == 1

    assert run(enqueued) == "succeeded"
    result = task_functions.add.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"sum": 5}
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.worker_ids == ["w1"] and result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at == result.last_attempted_at <= result.finished_at
    assert result.task.func is task_functions.add.func


def test_a_transient_error_is_retried_and_the_second_attempt_succeeds():
    enqueued = task_functions.flaky_once.enqueue("hello")
    assert run(enqueued) == "retry_scheduled"
    waiting = task_functions.flaky_once.get_result(enqueued.id)
    assert waiting.status == TaskResultStatus.READY and waiting.attempts == 1
    assert [error.exception_class_path for error in waiting.errors] == ["tasks.exceptions.TransientError"]

    with door_forced():
        Task.objects.filter(pk=enqueued.id).update(retry_at=db_now() - timedelta(seconds=1))
    assert run(enqueued) == "succeeded"
    result = task_functions.flaky_once.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "hello on attempt 2"
    assert result.attempts == 2 and result.worker_ids == ["w1", "w1"]
    assert result.last_attempted_at > result.started_at


def test_an_error_of_the_function_fails_the_task_into_the_dead_letter_queue_redacted():
    enqueued = task_functions.broken.enqueue(password="hunter2-very-secret")
    assert run(enqueued) == "failed"
    result = task_functions.broken.get_result(enqueued.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert "broken on purpose" in error.traceback and "hunter2-very-secret" not in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018
    row = Task.objects.get(pk=enqueued.id)
    assert row.state == TaskState.FAILED and row.in_dlq
    item = DeadLetter.objects.get(task=row)
    assert item.reason_code == "permanent_error" and "hunter2-very-secret" not in item.reason


def test_a_return_value_that_is_not_json_fails_the_task_with_the_frameworks_error():
    enqueued = task_functions.returns_a_set.enqueue()
    assert run(enqueued) == "failed"
    [error] = task_functions.returns_a_set.get_result(enqueued.id).errors
    assert error.exception_class_path == "builtins.TypeError" and "Unsupported type" in error.traceback


def test_the_task_is_written_in_the_callers_transaction_and_delivered_after_its_commit():
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = task_functions.add.enqueue(1, 2)
        raise RuntimeError("the caller's transaction fails")
    assert not Task.objects.filter(pk=rolled_back.id).exists() and jobs_waiting() == 0

    with transaction.atomic():
        committed = task_functions.add.enqueue(1, 2)
        assert Task.objects.filter(pk=committed.id).exists() and jobs_waiting() == 0
    assert jobs_waiting() == 1 and run(committed) == "succeeded"


def test_run_after_waits_without_a_job_until_the_sweeper_starts_it_at_its_time():
    run_after = db_now() + timedelta(seconds=3)
    enqueued = task_functions.add.using(run_after=run_after).enqueue(1, 1)
    row = Task.objects.get(pk=enqueued.id)
    assert (row.state, row.wait_for, row.retry_at) == (TaskState.WAITING, WaitKind.START, run_after)
    assert jobs_waiting() == 0
    assert task_functions.add.get_result(enqueued.id).status == "READY"

    def released():
        sweep_once()
        swept_by = db_now()
        row = Task.objects.get(pk=enqueued.id)
        if row.state == TaskState.WAITING:
            return None
        assert swept_by >= run_after, f"released by a sweep that ended at {swept_by}, before {run_after}"
        return row

    row = wait_for(released, timeout=15, interval=0.2, message="the sweeper to release the task")
    assert jobs_waiting() == 1 and row.retry_at is None
    assert run(enqueued) == "succeeded"
    attempt = StepAttempt.objects.get(task_id=enqueued.id, kind=AttemptKind.STEP)
    assert attempt.started_at >= run_after
    assert task_functions.add.get_result(enqueued.id).task.run_after == run_after


def test_a_stray_delivery_before_run_after_does_not_start_the_task_and_keeps_it_waiting():
    run_after = db_now() + timedelta(minutes=5)
    enqueued = task_functions.add.using(run_after=run_after).enqueue(1, 1)
    # A duplicate job of the task (or one an operator re-queued) reaches a worker long before its time.
    assert run(enqueued) == "skipped"
    row = Task.objects.get(pk=enqueued.id)
    assert (row.state, row.wait_for, row.retry_at, row.total_attempts) == (
        TaskState.WAITING,
        WaitKind.START,
        run_after,
        0,
    )
    assert not StepAttempt.objects.filter(task_id=enqueued.id).exists()


def test_priority_picks_the_engine_queue_and_queue_name_is_kept():
    high = task_functions.add.using(priority=10).enqueue(1, 1)
    low = task_functions.add.using(priority=-1, queue_name="reports").enqueue(1, 1)
    assert Task.objects.get(pk=high.id).pipeline == "django_task_default_critical"
    assert Task.objects.get(pk=low.id).pipeline == "django_task_default_bulk"
    assert (get_queue("critical").count, get_queue("default").count, get_queue("bulk").count) == (1, 0, 1)
    result = task_functions.add.get_result(low.id)
    assert (result.task.priority, result.task.queue_name) == (-1, "reports")


def test_an_async_task_runs_and_the_async_api_answers():
    enqueued = async_to_sync(task_functions.add_async.aenqueue)(2, 5)
    assert run(enqueued) == "succeeded"
    result = async_to_sync(task_functions.add_async.aget_result)(enqueued.id)
    assert result.return_value == 7


def test_options_set_the_retry_policy_timeout_and_deadline(settings):
    options = {"MAX_ATTEMPTS": 2, "TIMEOUT_SECONDS": 7.5, "DEADLINE_SECONDS": 60}
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": options}}
    backend = task_backends["default"]
    pipeline = backend.pipelines["default"]
    assert pipeline.retry.max_attempts == 2 and pipeline.default_step_timeout == 7.5
    enqueued = task_functions.add.enqueue(1, 1)
    row = Task.objects.get(pk=enqueued.id)
    assert timedelta(seconds=59) < row.deadline - row.created_at <= timedelta(seconds=61)


@pytest.mark.parametrize(
    ("options", "named"),
    [({"MAX_ATEMPTS": 3}, "'MAX_ATEMPTS'"), ({"TIMEOUT_SECONDS": -1}, "'TIMEOUT_SECONDS'"), ("3", "OPTIONS")],
)
def test_an_unknown_or_wrong_option_is_the_frameworks_error_naming_it(settings, options, named):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": options}}
    with pytest.raises(InvalidTaskBackendError, match=named):
        task_functions.add.enqueue(1, 1)
    assert not Task.objects.exists()


def test_bad_calls_are_the_frameworks_errors_and_store_nothing():
    with pytest.raises(TypeError, match="Unsupported type"):
        task_functions.add.enqueue(object(), 1)
    with pytest.raises(InvalidTask, match="priority"):
        task_functions.add.using(priority=101)
    with pytest.raises(InvalidTask, match="Queue"):
        task_functions.add.using(queue_name="elsewhere")
    with pytest.raises(InvalidTaskInput):
        task_functions.add.enqueue("nul \x00 inside", 1)
    assert not Task.objects.exists() and jobs_waiting() == 0


@pytest.mark.parametrize("path", ["tests.task_functions.not_a_task", "os.system", "tests.no_such_module.add", "add", 3])
def test_only_tasks_of_this_backend_are_accepted_by_its_pipelines(path):
    call = {"task": path, "args": [], "kwargs": {}, "priority": 0, "queue_name": "default", "run_after": None}
    with pytest.raises(InvalidTaskInput):
        task_submit(pipeline="django_task_default_default", input=call)
    assert not Task.objects.exists()


def test_an_unknown_or_foreign_result_id_does_not_exist():
    other = task_submit(pipeline="t_local", input={})
    backend = task_backends["default"]
    assert isinstance(backend, ReliabilityBackend)
    for result_id in ("not-a-uuid", "7d3a2b4e-0000-4000-8000-000000000000", str(other.pk)):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result_id)
