"""Pause, concurrency and rate limits (issue #14, points 2 and 4) against real workers, a real sweeper and the
platform simulator.

The steps of these pipelines do work at the simulator (``POST /v1/work``),
which records when each piece of work began and ended: the far side's view
of how many ran at once. Where the engine's promise is about its own clock
(a rate limit's permits are stamped by PostgreSQL), the test reads what the
database recorded as well. No wall-clock assertion: every wait polls with a
timeout, and every figure compared is a recorded time.
"""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.db import connection
from rq import Worker

from dlq.models import AuditEntry
from tasks.delivery.enqueue import get_queue, redis_client
from tasks.lifecycle.controls import pipeline_limits_reset, pipeline_limits_set, pipeline_pause, pipeline_resume
from tasks.models import AttemptOutcome, RatePermit, StepAttempt, Task
from tasks.submission.submit import task_submit
from tests.support import attempt_intervals, most_at_once, pid_of_owner, wait_for, work_intervals

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]


def pipeline_audit(pipeline: str) -> list[tuple[str, str, str]]:
    """The audit log's entries for the pipeline, oldest first (the console's receiver of the control signal)."""
    entries = AuditEntry.objects.filter(target_type="pipeline", target_id=pipeline).order_by("created_at", "id")
    return list(entries.values_list("action", "actor", "reason"))


def submit_many(pipeline: str, count: int, **input_) -> list[str]:
    return [str(task_submit(pipeline=pipeline, input={"n": n, **input_}).pk) for n in range(count)]


def all_succeeded(task_ids: list[str], pool, *, timeout: float = 120, on_poll=None) -> None:
    def done():
        if on_poll is not None:
            on_poll()
        return Task.objects.filter(pk__in=task_ids, state="succeeded").count() == len(task_ids)

    try:
        wait_for(done, timeout=timeout, interval=0.1, message=f"{len(task_ids)} tasks to succeed")
    except AssertionError:
        states = sorted(Task.objects.filter(pk__in=task_ids).values_list("state", "hold"))
        print(states, pool.logs()[-6000:])
        raise


def workers_registered(count: int) -> None:
    """Wait until ``count`` workers listen: a limit is only tested when more workers than slots compete."""
    wait_for(lambda: len(Worker.all(connection=redis_client())) == count, timeout=60, message=f"{count} workers")


# --- pause ----------------------------------------------------------------------------------------------------------


def test_tasks_submitted_while_paused_wait_unstarted_all_succeed_after_resume_and_a_deadline_still_runs_out(
    start_workers, start_sweeper, platform
):
    pipeline_pause(pipeline="t_live_work", actor="supervisor:sam", reason="the platform is in maintenance")
    pool = start_workers(2)
    start_sweeper()
    workers_registered(2)
    late = str(task_submit(pipeline="t_live_work", input={"late": True}, deadline=timedelta(seconds=2)).pk)
    task_ids = submit_many("t_live_work", 50)

    # Each delivery reached a worker, whose claim held the task: no job is left for it anywhere.
    wait_for(
        lambda: (
            Task.objects.filter(pk__in=task_ids, state="queued", hold="paused").count() == 50 and get_queue().count == 0
        ),
        timeout=60,
        message="the 50 tasks to be held by the pause",
    )
    held = list(Task.objects.filter(pk__in=task_ids).values_list("state", "hold", "step_attempt", "total_attempts"))
    assert held == [("queued", "paused", 0, 0)] * 50
    assert not StepAttempt.objects.filter(task_id__in=task_ids).exists()
    assert platform.calls() == []

    # Deadlines keep running: the sweeper lets the late task through, and its claim fails it before any step
    # (and, nothing done, there is nothing to compensate: compensation is never held back by a pause).
    failed = wait_for(
        lambda: Task.objects.filter(pk=late, state="compensated").first(),
        timeout=30,
        message="the late task to fail and end",
    )
    assert (failed.failure_reason, failed.failed_step) == ("deadline_exceeded", "work_one")
    assert not StepAttempt.objects.filter(task_id=late).exists()

    # The others still wait, as they were: held, not spun on. No job waits or is scheduled for them, and no
    # worker is busy with them (once the late task's job has returned).
    assert list(Task.objects.filter(pk__in=task_ids).values_list("hold", "total_attempts")) == [("paused", 0)] * 50
    queue = get_queue()
    wait_for(
        lambda: (
            queue.count == 0
            and queue.scheduled_job_registry.count == 0
            and [worker.get_state() for worker in Worker.all(connection=redis_client())] == ["idle", "idle"]
        ),
        timeout=10,
        message="both workers idle, no job for the held tasks",
    )

    pipeline_resume(pipeline="t_live_work", actor="supervisor:sam", reason="maintenance over")
    all_succeeded(task_ids, pool)
    # Each step ran once: the wait used no attempt.
    finished = list(Task.objects.filter(pk__in=task_ids).values_list("hold", "total_attempts"))
    assert finished == [("", 2)] * 50
    assert StepAttempt.objects.filter(task_id__in=task_ids, outcome=AttemptOutcome.SUCCEEDED).count() == 100
    assert len(work_intervals(task_ids, platform)) == 100
    assert pipeline_audit("t_live_work") == [
        ("pipeline_paused", "supervisor:sam", "the platform is in maintenance"),
        ("pipeline_resumed", "supervisor:sam", "maintenance over"),
    ]


# --- concurrency ----------------------------------------------------------------------------------------------------


def test_max_concurrency_two_never_runs_more_than_two_at_once_across_four_workers(start_workers, platform):
    pool = start_workers(4)
    workers_registered(4)
    task_ids = submit_many("t_live_limited", 40, ms=150)
    held_seen = []

    def sample_holds():
        held_seen.append(Task.objects.filter(pk__in=task_ids, hold="concurrency").count())

    all_succeeded(task_ids, pool, on_poll=sample_holds)
    # What the platform saw, and what the workers recorded: never more than two, and two were reached.
    assert most_at_once(work_intervals(task_ids, platform)) == 2
    assert most_at_once(attempt_intervals(task_ids)) == 2
    # The limit held tasks back (the other two workers did not just happen to be slower), without an attempt.
    assert max(held_seen) > 0
    assert list(Task.objects.filter(pk__in=task_ids).values_list("total_attempts", flat=True)) == [1] * 40


def test_a_slot_held_by_a_killed_worker_is_free_again_after_lease_and_sweep(start_workers, start_sweeper, platform):
    # The first work call hangs: the task holding the pipeline's one slot waits there until its worker dies.
    platform.set_faults(rules=[{"path_prefix": "/v1/work", "hang": 60, "times": 1}])
    pool = start_workers(2)
    start_sweeper()
    first = str(task_submit(pipeline="t_live_single", input={"which": "first"}).pk)

    def holding_the_slot():
        task = Task.objects.get(pk=first)
        in_flight = not platform.faults()["rules"]
        return task if task.state == "running" and task.lease_owner and in_flight else None

    running = wait_for(holding_the_slot, timeout=60, message="the first task to hold the slot")
    second = str(task_submit(pipeline="t_live_single", input={"which": "second"}).pk)
    wait_for(
        lambda: Task.objects.filter(pk=second, state="queued", hold="concurrency").exists(),
        timeout=30,
        message="the second task to be held for the slot",
    )
    victim = pool.by_pid(pid_of_owner(running.lease_owner))
    assert victim is not None
    victim.kill(signal.SIGKILL)

    # The lease (3 s) runs out, the sweeper hands the first task on: its slot is free, the held task starts.
    all_succeeded([first, second], pool, timeout=60)
    crash = StepAttempt.objects.get(task_id=first, outcome=AttemptOutcome.CRASHED)
    second_start = StepAttempt.objects.get(task_id=second).started_at
    assert second_start > crash.finished_at
    assert Task.objects.get(pk=second).total_attempts == 1
    assert pid_of_owner(StepAttempt.objects.get(task_id=second).worker) != victim.pid


# --- rate -----------------------------------------------------------------------------------------------------------

RATE = 5  # t_live_rated: rate_limit="5/s"
WINDOW = 1.0
# The engine's promise is on its permits, stamped by PostgreSQL's clock: checked exactly (the permit log). A
# start the worker or the platform recorded comes a little after its permit (the claim's commit, the checkpoint
# read, the HTTP request), by a lag that varies from start to start, so two starts a window apart at the
# database may look closer by the difference of their lags: within 10 ms in our runs, this margin allows 50 ms
# for a loaded 2-core machine (small beside the 200 ms between two starts at the rate).
START_LAG_TOLERANCE = 0.05


@pytest.fixture
def permit_log():
    """Every rate permit the database grants, as it stamps it (a test-only trigger on the permits table)."""
    permits = RatePermit._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_permit_log (pipeline text, slot integer, started_at timestamptz)")
        cursor.execute(
            "CREATE FUNCTION test_permit_logged() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO test_permit_log VALUES (NEW.pipeline, NEW.slot, NEW.started_at); RETURN NEW; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER test_permit_logged AFTER UPDATE OF started_at ON {permits} "
            "FOR EACH ROW EXECUTE FUNCTION test_permit_logged()"
        )

    def read(pipeline: str) -> list[float]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM started_at) FROM test_permit_log WHERE pipeline = %s ORDER BY started_at",
                [pipeline],
            )
            return [float(row[0]) for row in cursor.fetchall()]

    yield read
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER test_permit_logged ON {permits}")
        cursor.execute("DROP FUNCTION test_permit_logged()")
        cursor.execute("DROP TABLE test_permit_log")


def busiest_window(starts: list[float], window: float) -> int:
    """The most starts within any half-open window [t, t + window) that begins at a start."""
    starts = sorted(starts)
    return max(sum(1 for other in starts[index:] if other < start + window) for index, start in enumerate(starts))


def test_a_rate_of_five_per_second_never_starts_more_than_five_steps_in_a_second(
    start_workers, start_sweeper, platform, permit_log
):
    pool = start_workers(4)
    start_sweeper()
    workers_registered(4)
    task_ids = submit_many("t_live_rated", 12)  # 24 step starts: about five seconds at the rate
    all_succeeded(task_ids, pool)

    permits = permit_log("t_live_rated")
    attempts = [start for start, _ in attempt_intervals(task_ids)]
    at_platform = [start / 1000 for start, _ in work_intervals(task_ids, platform)]
    assert len(permits) == len(attempts) == len(at_platform) == 24
    # The database's permits: exactly the limit, and the limit was reached (the test could see a breach).
    assert busiest_window(permits, WINDOW) == RATE
    assert busiest_window(attempts, WINDOW - START_LAG_TOLERANCE) <= RATE
    assert busiest_window(at_platform, WINDOW - START_LAG_TOLERANCE) <= RATE
    # Tasks waiting for a permit used no attempt.
    assert list(Task.objects.filter(pk__in=task_ids).values_list("total_attempts", flat=True)) == [2] * 12


# --- limits changed at runtime --------------------------------------------------------------------------------------


def test_a_supervisors_limit_change_applies_to_the_next_claims_until_reset(start_workers, platform):
    pool = start_workers(4)
    workers_registered(4)
    pipeline_limits_set(
        pipeline="t_live_limited", actor="supervisor:sam", reason="platform struggles", max_concurrency=1
    )
    one_at_a_time = submit_many("t_live_limited", 10, ms=100)
    all_succeeded(one_at_a_time, pool)
    assert most_at_once(work_intervals(one_at_a_time, platform)) == 1

    # Raised above the declared two: more run at once (with four workers, at least three were seen).
    pipeline_limits_set(
        pipeline="t_live_limited", actor="supervisor:sam", reason="platform recovered", max_concurrency=4
    )
    four_at_a_time = submit_many("t_live_limited", 16, ms=300)
    all_succeeded(four_at_a_time, pool)
    assert 3 <= most_at_once(work_intervals(four_at_a_time, platform)) <= 4

    pipeline_limits_reset(pipeline="t_live_limited", actor="supervisor:sam", reason="back to the code's limit")
    declared = submit_many("t_live_limited", 10, ms=150)
    all_succeeded(declared, pool)
    assert most_at_once(work_intervals(declared, platform)) == 2
    assert [action for action, _, _ in pipeline_audit("t_live_limited")] == [
        "pipeline_limits_set",
        "pipeline_limits_set",
        "pipeline_limits_reset",
    ]
