"""Interrupt a step that overruns its effective timeout (even in a blocking socket read), or whose task is cancelled."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from tasks import interrupts
from tasks.exceptions import StepCancelled, StepTimeout


def _stray_alarm(signum, frame) -> None:
    """Put in place of the default action after a time limit: a late SIGALRM must never end the worker."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str, *, task_id=None) -> Iterator[None]:
    """Raise ``StepTimeout`` in the calling code after ``seconds``; ``StepCancelled`` when ``task_id`` is cancelled.

    Uses a real-time interval timer and SIGALRM: a blocked ``recv`` returns
    with EINTR, the handler raises, and the step unwinds. Signals reach only
    the main thread, so elsewhere (tests calling the runner from a thread)
    the limit is left to the client timeouts the context hands out, and a
    cancel to the step boundary. With ``task_id``, a cancel of that task
    interrupts the block the same way (``tasks.interrupts``).
    """
    if seconds <= 0:
        raise StepTimeout(f"{what}: no time left")
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    armed = True

    def on_alarm(signum, frame):
        # Only interrupt while the guarded block runs; a late signal after it
        # returned must not tear down the checkpoint write that follows.
        if not armed:
            return
        if task_id is not None and interrupts.attempt_cancelled(task_id):
            raise StepCancelled(f"{what} was interrupted: its task was cancelled")
        raise StepTimeout(f"{what} exceeded its timeout of {seconds:.3f}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    if task_id is not None:
        interrupts.attempt_started(task_id)
    try:
        yield
    finally:
        if task_id is not None:
            interrupts.attempt_ended()  # first: a cancel arriving now no longer signals
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if callable(previous) else _stray_alarm)
