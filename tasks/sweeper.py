"""The sweeper: rebuilds delivery from the database.

It hands tasks whose lease expired to ``tasks.outcomes.lease_expired``
(re-queue, or fail a crash loop), starts due retries even without an RQ
scheduler, re-delivers QUEUED tasks whose job was never enqueued or was
lost, and purges expired idempotency records. Running several sweepers at
once is safe: each task is handled under a row lock taken with SKIP LOCKED,
and every change is a conditional transition.

Other apps add their own periodic work as *chores* (``chore_register``):
the engine runs them without knowing what they are. A chore without an
interval runs on every sweep; one with an interval runs from the sweeper
loop at most that often.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone
from django_fsm import ConcurrentTransition

from tasks.delivery import deliver_on_commit, delivery_pending
from tasks.exceptions import LeaseLost
from tasks.idempotency import idempotency_purge_expired
from tasks.models import LEASED_STATES, SweeperHeartbeat, Task, TaskState
from tasks.outcomes import LeaseExpiry, lease_expired

logger = logging.getLogger(__name__)

BATCH_SIZE = 200
# A retry the RQ scheduler should have started this long ago is started by the sweeper.
DUE_RETRY_GRACE = timedelta(seconds=1)


@dataclass(frozen=True)
class Chore:
    """Periodic work another app adds to the sweeper; ``run`` returns how many things it did."""

    name: str
    run: Callable[[], int]
    # None: on every sweep (sweep_once); seconds: from the sweeper loop, at most this often.
    interval: float | None = None


_CHORES: dict[str, Chore] = {}


def chore_register(chore: Chore) -> None:
    """Add ``chore`` to every sweep (idempotent per name: the last registration wins)."""
    _CHORES[chore.name] = chore


@dataclass
class SweepReport:
    requeued: int = 0
    crash_loops: int = 0
    compensation_crash_loops: int = 0
    retries_started: int = 0
    redelivered: int = 0
    idempotency_records_purged: int = 0
    chores: dict[str, int] = field(default_factory=dict)
    redis_unavailable: bool = False

    def as_log(self) -> dict:
        return {
            "requeued": self.requeued,
            "crash_loops": self.crash_loops + self.compensation_crash_loops,
            "retries_started": self.retries_started,
            "redelivered": self.redelivered,
            "idempotency_records_purged": self.idempotency_records_purged,
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
                self.redelivered,
                self.idempotency_records_purged,
                *self.chores.values(),
            )
        )


def sweep_once() -> SweepReport:
    """One sweep: expired leases, due retries, lost deliveries, expired idempotency records, then the chores."""
    report = SweepReport()
    _expired_leases(report)
    _due_retries(report)
    _lost_deliveries(report)
    report.idempotency_records_purged = idempotency_purge_expired()
    for chore in _CHORES.values():
        if chore.interval is None:
            report.chores[chore.name] = chore.run()
    if report.did_something or report.redis_unavailable:
        logger.info("sweep", extra={"event": "sweep", **report.as_log()})
    return report


def _lock(queryset, pk):
    # SKIP LOCKED: a second sweeper moves on to other rows instead of waiting.
    return queryset.select_for_update(skip_locked=True).filter(pk=pk).first()


def _expired_leases(report: SweepReport) -> None:
    expired = Task.objects.filter(state__in=LEASED_STATES, lease_expires_at__lt=Now())
    for pk in list(expired.values_list("pk", flat=True)[:BATCH_SIZE]):
        try:
            with transaction.atomic():
                task = _lock(expired, pk)
                if task is None:
                    continue
                expiry = lease_expired(task=task)
            report.count_lease_expiry(expiry)
        except (ConcurrentTransition, LeaseLost):
            continue


def _due_retries(report: SweepReport) -> None:
    due = Task.objects.filter(state=TaskState.RETRY_SCHEDULED).filter(
        Q(retry_at__lte=Now() - DUE_RETRY_GRACE) | Q(deadline__lte=Now())
    )
    for pk in list(due.values_list("pk", flat=True)[:BATCH_SIZE]):
        try:
            with transaction.atomic():
                task = _lock(due, pk)
                if task is None:
                    continue
                task.make_due()
                task.save(update_fields=["state", "retry_at", "updated_at"])
                deliver_on_commit(task.pk, task.fencing_token)
                report.retries_started += 1
        except ConcurrentTransition:
            continue


def _lost_deliveries(report: SweepReport) -> None:
    grace = timedelta(seconds=settings.RELIABILITY_REDELIVERY_GRACE_SECONDS)
    waiting = Task.objects.filter(
        Q(state=TaskState.QUEUED) | Q(state=TaskState.COMPENSATING, lease_owner=""),
        updated_at__lte=Now() - grace,
    )
    for pk, token in list(waiting.values_list("pk", "fencing_token")[:BATCH_SIZE]):
        pending = delivery_pending(pk, token)
        if pending is None:
            report.redis_unavailable = True
            return
        if pending:
            continue
        with transaction.atomic():
            task = _lock(waiting, pk)
            if task is None or task.fencing_token != token:
                continue
            # Touch the row so the next sweep waits a grace period before checking again.
            Task.objects.filter(pk=pk).update(updated_at=timezone.now())
            deliver_on_commit(task.pk, token)
            report.redelivered += 1


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
    due_at = {chore.name: time.monotonic() + chore.interval for chore in _CHORES.values() if chore.interval}
    logger.info("sweeper started", extra={"event": "sweeper_started", "interval": interval})
    while not stop.is_set():
        try:
            sweep_once()
            sweeper_heartbeat(name=name)
            for chore in _CHORES.values():
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
