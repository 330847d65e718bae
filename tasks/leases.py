"""Leases: who may work on a task right now, fenced by a monotonically increasing token.

A claim reads the row (and its checkpoints), applies the transition and
saves it with one conditional update on (state, fencing token). Every later
write by the holder is conditional on the token it got; a worker whose lease
was taken over (a zombie) finds its writes rejected and stops.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from tasks import interrupts, limits
from tasks.conf import engine_settings
from tasks.exceptions import LeaseLost
from tasks.fenced_writes import one_statement, task_save_fenced
from tasks.limits_policy import OPEN_GATE, ControlValues, Gate
from tasks.models import LEASED_STATES, Checkpoint, PipelineControl, Task, TaskHold, TaskState, lease_expiry

logger = logging.getLogger(__name__)


@dataclass
class Claim:
    """A task this worker holds, with the outputs of its completed steps (by step name)."""

    task: Task
    owner: str
    outputs: dict[str, Any] = field(default_factory=dict)
    # The completed steps' names in the order they ran (their checkpoints' step index).
    completed: list[str] = field(default_factory=list)
    # What held the pipeline back when the task was claimed (tasks.limits): checked again at each step start.
    gate: Gate = OPEN_GATE

    @property
    def token(self) -> int:
        return self.task.fencing_token


def lease_seconds() -> float:
    return float(engine_settings.LEASE_SECONDS)


def task_claim(*, task_id: str, owner: str) -> Claim | None:
    """Claim ``task_id`` for ``owner``; None when there is nothing for this delivery to do.

    Duplicate deliveries and jobs for finished tasks end here without effects:
    only one claim can win the conditional update.
    """
    for _ in range(2):
        try:
            return _claim_once(task_id=task_id, owner=owner)
        except _TooEarly as early:
            # RQ's scheduler works in whole seconds and clocks drift a little:
            # a retry delivered slightly early waits for its time instead of
            # being dropped. A much earlier job is a stray duplicate.
            if early.seconds > MAX_EARLY_WAIT_SECONDS:
                return None
            time.sleep(early.seconds)
    return None


class _TooEarly(Exception):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


# The longest a worker waits for a retry that was delivered before its time.
MAX_EARLY_WAIT_SECONDS = 5.0


CLAIM_FIELDS = [
    "state",
    "retry_at",
    "hold",
    "fencing_token",
    "lease_owner",
    "lease_expires_at",
    "step_attempt",
    "total_attempts",
    "updated_at",
]


def _claim_once(*, task_id: str, owner: str) -> Claim | None:
    # Two round trips: read the row (with the database's clock and, on
    # PostgreSQL, the checkpoints), then one conditional update on the state
    # and token that were read. A concurrent claim or a takeover in between
    # makes the update match nothing, and this delivery ends without effects.
    # Checkpoints read with the row are complete: only the lease holder
    # writes them, and no one can hold the lease until this update wins.
    task = _task_for_claim(task_id)
    if task is None:
        return None
    deadline_passed = task.deadline is not None and task.deadline <= task.db_now
    if task.state == TaskState.RETRY_SCHEDULED:
        if task.retry_at is not None and task.retry_at > task.db_now and not deadline_passed and not task.is_cancelled:
            raise _TooEarly((task.retry_at - task.db_now).total_seconds())
        task.make_due()
    elif task.state == TaskState.QUEUED and task.hold == TaskHold.START_TIME:
        # A later start (run_after) has no job until the sweeper releases it; a delivery before its time
        # (a duplicate, a job an operator re-queued) must not start it early, and leaves the hold alone.
        if task.retry_at is not None and task.retry_at > task.db_now and not deadline_passed and not task.is_cancelled:
            raise _TooEarly((task.retry_at - task.db_now).total_seconds())
    gate = OPEN_GATE
    if task.state == TaskState.QUEUED:
        gate = limits.gate_of(pipeline=task.pipeline, control=task.control_read)
        # A task past its deadline or cancelled goes through whatever holds its pipeline:
        # the runner fails or cancels it at once, without running a step.
        if gate.paused and not deadline_passed and not task.is_cancelled:
            task_hold(task, TaskHold.PAUSED, gate)
            return None
        if gate.limited and not deadline_passed and not task.is_cancelled:
            if not _claim_within_limits(task, owner, gate):
                return None
        else:
            task.claim(owner=owner, lease_seconds=lease_seconds())
            if not _claim_save(task):
                return None
    elif task.state == TaskState.COMPENSATING and not task.lease_owner:
        task.claim_compensation(owner=owner, lease_seconds=lease_seconds())
        if not _claim_save(task):
            return None
    else:
        return None
    task.run_gate = gate
    checkpoints = task.checkpoints_read
    if checkpoints is None:
        checkpoints = Checkpoint.objects.filter(task_id=task.pk).values_list("step_index", "step_name", "output")
    checkpoints = sorted(checkpoints, key=lambda checkpoint: checkpoint[0])
    logger.info(
        "task claimed",
        extra={
            "event": "task_claimed",
            "task_id": str(task.pk),
            "step": task.current_step,
            "attempt": task.step_attempt,
            "fencing_token": task.fencing_token,
            "worker": owner,
        },
    )
    return Claim(
        task=task,
        owner=owner,
        outputs={name: output for _, name, output in checkpoints},
        completed=[name for _, name, _ in checkpoints],
        gate=gate,
    )


def _claim_save(task: Task) -> bool:
    try:
        task_save_fenced(task, CLAIM_FIELDS)
    except LeaseLost:
        return False
    return True


def _claim_within_limits(task: Task, owner: str, gate: Gate) -> bool:
    """Claim ``task`` if a concurrency slot and a rate permit are free (one transaction); else hold it."""
    hold, wait = "", None
    with transaction.atomic():
        if gate.max_concurrency is not None and not limits.concurrency_slot_take(
            pipeline=task.pipeline, limit=gate.max_concurrency, task_id=task.pk, fencing_token=task.fencing_token + 1
        ):
            hold = TaskHold.CONCURRENCY
        elif gate.rate is not None:
            wait = limits.rate_permit_take(pipeline=task.pipeline, rate=gate.rate)
            if wait is not None:
                hold = TaskHold.RATE
        if hold:
            transaction.set_rollback(True)  # the slot taken before a refused permit goes back
        else:
            task.claim(owner=owner, lease_seconds=lease_seconds())
            if not _claim_save(task):
                transaction.set_rollback(True)
                return False
    if hold:
        task_hold(task, hold, gate, wait=wait)
        return False
    return True


def task_hold(task: Task, hold: str, gate: Gate, *, wait: float | None = None) -> bool:
    """Hold ``task`` (QUEUED, or RUNNING at a step boundary) for ``hold``; False when someone else moved it first.

    A rate hold is given its start time in line (``limits.rate_hold_seconds``).
    """
    from tasks.outcomes import task_held  # outcomes needs this module's Claim

    until = None
    if hold == TaskHold.RATE and gate.rate is not None:
        seconds = limits.rate_hold_seconds(pipeline=task.pipeline, rate=gate.rate, wait=wait or 0.0)
        until = timezone.now() + timedelta(seconds=seconds)
    try:
        task_held(task=task, hold=hold, until=until)
    except LeaseLost:
        return False  # another delivery claimed or held it first, or a canceller moved it
    return True


def _task_for_claim(task_id: str) -> Task | None:
    """The task with ``db_now`` and ``checkpoints_read`` (on PostgreSQL from the same query, else None).

    ``checkpoints_read`` holds (step index, step name, output) of each checkpoint.
    """
    if not one_statement():
        task = Task.objects.filter(pk=task_id).annotate(db_now=Now()).order_by().first()
        if task is not None:
            task.checkpoints_read = None
            task.control_read = limits.control_values(task.pipeline)
        return task
    # SQL built once per process instead of a queryset compiled for each delivery.
    columns, converters, sql = _claim_read()
    with connection.cursor() as cursor:
        cursor.execute(sql, [Task._meta.pk.get_db_prep_value(task_id, connection)])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row[: len(columns)])
    for index, column, convert in converters:
        values[index] = convert(values[index], column, connection)
    task = Task.from_db(connection.alias, columns, values)
    task.db_now, triples, control = row[len(columns) :]
    if isinstance(triples, str):
        triples = json.loads(triples)
    if isinstance(control, str):
        control = json.loads(control)
    task.checkpoints_read = [tuple(checkpoint) for checkpoint in triples or ()]
    task.control_read = ControlValues.from_row(control)
    return task


@functools.cache
def _claim_read() -> tuple[list[str], list, str]:
    """Task columns, their from-database converters and the query: the row, the database's clock, the checkpoints.

    And the pipeline's control row (pause and overridden limits, ``tasks.limits``), in the same round trip.
    """
    fields = Task._meta.concrete_fields
    converters = []
    for index, task_field in enumerate(fields):
        column = task_field.get_col(Task._meta.db_table)
        for convert in connection.ops.get_db_converters(column) + column.get_db_converters(connection):
            converters.append((index, column, convert))
    q = connection.ops.quote_name
    task_table, checkpoints = q(Task._meta.db_table), q(Checkpoint._meta.db_table)
    controls = q(PipelineControl._meta.db_table)
    control_columns = ", ".join(f"pc.{q(column)}" for column in limits.CONTROL_COLUMNS)
    sql = (
        f"SELECT {', '.join(f'{task_table}.{q(task_field.column)}' for task_field in fields)}, STATEMENT_TIMESTAMP(), "
        f"(SELECT jsonb_agg(jsonb_build_array(c.{q('step_index')}, c.{q('step_name')}, c.{q('output')})) "
        f"FROM {checkpoints} c "
        f"WHERE c.{q('task_id')} = {task_table}.{q(Task._meta.pk.column)}), "
        f"(SELECT jsonb_build_array({control_columns}) FROM {controls} pc "
        f"WHERE pc.{q('pipeline')} = {task_table}.{q('pipeline')}) "
        f"FROM {task_table} WHERE {task_table}.{q(Task._meta.pk.column)} = %s"
    )
    return [task_field.attname for task_field in fields], converters, sql


def lease_extend(*, task_id, fencing_token: int) -> bool:
    """Push the lease forward, or raise ``LeaseLost`` when the token no longer holds it.

    Returns whether a cancel of the task was requested (the heartbeat stops a waiting step on it).
    """
    leased = Task.objects.filter(pk=task_id, fencing_token=fencing_token, state__in=LEASED_STATES)
    if one_statement():
        q = connection.ops.quote_name
        table = q(Task._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {q('lease_expires_at')} = STATEMENT_TIMESTAMP() + make_interval(secs => %s) "
                f"WHERE {q('id')} = %s AND {q('fencing_token')} = %s AND {q('state')} = ANY(%s) "
                f"RETURNING {q('cancel_requested_at')} IS NOT NULL",
                # An array with either driver (psycopg2 expands a tuple for "IN %s", psycopg 3 does not).
                [lease_seconds(), task_id, fencing_token, list(LEASED_STATES)],
            )
            row = cursor.fetchone()
        if row is None:
            raise LeaseLost(f"task {task_id}: lease with token {fencing_token} was taken over")
        return bool(row[0])
    extended = leased.update(lease_expires_at=lease_expiry(lease_seconds()))
    if not extended:
        raise LeaseLost(f"task {task_id}: lease with token {fencing_token} was taken over")
    return Task.objects.filter(pk=task_id, cancel_requested_at__isnull=False).exists()


class Heartbeat:
    """Extends a lease from a background thread for as long as the task is held.

    A step's progress does not touch the lease (see ``Task.advance``), so
    this is what keeps a task of many steps leased; one that finishes within
    the first interval never beats. The thread is the process's one heartbeat thread, started once
    and shared by every task the process runs, so entering and leaving a
    heartbeat costs no thread start and join per task.
    """

    def __init__(self, *, task_id, fencing_token: int, interval: float | None = None) -> None:
        self.task_id = task_id
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
                extra={"event": "lease_lost", "task_id": str(self.task_id), "fencing_token": self.fencing_token},
            )
            return False
        except Exception:  # a database blip must not kill the heartbeat thread
            logger.warning("heartbeat failed", extra={"event": "heartbeat_failed", "task_id": str(self.task_id)})
            # Reconnect on the next beat rather than reuse a broken connection.
            connection.close()
        return True


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
