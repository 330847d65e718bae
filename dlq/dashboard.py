"""Reads for the operator dashboard: task states, dead letters, queues, workers, paused pipelines and held tasks,
the sweeper, operator actions, the data held and the retention purges.

Each figure is one aggregate query bounded by a time window or by DLQ status,
on an indexed column, so the page costs the same few queries whether the
tables hold a hundred rows or millions; the rows held are PostgreSQL's own
estimates, read from its catalogue in one query. Redis figures degrade to
"unavailable" rather than failing the page.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from django.db import connection, models
from django.db.models import Count, Max, Min
from django.db.models.functions import TruncHour
from django.utils import timezone
from django.utils.html import avoid_wrapping
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from redis.exceptions import RedisError

from dlq.activity import MinuteActivity, minute_activity
from dlq.alerting.models import AlertEvent, AlertRule, AlertState
from dlq.audit import AUDIT_PURGE_KIND
from dlq.audit_actions import action_label
from dlq.conf import console_settings
from dlq.models import AuditEntry, AuditOutcome, DLQItem
from dlq.selectors import FailureGroup
from tasks.conf import engine_settings
from tasks.lifecycle import TASKS_KIND
from tasks.models import (
    Checkpoint,
    DLQStatus,
    IdempotencyRecord,
    PipelineControl,
    RetentionPurge,
    SideEffect,
    StepAttempt,
    SweeperHeartbeat,
    Task,
    TaskHold,
    TaskState,
    WaitKind,
)
from tasks.selectors import (
    QueueBacklog,
    WaitingCount,
    held_counts,
    live_workers,
    paused_pipelines,
    queue_backlogs,
    queue_registry_counts,
    waiting_counts,
)

logger = logging.getLogger(__name__)

# Task states and operator actions are counted over this recent window.
RECENT_WINDOW = dt.timedelta(hours=24)
# Seven days of hourly buckets for the DLQ growth chart.
GROWTH_HOURS = 7 * 24
TOP_PIPELINES = 10
TOP_FAILURE_GROUPS = 10
# The sweeper counts as stalled once it has missed this many sweeps in a row.
SWEEPER_MISSED_SWEEPS = 3


def age_text(*, since: dt.datetime, now: dt.datetime) -> str:
    """How long ago ``since`` was, in its largest unit only: "40 seconds", "3 hours", "2 days"."""
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return avoid_wrapping(ngettext("%(count)d second", "%(count)d seconds", seconds) % {"count": seconds})
    return timesince(since, now, depth=1)


# --- tasks -----------------------------------------------------------------------


@dataclass(frozen=True)
class StateCount:
    state: str
    label: str
    count: int


@dataclass(frozen=True)
class TaskStateCounts:
    since: dt.datetime
    counts: list[StateCount]  # every TaskState in declaration order, zeros included

    @property
    def total(self) -> int:
        return sum(row.count for row in self.counts)


def task_state_counts(*, now: dt.datetime) -> TaskStateCounts:
    """Tasks created in the last 24 hours, per current state."""
    since = now - RECENT_WINDOW
    found = dict(
        # Every state named (they are all there are): the window is then read as one range of
        # task_state_created_idx (state, created_at) per state from the index alone, instead of a
        # day of rows fetched from the table through task_created_idx for their state.
        Task.objects.filter(state__in=TaskState.values, created_at__gte=since)
        .order_by()
        .values_list("state")
        .annotate(count=Count("*"))
    )
    counts = [StateCount(state=state.value, label=state.label, count=found.get(state.value, 0)) for state in TaskState]
    return TaskStateCounts(since=since, counts=counts)


# --- dead letters ------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineCount:
    pipeline: str
    count: int


@dataclass(frozen=True)
class OpenItems:
    as_of: dt.datetime
    total: int
    oldest_created_at: dt.datetime | None
    by_pipeline: list[PipelineCount]  # the largest first, at most TOP_PIPELINES
    failure_groups: list[FailureGroup]  # the largest first, at most TOP_FAILURE_GROUPS

    @property
    def oldest_age(self) -> str:
        return age_text(since=self.oldest_created_at, now=self.as_of) if self.oldest_created_at else ""

    @property
    def in_other_pipelines(self) -> int:
        return self.total - sum(row.count for row in self.by_pipeline)


def dlq_unresolved_groups() -> list[FailureGroup]:
    """Every group of unresolved items sharing a fingerprint (pipeline:step:error code), in no particular order."""
    # exclude(RESOLVED) rather than status IN (…): the same rows, but the
    # predicate matches the partial indexes on unresolved items (the
    # one-item-per-task constraint's, and any added for this page).
    # Grouping on the fingerprint alone lets PostgreSQL estimate few groups and
    # hash them in memory; the other columns follow from the fingerprint.
    rows = (
        DLQItem.objects.exclude(status=DLQStatus.RESOLVED)
        .order_by()
        .values_list("fingerprint")
        .annotate(
            Min("pipeline"),
            Min("failing_step"),
            Min("error_code"),
            # COUNT(*), not COUNT(id): it lets PostgreSQL answer from the covering index.
            items=Count("*"),
            first_seen=Min("created_at"),
            last_seen=Max("created_at"),
        )
    )
    return [
        FailureGroup(
            fingerprint=fingerprint,
            pipeline=pipeline,
            failing_step=failing_step,
            error_code=error_code,
            count=count,
            first_seen=first_seen,
            last_seen=last_seen,
        )
        for fingerprint, pipeline, failing_step, error_code, count, first_seen, last_seen in rows
    ]


def dlq_open_items(
    *, now: dt.datetime, top_pipelines: int = TOP_PIPELINES, top_groups: int = TOP_FAILURE_GROUPS
) -> OpenItems:
    """Unresolved DLQ items: how many, the oldest, and the pipelines and failure groups with the most.

    One scan of the unresolved items, grouped by fingerprint; the totals are
    summed from the groups (a few hundred rows, not one per item).
    """
    groups = dlq_unresolved_groups()
    per_pipeline: dict[str, int] = {}
    for group in groups:
        per_pipeline[group.pipeline] = per_pipeline.get(group.pipeline, 0) + group.count
    by_pipeline = sorted(per_pipeline.items(), key=lambda row: (-row[1], row[0]))[:top_pipelines]
    largest_groups = sorted(groups, key=lambda g: (-g.count, -g.last_seen.timestamp(), g.fingerprint))[:top_groups]
    return OpenItems(
        as_of=now,
        total=sum(group.count for group in groups),
        oldest_created_at=min((group.first_seen for group in groups), default=None),
        by_pipeline=[PipelineCount(pipeline=pipeline, count=count) for pipeline, count in by_pipeline],
        failure_groups=largest_groups,
    )


@dataclass(frozen=True)
class HourlyGrowth:
    hours: list[dt.datetime]  # the start of each bucket, in UTC, oldest first
    created: list[int]
    resolved: list[int]

    @property
    def total_created(self) -> int:
        return sum(self.created)

    @property
    def total_resolved(self) -> int:
        return sum(self.resolved)


def _count_per_hour(model: type[models.Model], field: str, hours: list[dt.datetime]) -> list[int]:
    """Rows of ``model`` whose ``field`` falls in each UTC hour starting at ``hours`` (ascending), in that order."""
    if connection.vendor == "postgresql":
        # One index range count per hour, on the field's index alone. Grouping the week's rows
        # instead (date_trunc of each, then a hash of them) cost 2.5 times as much: 44 against
        # 17 ms for the 236,000 items created in a week at 1,000,000 items (docs/performance.md).
        quote = connection.ops.quote_name
        table, column = quote(model._meta.db_table), quote(model._meta.get_field(field).column)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT (SELECT COUNT(*) FROM {table}"
                f" WHERE {column} >= bucket.start AND {column} < bucket.start + interval '1 hour')"
                " FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS bucket(start, position)"
                " ORDER BY bucket.position",
                [hours],
            )
            return [row[0] for row in cursor.fetchall()]
    # Buckets are UTC hours whatever the active time zone: a zone with a half-hour offset or a
    # DST change would otherwise make buckets that do not line up with the ones laid out.
    window = {f"{field}__gte": hours[0], f"{field}__lt": hours[-1] + dt.timedelta(hours=1)}
    found = dict(
        model.objects.filter(**window)
        .annotate(hour=TruncHour(field, tzinfo=dt.UTC))
        .order_by()
        .values_list("hour")
        .annotate(count=Count("*"))  # COUNT(*) allows index-only scans
    )
    return [found.get(hour, 0) for hour in hours]


def dlq_hourly_growth(*, now: dt.datetime, hours: int = GROWTH_HOURS) -> HourlyGrowth:
    """DLQ items created and resolved per hour over the last ``hours`` hours, the current hour included."""
    current_hour = now.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    start = current_hour - dt.timedelta(hours=hours - 1)
    buckets = [start + dt.timedelta(hours=offset) for offset in range(hours)]
    return HourlyGrowth(
        hours=buckets,
        created=_count_per_hour(DLQItem, "created_at", buckets),
        resolved=_count_per_hour(DLQItem, "resolved_at", buckets),
    )


# --- queue, workers, sweeper --------------------------------------------------------


@dataclass(frozen=True)
class QueueFigures:
    available: bool  # False when Redis could not be read: every figure below is then None
    queued: int | None = None  # the counts are the sums over every engine queue
    scheduled: int | None = None
    started: int | None = None
    failed: int | None = None
    workers: tuple[str, ...] | None = None
    queues: tuple[QueueBacklog, ...] = ()  # each queue's depth and oldest job, highest priority first

    @property
    def worker_count(self) -> int | None:
        return None if self.workers is None else len(self.workers)


def queue_figures() -> QueueFigures:
    """Job counts of the engine's queues (summed), each queue's backlog, live workers; unavailable if Redis is down."""
    try:
        backlogs = tuple(queue_backlogs())
        counts = queue_registry_counts().values()
        return QueueFigures(
            available=True,
            queued=sum(backlog.depth for backlog in backlogs),
            scheduled=sum(count.scheduled for count in counts),
            started=sum(count.started for count in counts),
            failed=sum(count.failed for count in counts),
            workers=live_workers(),
            queues=backlogs,
        )
    except RedisError as exc:
        logger.warning("dashboard redis unavailable", extra={"event": "dashboard_redis_unavailable", "error": str(exc)})
        return QueueFigures(available=False)


@dataclass(frozen=True)
class SweeperStatus:
    as_of: dt.datetime
    last_run_at: dt.datetime | None  # the latest sweep of any sweeper process
    stale_after: dt.timedelta

    @property
    def stale(self) -> bool:
        return self.last_run_at is None or self.as_of - self.last_run_at > self.stale_after

    @property
    def age(self) -> str:
        return age_text(since=self.last_run_at, now=self.as_of) if self.last_run_at else ""


def sweeper_status(*, now: dt.datetime) -> SweeperStatus:
    """When a sweeper last completed a sweep, and whether that is too long ago."""
    # One row per sweeper process ever started: a small table, no window needed.
    last_run_at = SweeperHeartbeat.objects.aggregate(last=Max("last_run_at"))["last"]
    stale_after = dt.timedelta(seconds=SWEEPER_MISSED_SWEEPS * engine_settings.SWEEP_INTERVAL_SECONDS)
    return SweeperStatus(as_of=now, last_run_at=last_run_at, stale_after=stale_after)


# --- live control: paused pipelines, held tasks ----------------------------------------


@dataclass(frozen=True)
class HeldTasks:
    pipeline: str
    hold: str
    label: str
    count: int


@dataclass(frozen=True)
class PausedPipeline:
    control: PipelineControl
    held: int  # tasks of the pipeline held back (by the pause or its limits)


@dataclass(frozen=True)
class LiveControl:
    paused: list[PausedPipeline]  # longest paused first
    held: list[HeldTasks]  # per pipeline and hold reason, the largest first

    @property
    def held_total(self) -> int:
        return sum(row.count for row in self.held)


def live_control() -> LiveControl:
    """Paused pipelines (who, since when, why) and held tasks per pipeline and reason: two small queries.

    Control rows are one per pipeline ever controlled; held tasks are counted
    through ``task_held_idx``, which holds only them.
    """
    counts = held_counts()
    labels = dict(TaskHold.choices)
    held = sorted(
        (
            HeldTasks(pipeline=pipeline, hold=hold, label=str(labels.get(hold, hold)), count=count)
            for (pipeline, hold), count in counts.items()
        ),
        key=lambda row: (-row.count, row.pipeline, row.hold),
    )
    per_pipeline: dict[str, int] = {}
    for row in held:
        per_pipeline[row.pipeline] = per_pipeline.get(row.pipeline, 0) + row.count
    paused = [
        PausedPipeline(control=control, held=per_pipeline.get(control.pipeline, 0)) for control in paused_pipelines()
    ]
    return LiveControl(paused=paused, held=held)


# --- operator actions --------------------------------------------------------------


@dataclass(frozen=True)
class ActionOutcomeCounts:
    action: str
    label: str
    counts: tuple[int, ...]  # aligned with OperatorActivity.outcomes

    @property
    def total(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class OperatorActivity:
    since: dt.datetime
    outcomes: tuple[tuple[str, str], ...]  # (value, label) of every AuditOutcome, the column order
    rows: list[ActionOutcomeCounts]  # one per action seen in the window, by name

    @property
    def totals(self) -> tuple[int, ...]:
        return tuple(sum(row.counts[column] for row in self.rows) for column in range(len(self.outcomes)))

    @property
    def total(self) -> int:
        return sum(self.totals)


def operator_activity(*, now: dt.datetime) -> OperatorActivity:
    """Audited operator actions of the last 24 hours, per action and outcome."""
    since = now - RECENT_WINDOW
    counts: dict[str, dict[str, int]] = {}
    for action, outcome, count in (
        AuditEntry.objects.filter(created_at__gte=since)
        .order_by()
        .values_list("action", "outcome")
        .annotate(count=Count("pk"))
    ):
        counts.setdefault(action, {})[outcome] = count
    outcomes = tuple((outcome.value, outcome.label) for outcome in AuditOutcome)
    rows = [
        ActionOutcomeCounts(
            action=action,
            label=action_label(action),
            counts=tuple(by_outcome.get(value, 0) for value, _label in outcomes),
        )
        for action, by_outcome in sorted(counts.items())
    ]
    return OperatorActivity(since=since, outcomes=outcomes, rows=rows)


# --- alerts ---------------------------------------------------------------------------

RECENT_ALERT_EVENTS = 10


@dataclass(frozen=True)
class AlertsOverview:
    rules: int  # enabled rules
    firing: list[AlertRule]
    recent_events: list[AlertEvent]


def alerts_overview() -> AlertsOverview:
    """Firing rules and the latest alert events (small tables; the newest events via their index)."""
    rules = list(AlertRule.objects.filter(enabled=True))  # a handful of rows
    firing = sorted((rule for rule in rules if rule.state == AlertState.FIRING), key=lambda rule: rule.firing_since)
    return AlertsOverview(
        rules=len(rules),
        firing=firing,
        recent_events=list(AlertEvent.objects.select_related("rule")[:RECENT_ALERT_EVENTS]),
    )


# --- data held and retention ------------------------------------------------------------

# The tables that grow with the work done, in the order the page lists them.
HELD_TABLES: tuple[tuple[str, type[models.Model]], ...] = (
    (_("Tasks"), Task),
    (_("Step attempts"), StepAttempt),
    (_("Checkpoints"), Checkpoint),
    (_("Side-effect ledger"), SideEffect),
    (_("Dead-letter items"), DLQItem),
    (_("Idempotency records"), IdempotencyRecord),
    (_("Audit entries"), AuditEntry),
)


@dataclass(frozen=True)
class HeldRows:
    label: str
    table: str
    rows: int


@dataclass(frozen=True)
class PurgeStatus:
    as_of: dt.datetime
    retention_days: int  # 0: kept forever
    last: RetentionPurge | None  # None: never ran

    @property
    def purged_age(self) -> str:
        purged_at = self.last.last_purged_at if self.last else None
        return age_text(since=purged_at, now=self.as_of) if purged_at else ""

    @property
    def checked_age(self) -> str:
        return age_text(since=self.last.checked_at, now=self.as_of) if self.last else ""


@dataclass(frozen=True)
class DataHeld:
    estimated: bool  # PostgreSQL's estimates (planner statistics) rather than counts
    tables: list[HeldRows]
    tasks: PurgeStatus
    audit: PurgeStatus


def table_rows(tables: list[str]) -> tuple[dict[str, int], bool]:
    """Rows per table and whether they are estimates: one catalogue query on PostgreSQL, a count per table else.

    PostgreSQL's estimate is ``pg_class.reltuples``, kept by (auto)vacuum and
    analyze; a table never analyzed (-1) falls back to the live-row count of
    the statistics collector. Either costs nothing at any size; neither is
    exact between two analyzes.
    """
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            counts = {}
            for table in tables:
                cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
                counts[table] = cursor.fetchone()[0]
        return counts, False
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT name, CASE WHEN c.reltuples >= 0 THEN c.reltuples ELSE coalesce(s.n_live_tup, 0) END::bigint
            FROM unnest(%s::text[]) AS name
            JOIN pg_class AS c ON c.oid = to_regclass(name)
            LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
            """,
            [tables],
        )
        return dict(cursor.fetchall()), True


def data_held(*, now: dt.datetime) -> DataHeld:
    """Rows held per growing table, the retention settings, and the last purge of tasks and of audit entries."""
    names = [model._meta.db_table for _label, model in HELD_TABLES]
    rows, estimated = table_rows(names)
    purges = {purge.kind: purge for purge in RetentionPurge.objects.filter(kind__in=[TASKS_KIND, AUDIT_PURGE_KIND])}
    return DataHeld(
        estimated=estimated,
        tables=[
            HeldRows(label=str(label), table=model._meta.db_table, rows=rows.get(model._meta.db_table, 0))
            for label, model in HELD_TABLES
        ],
        tasks=PurgeStatus(as_of=now, retention_days=engine_settings.TASK_RETENTION_DAYS, last=purges.get(TASKS_KIND)),
        audit=PurgeStatus(
            as_of=now, retention_days=console_settings.AUDIT_RETENTION_DAYS, last=purges.get(AUDIT_PURGE_KIND)
        ),
    )


# --- waiting tasks: delayed starts, sleeps, waits for a signal, approvals ------------------


@dataclass(frozen=True)
class WaitingRow:
    count: WaitingCount
    kind_label: str  # what it waits for, in the reader's language


@dataclass(frozen=True)
class WaitingTasks:
    rows: list[WaitingRow]  # per pipeline, wait and kind; approval waits first

    @property
    def total(self) -> int:
        return sum(row.count.count for row in self.rows)

    @property
    def approvals(self) -> int:
        return sum(row.count.count for row in self.rows if row.count.approval)


def waiting_tasks() -> WaitingTasks:
    """Waiting tasks per pipeline, wait and kind (one grouped query), approval waits first."""
    labels = dict(WaitKind.choices)
    rows = [WaitingRow(count, str(labels.get(count.kind, count.kind))) for count in waiting_counts()]
    rows.sort(key=lambda row: not row.count.approval)  # stable: by pipeline and wait within each half
    return WaitingTasks(rows)


# --- the page ------------------------------------------------------------------------


@dataclass(frozen=True)
class Dashboard:
    as_of: dt.datetime
    task_states: TaskStateCounts
    open_items: OpenItems
    growth: HourlyGrowth
    activity: MinuteActivity  # tasks finished and retries per minute (dlq.activity)
    queue: QueueFigures
    live_control: LiveControl
    waiting: WaitingTasks
    sweeper: SweeperStatus
    operator_activity: OperatorActivity
    alerts: AlertsOverview
    data: DataHeld


def dashboard_snapshot(*, now: dt.datetime | None = None) -> Dashboard:
    """Every figure of the operator dashboard, as of ``now`` (default: the current time)."""
    now = now or timezone.now()
    return Dashboard(
        as_of=now,
        task_states=task_state_counts(now=now),
        open_items=dlq_open_items(now=now),
        growth=dlq_hourly_growth(now=now),
        activity=minute_activity(now=now),
        queue=queue_figures(),
        live_control=live_control(),
        waiting=waiting_tasks(),
        sweeper=sweeper_status(now=now),
        operator_activity=operator_activity(now=now),
        alerts=alerts_overview(),
        data=data_held(now=now),
    )
