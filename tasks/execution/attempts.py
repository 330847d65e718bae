"""One attempt: run a step, a compensation or the failure notice under a time limit, classify it, record it.

The step runner and the compensation runner both go through ``attempt_run``,
so a timeout, a transient and a permanent error mean the same thing whatever
was attempted. It writes nothing: the caller decides (retry or not) and hands
the ``AttemptRecord`` to ``tasks.lifecycle.outcomes``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import InterfaceError, OperationalError
from django.utils import timezone

from tasks.exceptions import LeaseLost, StepCancelled, StepTimeout
from tasks.execution.classify import Classification, classify
from tasks.execution.context import StepContext
from tasks.execution.timeouts import time_limit
from tasks.models import AttemptKind, AttemptOutcome, StepAttempt, Task
from tasks.observability import tracing
from tasks.observability.attempt_log import LogLine, capture_installed
from tasks.observability.log_fields import AttemptScope, current_attempt
from tasks.redaction import task_redactor

# Raised through an attempt, never recorded as its failure: a lost lease, or
# the database gone mid-attempt. Nothing can be written now; the lease
# expires and the sweeper hands the task to a worker again.
NOT_AN_ATTEMPT_FAILURE = (LeaseLost, OperationalError, InterfaceError)
# Error codes of an attempt that ran out of time (its own limit, or a client timeout).
TIMEOUT_CODES = frozenset({StepTimeout.code, "timeout"})
TRACEBACK_FRAMES = 20


@dataclass(frozen=True)
class AttemptRecord:
    """What one attempt did, ready to be written."""

    kind: str
    step_index: int
    step_name: str
    attempt: int
    worker: str
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    error: Classification | None = None
    traceback: str = ""
    retry_delay: float | None = None
    # What the step logged meanwhile (tasks.observability.attempt_log): the lines kept, and how many past the limits
    # were not.
    log: tuple[LogLine, ...] = ()
    log_dropped: int = 0
    # The W3C traceparent of a failed attempt's span when traced (tasks.observability.tracing): its retry's span links
    # to it.
    traceparent: str = ""

    def row(self, task: Task) -> StepAttempt:
        """The attempt's row, its error message, traceback and log redacted (``tasks.redaction``)."""
        return StepAttempt(**self.values(task))

    def values(self, task: Task) -> dict[str, Any]:
        """The attempt row's field values (``row`` without a model instance: a step's write needs only these)."""
        error = self.error
        redactor = task_redactor(task)
        return dict(
            task_id=task.pk,
            kind=self.kind,
            generation=task.generation,
            step_index=self.step_index,
            step_name=self.step_name,
            attempt=self.attempt,
            worker=self.worker[:200],
            fencing_token=task.fencing_token,
            started_at=self.started_at,
            finished_at=self.finished_at,
            outcome=self.outcome,
            error_code=error.code[:100] if error else "",
            error_class=error.error_class[:200] if error else "",
            error_message=redactor.text(error.message) if error else "",
            traceback=redactor.text(self.traceback),
            retry_delay_seconds=self.retry_delay,
            retry_after_seconds=error.retry_after if error else None,
            log=[{**line.as_json(), "message": redactor.text(line.message)} for line in self.log] or None,
            log_dropped=self.log_dropped,
        )


@dataclass(frozen=True)
class AttemptResult:
    record: AttemptRecord
    value: Any = None

    @property
    def error(self) -> Classification | None:
        return self.record.error


def attempt_outcome(error: Classification) -> str:
    """The outcome an attempt that failed with ``error`` is recorded with."""
    if error.code in TIMEOUT_CODES:
        return AttemptOutcome.TIMEOUT
    if error.code == StepCancelled.code and not error.transient:
        return AttemptOutcome.CANCELLED
    return AttemptOutcome.TRANSIENT_ERROR if error.transient else AttemptOutcome.PERMANENT_ERROR


def attempt_run(
    function: Callable[[StepContext], Any],
    ctx: StepContext,
    *,
    kind: str,
    step_index: int,
    worker: str,
    timeout: float,
    transient_errors: tuple[type[BaseException], ...] = (),
) -> AttemptResult:
    """Run ``function(ctx)`` within ``timeout`` seconds and return what it returned or how it failed.

    Whatever it raises is classified (transient or permanent, with a code),
    except a lost lease or a database outage, which propagate. A step (not a
    compensation or the notice) is interrupted when its task is cancelled
    (``tasks.execution.interrupts``): the outcome ``cancelled``. Every line logged
    meanwhile in this thread carries the attempt's ids (``tasks.observability.log_fields``),
    and what the step logged is kept with the record (``tasks.observability.attempt_log``).
    With tracing on, the attempt is a span (``tasks.observability.tracing``).
    """
    tracer = tracing.active
    if tracer is not None:
        return tracer.attempt_traced(_attempt_run, function, ctx, kind, step_index, worker, timeout, transient_errors)
    return _attempt_run(function, ctx, kind, step_index, worker, timeout, transient_errors)


def _attempt_run(
    function: Callable[[StepContext], Any],
    ctx: StepContext,
    kind: str,
    step_index: int,
    worker: str,
    timeout: float,
    transient_errors: tuple[type[BaseException], ...],
) -> AttemptResult:
    started_at = timezone.now()
    capture_installed()
    scope = AttemptScope(
        task_id=ctx.task_id,
        pipeline=ctx.pipeline,
        step=ctx.step,
        attempt=ctx.attempt,
        kind=kind,
        input=ctx.input,
        step_index=step_index,
    )

    def record(outcome: str, error: Classification | None = None, tb: str = "") -> AttemptRecord:
        log = scope.log
        return AttemptRecord(
            kind=kind,
            step_index=step_index,
            step_name=ctx.step,
            attempt=ctx.attempt,
            worker=worker,
            started_at=started_at,
            finished_at=timezone.now(),
            outcome=outcome,
            error=error,
            traceback=tb,
            log=tuple(log.lines) if log is not None else (),
            log_dropped=log.dropped if log is not None else 0,
        )

    token = current_attempt.set(scope)
    try:
        with time_limit(timeout, f"{kind} {ctx.step!r}", task_id=ctx.task_id if kind == AttemptKind.STEP else None):
            value = function(ctx)
    except NOT_AN_ATTEMPT_FAILURE:
        raise
    except (Exception, StepTimeout, StepCancelled) as exc:
        error = classify(exc, transient_errors)
        return AttemptResult(record(attempt_outcome(error), error, traceback.format_exc(limit=TRACEBACK_FRAMES)))
    finally:
        current_attempt.reset(token)
    return AttemptResult(record(AttemptOutcome.SUCCEEDED), value)
