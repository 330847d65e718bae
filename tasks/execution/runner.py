"""Run a claimed task's remaining steps in order, inside one RQ job.

The runner applies the policies (retry, timeout, deadline, failure policy);
each attempt runs through ``tasks.execution.attempts`` and every outcome is written by
``tasks.lifecycle.outcomes`` in one transaction. No Redis round trip happens between
two steps of a task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from tasks import registry
from tasks.conf import engine_settings
from tasks.exceptions import LeaseLost, PermanentError, UnknownPipeline
from tasks.execution import compensation, gates
from tasks.execution.attempts import attempt_run
from tasks.execution.claim import Claim
from tasks.execution.classify import Classification
from tasks.execution.context import StepContext
from tasks.execution.heartbeat import Heartbeat
from tasks.execution.waits import wait_attempt
from tasks.json_text import unstorable_json
from tasks.lifecycle.claims import task_claim
from tasks.lifecycle.fenced_writes import NO_SIGNALS
from tasks.lifecycle.holds import task_hold
from tasks.lifecycle.outcomes import (
    step_retry_scheduled,
    step_succeeded,
    task_cancelled,
    task_failed,
    task_steps_redeclared,
)
from tasks.lifecycle.waits import task_waits
from tasks.models import AttemptKind, AttemptOutcome, FailureReason, TaskHold, TaskState
from tasks.observability import tracing
from tasks.observability.log_fields import task_fields
from tasks.pipelines.changes import pipeline_change
from tasks.pipelines.pipeline import FailurePolicy, Pipeline

logger = logging.getLogger(__name__)

DEADLINE_EXCEEDED_CODE = FailureReason.DEADLINE_EXCEEDED.value
PIPELINE_CHANGED_CODE = FailureReason.PIPELINE_CHANGED.value


def task_run(*, task_id: str, worker: str) -> str:
    """Claim ``task_id`` and drive it as far as it goes; return what happened (for logs and tests)."""
    claim = task_claim(task_id=task_id, owner=worker)
    if claim is None:  # the claim logged why (delivery_skipped)
        return "skipped"
    tracer = tracing.active
    if tracer is not None:
        return tracer.run_traced(
            claim, _claimed_run
        )  # the run is a span of the task's trace (tasks.observability.tracing)
    return _claimed_run(claim)


def _claimed_run(claim: Claim) -> str:
    worker = claim.owner
    try:
        with Heartbeat(task_id=claim.task.pk, fencing_token=claim.token, task=claim.task):
            if claim.task.state == TaskState.RUNNING:
                _run_steps(claim)
            if claim.task.state == TaskState.COMPENSATING and claim.task.lease_owner == worker:
                compensation.run_compensation(claim)
    except LeaseLost as exc:
        # A zombie: another worker owns the task now. Stop without writing.
        logger.warning("lease lost", extra={"event": "lease_lost", **task_fields(claim.task), "error": str(exc)})
        return "lease_lost"
    return claim.task.state


def _run_steps(claim: Claim) -> None:
    task = claim.task
    try:
        pipeline = registry.get(task.pipeline)
    except UnknownPipeline as exc:
        error = Classification(False, exc.code, exc.message, f"{UnknownPipeline.__module__}.UnknownPipeline")
        _park(task, FailureReason.PERMANENT_ERROR, error, step_name="")
        return
    if task.is_cancelled:
        # Claimed in a race with its cancel (held, or due for a retry, when it came in): stop before any step.
        _cancel(claim, pipeline, step_not_started=True)
        return
    if not _follows_declaration(claim, pipeline):
        return
    while task.state == TaskState.RUNNING:
        _run_one_attempt(claim, pipeline)
        if task.state == TaskState.RUNNING and _stopped_at_boundary(claim, pipeline):
            return


def _stopped_at_boundary(claim: Claim, pipeline: Pipeline) -> bool:
    """Between two steps: stop for a cancel, wait while the pipeline is paused, or for a rate permit.

    The step's write said whether a cancel or a pause had come in (no round
    trip); a rate-limited pipeline takes a permit for the next step here.
    A task that waits gives back the attempt counted for its next step.
    """
    task = claim.task
    signals = getattr(task, "boundary", NO_SIGNALS)
    if signals.cancel_requested:
        _cancel(claim, pipeline, step_not_started=True)
        return True
    if signals.paused:
        task_hold(task, TaskHold.PAUSED, claim.gate)
        return True
    rate = claim.gate.rate
    if rate is not None:
        wait = gates.rate_permit_take(pipeline=task.pipeline, rate=rate)
        if wait is not None:
            task_hold(task, TaskHold.RATE, claim.gate, wait=wait)
            return True
    return False


def _cancel(claim: Claim, pipeline: Pipeline, *, step_not_started: bool = False, record=None, uncertain=None) -> None:
    task = claim.task
    task_cancelled(
        task=task,
        policy=pipeline.on_cancel,
        record=record,
        uncertain_keys=uncertain,
        keep_lease_for=claim.owner,
        step_not_started=step_not_started,
    )


def _follows_declaration(claim: Claim, pipeline: Pipeline) -> bool:
    """Apply the pipeline-change rule (``tasks.pipelines.changes``): go on, or park the task."""
    task = claim.task
    declared = [step.name for step in pipeline.steps]
    # Checked against the checkpoints (what really ran), not only the recorded
    # names: a task whose pipeline shifted before names were recorded is caught too.
    change = pipeline_change(pipeline=pipeline.name, completed=claim.completed, declared=declared)
    if not change.continues:
        _park(
            task,
            FailureReason.PIPELINE_CHANGED,
            Classification(False, PIPELINE_CHANGED_CODE, change.message, ""),
            step_name=change.step,
        )
        return False
    if task.step_names != declared:
        # Written before names were recorded, or its pipeline gained or changed
        # steps after its completed ones: it goes on as now declared.
        task_steps_redeclared(claim=claim, step_names=declared)
    return True


def _park(task, reason: FailureReason, error: Classification, *, step_name: str) -> None:
    """Fail the task for an operator, whatever the pipeline's policy: no step of it can run as it stands."""
    task_failed(
        task=task,
        policy=FailurePolicy.PARK,
        reason=reason,
        error=error,
        step_index=task.current_step,
        step_name=step_name,
    )


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
            False, DEADLINE_EXCEEDED_CODE, "the task's deadline passed before the step started", "", None
        )
        _fail(claim, pipeline, FailureReason.DEADLINE_EXCEEDED, error, index, step.name)
        return
    timeout = pipeline.timeout_for(step, engine_settings.DEFAULT_STEP_TIMEOUT_SECONDS)
    effective = timeout if deadline is None else min(timeout, deadline - now)
    ctx = StepContext(
        task_id=task.pk,
        pipeline=pipeline.name,
        step=step.name,
        input=task.input,
        outputs={s.name: claim.outputs.get(s.name) for s in pipeline.steps[:index]},
        deadline=task.deadline,
        call_deadline=now + effective,
        attempt=task.step_attempt,
        generation=task.generation,
        search_attributes=pipeline.search_attributes,
    )
    # A transactional step's own writes commit together with its checkpoint,
    # or roll back with its failed attempt; otherwise the checkpoint is
    # written (one statement) after the step returned. The engine's own
    # writes are not the step's: an error in them is not an attempt failure.
    waits = step.sleep is not None or step.wait is not None
    function = wait_attempt(task, step) if waits else lambda ctx: _json_output(step(ctx))
    scope = transaction.atomic() if step.transactional else contextlib.nullcontext()
    with scope:
        result = attempt_run(
            function,
            ctx,
            kind=AttemptKind.STEP,
            step_index=index,
            worker=claim.owner,
            timeout=effective,
            transient_errors=policy.transient_errors,
        )
        if result.error is None and waits and result.value.until is not None:
            # Not over: the task waits without a worker (a signal or the sweeper wakes it).
            task_waits(claim=claim, step=step.name, until=result.value.until, signal=step.wait is not None)
            return
        if result.error is None:
            step_succeeded(
                claim=claim,
                record=result.record,
                output=result.value.output if waits else result.value,
                used_keys=ctx.used_keys,
                is_last=index == len(pipeline.steps) - 1,
                has_compensation=step.compensate is not None,
                attributes=ctx.attribute_changes,
            )
            return
        if step.transactional:
            transaction.set_rollback(True)
    error = result.error
    if result.record.outcome == AttemptOutcome.CANCELLED:
        # Interrupted while it waited: the task is cancelled; what the step used may have acted.
        _cancel(claim, pipeline, record=result.record, uncertain=dict(ctx.used_keys) or None)
        return
    decision = policy.decide(attempt=task.step_attempt, error=error, now=time.time(), deadline=deadline)
    logger.info(
        "step attempt failed",
        extra={
            "event": "step_failed",
            **task_fields(task),
            "error_code": error.code,
            "transient": error.transient,
            "retry": decision.retry,
        },
    )
    if decision.retry:
        record = dataclasses.replace(result.record, retry_delay=decision.delay)
        step_retry_scheduled(claim=claim, record=record, retry_at=timezone.now() + timedelta(seconds=decision.delay))
        return
    # The step's effects that may have happened: all it used when its last answer left that open (a
    # timeout, a lost connection, a 5xx), else those the far side confirmed before the step failed (a
    # charge answered 201, then a second call refused): compensation covers the step either way.
    uncertain = dict(ctx.used_keys) if error.effect_uncertain else (dict(ctx.acted_keys) or None)
    _fail(claim, pipeline, decision.reason, error, index, step.name, result.record, uncertain)


def _fail(claim, pipeline, reason, error, index, step_name, record=None, uncertain_keys=None) -> None:
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


def _json_output(value):
    """A step's output is stored as JSON: reject anything else as a permanent error of the step."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"step output is not JSON-serializable: {exc}", code="output_not_json") from None
    problem = unstorable_json(text, value)
    if problem:
        # PostgreSQL's jsonb cannot hold it: refused here, it is the step's failure, not a failed write.
        raise PermanentError(f"step output holds {problem}, which PostgreSQL cannot store", code="output_not_json")
    return value
