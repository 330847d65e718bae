"""A step on ctx.http whose last answer was a 5xx may have acted: compensation covers it; a 4xx refusal did not act.

Issue #13, point 2: "5xx and 408 mark the effect uncertain, so compensation covers that step". In-process runs
(``task_run``) on PostgreSQL against the report-platform simulator over real HTTP.
"""

from __future__ import annotations

import pytest

from tasks.execution.context import effect_key
from tasks.execution.runner import task_run
from tasks.models import AttemptKind, EffectStatus, SideEffect, StepAttempt, Task
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

CHARGE_STEP = "http_pay_charge"  # tests/pipelines.py, t_http_pay: 3 attempts, compensate


def run_to_the_end(task_id: str) -> str:
    # Each retry is due 0.1-0.2 s later; a run that arrives early waits for it (at most 5 s).
    for _ in range(10):
        outcome = task_run(task_id=task_id, worker="w1")
        if outcome != "retry_scheduled":
            return outcome
    raise AssertionError("the task did not finish in 10 runs")


def charge_answered(platform, status: int) -> Task:
    """A t_http_pay task whose charge gets ``status`` on each of its 3 attempts, run to its end."""
    task = task_submit(pipeline="t_http_pay", input={"user_id": f"u-{status}"})
    platform.set_faults(
        rules=[{"path_prefix": "/v1/quota/charges", "task_id": str(task.pk), "status": status, "times": 3}]
    )
    assert run_to_the_end(str(task.pk)) == "compensated"
    task.refresh_from_db()
    return task


def test_a_charge_whose_attempts_all_got_a_503_is_compensated(platform, clean_redis):
    task = charge_answered(platform, 503)
    assert (task.failure_reason, task.failure_code) == ("attempts_exhausted", "http_503")
    charge_key = effect_key(task.pk, 0, CHARGE_STEP, "charge")
    # The 503s left the charge uncertain: the ledger names it and its compensation ran (and undid it).
    assert list(SideEffect.objects.filter(task=task).values_list("step_name", "effect_key", "status")) == [
        (CHARGE_STEP, charge_key, EffectStatus.COMPENSATED)
    ]
    compensations = StepAttempt.objects.filter(task=task, kind=AttemptKind.COMPENSATION)
    assert list(compensations.values_list("step_name", "outcome")) == [(CHARGE_STEP, "succeeded")]
    refunds = [call for call in platform.calls(task_id=str(task.pk)) if call["kind"] == "refund" and call["effect"]]
    assert len(refunds) == 1


def test_a_charge_refused_with_a_409_is_not_compensated(platform, clean_redis):
    # The control: a permanent 4xx is a refusal before any work, so there is nothing to undo.
    task = charge_answered(platform, 409)
    assert (task.failure_reason, task.failure_code) == ("permanent_error", "http_409")
    assert not SideEffect.objects.filter(task=task).exists()
    assert not StepAttempt.objects.filter(task=task, kind=AttemptKind.COMPENSATION).exists()


def test_a_step_whose_first_call_acted_and_second_was_refused_is_compensated(platform, clean_redis):
    # The charge answered 201, the report 409: the step failed for good after an effect the far side
    # confirmed, so its compensation runs (and, without the step's output, learns the charge by replaying it).
    task = task_submit(pipeline="t_http_two_calls", input={"user_id": "u-two-calls"})
    platform.set_faults(rules=[{"path_prefix": "/v1/reports", "task_id": str(task.pk), "status": 409, "times": 1}])
    assert run_to_the_end(str(task.pk)) == "compensated"
    charge_key = effect_key(task.pk, 0, "charge_then_report", "charge")
    assert list(SideEffect.objects.filter(task=task).values_list("effect_key", "status")) == [
        (charge_key, EffectStatus.COMPENSATED)
    ]
    refunds = [call for call in platform.calls(task_id=str(task.pk)) if call["kind"] == "refund" and call["effect"]]
    assert len(refunds) == 1
