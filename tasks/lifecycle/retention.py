"""The retention purge: finished tasks, with every row they own, deleted once they are old enough.

A task may go when it is finished (a terminal state) for longer than the
retention and nothing still needs it:

- it has no unresolved dead letter (``in_dlq`` is off, and no unresolved
  item exists), and none was resolved within the retention (an operator's
  recent close keeps the task and its item as long as a recent finish would);
- no idempotency record still inside its TTL points at it (a replay of that
  key must find its task);
- no row of another app that protects it (``PROTECT``, ``RESTRICT``) points
  at it.

It goes with its attempts, checkpoints, ledger rows, resolved dead letters
and expired idempotency records; a row of another app that refers to it
follows its own ``on_delete`` (the console's alert deliveries keep their
history with the task set to NULL). Nothing else is read or written: the
audit log refers to tasks by id, not by a foreign key, and keeps them.

Each batch is one short transaction: lock up to ``batch_size`` candidates
(finished, past the cutoff, no open dead letter: the rows of a partial index,
in finish order) with ``FOR UPDATE SKIP LOCKED`` (a task someone holds is
left for a later run), drop from the batch the tasks that something above
still needs (one indexed lookup per kind of row, for the whole batch), delete
what the others own, delete them, commit. No session state outlives a
transaction (``SET LOCAL`` only, no server-side cursor, no advisory lock), so
it runs behind PgBouncer in transaction mode. The next batch starts after
the last (finished_at, id) of the previous one, so a run never walks again
over the index entries of rows it deleted. Between batches it pauses in
proportion to the batch's time (``pause_ratio``), leaving the database to the
workers. Several purges at once are safe (they skip each other's rows).

The sweeper runs it every ``RELIABILITY_PURGE_INTERVAL_SECONDS`` for at most
``SWEEPER_RUN_SECONDS``; ``manage.py purge_finished_tasks`` runs it until done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone

from tasks.conf import engine_settings
from tasks.lifecycle.purge import tasks_purge
from tasks.models import TERMINAL_STATES, DeadLetter, DLQStatus, IdempotencyRecord, RetentionPurge, Task
from tasks.observability import metrics

logger = logging.getLogger(__name__)

# Exactly the predicate of the partial index task_purge_candidates_idx (migration 0018), sorted as written there.
PURGEABLE_STATES = sorted(TERMINAL_STATES)
TASKS_KIND = "finished_tasks"
# A sweeper run purges for at most this long (pauses included): the sweep it is part of (expired leases, due
# retries, lost deliveries) waits for it. The dashboard says when runs stop here with more to delete.
SWEEPER_RUN_SECONDS = 5.0
# A batch never queues behind someone else's lock while holding its own: a locked task is skipped (SKIP
# LOCKED); a row it owns that is locked (nobody should hold one of a finished task) ends the batch instead.
BATCH_LOCK_TIMEOUT = "2s"
BATCH_STATEMENT_TIMEOUT = "60s"


@dataclass(kw_only=True)
class PurgeRun:
    """How a batched purge went: its batches, its seconds (pauses included), and whether it ran out of rows."""

    batches: int = 0
    seconds: float = 0.0
    # True when nothing was left to delete; False when the run stopped at its time limit.
    complete: bool = False


def purge_batches(
    *,
    run: PurgeRun,
    batch: Callable[[tuple | None], list[tuple]],
    batch_size: int,
    max_seconds: float | None = None,
    pause_ratio: float = 0.0,
    on_batch: Callable[[PurgeRun], None] | None = None,
) -> None:
    """Call ``batch(after)`` until it returns fewer than ``batch_size`` keys, or ``max_seconds`` have passed.

    ``batch`` handles (in its own transaction) at most ``batch_size`` rows in
    key order after ``after`` (None: from the start) and returns their keys;
    the next call starts after the last of them. After each full batch the
    run pauses ``pause_ratio`` times as long as the batch took. ``run``
    counts the batches and the seconds; ``on_batch`` sees it after each batch.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    clock = time.monotonic()
    after = None
    while True:
        batch_started = time.monotonic()
        found = batch(after)
        batch_seconds = time.monotonic() - batch_started
        run.seconds = time.monotonic() - clock
        if found:
            run.batches += 1
            after = found[-1]
            if on_batch is not None:
                on_batch(run)
        if len(found) < batch_size:
            run.complete = True
            return
        if max_seconds is not None and run.seconds >= max_seconds:
            return
        if pause_ratio > 0:
            time.sleep(batch_seconds * pause_ratio)


@dataclass(kw_only=True)
class PurgeReport(PurgeRun):
    """What a purge deleted (with ``dry_run``, would delete): tasks, and rows per model, tasks included."""

    cutoff: datetime
    dry_run: bool
    tasks: int = 0
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def count(self, rows: dict[str, int]) -> None:
        for label, number in rows.items():
            if number:
                self.rows[label] = self.rows.get(label, 0) + number

    def as_log(self) -> dict:
        return {
            "cutoff": self.cutoff.isoformat(),
            "dry_run": self.dry_run,
            "tasks": self.tasks,
            "rows": self.total_rows,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "complete": self.complete,
        }


def finished_tasks_purge(
    *,
    older_than: timedelta,
    batch_size: int,
    dry_run: bool = False,
    max_seconds: float | None = None,
    pause_ratio: float = 0.0,
    on_batch: Callable[[PurgeReport], None] | None = None,
) -> PurgeReport:
    """Delete the tasks that finished more than ``older_than`` ago and that nothing still needs, batch by batch.

    Each batch of at most ``batch_size`` tasks is its own transaction.
    ``dry_run`` reads the same batches and counts what would go, changing
    nothing. ``max_seconds`` stops the run after the batch that reaches it;
    after each batch the run pauses ``pause_ratio`` times as long as the
    batch took, so that it leaves the database to the workers that share it
    (1: it purges at most half of the time). ``on_batch`` is called with the
    report so far after each batch.
    A real run is recorded (``RetentionPurge``, kind ``finished_tasks``) for
    the dashboard.
    """
    started_at = timezone.now()
    cutoff = started_at - older_than
    report = PurgeReport(cutoff=cutoff, dry_run=dry_run)

    def batch(after):
        if dry_run:
            return _dry_batch(cutoff, started_at, after, batch_size, report)
        with transaction.atomic():
            _limit_waits()
            return _batch(cutoff, started_at, after, batch_size, report)

    purge_batches(
        run=report,
        batch=batch,
        batch_size=batch_size,
        max_seconds=max_seconds,
        pause_ratio=0.0 if dry_run else pause_ratio,
        on_batch=on_batch,
    )
    if not dry_run:
        retention_purge_record(
            kind=TASKS_KIND,
            cutoff=cutoff,
            items=report.tasks,
            rows=report.total_rows,
            seconds=report.seconds,
            complete=report.complete,
        )
    if report.tasks or dry_run:
        logger.info("tasks purged", extra={"event": "tasks_purged", **report.as_log()})
    return report


def finished_tasks_purge_due() -> int:
    """The sweeper's chore: one bounded run with the configured retention (none when it is 0); tasks deleted."""
    days = engine_settings.TASK_RETENTION_DAYS
    if not days:
        return 0
    report = finished_tasks_purge(
        older_than=timedelta(days=days),
        batch_size=engine_settings.PURGE_BATCH_SIZE,
        max_seconds=SWEEPER_RUN_SECONDS,
        pause_ratio=engine_settings.PURGE_PAUSE_RATIO,
    )
    return report.tasks


def retention_purge_record(
    *, kind: str, cutoff: datetime, items: int, rows: int, seconds: float, complete: bool
) -> None:
    """Record a purge run of ``kind`` for the dashboard.

    Every run sets when it ran and whether it finished (``caught_up``); one
    that deleted something also sets its figures and adds to the totals.
    """
    now = timezone.now()
    values: dict = {"checked_at": now, "caught_up": complete}
    if items or rows:
        values.update(
            last_purged_at=now,
            last_cutoff=cutoff,
            last_items=items,
            last_rows=rows,
            last_seconds=seconds,
            total_items=F("total_items") + items,
            total_rows=F("total_rows") + rows,
        )
    if not RetentionPurge.objects.filter(kind=kind).update(**values):
        # The first run of this kind: create the row (a concurrent first run may win; then update it).
        created = {key: value for key, value in values.items() if not key.startswith("total_")}
        _, made = RetentionPurge.objects.get_or_create(
            kind=kind, defaults={**created, "total_items": items, "total_rows": rows}
        )
        if not made:
            RetentionPurge.objects.filter(kind=kind).update(**values)


# --- one batch ---------------------------------------------------------------------------------------------


def _limit_waits() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # Transaction-local, so nothing outlives the batch (PgBouncer in transaction mode). A batch lost in a
            # crash is simply deleted again by the next run: it need not wait for its commit to reach the disk.
            cursor.execute(
                f"SET LOCAL lock_timeout = '{BATCH_LOCK_TIMEOUT}'; "
                f"SET LOCAL statement_timeout = '{BATCH_STATEMENT_TIMEOUT}'; "
                "SET LOCAL synchronous_commit = off"
            )


def _candidates(cutoff: datetime, after: tuple[datetime, object] | None) -> models.QuerySet:
    """Finished tasks past the cutoff without an open dead letter, oldest finish first, after ``after``.

    Exactly the rows of the partial index task_purge_candidates_idx, walked in its order from ``after`` (the
    last (finished_at, id) already handled). What else keeps a task is checked on the batch (``_kept``).
    """
    candidates = Task.objects.filter(state__in=PURGEABLE_STATES, in_dlq=False, finished_at__lt=cutoff)
    if after is not None:
        finished_at, pk = after
        # finished_at >= … bounds the index range; the exclusion drops the ties already handled.
        candidates = candidates.filter(finished_at__gte=finished_at).exclude(finished_at=finished_at, pk__lte=pk)
    return candidates.order_by("finished_at", "pk")


def _kept(ids: list, cutoff: datetime, now: datetime) -> set:
    """The tasks among ``ids`` that must stay: a dead letter, an idempotency record or another app needs them.

    One indexed lookup per kind of row for the whole batch (``task_id IN (…)``): its cost does not depend
    on how many dead letters or records the tables hold.
    """
    kept = set(
        DeadLetter.objects.filter(task_id__in=ids)
        .filter(~Q(status=DLQStatus.RESOLVED) | Q(resolved_at__gte=cutoff) | Q(resolved_at__isnull=True))
        .values_list("task_id", flat=True)
    )
    kept.update(IdempotencyRecord.objects.filter(task_id__in=ids, expires_at__gt=now).values_list("task_id", flat=True))
    for relation in _protecting_relations():
        column = relation.field.attname
        rows = relation.related_model._base_manager.filter(**{f"{column}__in": ids})
        kept.update(rows.values_list(column, flat=True))
    return kept


def _batch(cutoff, now, after, batch_size: int, report: PurgeReport) -> list[tuple[datetime, object]]:
    found = list(
        _candidates(cutoff, after)
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("finished_at", "pk")[:batch_size]
    )
    if not found:
        return found
    kept = _kept([pk for _, pk in found], cutoff, now)
    ids = [pk for _, pk in found if pk not in kept]
    if not ids:
        return found
    rows = tasks_purge(task_ids=ids)
    tasks = rows.get(Task._meta.label, 0)
    report.tasks += tasks
    report.count(rows)
    metrics.tasks_purged(tasks=tasks, rows=rows)
    return found


def _dry_batch(cutoff, now, after, batch_size: int, report: PurgeReport) -> list[tuple[datetime, object]]:
    found = list(_candidates(cutoff, after).values_list("finished_at", "pk")[:batch_size])
    if not found:
        return found
    kept = _kept([pk for _, pk in found], cutoff, now)
    ids = [pk for _, pk in found if pk not in kept]
    if not ids:
        return found
    rows = {Task._meta.label: len(ids)}
    rows[DeadLetter._meta.label] = DeadLetter.objects.filter(task_id__in=ids, status=DLQStatus.RESOLVED).count()
    for relation in _owned_relations():
        model = relation.related_model
        rows[model._meta.label] = model._base_manager.filter(**{f"{relation.field.attname}__in": ids}).count()
    report.tasks += len(ids)
    report.count(rows)
    return found


# --- what points at a task -----------------------------------------------------------------------------------


def _relations_to_task():
    # Every foreign key to Task, from any installed app, hidden ones (related_name="+") included, as Django's
    # deletion collector sees them.
    return [
        relation
        for relation in Task._meta.get_fields(include_hidden=True)
        if relation.auto_created and not relation.concrete and (relation.one_to_one or relation.one_to_many)
    ]


def _owned_relations():
    """Rows deleted with their task (CASCADE): attempts, checkpoints, ledger rows, idempotency records, …"""
    return [relation for relation in _relations_to_task() if relation.on_delete is models.CASCADE]


def _protecting_relations():
    """Rows that forbid their task's deletion (PROTECT, RESTRICT), dead letters aside: their task is kept."""
    return [
        relation
        for relation in _relations_to_task()
        if relation.on_delete in (models.PROTECT, models.RESTRICT) and relation.related_model is not DeadLetter
    ]
