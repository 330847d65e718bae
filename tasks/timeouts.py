"""Interrupt a step that overruns its effective timeout, even inside a blocking socket read."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from tasks.exceptions import StepTimeout


@contextlib.contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise ``StepTimeout`` in the calling code after ``seconds``.

    Uses a real-time interval timer and SIGALRM: a blocked ``recv`` returns
    with EINTR, the handler raises, and the step unwinds. Signals reach only
    the main thread, so elsewhere (tests calling the runner from a thread)
    the limit is left to the client timeouts the context hands out.
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
        if armed:
            raise StepTimeout(f"{what} exceeded its timeout of {seconds:.3f}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
