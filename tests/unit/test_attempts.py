"""One attempt runner for steps, compensations and failure notices: one time limit, one classification."""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from django.db import InterfaceError, OperationalError

from tasks.exceptions import LeaseLost, PermanentError, StepTimeout, TransientError
from tasks.execution.attempts import attempt_run
from tasks.execution.context import StepContext
from tasks.models import AttemptKind, AttemptOutcome


def context(step: str = "charge", attempt: int = 2) -> StepContext:
    return StepContext(
        task_id=uuid.uuid4(),
        pipeline="orders",
        step=step,
        input={},
        outputs={},
        deadline=None,
        call_deadline=time.time() + 5,
        attempt=attempt,
        generation=0,
    )


def raising(exc: BaseException):
    def function(ctx):
        raise exc

    return function


def run(function, kind=AttemptKind.STEP, timeout=5.0):
    return attempt_run(function, context(), kind=kind, step_index=3, worker="w1", timeout=timeout)


@pytest.mark.parametrize("kind", [AttemptKind.STEP, AttemptKind.COMPENSATION, AttemptKind.FAILURE_NOTICE])
@pytest.mark.parametrize(
    "exc",
    [StepTimeout("cut"), TransientError("no answer", code="timeout"), requests.Timeout("read timed out")],
    ids=["own limit", "transient code timeout", "client timeout"],
)
def test_a_timeout_is_a_timeout_whatever_was_attempted_and_whatever_raised_it(kind, exc):
    result = run(raising(exc), kind=kind)
    assert result.record.outcome == AttemptOutcome.TIMEOUT
    assert result.error.transient and result.error.effect_uncertain


@pytest.mark.parametrize("kind", [AttemptKind.STEP, AttemptKind.COMPENSATION])
def test_transient_and_permanent_errors_are_recorded_with_their_code(kind):
    transient = run(raising(TransientError("down", code="http_503")), kind=kind)
    permanent = run(raising(PermanentError("refused", code="card_declined")), kind=kind)
    unexpected = run(raising(KeyError("user_id")), kind=kind)
    assert (transient.record.outcome, transient.error.code) == (AttemptOutcome.TRANSIENT_ERROR, "http_503")
    assert (permanent.record.outcome, permanent.error.code) == (AttemptOutcome.PERMANENT_ERROR, "card_declined")
    assert (unexpected.record.outcome, unexpected.error.code) == (AttemptOutcome.PERMANENT_ERROR, "unhandled_exception")
    assert "KeyError" in unexpected.record.traceback


def test_the_time_limit_interrupts_a_blocking_call():
    started = time.monotonic()
    result = run(lambda ctx: time.sleep(5), timeout=0.2)
    assert result.record.outcome == AttemptOutcome.TIMEOUT and result.error.code == StepTimeout.code
    assert time.monotonic() - started < 4


@pytest.mark.parametrize("exc", [LeaseLost("taken over"), OperationalError("server closed"), InterfaceError("closed")])
def test_a_lost_lease_or_a_database_outage_is_not_the_attempts_failure(exc):
    with pytest.raises(type(exc)):
        run(raising(exc))


def test_a_success_returns_the_value_and_a_record_of_the_attempt():
    result = run(lambda ctx: {"charged": ctx.step, "attempt": ctx.attempt})
    assert result.error is None and result.value == {"charged": "charge", "attempt": 2}
    record = result.record
    assert (record.kind, record.step_index, record.step_name, record.attempt, record.worker) == (
        AttemptKind.STEP,
        3,
        "charge",
        2,
        "w1",
    )
    assert record.outcome == AttemptOutcome.SUCCEEDED and record.started_at <= record.finished_at


def test_a_late_alarm_after_the_limit_is_ignored_and_a_foreign_handler_is_put_back():
    import os
    import signal

    from tasks.delivery.worker import JobTimeout
    from tasks.execution.timeouts import time_limit

    seen = []

    def foreign(signum, frame):
        seen.append(signum)

    before = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    try:
        with time_limit(5, "step 'a'"):
            pass
        # The limit's handler stays (no swap per step) and, disarmed, ignores an alarm that comes late.
        os.kill(os.getpid(), signal.SIGALRM)
        signal.signal(signal.SIGALRM, foreign)
        with time_limit(5, "step 'b'"):
            assert signal.getsignal(signal.SIGALRM) is not foreign
        assert signal.getsignal(signal.SIGALRM) is foreign  # someone else's handler is put back
        os.kill(os.getpid(), signal.SIGALRM)
        assert seen == [signal.SIGALRM]
        # RQ's job timeout: armed only for a job that has one (the engine's deliveries have none).
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        with JobTimeout(-1, job_id="j1"):
            assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
        with JobTimeout(30, job_id="j2"):
            assert signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, foreign)
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
