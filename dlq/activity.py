"""The dashboard's per-minute charts: tasks finished by outcome, and retries scheduled, over the last hours.

Each series is one grouped query over a time range of an index made for it
(``tasks`` 0013): finished tasks through ``task_finished_idx`` (finished_at,
with the state included, so PostgreSQL answers from the index alone), retries
through ``attempt_retried_idx`` (the finish time of the attempts that had a
retry scheduled after them). Both indexes hold only the rows they count, so
neither grows with queued or running work, and a query reads only the rows
of its window: a few hours of finishes, not the millions of tasks kept.

Minutes are UTC minutes whatever the active time zone, so every bucket lines
up with the ones the chart lays out.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncMinute

from tasks.models import StepAttempt, Task, TaskState

# The charts cover this many hours, one point per minute.
ACTIVITY_HOURS = 3
# The outcomes of a finished task, in the order the chart's legend lists them.
OUTCOMES = (
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.COMPENSATED,
    TaskState.COMPENSATION_FAILED,
    TaskState.CANCELLED,
)


@dataclass(frozen=True)
class MinuteActivity:
    minutes: list[dt.datetime]  # the start of each bucket, in UTC, oldest first
    finished: dict[str, list[int]]  # per outcome (a terminal TaskState), aligned with minutes
    retries: list[int]  # attempts that had a retry scheduled after them, aligned with minutes

    @property
    def hours(self) -> int:
        return len(self.minutes) // 60

    @property
    def total_finished(self) -> int:
        return sum(sum(counts) for counts in self.finished.values())

    @property
    def total_retries(self) -> int:
        return sum(self.retries)


def _minute_buckets(*, now: dt.datetime, hours: int) -> tuple[list[dt.datetime], dt.datetime, dt.datetime]:
    current = now.astimezone(dt.UTC).replace(second=0, microsecond=0)
    count = hours * 60
    start = current - dt.timedelta(minutes=count - 1)
    return [start + dt.timedelta(minutes=offset) for offset in range(count)], start, current + dt.timedelta(minutes=1)


def _per_minute(queryset: QuerySet, *group_by: str) -> list[tuple]:
    return list(
        queryset.annotate(minute=TruncMinute("finished_at", tzinfo=dt.UTC))
        .order_by()
        .values_list("minute", *group_by)
        .annotate(count=Count("*"))  # COUNT(*) allows index-only scans
    )


def tasks_finished_per_minute(*, start: dt.datetime, end: dt.datetime) -> dict[tuple[dt.datetime, str], int]:
    """Tasks that finished in [start, end), per UTC minute and outcome: one grouped query."""
    rows = _per_minute(Task.objects.filter(finished_at__gte=start, finished_at__lt=end), "state")
    return {(minute, state): count for minute, state, count in rows}


def retries_per_minute(*, start: dt.datetime, end: dt.datetime) -> dict[dt.datetime, int]:
    """Attempts that ended in [start, end) with a retry scheduled after them, per UTC minute: one grouped query."""
    retried = StepAttempt.objects.filter(retry_delay_seconds__isnull=False, finished_at__gte=start, finished_at__lt=end)
    return {minute: count for minute, count in _per_minute(retried)}


def minute_activity(*, now: dt.datetime, hours: int = ACTIVITY_HOURS) -> MinuteActivity:
    """Tasks finished per minute by outcome and retries per minute over the last ``hours``, this minute included."""
    minutes, start, end = _minute_buckets(now=now, hours=hours)
    finished = tasks_finished_per_minute(start=start, end=end)
    retries = retries_per_minute(start=start, end=end)
    return MinuteActivity(
        minutes=minutes,
        finished={state.value: [finished.get((minute, state.value), 0) for minute in minutes] for state in OUTCOMES},
        retries=[retries.get(minute, 0) for minute in minutes],
    )
