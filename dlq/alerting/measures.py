"""Reads behind the alert rules: one bounded, indexed query (or a few) per rule.

- open items: unresolved items (partial unique index, ``pipeline, status`` index);
- growth: items created in the window (``created_at`` index);
- oldest: the earliest ``created_at`` among unresolved items (``status, created_at``);
- new failure group: fingerprints of the window (bounded by ``NEW_GROUP_SCAN_LIMIT``),
  each checked with one EXISTS on the ``fingerprint, status`` index;
- sweeper: the latest heartbeat (one row per sweeper process).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Max, Min

from dlq.alerting.models import AlertKind, AlertRule
from dlq.models import DLQItem
from tasks.models import UNRESOLVED_STATUSES, SweeperHeartbeat

# Notifications link to at most this many matching items (and the filtered list).
LINKED_ITEMS = 20
# At most this many distinct fingerprints of the window are checked for novelty.
NEW_GROUP_SCAN_LIMIT = 200


@dataclass(frozen=True)
class Measurement:
    value: float | None  # None: nothing to measure yet (no sweeper ever ran)
    breaching: bool
    summary: str
    dlq_item_ids: tuple[int, ...] = ()


def _scope(queryset, rule: AlertRule):
    return queryset.filter(pipeline=rule.pipeline) if rule.pipeline else queryset


def _where(rule: AlertRule) -> str:
    return f"pipeline {rule.pipeline!r}" if rule.pipeline else "all pipelines"


def _open(rule: AlertRule):
    return _scope(DLQItem.objects.filter(status__in=UNRESOLVED_STATUSES), rule)


def measure_open_items(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    items = _open(rule)
    count = items.count()
    ids = tuple(items.order_by("-created_at").values_list("pk", flat=True)[:LINKED_ITEMS])
    return Measurement(
        float(count),
        count > rule.threshold,
        f"{count} open DLQ items in {_where(rule)} (limit {rule.threshold:g})",
        ids,
    )


def measure_growth(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    items = _scope(DLQItem.objects.filter(created_at__gte=now - dt.timedelta(seconds=rule.window_seconds)), rule)
    count = items.count()
    ids = tuple(items.order_by("-created_at").values_list("pk", flat=True)[:LINKED_ITEMS])
    summary = f"{count} new DLQ items in {_where(rule)} within {rule.window_seconds}s (limit {rule.threshold:g})"
    return Measurement(float(count), count > rule.threshold, summary, ids)


def measure_oldest_age(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    oldest = list(_open(rule).order_by("created_at").values_list("pk", "created_at")[:LINKED_ITEMS])
    if not oldest:
        return Measurement(0.0, False, f"no open DLQ items in {_where(rule)}")
    age = max(0.0, (now - oldest[0][1]).total_seconds())
    summary = f"the oldest open DLQ item in {_where(rule)} is {age:.0f}s old (limit {rule.threshold:g}s)"
    return Measurement(age, age > rule.threshold, summary, tuple(pk for pk, _ in oldest))


def measure_new_failure_group(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    window_start = now - dt.timedelta(seconds=rule.window_seconds)
    lookback = dt.timedelta(days=rule.lookback_days)
    recent = (
        _scope(DLQItem.objects.filter(created_at__gte=window_start), rule)
        .order_by()
        .values_list("fingerprint")
        .annotate(first_seen=Min("created_at"))[:NEW_GROUP_SCAN_LIMIT]
    )
    new = [
        fingerprint
        for fingerprint, first_seen in recent
        if not DLQItem.objects.filter(
            fingerprint=fingerprint, created_at__lt=first_seen, created_at__gte=first_seen - lookback
        ).exists()
    ]
    new.sort()
    ids = tuple(
        DLQItem.objects.filter(fingerprint__in=new, created_at__gte=window_start)
        .order_by("-created_at")
        .values_list("pk", flat=True)[:LINKED_ITEMS]
    )
    if not new:
        return Measurement(0.0, False, f"no new failure group in {_where(rule)}")
    shown = ", ".join(new[:5]) + (" …" if len(new) > 5 else "")
    summary = f"{len(new)} failure group(s) not seen in the previous {rule.lookback_days} days: {shown}"
    return Measurement(float(len(new)), len(new) > rule.threshold, summary, ids)


def measure_sweeper_stalled(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    last = SweeperHeartbeat.objects.aggregate(last=Max("last_run_at"))["last"]
    if last is None:
        return Measurement(None, True, "no sweeper has ever run: delivery of lost or retried tasks is at risk")
    age = max(0.0, (now - last).total_seconds())
    breaching = age > rule.threshold
    summary = f"the last sweep finished {age:.0f}s ago (limit {rule.threshold:g}s)"
    return Measurement(age, breaching, summary + (": delivery is at risk" if breaching else ""))


MEASURES = {
    AlertKind.OPEN_ITEMS: measure_open_items,
    AlertKind.GROWTH: measure_growth,
    AlertKind.OLDEST_AGE: measure_oldest_age,
    AlertKind.NEW_FAILURE_GROUP: measure_new_failure_group,
    AlertKind.SWEEPER_STALLED: measure_sweeper_stalled,
}


def rule_measure(*, rule: AlertRule, now: dt.datetime) -> Measurement:
    """The rule's current value and whether it is beyond its threshold."""
    return MEASURES[AlertKind(rule.kind)](rule, now=now)
