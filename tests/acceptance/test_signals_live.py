"""An approval pipeline (a step, a wait for the signal ``manager_approval``, a step) on real workers and sweepers:
the approval arriving before the wait is reached and during it, a rejection, a timeout; every worker and the
sweeper SIGKILLed while tasks wait; 1,000 waiting tasks hold no worker."""

from __future__ import annotations

import pytest

from tasks.lifecycle.signals import task_signal
from tasks.models import AttemptKind, Checkpoint, StepAttempt, Task, TaskState, WaitKind
from tasks.submission.batches import BatchItem, task_submit_many
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

SWEEP_INTERVAL = 0.5
APPROVED = {"approved": True, "by": "manager", "reason": "within policy"}
REJECTED = {"approved": False, "by": "manager", "reason": "over the limit"}


def state(task) -> str:
    return Task.objects.get(pk=task.pk).state


def waits_for_its_signal(task) -> bool:
    row = Task.objects.get(pk=task.pk)
    return row.state == TaskState.WAITING and row.wait_for == WaitKind.SIGNAL


def steps_run(task) -> list[str]:
    attempts = StepAttempt.objects.filter(task_id=task.pk, kind=AttemptKind.STEP).order_by("started_at")
    return [attempt.step_name for attempt in attempts]


def test_approvals_before_and_during_the_wait_a_rejection_and_a_timeout_across_kills(
    start_workers, start_sweeper, clean_redis
):
    pool = start_workers(2)
    sweeper = start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
    try:
        # Before: the signal comes while the task has not started (it starts 2 s later).
        early = task_submit(pipeline="t_approval", input={"amount": 1}, run_at=2)
        assert task_signal(task_id=early.pk, name="manager_approval", payload=APPROVED).woke is False
        # During: the task waits when the signal comes; and one rejected while it waits.
        during = task_submit(pipeline="t_approval", input={"amount": 2})
        rejected = task_submit(pipeline="t_approval", input={"amount": 3})
        # No signal: its timeout (1 s) passes, the step fails for good, the pipeline compensates.
        silent = task_submit(pipeline="t_approval_short", input={"amount": 4})
        for task in (during, rejected):
            wait_for(lambda task=task: waits_for_its_signal(task), timeout=30, message="the task to wait")
        # The early task found its signal at the wait and went on: finished before the kill below. Where
        # reaching the two waits takes longer than its 2 s (a slow machine), the kill would otherwise come
        # in the middle of one of its steps, which then runs again: at least once, as it should, but not the
        # "each step once" checked below, which is about waiting tasks.
        wait_for(lambda: state(early) == TaskState.SUCCEEDED, timeout=30, message="the early task to finish")

        # Every worker and the sweeper die while the tasks wait; they come back.
        for worker in pool.live():
            worker.kill()
        sweeper.kill()
        pool.stop()
        pool = start_workers(2)
        start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)

        assert task_signal(task_id=during.pk, name="manager_approval", payload=APPROVED).woke
        assert task_signal(task_id=rejected.pk, name="manager_approval", payload=REJECTED).woke
        for task in (early, during, rejected):
            wait_for(lambda task=task: state(task) == TaskState.SUCCEEDED, timeout=30, message="the task to go on")
        wait_for(lambda: state(silent) == TaskState.COMPENSATED, timeout=30, message="the silent task to compensate")
    except AssertionError:
        print(pool.logs())
        raise

    for task, decision in ((early, APPROVED), (during, APPROVED), (rejected, REJECTED)):
        row = Task.objects.get(pk=task.pk)
        # Each step once, the wait's attempt included: resumed once.
        assert steps_run(task) == ["draft_refund", "manager_approval", "pay_refund"]
        assert row.result == {"paid": decision["approved"], "decision": decision}
        assert Checkpoint.objects.get(task_id=task.pk, step_name="manager_approval").output == decision
    silent_row = Task.objects.get(pk=silent.pk)
    assert (silent_row.failure_code, silent_row.failed_step) == ("signal_timeout", "manager_approval")


def test_a_thousand_waiting_tasks_hold_no_worker(start_workers, start_sweeper, clean_redis):
    pool = start_workers(1)
    start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
    outcomes = task_submit_many([BatchItem(pipeline="t_approval", input={"n": n}) for n in range(1000)])
    ids = [outcome.task_id for outcome in outcomes]
    assert all(ids)
    try:
        wait_for(
            lambda: Task.objects.filter(pk__in=ids, state=TaskState.WAITING).count() == 1000,
            timeout=120,
            message="the 1,000 tasks to wait",
        )
        # The only worker is free: a task submitted now finishes at once.
        plain = task_submit(pipeline="t_local", input={})
        wait_for(lambda: state(plain) == TaskState.SUCCEEDED, timeout=30, message="the plain task to finish")
        for task_id in ids:
            task_signal(task_id=task_id, name="manager_approval", payload=APPROVED)
        wait_for(
            lambda: Task.objects.filter(pk__in=ids, state=TaskState.SUCCEEDED).count() == 1000,
            timeout=120,
            message="the 1,000 tasks to go on",
        )
    except AssertionError:
        print(pool.logs()[-5000:])
        raise
    # Each went on once.
    assert StepAttempt.objects.filter(task_id__in=ids, step_name="pay_refund").count() == 1000
