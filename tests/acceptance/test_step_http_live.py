"""ctx.http in real worker processes (issue #13, point 1): a step killed mid-POST, and a POST that names no effect.

The platform simulator checks the headers ctx.http must send (X-Task-Id, X-Request-Deadline and, on a mutating
call, Idempotency-Key) and answers with the replay semantics of a real idempotent API.
"""

from __future__ import annotations

import signal

import pytest

from tasks.execution.context import effect_key
from tasks.models import AttemptKind, AttemptOutcome, EffectStatus, SideEffect, StepAttempt, Task
from tasks.submission.submit import task_submit
from tests.support import pid_of_owner, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}


def finished(task_id, pool, timeout: float = 60) -> Task:
    def done():
        task = Task.objects.get(pk=task_id)
        return task if task.state in TERMINAL else None

    try:
        return wait_for(done, timeout=timeout, message=f"task {task_id} to finish")
    except AssertionError:
        print(pool.logs())
        raise


def test_a_step_killed_mid_post_resumes_with_the_same_key_and_is_compensated_when_the_task_fails(
    platform, start_workers, start_sweeper
):
    task = task_submit(pipeline="t_http_pay", input={"user_id": "u-killed"})
    platform.set_faults(
        rules=[
            # The first charge hangs (before the platform acts) until its worker is killed.
            {"path_prefix": "/v1/quota/charges", "task_id": str(task.pk), "hang": 30, "times": 1},
            # The next step is refused for good: the task fails after its charge went through.
            {"path_prefix": "/v1/reports", "user_id": "u-killed", "status": 409, "times": 5},
        ]
    )
    pool = start_workers(2)
    start_sweeper()

    def charge_in_flight():
        current = Task.objects.get(pk=task.pk)
        hanging = not any(rule.get("hang") for rule in platform.faults()["rules"])
        return current if current.state == "running" and current.lease_owner and hanging else None

    running = wait_for(charge_in_flight, timeout=30, message="the charge to be in flight")
    victim = pool.by_pid(pid_of_owner(running.lease_owner))
    assert victim is not None
    victim.kill(signal.SIGKILL)

    task = finished(task.pk, pool)
    assert (task.state, task.failure_code) == ("compensated", "http_409"), pool.logs()
    charge_key = effect_key(task.pk, 0, "http_pay_charge", "charge")
    calls = platform.calls(task_id=str(task.pk))
    charges = [call for call in calls if call["kind"] == "charge"]
    # Every charge the platform saw, before and after the crash and in the compensation's replay, had one key.
    assert charges and {call["idempotency_key"] for call in charges} == {charge_key}
    assert sum(1 for call in charges if call["effect"]) == 1
    refunds = [call for call in calls if call["kind"] == "refund"]
    assert [call["idempotency_key"] for call in refunds if call["effect"]] == [
        effect_key(task.pk, 0, "http_pay_charge", "refund")
    ]
    charge = next(c for c in platform.state()["charges"].values() if c["task_id"] == str(task.pk))
    assert charge["refunded"]
    attempts = list(
        StepAttempt.objects.filter(task=task, kind=AttemptKind.STEP, step_name="http_pay_charge")
        .order_by("attempt")
        .values_list("outcome", flat=True)
    )
    assert attempts == [AttemptOutcome.CRASHED, AttemptOutcome.SUCCEEDED]
    assert (
        pid_of_owner(
            StepAttempt.objects.get(task=task, kind="step", step_name="http_pay_charge", outcome="succeeded").worker
        )
        != victim.pid
    )
    # The ledger holds what ctx.http recorded: the charge, then undone.
    assert list(SideEffect.objects.filter(task=task).values_list("effect_name", "effect_key", "status")) == [
        ("charge", charge_key, EffectStatus.COMPENSATED)
    ]
    assert StepAttempt.objects.filter(task=task, kind=AttemptKind.COMPENSATION, outcome="succeeded").count() == 1


def test_a_post_without_its_effect_fails_the_step_at_once_and_sends_nothing(platform, start_workers):
    pool = start_workers(1)
    task = task_submit(pipeline="t_http_no_effect", input={})
    task = finished(task.pk, pool)
    assert (task.state, task.failure_reason, task.failure_code) == ("failed", "permanent_error", "effect_required")
    assert 'effect="charge"' in task.failure_message and "Idempotency-Key" in task.failure_message
    (attempt,) = task.attempts.all()
    assert (attempt.outcome, attempt.error_class) == ("permanent_error", "tasks.exceptions.EffectRequired")
    assert task.in_dlq and task.dlq_items.get().error_code == "effect_required"
    assert platform.calls(task_id=str(task.pk)) == []
