"""Run a claimed task's remaining steps in order, inside one RQ job.

The runner applies the policies (retry, timeout, deadline, failure policy);
every outcome is written by ``tasks.outcomes`` in one transaction. No Redis
round trip happens between two steps of a task.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import traceback
from datetime import timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from reliability_console.exceptions import LeaseLost, PermanentError, StepTimeout, UnknownPipeline
from tasks import compensation, registry
from tasks.classify import Classification, classify
from tasks.context import StepContext
from tasks.leases import Claim, Heartbeat, task_claim
from tasks.models import AttemptKind, AttemptOutcome, TaskState
from tasks.outcomes import AttemptRecord, step_retry_scheduled, step_succeeded, task_failed
from tasks.pipelines import FailurePolicy, Pipeline
from tasks.timeouts import time_limit

logger = logging.getLogger(__name__)


def task_run(*, task_id: str, worker: str) -> str:
    """Claim ``task_id`` and drive it as far as it goes; return what happened (for logs and tests)."""
    claim = task_claim(task_id=task_id, owner=worker)
    if claim is None:
        logger.info("nothing to do", extra={"event": "delivery_skipped", "task_id": task_id, "worker": worker})
        return "skipped"
    try:
        with Heartbeat(task_id=claim.task.pk, fencing_token=claim.token):
            if claim.task.state == TaskState.RUNNING:
                _run_steps(claim)
            if claim.task.state == TaskState.COMPENSATING and claim.task.lease_owner == worker:
                compensation.run_compensation(claim)
    except LeaseLost as exc:
        # A zombie: another worker owns the task now. Stop without writing.
        logger.warning("lease lost", extra={"event": "lease_lost", "task_id": task_id, "error": str(exc)})
        return "lease_lost"
    return claim.task.state


def _run_steps(claim: Claim) -> None:
    task = claim.task
    try:
        pipeline = registry.get(task.pipeline)
    except UnknownPipeline as exc:
        error = Classification(False, exc.code, exc.message, "reliability_console.exceptions.UnknownPipeline")
        task_failed(
            task=task,
            policy=FailurePolicy.PARK,
            reason="permanent_error",
            error=error,
            step_index=task.current_step,
            step_name="",
        )
        return
    while task.state == TaskState.RUNNING:
        _run_one_attempt(claim, pipeline)


def _run_one_attempt(claim: Claim, pipeline: Pipeline) -> None:
    task = claim.task
    index = task.current_step
    step = pipeline.steps[index]
    policy = pipeline.retry_policy_for(step)
    now = time.time()
    deadline = task.deadline.timestamp() if task.deadline else None
    if deadline is not None and now >= deadline:
        # Nothing starts after the deadline: fail before the attempt begins.
        error = Classification(
            False, "deadline_exceeded", "the task's deadline passed before the step started", "", None
        )
        _fail(claim, pipeline, "deadline_exceeded", error, index, step.name, record=None, uncertain_keys=None)
        return
    timeout = pipeline.timeout_for(step, settings.RELIABILITY_DEFAULT_STEP_TIMEOUT_SECONDS)
    effective = timeout if deadline is None else min(timeout, deadline - now)
    ctx = StepContext(
        task_id=task.pk,
        pipeline=pipeline.name,
        step=step.name,
        input=task.input,
        outputs={s.name: claim.outputs.get(i) for i, s in enumerate(pipeline.steps[:index])},
        deadline=task.deadline,
        call_deadline=now + effective,
        attempt=task.step_attempt,
        generation=task.generation,
    )
    started_at = timezone.now()
    is_last = index == len(pipeline.steps) - 1

    def record(outcome: str, error: Classification | None = None, tb: str = "", delay: float | None = None):
        return AttemptRecord(
            kind=AttemptKind.STEP,
            step_index=index,
            step_name=step.name,
            attempt=task.step_attempt,
            worker=claim.owner,
            started_at=started_at,
            finished_at=timezone.now(),
            outcome=outcome,
            error=error,
            traceback=tb,
            retry_delay=delay,
        )

    # A transactional step's own writes commit together with its checkpoint;
    # otherwise the checkpoint is written (one statement) after the step returned.
    scope = transaction.atomic() if step.transactional else contextlib.nullcontext()
    try:
        with scope:
            with time_limit(effective, f"step {step.name!r}"):
                output = _json_output(step(ctx))
            step_succeeded(
                claim=claim,
                record=record(AttemptOutcome.SUCCEEDED),
                output=output,
                used_keys=ctx.used_keys,
                is_last=is_last,
            )
    except (LeaseLost, OperationalError, InterfaceError):
        # A lost lease, or the database gone mid-write: nothing can be recorded
        # now. The lease expires and the sweeper re-queues the task.
        raise
    except (Exception, StepTimeout) as exc:
        error = classify(exc, policy.transient_errors)
        outcome = _outcome_of(exc, error)
        tb = traceback.format_exc(limit=20)
        decision = policy.decide(attempt=task.step_attempt, error=error, now=time.time(), deadline=deadline)
        logger.info(
            "step attempt failed",
            extra={
                "event": "step_failed",
                "task_id": str(task.pk),
                "step": step.name,
                "attempt": task.step_attempt,
                "error_code": error.code,
                "transient": error.transient,
                "retry": decision.retry,
            },
        )
        if decision.retry:
            retry_at = timezone.now() + timedelta(seconds=decision.delay)
            step_retry_scheduled(claim=claim, record=record(outcome, error, tb, decision.delay), retry_at=retry_at)
            return
        uncertain = dict(ctx.used_keys) if error.effect_uncertain else None
        _fail(claim, pipeline, decision.reason, error, index, step.name, record(outcome, error, tb), uncertain)


def _fail(claim, pipeline, reason, error, index, step_name, record, uncertain_keys) -> None:
    task_failed(
        task=claim.task,
        policy=pipeline.failure_policy,
        reason=reason,
        error=error,
        step_index=index,
        step_name=step_name,
        record=record,
        uncertain_keys=uncertain_keys,
        keep_lease_for=claim.owner,
    )


def _outcome_of(exc: BaseException, error: Classification) -> str:
    if isinstance(exc, StepTimeout) or error.code == "timeout":
        return AttemptOutcome.TIMEOUT
    return AttemptOutcome.TRANSIENT_ERROR if error.transient else AttemptOutcome.PERMANENT_ERROR


def _json_output(value):
    """A step's output is stored as JSON: reject anything else as a permanent error of the step."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"step output is not JSON-serializable: {exc}", code="output_not_json") from None
    return value
