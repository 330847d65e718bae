"""Django's Tasks framework on real workers and a real sweeper (``tasks.backends.ReliabilityBackend``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from tasks.backends import TaskResultStatus
from tasks.models import AttemptKind, DeadLetter, StepAttempt, Task
from tests import task_functions
from tests.django_tasks_settings import TASKS
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

SETTINGS_MODULE = {"DJANGO_SETTINGS_MODULE": "tests.django_tasks_settings"}


@pytest.fixture(autouse=True)
def reliability_tasks(settings):
    settings.TASKS = TASKS


def finished(task, result_id: str, pool, timeout: float = 60):
    def done():
        result = task.get_result(result_id)
        return result if result.is_finished else None

    try:
        return wait_for(done, timeout=timeout, message=f"task {result_id} to finish")
    except AssertionError:
        print(pool.logs())
        raise


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_tasks_succeed_retry_and_fail_on_real_workers(start_workers):
    pool = start_workers(2, **SETTINGS_MODULE)
    with pytest.raises(RuntimeError), transaction.atomic():
        task_functions.add.enqueue(100, 100)
        raise RuntimeError("rolled back: nothing enqueued")
    added = task_functions.add.enqueue(2, 3)
    flaky = task_functions.flaky_once.enqueue("hello")
    broken = task_functions.broken.enqueue(password="hunter2-very-secret")

    result = finished(task_functions.add, added.id, pool)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"sum": 5}, pool.logs()
    assert result.attempts == 1 and result.worker_ids[0]

    result = finished(task_functions.flaky_once, flaky.id, pool)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "hello on attempt 2"
    assert result.attempts == 2
    assert [error.exception_class_path for error in result.errors] == ["tasks.exceptions.TransientError"]

    result = finished(task_functions.broken, broken.id, pool)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert "hunter2-very-secret" not in result.errors[0].traceback
    assert DeadLetter.objects.filter(task_id=broken.id, resolved_at__isnull=True).count() == 1

    # The rolled-back call left nothing: three tasks, all finished.
    assert Task.objects.count() == 3


def test_run_after_does_not_start_before_its_time(start_workers, start_sweeper):
    pool = start_workers(1, **SETTINGS_MODULE)
    start_sweeper(**SETTINGS_MODULE)
    run_after = db_now() + timedelta(seconds=3)
    delayed = task_functions.add.using(run_after=run_after).enqueue(1, 1)
    now = task_functions.add.enqueue(2, 2)

    assert finished(task_functions.add, now.id, pool).status == TaskResultStatus.SUCCESSFUL
    # On a loaded machine the plain task may finish after run_after: then only the start times below can tell.
    if db_now() < run_after:
        assert not task_functions.add.get_result(delayed.id).is_finished
    result = finished(task_functions.add, delayed.id, pool, timeout=30)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"sum": 2}
    attempt = StepAttempt.objects.get(task_id=delayed.id, kind=AttemptKind.STEP)
    assert attempt.started_at >= run_after and result.started_at >= run_after
