"""Batches on real workers: several tasks per RQ job, each claimed on its own, none lost with a killed worker, none
holding up a critical task, none breaking its pipeline's limits."""

from __future__ import annotations

import pytest
from django.conf import settings
from redis import Redis
from rq import Worker

from tasks.models import AttemptKind, StepAttempt, Task, TaskState
from tasks.submission.batches import task_submit_many
from tasks.submission.submit import task_submit
from tests.support import attempt_intervals, most_at_once, pid_of_owner, wait_for, work_intervals

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]


def _succeeded(ids) -> int:
    return Task.objects.filter(pk__in=ids, state=TaskState.SUCCEEDED).count()


def test_a_batch_runs_several_tasks_per_job(start_workers):
    ids = [o.task_id for o in task_submit_many([{"pipeline": "t_quiet_1", "input": {"n": n}} for n in range(50)])]
    pool = start_workers(2)
    redis = Redis.from_url(settings.REDIS_URL)

    wait_for(lambda: _succeeded(ids) == 50, timeout=60, message="the batch's 50 tasks to succeed")
    # Submitted with the default delivery size (20): 50 tasks in 3 jobs, as RQ counts them.
    wait_for(
        lambda: sum(worker.successful_job_count for worker in Worker.all(connection=redis)) == 3,
        timeout=30,
        message="the workers to count 3 jobs",
    )
    assert Task.objects.filter(pk__in=ids, total_attempts=1).count() == 50, pool.logs()


def test_a_worker_killed_in_the_middle_of_a_batch_loses_no_task(start_workers, start_sweeper):
    outcomes = task_submit_many([{"pipeline": "t_long", "input": {"seconds": 1, "n": n}} for n in range(6)])
    ids = [outcome.task_id for outcome in outcomes]
    pool = start_workers(1, replace_dead=True)
    start_sweeper()

    # The one worker took the batch's job: once its second task runs, it dies.
    second = wait_for(
        lambda: Task.objects.filter(pk=ids[1], state=TaskState.RUNNING).first(), timeout=30, message="task 2 to run"
    )
    pool.by_pid(pid_of_owner(second.lease_owner)).kill()

    wait_for(lambda: _succeeded(ids) == 6, timeout=90, interval=0.2, message="every task of the batch to succeed")
    rows = {task.pk: task for task in Task.objects.filter(pk__in=ids)}
    assert rows[ids[0]].total_attempts == 1  # done before the kill
    assert rows[ids[1]].crash_count == 1  # its lease expired and it ran again
    # The rest never started in the dead worker: delivered again each on its own, one attempt each.
    assert all(rows[task_id].total_attempts == 1 and rows[task_id].batch_job == "" for task_id in ids[2:]), pool.logs()


def _step_starts(ids) -> list:
    return list(StepAttempt.objects.filter(task_id__in=ids, kind=AttemptKind.STEP).values_list("started_at", flat=True))


def test_a_critical_task_submitted_while_a_worker_runs_a_bulk_batch_starts_before_the_batchs_rest(start_workers):
    # One job of 20 tasks of 0.2 s on the bulk queue, and one worker: without the hand-back the critical task
    # would wait for all 20 (4 s).
    batch = [{"pipeline": "t_bulk", "input": {"n": n, "seconds": 0.2}} for n in range(20)]
    ids = [outcome.task_id for outcome in task_submit_many(batch)]
    pool = start_workers(1)
    wait_for(
        lambda: Task.objects.filter(pk=ids[0], state=TaskState.RUNNING).exists(),
        timeout=60,
        interval=0.02,
        message="the batch's first task to run",
    )
    critical = task_submit(pipeline="t_critical", input={})
    started_by_then = len(_step_starts(ids))

    wait_for(lambda: _succeeded([critical.pk, *ids]) == 21, timeout=60, message="the critical task and the batch")
    critical_start = StepAttempt.objects.get(task=critical).started_at
    before = sum(start < critical_start for start in _step_starts(ids))
    # The batch hands back after the task in hand (or, between two tasks at the submission, after the next one).
    assert before <= started_by_then + 1 < len(ids), pool.logs()[-3000:]
    # The rest was handed back, each task delivered on its own, and ran after the critical one, once each.
    assert Task.objects.filter(pk__in=ids, batch_job="").count() == len(ids) - before
    assert Task.objects.filter(pk__in=ids, total_attempts=1).count() == len(ids)


def test_a_pipelines_concurrency_limit_holds_for_the_tasks_of_a_batch(start_workers, platform, settings):
    # t_live_limited: max_concurrency 2. Four batch jobs of five on three workers: three jobs at once, each claiming
    # its tasks in turn; those over the limit are held, and released each on its own as slots free (no sweeper).
    settings.RELIABILITY_BATCH_DELIVERY_SIZE = 5
    pool = start_workers(3)
    wait_for(
        lambda: len(Worker.all(connection=Redis.from_url(settings.REDIS_URL))) == 3, timeout=60, message="3 workers"
    )
    ids = [
        str(outcome.task_id)
        for outcome in task_submit_many(
            [{"pipeline": "t_live_limited", "input": {"n": n, "ms": 150}} for n in range(20)]
        )
    ]
    assert Task.objects.filter(pk__in=ids).values("batch_job").distinct().count() == 4
    held_seen = []

    def all_done() -> bool:
        held_seen.append(Task.objects.filter(pk__in=ids, hold="concurrency").count())
        return _succeeded(ids) == 20

    wait_for(all_done, timeout=90, interval=0.1, message="the batch's 20 tasks to succeed")
    # Never more than two at once, at the platform and in the attempts the workers recorded, and two were reached.
    assert most_at_once(work_intervals(ids, platform)) == 2, pool.logs()[-3000:]
    assert most_at_once(attempt_intervals(ids)) == 2
    # The limit held tasks of the batches back, and each ran once: a hold uses no attempt.
    assert max(held_seen) > 0
    assert list(Task.objects.filter(pk__in=ids).values_list("total_attempts", flat=True)) == [1] * 20
