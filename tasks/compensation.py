"""Compensation: undo, in reverse order, the effects of steps that ran, then tell the user.

Runs after a task's deadline too (the deadline stops forward progress, not
clean-up): each compensation and the failure notice get their own timeout and
their own bounded retries. A compensation recorded as done never runs again.
"""

from __future__ import annotations

import logging
import time
import traceback

from django.conf import settings
from django.utils import timezone

from reliability_console.exceptions import LeaseLost, StepTimeout, UnknownPipeline
from tasks import registry
from tasks.classify import classify
from tasks.context import StepContext
from tasks.leases import Claim
from tasks.models import AttemptKind, AttemptOutcome
from tasks.outcomes import (
    AttemptRecord,
    compensation_attempt_recorded,
    compensation_finished,
    completed_compensations,
    uncertain_step_indexes,
)
from tasks.retry import RetryPolicy
from tasks.timeouts import time_limit

logger = logging.getLogger(__name__)

FAILURE_NOTICE_STEP_INDEX = -1
FAILURE_NOTICE_STEP_NAME = "on_failure"


def run_compensation(claim: Claim) -> None:
    """Compensate the claimed COMPENSATING task and move it to COMPENSATED or COMPENSATION_FAILED."""
    task = claim.task
    try:
        pipeline = registry.get(task.pipeline)
    except UnknownPipeline as exc:
        compensation_finished(claim=claim, errors=[exc.message])
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
        timeout = step.compensation_timeout or settings.RELIABILITY_COMPENSATION_TIMEOUT_SECONDS
        error = _attempt_with_retries(
            claim,
            kind=AttemptKind.COMPENSATION,
            index=index,
            name=step.name,
            function=step.compensate,
            output=claim.outputs.get(index),
            timeout=timeout,
            policy=step.compensation_retry,
        )
        if error:
            errors.append(f"compensation of {step.name!r} failed: {error}")
    if pipeline.on_failure is not None and (AttemptKind.FAILURE_NOTICE, FAILURE_NOTICE_STEP_INDEX) not in done:
        timeout = pipeline.on_failure_timeout or settings.RELIABILITY_COMPENSATION_TIMEOUT_SECONDS
        error = _attempt_with_retries(
            claim,
            kind=AttemptKind.FAILURE_NOTICE,
            index=FAILURE_NOTICE_STEP_INDEX,
            name=FAILURE_NOTICE_STEP_NAME,
            function=pipeline.on_failure,
            output=None,
            timeout=timeout,
            policy=pipeline.retry,
        )
        if error:
            errors.append(f"failure notice failed: {error}")
    compensation_finished(claim=claim, errors=errors)


def _attempt_with_retries(claim, *, kind, index, name, function, output, timeout, policy: RetryPolicy) -> str:
    """Run ``function`` until it succeeds or its policy gives up; return "" or the last error."""
    task = claim.task
    failure = {
        "reason": task.failure_reason,
        "code": task.failure_code,
        "message": task.failure_message,
        "step": task.failed_step,
    }
    pipeline = registry.get(task.pipeline)
    outputs = {s.name: claim.outputs.get(i) for i, s in enumerate(pipeline.steps) if i in claim.outputs}
    attempt = 0
    while True:
        attempt += 1
        started_at = timezone.now()

        def record(outcome, error=None, tb="", delay=None, attempt=attempt, started_at=started_at):
            return AttemptRecord(
                kind=kind,
                step_index=index,
                step_name=name,
                attempt=attempt,
                worker=claim.owner,
                started_at=started_at,
                finished_at=timezone.now(),
                outcome=outcome,
                error=error,
                traceback=tb,
                retry_delay=delay,
            )

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
        try:
            with time_limit(timeout, f"{kind} {name!r}"):
                function(ctx)
        except LeaseLost:
            raise
        except (Exception, StepTimeout) as exc:
            error = classify(exc, policy.transient_errors)
            decision = policy.decide(attempt=attempt, error=error, now=time.time(), deadline=None)
            if isinstance(exc, StepTimeout):
                outcome = AttemptOutcome.TIMEOUT
            elif error.transient:
                outcome = AttemptOutcome.TRANSIENT_ERROR
            else:
                outcome = AttemptOutcome.PERMANENT_ERROR
            delay = decision.delay if decision.retry else None
            tb = traceback.format_exc(limit=20)
            compensation_attempt_recorded(claim=claim, record=record(outcome, error, tb, delay), compensated_step=None)
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
            continue
        record_ok = record(AttemptOutcome.SUCCEEDED)
        compensated = index if kind == AttemptKind.COMPENSATION else None
        compensation_attempt_recorded(claim=claim, record=record_ok, compensated_step=compensated)
        return ""
