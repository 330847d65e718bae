"""``/metrics``: the Prometheus text exposition, and who may read it.

State figures are computed from PostgreSQL and Redis at scrape time by
``StateCollector`` (right however many processes or hosts run); event
counters and histograms come from ``dlq.metrics``, summed over every process
of the host through ``PROMETHEUS_MULTIPROC_DIR`` when it is set.

Every query here is bounded: tasks are counted only in non-terminal states
(``state`` index) plus those created in the last 24 hours (``created_at``
index); DLQ figures read only unresolved items (partial index); held tasks
through ``task_held_idx``, which holds only them; waiting tasks in one grouped
query on the ``state`` index; the sweeper, channel and pipeline control tables
hold a few rows.
"""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
import logging

from django.db.models import Count, Max, Min, Sum
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from dlq.alerting.models import AlertChannel, AlertChannelKind, AlertKind, AlertRule, AlertState
from dlq.conf import console_settings
from dlq.metrics import label_kind
from dlq.models import DLQItem
from tasks import registry
from tasks.models import TERMINAL_STATES, UNRESOLVED_STATUSES, PipelineControl, SweeperHeartbeat, Task, TaskState
from tasks.selectors import held_counts, live_worker_count, queue_backlogs, queue_registry_counts, waiting_counts

logger = logging.getLogger(__name__)

RECENT_WINDOW = dt.timedelta(hours=24)
ACTIVE_STATES = [state.value for state in TaskState if state not in TERMINAL_STATES]


class StateCollector:
    """Gauges read from the database and Redis on every scrape."""

    def collect(self):
        now = timezone.now()
        yield from self._tasks(now)
        yield from self._live_control()
        yield from self._waiting(now)
        yield from self._dlq(now)
        yield from self._queue(now)
        yield from self._sweeper(now)
        yield from self._alerts()

    def _tasks(self, now):
        active = GaugeMetricFamily(
            "reliability_tasks_active",
            "Tasks not yet in a terminal state, by pipeline and state.",
            labels=["pipeline", "state"],
        )
        for pipeline, state, count in (
            Task.objects.filter(state__in=ACTIVE_STATES)
            .order_by()
            .values_list("pipeline", "state")
            .annotate(Count("pk"))
        ):
            active.add_metric([pipeline, state], count)
        yield active
        recent = GaugeMetricFamily(
            "reliability_tasks_recent",
            "Tasks created in the last 24 hours, by pipeline and current state.",
            labels=["pipeline", "state"],
        )
        for pipeline, state, count in (
            Task.objects.filter(created_at__gte=now - RECENT_WINDOW)
            .order_by()
            .values_list("pipeline", "state")
            .annotate(Count("pk"))
        ):
            recent.add_metric([pipeline, state], count)
        yield recent

    def _live_control(self):
        paused = GaugeMetricFamily(
            "reliability_pipeline_paused",
            "1 while a pipeline is paused, else 0 (every registered pipeline, and any other ever paused or limited).",
            labels=["pipeline"],
        )
        rows = dict(PipelineControl.objects.values_list("pipeline", "paused"))
        for name in sorted(set(rows) | {pipeline.name for pipeline in registry.all_pipelines()}):
            paused.add_metric([name], 1 if rows.get(name) else 0)
        yield paused
        held = GaugeMetricFamily(
            "reliability_tasks_held",
            "Queued tasks held back by their pipeline's pause or limits (no job, attempts unused), by pipeline and "
            "hold (paused, concurrency, rate).",
            labels=["pipeline", "hold"],
        )
        for (pipeline, hold), count in sorted(held_counts().items()):
            held.add_metric([pipeline, hold], count)
        yield held

    def _waiting(self, now):
        waiting = GaugeMetricFamily(
            "reliability_tasks_waiting",
            'Tasks waiting without a worker, by pipeline, wait (the step: a sleep or a wait for a signal; "" for '
            "a later start) and kind (start, time, signal).",
            labels=["pipeline", "wait", "kind"],
        )
        oldest = GaugeMetricFamily(
            "reliability_approvals_oldest_waiting_seconds",
            "How long the task waiting longest at each approval wait has waited for a person's decision.",
            labels=["pipeline", "wait"],
        )
        for row in waiting_counts():
            waiting.add_metric([row.pipeline, row.wait, row.kind], row.count)
            if row.approval:
                oldest.add_metric([row.pipeline, row.wait], max(0.0, (now - row.oldest_since).total_seconds()))
        yield waiting
        yield oldest

    def _dlq(self, now):
        open_items = GaugeMetricFamily(
            "reliability_dlq_open_items", "Unresolved DLQ items by pipeline and reason.", labels=["pipeline", "reason"]
        )
        oldest = GaugeMetricFamily(
            "reliability_dlq_oldest_open_item_age_seconds",
            "Age of the oldest unresolved DLQ item, by pipeline.",
            labels=["pipeline"],
        )
        oldest_by_pipeline: dict[str, dt.datetime] = {}
        for pipeline, reason, count, first in (
            DLQItem.objects.filter(status__in=UNRESOLVED_STATUSES)
            .order_by()
            .values_list("pipeline", "reason_code")
            .annotate(Count("pk"), Min("created_at"))
        ):
            open_items.add_metric([pipeline, reason], count)
            if pipeline not in oldest_by_pipeline or first < oldest_by_pipeline[pipeline]:
                oldest_by_pipeline[pipeline] = first
        for pipeline, first in oldest_by_pipeline.items():
            oldest.add_metric([pipeline], max(0.0, (now - first).total_seconds()))
        yield open_items
        yield oldest
        # Per failure group (fingerprint): lets PromQL spot a group that was not there before.
        groups = GaugeMetricFamily(
            "reliability_dlq_open_items_by_group",
            "Unresolved DLQ items by failure group (pipeline, failing step, error code).",
            labels=["pipeline", "step", "error_code"],
        )
        for pipeline, step, error_code, count in (
            DLQItem.objects.filter(status__in=UNRESOLVED_STATUSES)
            .order_by()
            .values_list("pipeline", "failing_step", "error_code")
            .annotate(Count("pk"))
        ):
            groups.add_metric([pipeline, step, error_code], count)
        yield groups

    def _queue(self, now):
        from redis.exceptions import RedisError

        up = GaugeMetricFamily("reliability_redis_up", "1 when Redis answered this scrape.")
        jobs = GaugeMetricFamily("reliability_queue_jobs", "RQ jobs by queue and registry.", labels=["queue", "status"])
        depth = GaugeMetricFamily(
            "reliability_queue_depth", "Jobs waiting in each engine queue for a worker.", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "reliability_queue_oldest_job_age_seconds",
            "How long the oldest job waiting in each engine queue has waited (0 when the queue is empty).",
            labels=["queue"],
        )
        workers = GaugeMetricFamily("reliability_workers", "Live RQ workers (registered in Redis).")
        try:
            backlogs = queue_backlogs()
            figures = {
                name: {"scheduled": counts.scheduled, "started": counts.started, "failed": counts.failed}
                for name, counts in queue_registry_counts().items()
            }
            live = live_worker_count()
        except RedisError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        for backlog in backlogs:
            jobs.add_metric([backlog.name, "queued"], backlog.depth)
            for status, count in figures[backlog.name].items():
                jobs.add_metric([backlog.name, status], count)
            depth.add_metric([backlog.name], backlog.depth)
            oldest.add_metric([backlog.name], backlog.oldest_age(now))
        workers.add_metric([], live)
        yield from (up, jobs, depth, oldest, workers)

    def _sweeper(self, now):
        row = SweeperHeartbeat.objects.aggregate(last=Max("last_run_at"), runs=Sum("runs"))
        runs = CounterMetricFamily("reliability_sweeper_runs", "Completed sweeps, all sweeper processes.")
        runs.add_metric([], row["runs"] or 0)
        yield runs
        if row["last"] is not None:
            last = GaugeMetricFamily("reliability_sweeper_last_run_timestamp_seconds", "When the last sweep finished.")
            last.add_metric([], row["last"].timestamp())
            since = GaugeMetricFamily("reliability_sweeper_seconds_since_last_run", "Seconds since the last sweep.")
            since.add_metric([], max(0.0, (now - row["last"]).total_seconds()))
            yield from (last, since)

    def _alerts(self):
        # Ids and kinds, never names: a name is free text (dlq.metrics).
        firing = GaugeMetricFamily(
            "reliability_alert_rule_firing",
            "1 while a console alert rule fires, by rule id and rule kind.",
            labels=["rule_id", "rule_kind"],
        )
        for pk, kind, state in AlertRule.objects.filter(enabled=True).values_list("pk", "kind", "state"):
            firing.add_metric([str(pk), label_kind(kind, AlertKind)], 1 if state == AlertState.FIRING else 0)
        yield firing
        consecutive = GaugeMetricFamily(
            "reliability_alert_channel_consecutive_failures",
            "Failed deliveries in a row per alert channel id (0 after a success).",
            labels=["channel_id", "channel_kind"],
        )
        failures = CounterMetricFamily(
            "reliability_alert_channel_failures",
            "Failed delivery attempts per alert channel id.",
            labels=["channel_id", "channel_kind"],
        )
        for pk, kind, streak, total in AlertChannel.objects.values_list(
            "pk", "kind", "consecutive_failures", "total_failures"
        ):
            labels = [str(pk), label_kind(kind, AlertChannelKind)]
            consecutive.add_metric(labels, streak)
            failures.add_metric(labels, total)
        yield consecutive
        yield failures


class _ProcessLocal:
    """This process's own event metrics (single-process deployments without a multiprocess directory)."""

    def collect(self):
        return REGISTRY.collect()


def metrics_render() -> bytes:
    """The exposition text of every metric the console exports."""
    registry = CollectorRegistry(auto_describe=False)
    if console_settings.PROMETHEUS_MULTIPROC_DIR:
        MultiProcessCollector(registry, path=console_settings.PROMETHEUS_MULTIPROC_DIR)
    else:
        registry.register(_ProcessLocal())
    registry.register(StateCollector())
    return generate_latest(registry)


# --- access ------------------------------------------------------------------------------


def metrics_access(*, authorization: str, remote_addr: str) -> tuple[int, str]:
    """(status, reason) for a scrape: 200, 401 (token missing or wrong) or 403 (network or disabled).

    With a token and networks both configured, a scrape needs both.
    """
    token = console_settings.METRICS_TOKEN
    networks = console_settings.METRICS_ALLOWED_NETWORKS
    if not token and not networks:
        return 403, "metrics are disabled: set RELIABILITY_METRICS_TOKEN or RELIABILITY_METRICS_ALLOWED_NETWORKS"
    if networks:
        try:
            address = ipaddress.ip_address(remote_addr)
        except ValueError:
            return 403, "client address not allowed"
        # An embedding project may list CIDR text; the standalone settings give ipaddress networks.
        if not any(address in ipaddress.ip_network(network, strict=False) for network in networks):
            return 403, "client address not allowed"
    if token:
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), token.encode()):
            return 401, "a valid bearer token is required"
    return 200, ""
