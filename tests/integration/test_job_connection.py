"""A job's database connection (``tasks.delivery.jobs``): no health check while the worker is busy, one after it idled,
and a connection the server dropped between two busy jobs replaced without losing the job."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from devtools import postgres
from tasks import task_submit
from tasks.delivery import jobs
from tasks.models import Task, TaskState
from tests.support import database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


@pytest.fixture
def health_checks(monkeypatch):
    """Each of Django's health checks counted (the check itself runs as it would); the project turns them on."""
    connection.ensure_connection()
    assert connection.health_check_enabled
    checks = []
    real = connection.is_usable

    def is_usable():
        checks.append(time.monotonic())
        return real()

    monkeypatch.setattr(connection, "is_usable", is_usable)
    monkeypatch.setattr(jobs, "_last_job_ended", None)
    return checks


def _run(task: Task | None = None) -> Task:
    task = task or task_submit(pipeline="t_quiet_1", input={})
    assert jobs.run_task(str(task.pk)) == TaskState.SUCCEEDED
    return Task.objects.get(pk=task.pk)


def _idle(monkeypatch) -> None:
    monkeypatch.setattr(jobs, "_last_job_ended", time.monotonic() - jobs.STEADY_USE_SECONDS - 1)


def _drop_the_connection() -> None:
    """The server ends this process's session, as a restart or pg_terminate_backend would."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    admin = postgres.connect(database_url(), autocommit=True)
    try:
        with admin.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

            def gone() -> bool:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
                return cursor.fetchone()[0] == 0

            wait_for(gone, timeout=10, message="the session to end")
    finally:
        admin.close()


def test_a_busy_worker_checks_its_connection_only_after_it_idled(health_checks, monkeypatch):
    _run()
    checks_after_the_first = len(health_checks)
    for _ in range(3):
        _run()
    assert len(health_checks) == checks_after_the_first  # jobs back to back: no SELECT 1 before each

    _idle(monkeypatch)
    _run()
    assert len(health_checks) == checks_after_the_first + 1


def test_a_connection_dropped_while_the_worker_idled_is_found_by_the_check(health_checks, monkeypatch):
    _run()
    task = task_submit(pipeline="t_quiet_1", input={})
    _drop_the_connection()
    _idle(monkeypatch)

    assert _run(task).state == TaskState.SUCCEEDED
    assert health_checks  # the check found it and Django opened a new connection before the claim


def test_a_connection_dropped_between_two_busy_jobs_fails_nothing(health_checks):
    _run()
    task = task_submit(pipeline="t_quiet_1", input={})
    checks = len(health_checks)
    _drop_the_connection()

    # No check before the job: its first statement meets the dropped session, and the job runs again.
    assert _run(task).state == TaskState.SUCCEEDED
    assert len(health_checks) == checks + 1  # the one check made after the error, to tell a dropped connection
