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

from django.db import IntegrityError, connection, transaction
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
            raise key_reused(record)
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
            raise key_in_use()
        time.sleep(POLL_INTERVAL_SECONDS)


def key_reused(record: IdempotencyRecord) -> IdempotencyKeyReused:
    """The error for a request under ``record``'s key that is not the request it was first used with."""
    return IdempotencyKeyReused(
        "this idempotency key was already used with a different request",
        details={"task_id": str(record.task_id) if record.task_id else None},
    )


def key_in_use() -> IdempotencyKeyInUse:
    """The error for a request whose key another request is still processing (to send again)."""
    return IdempotencyKeyInUse(
        "a request with this idempotency key is still being processed; retry later",
        details={"retry_after_seconds": 1},
    )


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


# --- batches (tasks.submission.batches): many keys in one transaction -------------------------------------------------


def idempotency_reserve_many(
    *, scope: str, entries: list[tuple[str, str]], taken_over: list[IdempotencyRecord]
) -> dict[str, IdempotencyRecord]:
    """Reserve each (key, fingerprint) of ``entries`` for the caller's transaction; the records won, by key.

    ``taken_over``: records read expired, or in progress past the lock time, which go first (only if they are
    still as read). A key another request holds now (it inserted it since, committed or not) is not reserved:
    the insert skips it instead of failing the whole batch, and the caller refuses that item.
    """
    for record in taken_over:
        IdempotencyRecord.objects.filter(
            pk=record.pk, state=record.state, locked_at=record.locked_at, expires_at=record.expires_at
        ).delete()
    if not entries:
        return {}
    now = timezone.now()
    expires_at = now + timedelta(seconds=engine_settings.IDEMPOTENCY_TTL_SECONDS)
    rows = [
        IdempotencyRecord(scope=scope, key=key, fingerprint=fingerprint, locked_at=now, expires_at=expires_at)
        for key, fingerprint in entries
    ]
    meta = IdempotencyRecord._meta
    fields = [field for field in meta.concrete_fields if field is not meta.auto_field]
    quote = connection.ops.quote_name
    values = ", ".join("(" + ", ".join(["%s"] * len(fields)) + ")" for _ in rows)
    params = [field.get_db_prep_save(field.pre_save(row, add=True), connection) for row in rows for field in fields]
    scope_key = ", ".join(quote(meta.get_field(name).column) for name in ("scope", "key"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
            f"VALUES {values} ON CONFLICT ({scope_key}) DO NOTHING "
            f"RETURNING {quote(meta.pk.column)}, {quote(meta.get_field('key').column)}",
            params,
        )
        won = dict((key, pk) for pk, key in cursor.fetchall())
    reserved = {}
    for row in rows:
        if row.key in won:
            row.pk = won[row.key]
            row._state.adding = False
            reserved[row.key] = row
    return reserved


def idempotency_complete_many(completions: list[tuple[IdempotencyRecord, Task, int | None, bytes | None]]) -> None:
    """Store each reserved record's task and first response, in one statement (inside the batch's transaction)."""
    records = []
    for record, task, status, body in completions:
        record.state = IdempotencyState.COMPLETED
        record.task = task
        record.response_status = status
        record.response_body = body
        records.append(record)
    if records:
        IdempotencyRecord.objects.bulk_update(records, ["state", "task", "response_status", "response_body"])


def idempotency_replayed(records: list[IdempotencyRecord]) -> None:
    """Count one more replay of each of ``records`` (completed records whose request came again)."""
    if records:
        IdempotencyRecord.objects.filter(pk__in=[record.pk for record in records]).update(
            replay_count=F("replay_count") + 1
        )
