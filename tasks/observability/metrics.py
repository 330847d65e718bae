"""The engine's event metrics, recorded where things happen: workers, the sweeper, the web process.

Counters and histograms live in prometheus-client's registry. When
``PROMETHEUS_MULTIPROC_DIR`` is set (before the process starts), every process
writes its values to memory-mapped files in that directory and ``/metrics``
sums them, so several gunicorn and worker processes on one host report one
consistent set of numbers. Recording is an in-memory (or mmap) write: no
database or Redis round trip on the engine's hot path, and a failure to
record never fails the engine.

Figures that are state rather than events (tasks by state, open DLQ items,
queue lengths, live workers, the sweeper) are read from PostgreSQL and Redis
at scrape time by the console's ``dlq.metrics_export``: correct across
processes and hosts by construction. Other apps (the console) define their own
counters with the helpers below.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from prometheus_client import Counter, Histogram, disable_created_metrics

logger = logging.getLogger(__name__)

# No "<name>_created" samples: multiprocess mode has none, so exports look the same in both modes.
disable_created_metrics()

# Seconds; steps are network calls of up to a minute, tasks run up to hours.
STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TASK_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)

STEP_ATTEMPTS = Counter(
    "reliability_step_attempts",
    "Step attempts by pipeline, step, outcome and error code.",
    ["pipeline", "step", "outcome", "error_code"],
)
STEP_RETRIES = Counter(
    "reliability_step_retries",
    "Step attempts that scheduled a retry, by pipeline, step and error code.",
    ["pipeline", "step", "error_code"],
)
STEP_DURATION = Histogram(
    "reliability_step_duration_seconds",
    "Duration of step attempts.",
    ["pipeline", "step", "outcome"],
    buckets=STEP_BUCKETS,
)
TASK_DURATION = Histogram(
    "reliability_task_duration_seconds",
    "Time from submission to a terminal state, by pipeline and terminal state.",
    ["pipeline", "state"],
    buckets=TASK_BUCKETS,
)
TASKS_FINISHED = Counter("reliability_tasks_finished", "Tasks that reached a terminal state.", ["pipeline", "state"])
LEASE_EXPIRATIONS = Counter(
    "reliability_lease_expirations", "Leases that expired (a worker died or hung), by pipeline.", ["pipeline"]
)
COMPENSATIONS = Counter(
    "reliability_compensations", "Finished compensations by pipeline and outcome.", ["pipeline", "outcome"]
)
DLQ_ITEMS_CREATED = Counter(
    "reliability_dlq_items_created",
    "New dead-letter items by pipeline, reason, failing step and error code.",
    ["pipeline", "reason", "step", "error_code"],
)
DLQ_ITEMS_RESOLVED = Counter(
    "reliability_dlq_items_resolved",
    "Resolved dead-letter items by pipeline and resolution.",
    ["pipeline", "resolution"],
)

TASK_HOLDS = Counter(
    "reliability_task_holds",
    "Times a task was held back instead of starting a step (pipeline paused, concurrency or rate limit).",
    ["pipeline", "hold"],
)

TASKS_PURGED = Counter("reliability_tasks_purged", "Finished tasks deleted by the retention purge.")
ROWS_PURGED = Counter(
    "reliability_purged_rows", "Rows deleted by the retention purge (tasks and what they own), by table.", ["table"]
)


def safely(record: Callable[[], None]) -> None:
    """Run ``record`` now; a failure is logged, never raised."""
    try:
        record()
    except Exception:  # a metrics problem must never fail a step or a transaction
        logger.warning("metric not recorded", exc_info=True, extra={"event": "metric_failed"})


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def on_commit(record: Callable[[], None]) -> None:
    """Record once the surrounding transaction commits (a rolled-back change is not an event); now outside one."""
    if not connections[DEFAULT_DB_ALIAS].in_atomic_block:
        safely(record)  # what transaction.on_commit would do at once, without its bookkeeping (once per step)
        return
    transaction.on_commit(lambda: safely(record))


@functools.cache
def _child(metric, *labels: str):
    """``metric.labels(*labels)``, looked up once per label set: a step records three, on every attempt.

    prometheus-client hands back the same child for the same labels until it is removed, which this module
    never does.
    """
    return metric.labels(*labels)


# Each event below is a database change: it counts once that change commits.


def step_attempt_recorded(
    *, pipeline: str, step: str, outcome: str, error_code: str, started_at, finished_at, retried: bool = False
) -> None:
    def record():
        _child(STEP_ATTEMPTS, pipeline, step, outcome, error_code).inc()
        if retried:
            _child(STEP_RETRIES, pipeline, step, error_code).inc()
        duration = _seconds(started_at, finished_at)
        if duration is not None:
            _child(STEP_DURATION, pipeline, step, outcome).observe(duration)

    on_commit(record)


def task_finished(*, pipeline: str, state: str, created_at, finished_at) -> None:
    def record():
        TASKS_FINISHED.labels(pipeline, state).inc()
        duration = _seconds(created_at, finished_at)
        if duration is not None:
            TASK_DURATION.labels(pipeline, state).observe(duration)

    on_commit(record)


def task_held(*, pipeline: str, hold: str) -> None:
    on_commit(lambda: TASK_HOLDS.labels(pipeline, hold).inc())


def lease_expired(*, pipeline: str) -> None:
    on_commit(lambda: LEASE_EXPIRATIONS.labels(pipeline).inc())


def compensation_finished(*, pipeline: str, outcome: str) -> None:
    on_commit(lambda: COMPENSATIONS.labels(pipeline, outcome).inc())


def dlq_item_created(*, pipeline: str, reason: str, step: str, error_code: str) -> None:
    on_commit(lambda: DLQ_ITEMS_CREATED.labels(pipeline, reason, step, error_code).inc())


def dlq_item_resolved(*, pipeline: str, resolution: str, count: int = 1) -> None:
    if count:
        on_commit(lambda: DLQ_ITEMS_RESOLVED.labels(pipeline, resolution).inc(count))


def tasks_purged(*, tasks: int, rows: dict[str, int]) -> None:
    """``tasks`` finished tasks and ``rows`` ({table: rows}, the tasks' own table included) were deleted."""

    def record():
        TASKS_PURGED.inc(tasks)
        for table, count in rows.items():
            if count:
                ROWS_PURGED.labels(table).inc(count)

    if tasks:
        on_commit(record)
