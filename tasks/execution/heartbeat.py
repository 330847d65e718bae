"""The heartbeat: one thread per worker process that keeps every lease it holds alive.

It writes nothing itself: each beat is ``tasks.lifecycle.leases.lease_extend``.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from django.db import connection

from tasks.exceptions import LeaseLost
from tasks.execution import interrupts
from tasks.execution.claim import lease_seconds
from tasks.lifecycle.leases import lease_extend
from tasks.observability.log_fields import task_fields

logger = logging.getLogger(__name__)


class Heartbeat:
    """Extends a lease from a background thread for as long as the task is held.

    A step's progress does not touch the lease (see ``Task.advance``), so
    this is what keeps a task of many steps leased; one that finishes within
    the first interval never beats. The thread is the process's one heartbeat thread, started once
    and shared by every task the process runs, so entering and leaving a
    heartbeat costs no thread start and join per task.
    """

    def __init__(self, *, task_id, fencing_token: int, interval: float | None = None, task=None) -> None:
        self.task_id = task_id
        self.task = task  # the claimed row, for the fields of a line about it (read here, written by the runner)
        self.fencing_token = fencing_token
        self.interval = interval if interval is not None else max(lease_seconds() / 3.0, 0.2)
        self.lost = threading.Event()
        self.due = 0.0

    def __enter__(self) -> Heartbeat:
        _keeper.add(self)
        return self

    def __exit__(self, *exc_info) -> None:
        _keeper.remove(self)

    def beat(self) -> bool:
        """Extend the lease once; False when it was lost (no further beats). A cancel seen stops a waiting step."""
        try:
            if lease_extend(task_id=self.task_id, fencing_token=self.fencing_token):
                interrupts.cancel_attempt(self.task_id)
        except LeaseLost:
            self.lost.set()
            logger.warning(
                "lease lost",
                extra={"event": "lease_lost", **self._fields(), "fencing_token": self.fencing_token},
            )
            return False
        except Exception:  # a database blip must not kill the heartbeat thread
            logger.warning("heartbeat failed", extra={"event": "heartbeat_failed", **self._fields()})
            # Reconnect on the next beat rather than reuse a broken connection.
            connection.close()
        return True

    def _fields(self) -> dict:
        return task_fields(self.task) if self.task is not None else {"task_id": str(self.task_id)}


# The longest a finishing task waits for a beat of its lease that is under way (a hung database).
BEAT_WAIT_SECONDS = 5.0


class _HeartbeatThread:
    """The process's heartbeat thread: beats each held lease every ``interval`` seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the thread: a beat is due earlier than it planned
        self._idle = threading.Condition(self._lock)  # removers: the beat they wait for is over
        self._held: dict[int, Heartbeat] = {}
        self._beating: Heartbeat | None = None
        self._wake_at: float | None = None  # when the thread wakes by itself (None: only when notified)
        self._connected = False  # the thread's database connection is open
        self._thread: threading.Thread | None = None

    def add(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            heartbeat.due = time.monotonic() + heartbeat.interval
            self._held[id(heartbeat)] = heartbeat
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
                self._thread.start()
            elif self._wake_at is None or heartbeat.due < self._wake_at:
                # Only an earlier beat needs the thread awake: most tasks finish before their first.
                self._wake.notify()

    def remove(self, heartbeat: Heartbeat) -> None:
        """Stop beating ``heartbeat``; a beat of it already under way is waited for (a while), as a join would."""
        with self._lock:
            self._held.pop(id(heartbeat), None)
            deadline = time.monotonic() + BEAT_WAIT_SECONDS
            while self._beating is heartbeat and time.monotonic() < deadline:
                self._idle.wait(deadline - time.monotonic())
            if not self._held and self._connected:
                self._wake.notify()  # to give its connection back now

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._due_now()
                while not due and (self._held or not self._connected):
                    self._wake_at = min((held.due for held in self._held.values()), default=None)
                    self._wake.wait(None if self._wake_at is None else self._wake_at - time.monotonic())
                    due = self._due_now()
                self._wake_at = None
                if not due:
                    self._connected = False
            if not due:
                # Nothing held: give the database connection back until a long step needs one again.
                connection.close()
                continue
            for heartbeat in due:
                self._beat(heartbeat)

    def _beat(self, heartbeat: Heartbeat) -> None:
        # Outside the lock: a slow database must not hold up tasks starting or ending.
        with self._lock:
            if self._held.get(id(heartbeat)) is not heartbeat:
                return
            self._beating = heartbeat
            self._connected = True
        alive = False
        try:
            alive = heartbeat.beat()
        finally:
            with self._lock:
                self._beating = None
                if not alive:
                    self._held.pop(id(heartbeat), None)
                self._idle.notify_all()

    def _due_now(self) -> list[Heartbeat]:
        now = time.monotonic()
        due = [held for held in self._held.values() if held.due <= now]
        for held in due:
            held.due = now + held.interval
        return due


_keeper = _HeartbeatThread()
# A forked child (RQ's forking worker) has no heartbeat thread, and the lock may
# have been held by it at the fork: start over with a fresh one.
os.register_at_fork(after_in_child=lambda: globals().update(_keeper=_HeartbeatThread()))
