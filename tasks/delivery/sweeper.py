"""The sweeper: rebuilds delivery from the database.

It hands tasks whose lease expired to ``tasks.lifecycle.outcomes.lease_expired``
(re-queue, or fail a crash loop), starts due retries even without an RQ
scheduler, re-delivers QUEUED tasks whose job was never enqueued or was
lost, and purges expired idempotency records; it fires the schedules' due slots
(``tasks.lifecycle.schedules``). Each of the three hands on
at most ``BATCH_SIZE`` tasks a sweep, oldest first, so however deep the
backlog, no task waits behind newer ones. Running several sweepers at once
is safe: each task is handled under a row lock taken with SKIP LOCKED, and
every change is a conditional transition.

Other apps add their own periodic work as *chores* (``tasks.registry.chore_register``):
the engine runs them without knowing what they are. A chore without an
interval runs on every sweep; one with an interval runs from the sweeper
loop at most that often.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import close_old_connections, models, transaction
from django.db.models import F, Func, Q, QuerySet, Value
from django.db.models.functions import Cast, Now
from django.db.models.lookups import GreaterThan
from django.utils import timezone
from django_fsm import ConcurrentTransition

from tasks import registry
from tasks.conf import engine_settings
from tasks.delivery.enqueue import deliveries_lost, get_queue
from tasks.exceptions import LeaseLost
from tasks.lifecycle.deliveries import delivery_repeated, retry_made_due, wait_ended
from tasks.lifecycle.holds import held_tasks_sweep
from tasks.lifecycle.outcomes import LeaseExpiry, lease_expired, on_cancel_policy, task_cancelled
from tasks.lifecycle.schedules import schedules_fire_due, schedules_sync
from tasks.models import LEASED_STATES, SweeperHeartbeat, Task, TaskHold, TaskState
from tasks.submission.idempotency import idempotency_purge_expired

logger = logging.getLogger(__name__)

# Tasks handed on per sweep by each kind of work (expired leases, due retries,
# lost deliveries), oldest first. A task handed on leaves its set, so a deep
# set drains in order and no task waits behind newer ones.
BATCH_SIZE = 200
# Waiting tasks read from the database per query (fewer, larger pages cost
# less per row) and checked against Redis per round trip (a check blocks
# Redis while it runs: about 5 ms for 1,000 jobs).
WAITING_PAGE_SIZE = 5000
DELIVERY_CHECK_SIZE = 1000
# A retry the RQ scheduler should have started this long ago is started by the sweeper.
DUE_RETRY_GRACE = timedelta(seconds=1)


@dataclass
class SweepReport:
    requeued: int = 0
    crash_loops: int = 0
    compensation_crash_loops: int = 0
    retries_started: int = 0
    waits_ended: int = 0
    redelivered: int = 0
    held_released: int = 0
    cancels_completed: int = 0
    idempotency_records_purged: int = 0
    schedules_fired: int = 0
    schedule_slots_skipped: int = 0
    schedule_slots_missed: int = 0
    chores: dict[str, int] = field(default_factory=dict)
    redis_unavailable: bool = False

    def as_log(self) -> dict:
        return {
            "requeued": self.requeued,
            "crash_loops": self.crash_loops + self.compensation_crash_loops,
            "retries_started": self.retries_started,
            "waits_ended": self.waits_ended,
            "redelivered": self.redelivered,
            "held_released": self.held_released,
            "cancels_completed": self.cancels_completed,
            "idempotency_records_purged": self.idempotency_records_purged,
            "schedules_fired": self.schedules_fired,
            "schedule_slots_skipped": self.schedule_slots_skipped,
            "schedule_slots_missed": self.schedule_slots_missed,
            **self.chores,
            "redis_unavailable": self.redis_unavailable,
        }

    def count_lease_expiry(self, expiry: LeaseExpiry) -> None:
        if expiry == LeaseExpiry.REQUEUED:
            self.requeued += 1
        elif expiry == LeaseExpiry.CRASH_LOOP:
            self.crash_loops += 1
        else:
            self.compensation_crash_loops += 1

    @property
    def did_something(self) -> bool:
        return any(
            (
                self.requeued,
                self.crash_loops,
                self.compensation_crash_loops,
                self.retries_started,
                self.waits_ended,
                self.redelivered,
                self.held_released,
                self.cancels_completed,
                self.idempotency_records_purged,
                self.schedules_fired,
                self.schedule_slots_skipped,
                self.schedule_slots_missed,
                *self.chores.values(),
            )
        )


def sweep_once() -> SweepReport:
    """One sweep: expired leases, cancels, due retries and waits, lost deliveries, held tasks, idempotency records,
    schedules' due slots, chores."""
    report = SweepReport()
    _expired_leases(report)
    _pending_cancels(report)
    _due_retries(report)
    _due_waits(report)
    _lost_deliveries(report)
    report.held_released = held_tasks_sweep()
    report.idempotency_records_purged = idempotency_purge_expired()
    _due_slots(report)
    for chore in registry.chores():
        if chore.interval is None:
            report.chores[chore.name] = chore.run()
    if report.did_something or report.redis_unavailable:
        logger.info("sweep", extra={"event": "sweep", **report.as_log()})
    return report


def _due_slots(report: SweepReport) -> None:
    # The code's schedules are synced first on every sweep (one read of their rows; a write only for a change), so
    # a deployment that adds or changes one needs no migration and no command.
    schedules_sync()
    sweep = schedules_fire_due()
    report.schedules_fired = sweep.fired
    report.schedule_slots_skipped = sweep.skipped
    report.schedule_slots_missed = sweep.missed


def _lock(queryset, pk):
    # SKIP LOCKED: a second sweeper moves on to other rows instead of waiting.
    return queryset.select_for_update(skip_locked=True).filter(pk=pk).first()


def _expired_leases(report: SweepReport) -> None:
    expired = Task.objects.filter(state__in=LEASED_STATES, lease_expires_at__lt=Now())
    for pk in list(expired.order_by("lease_expires_at", "pk").values_list("pk", flat=True)[:BATCH_SIZE]):
        try:
            with transaction.atomic():
                task = _lock(expired, pk)
                if task is None:
                    continue
                expiry = lease_expired(task=task)
            report.count_lease_expiry(expiry)
        except (ConcurrentTransition, LeaseLost):
            continue


def _pending_cancels(report: SweepReport) -> None:
    """Carry out cancels that met a task waiting (held, or for a retry) in a race with its worker.

    The canceller cancels such a task itself; one that a worker put back to
    wait just after the request was written (it read the flag before) is
    found here, on ``task_cancel_pending_idx``.
    """
    pending = Task.objects.filter(
        state__in=[TaskState.QUEUED, TaskState.RETRY_SCHEDULED], cancel_requested_at__isnull=False
    )
    for pk in list(pending.order_by("cancel_requested_at").values_list("pk", flat=True)[:BATCH_SIZE]):
        try:
            with transaction.atomic():
                task = _lock(pending, pk)
                if task is None:
                    continue
                task_cancelled(task=task, policy=on_cancel_policy(task))
            report.cancels_completed += 1
        except (ConcurrentTransition, LeaseLost):
            continue


def _due_retries(report: SweepReport) -> None:
    due = Task.objects.filter(state=TaskState.RETRY_SCHEDULED).filter(
        Q(retry_at__lte=Now() - DUE_RETRY_GRACE) | Q(deadline__lte=Now())
    )
    report.retries_started += _each_due(due, retry_made_due)


def _due_waits(report: SweepReport) -> None:
    """Wake the WAITING tasks whose time has come (no grace: the sweeper is their only delivery, and a start is
    "not before its time, within a sweep after") or whose deadline passed, oldest time first; on
    ``task_state_retry_idx``."""
    due = Task.objects.filter(state=TaskState.WAITING).filter(Q(retry_at__lte=Now()) | Q(deadline__lte=Now()))
    report.waits_ended += _each_due(due, wait_ended)


def _each_due(due, act) -> int:
    """``act(task=…)`` on up to BATCH_SIZE of ``due``, oldest time first, each locked in its own transaction (one
    another sweeper holds is skipped); how many."""
    done = 0
    for pk in list(due.order_by("retry_at", "pk").values_list("pk", flat=True)[:BATCH_SIZE]):
        try:
            with transaction.atomic():
                task = _lock(due, pk)
                if task is None:
                    continue
                act(task=task)
                done += 1
        except ConcurrentTransition:
            continue
    return done


def _lost_deliveries(report: SweepReport) -> None:
    # A waiting task whose job is still in Redis stays waiting, so a bounded
    # batch of candidates would look at the same tasks every sweep and never
    # reach the rest of a deep backlog. Instead every waiting task past its
    # grace is checked on every sweep, oldest first (keyset pages of the
    # index, one Redis round trip per DELIVERY_CHECK_SIZE jobs), until a
    # batch of lost ones is found: the oldest lost deliveries go first, and
    # one lost among 100,000 waiting is delivered again by the next sweep.
    lost: list[tuple] = []
    queue = get_queue()
    for page in _pages(_waiting_oldest_first(), DELIVERY_CHECK_SIZE):
        found = deliveries_lost([(pk, token, batch) for _, pk, token, batch in page], queue=queue)
        if found is None:
            report.redis_unavailable = True
            return
        lost += found
        if len(lost) >= BATCH_SIZE:
            break
    waiting = _waiting()
    for pk, token, _ in lost[:BATCH_SIZE]:
        with transaction.atomic():
            task = _lock(waiting, pk)
            if task is None or task.fencing_token != token:
                continue
            delivery_repeated(task=task)
            report.redelivered += 1


def _waiting() -> QuerySet:
    """Tasks waiting for a worker longer than the grace: QUEUED, or COMPENSATING without a lease."""
    grace = timedelta(seconds=engine_settings.REDELIVERY_GRACE_SECONDS)
    # A held task has no job on purpose (tasks.execution.gates releases it): not a lost delivery.
    return Task.objects.filter(
        Q(state=TaskState.QUEUED, hold=TaskHold.NONE) | Q(state=TaskState.COMPENSATING, lease_owner=""),
        updated_at__lte=Now() - grace,
    )


def _waiting_oldest_first() -> Iterator[tuple[datetime, str, int, str]]:
    """(updated_at, task id, fencing token, batch job) of every waiting task, oldest first."""
    # One keyset walk per state, each an ordered range of task_state_updated_id_idx, merged.
    waiting = _waiting()
    return heapq.merge(
        _oldest_first(waiting.filter(state=TaskState.QUEUED)),
        _oldest_first(waiting.filter(state=TaskState.COMPENSATING)),
    )


def _oldest_first(tasks: QuerySet) -> Iterator[tuple[datetime, str, int, str]]:
    """(updated_at, task id, fencing token, batch job) of ``tasks``, oldest first, read by keyset pagination.

    Each page is a query of its own that starts after the last row read, so
    a page costs the same at any depth, ties on ``updated_at`` included (a
    set-based write gives many rows one time), and no cursor or other
    session state outlives a query (behind PgBouncer in transaction mode
    the next query may run in another server session).
    """
    # The id as text: only a job id is made of it, and parsing 100,000 UUIDs
    # a sweep would cost more than reading the rows.
    rows = tasks.order_by("updated_at", "pk").values_list(
        "updated_at", Cast("pk", models.TextField()), "fencing_token", "batch_job"
    )
    after = None
    while True:
        page = rows if after is None else rows.filter(GreaterThan(_Row(F("updated_at"), F("pk")), _Row(*after)))
        page = [(updated_at, _uuid_text(pk), token, batch) for updated_at, pk, token, batch in page[:WAITING_PAGE_SIZE]]
        yield from page
        if len(page) < WAITING_PAGE_SIZE:
            return
        updated_at, pk, _, _ = page[-1]
        after = (Value(updated_at, output_field=models.DateTimeField()), Value(pk, output_field=models.UUIDField()))


class _Row(Func):
    """A row value ``(a, b)``: compared whole, it starts a keyset page inside an index range."""

    function = ""
    output_field = models.Field()


def _uuid_text(value: str) -> str:
    # PostgreSQL prints a uuid as str(UUID) does, SQLite stores Django's 32 hex digits.
    return value if len(value) == 36 else str(uuid.UUID(value))


def _pages(rows: Iterator[tuple], size: int) -> Iterator[list[tuple]]:
    while page := list(itertools.islice(rows, size)):
        yield page


def sweeper_heartbeat(*, name: str) -> None:
    """Record that sweeper ``name`` completed a sweep now."""
    updated = SweeperHeartbeat.objects.filter(name=name).update(last_run_at=timezone.now(), runs=F("runs") + 1)
    if not updated:
        SweeperHeartbeat.objects.get_or_create(name=name, defaults={"last_run_at": timezone.now(), "runs": 1})


def sweeper_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def sweeper_loop(*, interval: float, stop: threading.Event) -> None:
    """Sweep every ``interval`` seconds until ``stop`` is set; run the interval chores when they are due."""
    name = sweeper_name()
    # Interval chores are first due one interval after start, then every interval (an in-memory check).
    due_at = {chore.name: time.monotonic() + chore.interval for chore in registry.chores() if chore.interval}
    logger.info("sweeper started", extra={"event": "sweeper_started", "interval": interval})
    while not stop.is_set():
        try:
            sweep_once()
            sweeper_heartbeat(name=name)
            for chore in registry.chores():
                if chore.interval and time.monotonic() >= due_at.setdefault(chore.name, 0.0):
                    due_at[chore.name] = time.monotonic() + chore.interval
                    chore.run()
        except Exception:
            # A database or Redis outage must not end the loop: retry next round.
            logger.exception("sweep failed", extra={"event": "sweep_failed"})
        finally:
            close_old_connections()
        stop.wait(interval)
    logger.info("sweeper stopped", extra={"event": "sweeper_stopped"})
