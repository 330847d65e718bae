"""Submission idempotency: one logical request per (scope, key), whatever the concurrency.

The first request inserts an IN_PROGRESS record in its own short
transaction; the unique index on (scope, key) makes exactly one request the
owner. The owner then creates the task and completes the record, with its
response, in one transaction. Any other request with the same key:

- different fingerprint: ``IdempotencyKeyReused`` (nothing changes);
- record completed: the stored response is replayed;
- record in progress: wait up to ``RELIABILITY_IDEMPOTENCY_WAIT_SECONDS`` for
  the owner to finish (then replay), else ``IdempotencyKeyInUse``.

An owner that died mid-request leaves a stale IN_PROGRESS record; after
``RELIABILITY_IDEMPOTENCY_LOCK_SECONDS`` another request may take it over.
Records expire after ``RELIABILITY_IDEMPOTENCY_TTL_SECONDS``; the sweeper
purges them and the key may then be used again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from tasks.conf import engine_settings
from tasks.exceptions import IdempotencyKeyInUse, IdempotencyKeyReused
from tasks.models import IdempotencyRecord, IdempotencyState, Task

POLL_INTERVAL_SECONDS = 0.05
PURGE_BATCH_SIZE = 1000


@dataclass(frozen=True)
class Reservation:
    """The outcome of ``idempotency_begin``: either ours to fulfil, or a finished record to replay."""

    record: IdempotencyRecord
    owned: bool


def idempotency_begin(*, scope: str, key: str, fingerprint: str) -> Reservation:
    deadline = time.monotonic() + engine_settings.IDEMPOTENCY_WAIT_SECONDS
    while True:
        now = timezone.now()
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(
                    scope=scope,
                    key=key,
                    fingerprint=fingerprint,
                    locked_at=now,
                    expires_at=now + timedelta(seconds=engine_settings.IDEMPOTENCY_TTL_SECONDS),
                )
            return Reservation(record=record, owned=True)
        except IntegrityError:
            pass
        record = IdempotencyRecord.objects.filter(scope=scope, key=key).first()
        if record is None:
            continue  # purged or abandoned in between: try to insert again
        if record.expires_at <= now:
            IdempotencyRecord.objects.filter(pk=record.pk, expires_at__lte=now).delete()
            continue
        if record.fingerprint != fingerprint:
            raise IdempotencyKeyReused(
                "this idempotency key was already used with a different request",
                details={"task_id": str(record.task_id) if record.task_id else None},
            )
        if record.state == IdempotencyState.COMPLETED:
            IdempotencyRecord.objects.filter(pk=record.pk).update(replay_count=F("replay_count") + 1)
            return Reservation(record=record, owned=False)
        stale_before = now - timedelta(seconds=engine_settings.IDEMPOTENCY_LOCK_SECONDS)
        if record.locked_at <= stale_before:
            # The owner died mid-request: take the record over (one taker wins).
            taken = IdempotencyRecord.objects.filter(
                pk=record.pk, state=IdempotencyState.IN_PROGRESS, locked_at=record.locked_at
            ).update(locked_at=now)
            if taken:
                record.locked_at = now
                return Reservation(record=record, owned=True)
            continue
        if time.monotonic() >= deadline:
            raise IdempotencyKeyInUse(
                "a request with this idempotency key is still being processed; retry later",
                details={"retry_after_seconds": 1},
            )
        time.sleep(POLL_INTERVAL_SECONDS)


def idempotency_complete(*, record: IdempotencyRecord, task: Task, status: int | None, body: bytes | None) -> None:
    """Store the first response; call inside the transaction that created ``task``."""
    record.state = IdempotencyState.COMPLETED
    record.task = task
    record.response_status = status
    record.response_body = body
    record.save(update_fields=["state", "task", "response_status", "response_body"])


def idempotency_abandon(*, record: IdempotencyRecord) -> None:
    """Forget a reservation whose request was refused before it did anything (the key stays usable)."""
    IdempotencyRecord.objects.filter(pk=record.pk, state=IdempotencyState.IN_PROGRESS).delete()


def idempotency_purge_expired(*, batch_size: int = PURGE_BATCH_SIZE) -> int:
    """Delete up to ``batch_size`` expired records; return how many went."""
    expired = IdempotencyRecord.objects.filter(expires_at__lte=timezone.now()).values_list("pk", flat=True)
    ids = list(expired[:batch_size])
    if not ids:
        return 0
    deleted, _ = IdempotencyRecord.objects.filter(pk__in=ids, expires_at__lte=timezone.now()).delete()
    return deleted
