"""Pause, concurrency and rate limits of a pipeline, decided by PostgreSQL at claim time and at every step start.

- **Pause**: no step of the pipeline starts. A task that would start one is
  held (``Task.hold``: QUEUED, no job, no attempt used) until the pipeline
  is resumed; a running step finishes and its task is held at the boundary.
- **Concurrency** (``max_concurrency``): a claim takes one of the pipeline's
  slot rows (``ConcurrencySlot``). A slot is free when the task that took it
  no longer runs under the fencing token it took it with, so a dead worker's
  slot frees as soon as the sweeper hands its task on (lease + sweep), and
  nothing has to give a slot back. ``FOR UPDATE SKIP LOCKED`` spreads
  concurrent claims over the free slots: no lock is held on the pipeline.
- **Rate** (``rate_limit``, N per window): each step start takes one of N
  permit rows (``RatePermit``) whose last use is a window old, and stamps it
  with the database's clock; so no window has more than N starts.

A task that cannot start is held, not spun on: it holds no worker and uses
no attempt. A held task is released (delivered again) when it may start: by
the run that frees a slot, by a resume, at its rate
permit's time (a scheduled delivery), and by the sweeper, which looks at
every pipeline with held tasks on each sweep and so catches anything the others missed
(``tasks.lifecycle.holds``, which writes every hold and release). Every release is re-checked by the
claim: a released task that still cannot start is held again.

Compensations and failure notices are not held back: they undo what steps
did, and a paused or limited pipeline must still be able to clean up.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from tasks import registry
from tasks.exceptions import UnknownPipeline
from tasks.models import ConcurrencySlot, PipelineControl, RatePermit, Task, TaskState
from tasks.pipelines.limits import ControlValues, Gate, RateLimit, gate_for

logger = logging.getLogger(__name__)

# Held tasks released by one call (a resume of a deep backlog goes on in the sweeper's next sweeps).
RELEASE_BATCH_SIZE = 5000
# A rate-held task whose scheduled delivery this long overdue is released by the sweeper.
RATE_RELEASE_GRACE = timedelta(seconds=1)
# Attempts at a permit when the free ones were all being taken by concurrent starts at that moment.
PERMIT_TRIES = 3
# The shortest wait a rate hold is given (a permit that frees "now" may still be taken by someone else).
MIN_RATE_WAIT_SECONDS = 0.05
# The control columns a gate needs, in ControlValues' order.
CONTROL_COLUMNS = ("paused", "concurrency_overridden", "max_concurrency", "rate_overridden", "rate_limit")


def control_values(pipeline: str) -> ControlValues | None:
    """The control row's gate columns for ``pipeline`` (None when no row exists)."""
    row = PipelineControl.objects.filter(pipeline=pipeline).values_list(*CONTROL_COLUMNS).first()
    return ControlValues.from_row(row)


def control_values_of(control: PipelineControl | None) -> ControlValues | None:
    """The gate columns of a control row already read (None: no row)."""
    if control is None:
        return None
    return ControlValues.from_row([getattr(control, column) for column in CONTROL_COLUMNS])


def gate_of(*, pipeline: str, control: ControlValues | bool | None = False) -> Gate:
    """The gate of the pipeline named ``pipeline`` now (``control``: its row's values if already read)."""
    if control is False:
        control = control_values(pipeline)
    try:
        declared = registry.get(pipeline)
    except UnknownPipeline:
        declared = None
    return gate_for(
        max_concurrency=declared.max_concurrency if declared else None,
        rate_limit=declared.rate_limit if declared else None,
        control=control,
    )


def concurrency_slot_take(*, pipeline: str, limit: int, task_id, fencing_token: int) -> bool:
    """Take a free slot of ``pipeline`` for the run of ``task_id`` under ``fencing_token``; False when none is free.

    Call it in the transaction of the claim that makes the task RUNNING with that token.
    """
    for _ in range(2):
        if connection.vendor == "postgresql":
            taken = _slot_take_sql(pipeline, limit, task_id, fencing_token)
        else:
            taken = _slot_take_orm(pipeline, limit, task_id, fencing_token)
        if taken:
            return True
        if ConcurrencySlot.objects.filter(pipeline=pipeline, slot__lt=limit).count() >= limit:
            return False
        _rows_ensure(ConcurrencySlot, pipeline, limit, {"fencing_token": 0})
    return False


def _slot_take_sql(pipeline: str, limit: int, task_id, fencing_token: int) -> bool:
    # Lock a slot that looks free, then look again with a new snapshot before taking it. One statement
    # would not do: a slot taken by a claim that committed after this statement's snapshot is re-read
    # when locked, but the holder's task row in that snapshot is still QUEUED, so it would look free
    # and be taken twice. The second statement's snapshot is newer than the holder's commit (its lock
    # was released by that commit), and while this transaction holds the slot nobody else takes it.
    slots, tasks = ConcurrencySlot._meta.db_table, Task._meta.db_table
    running = f"SELECT 1 FROM {tasks} t WHERE t.id = %s AND t.state = %s AND t.fencing_token = %s"
    passed_over: list[int] = []
    with connection.cursor() as cursor:
        for _ in range(limit):
            cursor.execute(
                f"SELECT s.id, s.task_id, s.fencing_token FROM {slots} s WHERE s.pipeline = %s AND s.slot < %s "
                f"AND NOT (s.id = ANY(%s)) AND (s.task_id IS NULL OR NOT EXISTS (SELECT 1 FROM {tasks} t "
                f"WHERE t.id = s.task_id AND t.state = %s AND t.fencing_token = s.fencing_token)) "
                f"ORDER BY s.slot LIMIT 1 FOR UPDATE OF s SKIP LOCKED",
                [pipeline, limit, passed_over, TaskState.RUNNING],
            )
            row = cursor.fetchone()
            if row is None:
                return False
            slot_id, holder, holder_token = row
            if holder is not None:
                cursor.execute(f"SELECT EXISTS ({running})", [holder, TaskState.RUNNING, holder_token])
                if cursor.fetchone()[0]:
                    passed_over.append(slot_id)  # taken by a claim this statement's snapshot did not see
                    continue
            cursor.execute(
                f"UPDATE {slots} SET task_id = %s, fencing_token = %s, taken_at = now() WHERE id = %s",
                [task_id, fencing_token, slot_id],
            )
            return True
    return False


def _slot_take_orm(pipeline: str, limit: int, task_id, fencing_token: int) -> bool:
    # SQLite (local use) serializes writers; the same rule as the SQL above.
    for slot in ConcurrencySlot.objects.filter(pipeline=pipeline, slot__lt=limit).order_by("slot"):
        holder_runs = (
            slot.task_id is not None
            and Task.objects.filter(pk=slot.task_id, state=TaskState.RUNNING, fencing_token=slot.fencing_token).exists()
        )
        if not holder_runs:
            slot.task_id, slot.fencing_token, slot.taken_at = task_id, fencing_token, timezone.now()
            slot.save(update_fields=["task_id", "fencing_token", "taken_at"])
            return True
    return False


def slots_in_use(*, pipeline: str, limit: int) -> int:
    """How many of ``pipeline``'s first ``limit`` slots are held by a running task (for releases and pages)."""
    running = Task.objects.filter(
        pk=OuterRef("task_id"), state=TaskState.RUNNING, fencing_token=OuterRef("fencing_token")
    )
    return ConcurrencySlot.objects.filter(pipeline=pipeline, slot__lt=limit).filter(Exists(running)).count()


def rate_permit_take(*, pipeline: str, rate: RateLimit) -> float | None:
    """Take a step start of ``pipeline``'s rate: None when granted, else the seconds until one may be."""
    wait = MIN_RATE_WAIT_SECONDS
    for _ in range(PERMIT_TRIES):
        if connection.vendor == "postgresql":
            granted, rows, wait = _permit_take_sql(pipeline, rate)
        else:
            granted, rows, wait = _permit_take_orm(pipeline, rate)
        if granted:
            return None
        if rows < rate.count:
            _rows_ensure(RatePermit, pipeline, rate.count, {"started_at": _never()})
            continue
        if wait > 0:
            break
    return max(wait, MIN_RATE_WAIT_SECONDS)


def _permit_take_sql(pipeline: str, rate: RateLimit) -> tuple[bool, int, float]:
    # One statement: take the least recently used permit that is a window old (the database's clock),
    # and say how many permits exist and when the next one will be a window old.
    permits = RatePermit._meta.db_table
    window = "make_interval(secs => %s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH taken AS (UPDATE {permits} SET started_at = clock_timestamp() WHERE id = ("
            f"SELECT id FROM {permits} WHERE pipeline = %s AND slot < %s "
            f"AND started_at <= clock_timestamp() - {window} ORDER BY started_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
            f"RETURNING slot) "
            f"SELECT (SELECT count(*) FROM taken), count(*), "
            f"COALESCE(EXTRACT(EPOCH FROM min(started_at) + {window} - clock_timestamp()), 0) "
            f"FROM {permits} WHERE pipeline = %s AND slot < %s",
            [pipeline, rate.count, rate.window, rate.window, pipeline, rate.count],
        )
        taken, rows, wait = cursor.fetchone()
    return bool(taken), int(rows), float(wait)


def _permit_take_orm(pipeline: str, rate: RateLimit) -> tuple[bool, int, float]:
    now = timezone.now()
    permits = list(RatePermit.objects.filter(pipeline=pipeline, slot__lt=rate.count).order_by("started_at"))
    if permits and permits[0].started_at <= now - timedelta(seconds=rate.window):
        RatePermit.objects.filter(pk=permits[0].pk).update(started_at=now)
        return True, len(permits), 0.0
    wait = (permits[0].started_at + timedelta(seconds=rate.window) - now).total_seconds() if permits else 0.0
    return False, len(permits), wait


def rate_hold_seconds(*, pipeline: str, rate: RateLimit, wait: float) -> float:
    """When (in seconds from now) a task refused a permit should try again: a place in line at the rate.

    Each held task is handed the latest time given so far plus ``window /
    count``, or ``wait`` (when a permit frees) if that is later, so held
    tasks come back spread at the rate rather than all at the next free
    permit (where all but a few would be refused again).
    """
    spacing = rate.window / rate.count
    PipelineControl.objects.get_or_create(pipeline=pipeline)
    if connection.vendor == "postgresql":
        controls = PipelineControl._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {controls} SET rate_horizon = GREATEST("
                f"COALESCE(rate_horizon, clock_timestamp()) + make_interval(secs => %s), "
                f"clock_timestamp() + make_interval(secs => %s)) "
                f"WHERE pipeline = %s RETURNING EXTRACT(EPOCH FROM rate_horizon - clock_timestamp())",
                [spacing, wait, pipeline],
            )
            row = cursor.fetchone()
        return max(float(row[0]) if row else wait, MIN_RATE_WAIT_SECONDS)
    with transaction.atomic():
        control = PipelineControl.objects.select_for_update().get(pipeline=pipeline)
        now = timezone.now()
        horizon = max((control.rate_horizon or now) + timedelta(seconds=spacing), now + timedelta(seconds=wait))
        PipelineControl.objects.filter(pk=control.pk).update(rate_horizon=horizon)
    return max((horizon - now).total_seconds(), MIN_RATE_WAIT_SECONDS)


def _never() -> datetime:
    # A new permit's last use: the epoch, so it may be taken at once.
    return datetime(1970, 1, 1, tzinfo=timezone.get_fixed_timezone(0))


def _rows_ensure(model, pipeline: str, count: int, defaults: dict) -> None:
    """Create the missing slot or permit rows 0..count-1 of ``pipeline`` (a limit set or raised)."""
    existing = set(model.objects.filter(pipeline=pipeline, slot__lt=count).values_list("slot", flat=True))
    model.objects.bulk_create(
        [model(pipeline=pipeline, slot=slot, **defaults) for slot in range(count) if slot not in existing],
        ignore_conflicts=True,
    )


def releasable(*, pipeline: str, gate: Gate) -> int:
    """How many tasks of ``pipeline`` held for pause or concurrency may be released under ``gate`` now."""
    if gate.paused:
        return 0
    if gate.max_concurrency is None:
        return RELEASE_BATCH_SIZE
    return max(gate.max_concurrency - slots_in_use(pipeline=pipeline, limit=gate.max_concurrency), 0)
