"""What a waiting step's attempt finds: a sleep (``Pipeline.sleep``) and a wait for a signal (``Pipeline.wait``).

Neither calls code of the step's own but ``until(ctx)``: the attempt decides whether the step is over (its
checkpoint written as any step's, ``output``) or the task waits on without a worker until ``until``
(``tasks.lifecycle.waits``). A wait whose timeout passed without its signal raises ``signal_timeout``, the
step's permanent error. It reads; the runner writes through the door.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from tasks.exceptions import PermanentError
from tasks.models import Signal, Task
from tasks.observability import tracing
from tasks.pipelines.pipeline import SIGNAL_TIMEOUT, Step


@dataclass(frozen=True)
class WaitOutcome:
    """Still waiting until ``until``, or (``until`` None) over, with the step's ``output``."""

    until: datetime | None
    output: Any = None


def wait_attempt(task: Task, step: Step) -> Callable[[Any], WaitOutcome]:
    """The attempt of the waiting step ``step`` of the claimed ``task`` (run through ``tasks.execution.attempts``)."""
    reached_at = timezone.now()
    # The wait begun before this claim (the task was woken, or retried): whether it is over is read on the
    # database's clock, which the claim read and the sweeper wakes by (a worker's clock behind it must not put
    # a woken task back to waiting).
    claimed_at = getattr(task, "db_now", None) or reached_at
    begun_until = task.wait_until

    def sleep(ctx) -> WaitOutcome:
        if begun_until is not None:
            until, now = begun_until, claimed_at
        else:
            until, now = step.sleep.wake_time(ctx, reached_at), timezone.now()
        return _traced(WaitOutcome(until if until > now else None, {"slept_until": until.isoformat()}), "sleep")

    def signal(ctx) -> WaitOutcome:
        received = Signal.objects.filter(task_id=task.pk, name=step.name).values_list("payload", flat=True)[:1]
        if received:
            return _traced(WaitOutcome(None, received[0]), "signal")
        if begun_until is None:
            return _traced(WaitOutcome(reached_at + timedelta(seconds=step.wait.timeout)), "signal")
        if begun_until > claimed_at:
            # Delivered before its timeout (an operator's retry): it waits on.
            return _traced(WaitOutcome(begun_until), "signal")
        tracing.span_event("wait.timed_out", {"wait.kind": "signal", "wait.until": begun_until.isoformat()})
        raise PermanentError(
            f"no signal {step.name!r} came within its timeout of {step.wait.timeout:g} s",
            code=SIGNAL_TIMEOUT,
        )

    return sleep if step.sleep is not None else signal


def _traced(outcome: WaitOutcome, kind: str) -> WaitOutcome:
    """``outcome`` as an event of the attempt's span (tracing on): the task waits on until a time, or its wait is
    over (the sleep's time came, the signal was there)."""
    if outcome.until is not None:
        tracing.span_event("wait.begun", {"wait.kind": kind, "wait.until": outcome.until.isoformat()})
    else:
        tracing.span_event("wait.over", {"wait.kind": kind})
    return outcome
