"""Interrupt a step that overruns its effective timeout (even in a blocking socket read), or whose task is cancelled."""

from __future__ import annotations

import contextlib
import signal
import threading

# signal.getsignal without its conversion to an enum (which raises and catches a ValueError for a function).
from _signal import getsignal as _handler_in_place
from collections.abc import Iterator

from tasks.exceptions import StepCancelled, StepTimeout
from tasks.execution import interrupts

# The limit the main thread runs under, (what, seconds, task_id), while a guarded block runs; None between two.
_limit: tuple[str, float, object] | None = None


def _on_alarm(signum, frame) -> None:
    """The SIGALRM handler while and after a time limit: raises in the guarded block, does nothing outside one.

    Installed by the first limit and left in place of the default action (a late SIGALRM must never
    end the worker), so a step costs no handler swap; a handler of someone else's found in place (RQ's job
    timeout) is put back after the block.
    """
    limit = _limit
    if limit is None:
        # A late signal after the block returned must not tear down the checkpoint write that follows.
        return
    what, seconds, task_id = limit
    if task_id is not None and interrupts.attempt_cancelled(task_id):
        raise StepCancelled(f"{what} was interrupted: its task was cancelled")
    raise StepTimeout(f"{what} exceeded its timeout of {seconds:.3f}s")


@contextlib.contextmanager
def time_limit(seconds: float, what: str, *, task_id=None) -> Iterator[None]:
    """Raise ``StepTimeout`` in the calling code after ``seconds``; ``StepCancelled`` when ``task_id`` is cancelled.

    Uses a real-time interval timer and SIGALRM: a blocked ``recv`` returns
    with EINTR, the handler raises, and the step unwinds. Signals reach only
    the main thread, so elsewhere (tests calling the runner from a thread)
    the limit is left to the client timeouts the context hands out, and a
    cancel to the step boundary. With ``task_id``, a cancel of that task
    interrupts the block the same way (``tasks.execution.interrupts``).
    """
    global _limit
    if seconds <= 0:
        raise StepTimeout(f"{what}: no time left")
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = _handler_in_place(signal.SIGALRM)
    if previous is not _on_alarm:
        signal.signal(signal.SIGALRM, _on_alarm)
    outer, _limit = _limit, (what, seconds, task_id)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    if task_id is not None:
        interrupts.attempt_started(task_id)
    try:
        yield
    finally:
        if task_id is not None:
            interrupts.attempt_ended()  # first: a cancel arriving now no longer signals
        _limit = outer  # disarmed: only the guarded block is ever interrupted
        signal.setitimer(signal.ITIMER_REAL, 0)
        if previous is not _on_alarm and callable(previous):
            signal.signal(signal.SIGALRM, previous)
