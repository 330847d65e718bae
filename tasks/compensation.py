"""Compensation: undo, in reverse order, the effects of steps that ran, then tell the user.

Runs after a task's deadline too (the deadline stops forward progress, not
clean-up): each compensation and the failure notice get their own timeout and
their own bounded retries. A compensation recorded as done never runs again.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from django.conf import settings

from tasks import registry
from tasks.attempts import attempt_run
from tasks.context import StepContext
from tasks.exceptions import UnknownPipeline
from tasks.leases import Claim
from tasks.models import AttemptKind, AttemptOutcome, EffectStatus, SideEffect, StepAttempt, Task
from tasks.outcomes import compensation_attempt_recorded, compensation_finished
from tasks.pipelines import Pipeline, StepFunction
from tasks.retry import RetryPolicy

logger = logging.getLogger(__name__)

FAILURE_NOTICE_STEP_INDEX = -1
FAILURE_NOTICE_STEP_NAME = "on_failure"


def run_compensation(claim: Claim) -> None:
    """Compensate the claimed COMPENSATING task and move it to COMPENSATED or COMPENSATION_FAILED."""
    task = claim.task
    try:
        pipeline = registry.get(task.pipeline)
    except UnknownPipeline as exc:
        compensation_finished(task=task, errors=[exc.message])
        return
    done = completed_compensations(task)
    targets = set(claim.outputs) | uncertain_step_indexes(task)
    errors: list[str] = []
    for index in sorted(targets, reverse=True):
        if index >= len(pipeline.steps):
            continue
        step = pipeline.steps[index]
        if step.compensate is None or (AttemptKind.COMPENSATION, index) in done:
            continue
        error = _attempt_with_retries(
            claim,
            pipeline,
            kind=AttemptKind.COMPENSATION,
            index=index,
            name=step.name,
            function=step.compensate,
            output=claim.outputs.get(index),
            timeout=step.compensation_timeout or settings.RELIABILITY_COMPENSATION_TIMEOUT_SECONDS,
            policy=step.compensation_retry,
        )
        if error:
            errors.append(f"compensation of {step.name!r} failed: {error}")
    if pipeline.on_failure is not None and (AttemptKind.FAILURE_NOTICE, FAILURE_NOTICE_STEP_INDEX) not in done:
        error = _attempt_with_retries(
            claim,
            pipeline,
            kind=AttemptKind.FAILURE_NOTICE,
            index=FAILURE_NOTICE_STEP_INDEX,
            name=FAILURE_NOTICE_STEP_NAME,
            function=pipeline.on_failure,
            output=None,
            timeout=pipeline.on_failure_timeout or settings.RELIABILITY_COMPENSATION_TIMEOUT_SECONDS,
            policy=pipeline.retry,
        )
        if error:
            errors.append(f"failure notice failed: {error}")
    compensation_finished(task=task, errors=errors)


def _attempt_with_retries(
    claim: Claim,
    pipeline: Pipeline,
    *,
    kind: str,
    index: int,
    name: str,
    function: StepFunction,
    output,
    timeout: float,
    policy: RetryPolicy,
) -> str:
    """Run ``function`` until it succeeds or its policy gives up; return "" or the last error."""
    task = claim.task
    failure = {
        "reason": task.failure_reason,
        "code": task.failure_code,
        "message": task.failure_message,
        "step": task.failed_step,
    }
    outputs = {s.name: claim.outputs.get(i) for i, s in enumerate(pipeline.steps) if i in claim.outputs}
    compensated_step = index if kind == AttemptKind.COMPENSATION else None
    attempt = 0
    while True:
        attempt += 1
        ctx = StepContext(
            task_id=task.pk,
            pipeline=task.pipeline,
            step=name,
            input=task.input,
            outputs=outputs,
            deadline=task.deadline,
            call_deadline=time.time() + timeout,
            attempt=attempt,
            generation=task.generation,
            output=output,
            failure=failure,
        )
        result = attempt_run(
            function,
            ctx,
            kind=kind,
            step_index=index,
            worker=claim.owner,
            timeout=timeout,
            transient_errors=policy.transient_errors,
        )
        error = result.error
        if error is None:
            compensation_attempt_recorded(claim=claim, record=result.record, compensated_step=compensated_step)
            return ""
        decision = policy.decide(attempt=attempt, error=error, now=time.time(), deadline=None)
        record = dataclasses.replace(result.record, retry_delay=decision.delay if decision.retry else None)
        compensation_attempt_recorded(claim=claim, record=record, compensated_step=None)
        logger.warning(
            "compensation attempt failed",
            extra={
                "event": "compensation_attempt_failed",
                "task_id": str(task.pk),
                "step": name,
                "attempt": attempt,
                "error_code": error.code,
            },
        )
        if not decision.retry:
            return f"{error.code}: {error.message}"
        # Compensation retries wait in-process: the lease (kept alive by
        # the heartbeat) keeps another worker from doing the same undo.
        time.sleep(decision.delay)


def completed_compensations(task: Task) -> set[tuple[str, int]]:
    """(kind, step index) of compensations and notices already done for this generation."""
    return set(
        StepAttempt.objects.filter(
            task_id=task.pk,
            generation=task.generation,
            kind__in=[AttemptKind.COMPENSATION, AttemptKind.FAILURE_NOTICE],
            outcome=AttemptOutcome.SUCCEEDED,
        ).values_list("kind", "step_index")
    )


def uncertain_step_indexes(task: Task) -> set[int]:
    """Steps whose last attempt may have acted on the far side (timeout, crash, 5xx)."""
    return set(
        SideEffect.objects.filter(
            task_id=task.pk, generation=task.generation, status=EffectStatus.UNCERTAIN
        ).values_list("step_index", flat=True)
    ) | set(
        StepAttempt.objects.filter(
            task_id=task.pk,
            generation=task.generation,
            kind=AttemptKind.STEP,
            outcome__in=[AttemptOutcome.TIMEOUT, AttemptOutcome.CRASHED],
            step_index=task.current_step,
        ).values_list("step_index", flat=True)
    )
