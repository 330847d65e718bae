"""Stop a waiting step when its task is cancelled, through the step's own timeout machinery.

A step runs in the worker's main thread under ``tasks.execution.timeouts.time_limit``
(SIGALRM). A cancel reaches the worker on another thread: the Redis command
the canceller publishes to the lease holder (``tasks.delivery.worker``), or the
heartbeat, which sees the request on the task's row. That thread calls
``cancel_attempt``: if the main thread is inside an attempt of that task, it
is sent SIGALRM, and the time limit's handler raises ``StepCancelled``
instead of ``StepTimeout``, wherever the step waits (a socket read, a
sleep). Nothing else is ever interrupted: not the engine's own writes
between attempts (the block is not armed then), and never a process killed
mid-write. A step that is not waiting (busy in C code) stops at its
boundary, when the runner reads the cancel.
"""

from __future__ import annotations

import logging
import signal
import threading

from tasks.observability.log_fields import AttemptScope, correlation_fields, current_attempt, current_trace_id

logger = logging.getLogger(__name__)

_lock = threading.Lock()
# The attempt the main thread is running: its task id, and whether its time limit is armed.
_current_task: str | None = None
_armed = False
# The attempt's scope (tasks.observability.log_fields), read in the main thread: the line of an interrupt is
# written on the thread that cancels, outside it. Its fields are made only then (an interrupt is rare).
_current_scope: AttemptScope | None = None
# Tasks whose running attempt was told to stop: the alarm handler raises StepCancelled for them.
_cancelled: set[str] = set()


def attempt_started(task_id) -> None:
    """The main thread enters an attempt of ``task_id`` (its time limit is armed)."""
    global _current_task, _armed, _current_scope
    scope = current_attempt.get()
    if scope is not None and not scope.trace_id:
        scope.trace_id = current_trace_id()  # the span is the main thread's: its trace, for the interrupt's line
    with _lock:
        _current_task, _armed, _current_scope = str(task_id), True, scope


def attempt_ended() -> None:
    """The attempt is over: no signal may reach the code that follows (its checkpoint write)."""
    global _current_task, _armed
    with _lock:
        _armed = False
        if _current_task is not None:
            _cancelled.discard(_current_task)
        _current_task = None


def attempt_cancelled(task_id) -> bool:
    """Whether the alarm that just fired is a cancel of ``task_id``'s attempt (not its timeout)."""
    with _lock:
        return str(task_id) in _cancelled


def cancel_attempt(task_id) -> bool:
    """Interrupt the attempt of ``task_id`` if this process's main thread is running one; True when it was."""
    with _lock:
        if not _armed or _current_task != str(task_id):
            return False
        _cancelled.add(_current_task)
        # Under the lock: attempt_ended (which disarms before the handler is put back) waits for
        # this, so the signal is pending before the block can end, and its handler is still in place.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
        scope = _current_scope
    fields = correlation_fields(scope) if scope is not None else {"task_id": str(task_id)}
    logger.info("attempt interrupted by a cancel", extra={"event": "attempt_interrupted", **fields})
    return True
