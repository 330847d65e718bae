"""Compensation: undo, in reverse order, the effects of steps that ran, then tell the user.

Runs after a task's deadline too (the deadline stops forward progress, not
clean-up): each compensation and the failure notice get their own timeout and
their own bounded retries. A compensation recorded as done never runs again.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from tasks import registry
from tasks.conf import engine_settings
from tasks.exceptions import UnknownPipeline
from tasks.execution.attempts import attempt_run
from tasks.execution.claim import Claim
from tasks.execution.compensation_plan import CompensationTarget, compensation_targets, completed_compensations
from tasks.execution.context import StepContext
from tasks.lifecycle.outcomes import compensation_attempt_recorded, compensation_finished
from tasks.models import AttemptKind, Task
from tasks.observability.log_fields import task_fields
from tasks.pipelines.pipeline import Pipeline, Step, StepFunction
from tasks.pipelines.retry import RetryPolicy

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
    declared = {step.name: step for step in pipeline.steps}
    errors: list[str] = []
    for target in compensation_targets(task):
        step = declared.get(target.name)
        if step is None or step.compensate is None:
            # The pipeline changed since the step ran (tasks.pipelines.changes):
            # an undo it declared then cannot run now. Say so, rather than skip it.
            problem = _missing_compensation(task, target, step)
            if problem:
                errors.append(problem)
            continue
        if (AttemptKind.COMPENSATION, step.name) in done:
            continue
        error = _attempt_with_retries(
            claim,
            pipeline,
            kind=AttemptKind.COMPENSATION,
            index=target.index,
            name=step.name,
            function=step.compensate,
            output=claim.outputs.get(step.name),
            timeout=step.compensation_timeout or engine_settings.COMPENSATION_TIMEOUT_SECONDS,
            policy=step.compensation_retry,
        )
        if error:
            errors.append(f"compensation of {step.name!r} failed: {error}")
    # A cancelled task was stopped on purpose: its undo runs, but the failure notice is for failures.
    notice = pipeline.on_failure is not None and not task.is_cancelled
    if notice and (AttemptKind.FAILURE_NOTICE, FAILURE_NOTICE_STEP_NAME) not in done:
        error = _attempt_with_retries(
            claim,
            pipeline,
            kind=AttemptKind.FAILURE_NOTICE,
            index=FAILURE_NOTICE_STEP_INDEX,
            name=FAILURE_NOTICE_STEP_NAME,
            function=pipeline.on_failure,
            output=None,
            timeout=pipeline.on_failure_timeout or engine_settings.COMPENSATION_TIMEOUT_SECONDS,
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
    outputs = dict(claim.outputs)
    compensated_step = name if kind == AttemptKind.COMPENSATION else None
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
                **task_fields(task, step_index=record.step_index, step=name, attempt=attempt),
                "error_code": error.code,
            },
        )
        if not decision.retry:
            return f"{error.code}: {error.message}"
        # Compensation retries wait in-process: the lease (kept alive by
        # the heartbeat) keeps another worker from doing the same undo.
        time.sleep(decision.delay)


def _missing_compensation(task: Task, target: CompensationTarget, step: Step | None) -> str:
    """Why ``target`` cannot be undone as it should ("" when it needs no undo)."""
    if step is None and target.had_compensation is not False:
        return (
            f"step {target.name!r} ran but is no longer in pipeline {task.pipeline!r}: "
            "its compensation cannot run (undo its effects by hand, then close the dead letter)"
        )
    if step is not None and target.had_compensation:
        return (
            f"step {target.name!r} declared a compensation when it ran, but pipeline {task.pipeline!r} "
            "no longer declares one (undo its effects by hand, then close the dead letter)"
        )
    return ""
