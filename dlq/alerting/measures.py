"""Reads behind the alert rules: one bounded, indexed query (or a few) per rule.

- open items: unresolved items (partial unique index, ``pipeline, status`` index);
- growth: items created in the window (``created_at`` index);
- oldest: the earliest ``created_at`` among unresolved items (``status, created_at``);
- new failure group: fingerprints of the window (bounded by ``NEW_GROUP_SCAN_LIMIT``),
  each checked with one EXISTS on the ``fingerprint, status`` index;
- sweeper: the latest heartbeat (one row per sweeper process);
- approval waiting: the tasks waiting longest at an approval wait (``task_state_updated_id_idx``: a waiting
  task's ``updated_at`` is when it began to wait).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db.models import Max, Min

from dlq.alerting.models import AlertKind, AlertRule
from dlq.alerting.summaries import SHOWN_GROUPS, summary_sentence_english
from dlq.models import DLQItem
from tasks.models import UNRESOLVED_STATUSES, SweeperHeartbeat
from tasks.selectors import approval_waiting_tasks

# Notifications link to at most this many matching items (and the filtered list).
LINKED_ITEMS = 20
# At most this many distinct fingerprints of the window are checked for novelty.
NEW_GROUP_SCAN_LIMIT = 200


@dataclass(frozen=True)
class Measurement:
    value: float | None  # None: nothing to measure yet (no sweeper ever ran)
    breaching: bool
    summary_code: str  # a key of dlq.alerting.summaries.SUMMARIES
    summary_params: dict = field(default_factory=dict)
    dlq_item_ids: tuple[int, ...] = ()

    @property
    def summary(self) -> str:
        """The summary in English, as stored with the event and sent in notifications."""
        return summary_sentence_english(code=self.summary_code, params=self.summary_params)


def _scope(queryset, rule: AlertRule):
    return queryset.filter(pipeline=rule.pipeline) if rule.pipeline else queryset


def _facts(rule: AlertRule, **values) -> dict:
    # Numbers as the sentence shows them, so the stored facts read the same in every language.
    return {"pipeline": rule.pipeline, "limit": f"{rule.threshold:g}", **values}


def _open(rule: AlertRule):
    return _scope(DLQItem.objects.filter(status__in=UNRESOLVED_STATUSES), rule)


def measure_open_items(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    items = _open(rule)
    count = items.count()
    ids = tuple(items.order_by("-created_at").values_list("pk", flat=True)[:LINKED_ITEMS])
    return Measurement(float(count), count > rule.threshold, "open_items", _facts(rule, count=count), ids)


def measure_growth(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    items = _scope(DLQItem.objects.filter(created_at__gte=now - dt.timedelta(seconds=rule.window_seconds)), rule)
    count = items.count()
    ids = tuple(items.order_by("-created_at").values_list("pk", flat=True)[:LINKED_ITEMS])
    facts = _facts(rule, count=count, window=rule.window_seconds)
    return Measurement(float(count), count > rule.threshold, "growth", facts, ids)


def measure_oldest_age(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    oldest = list(_open(rule).order_by("created_at").values_list("pk", "created_at")[:LINKED_ITEMS])
    if not oldest:
        return Measurement(0.0, False, "oldest_age_none", _facts(rule))
    age = max(0.0, (now - oldest[0][1]).total_seconds())
    facts = _facts(rule, age=f"{age:.0f}")
    return Measurement(age, age > rule.threshold, "oldest_age", facts, tuple(pk for pk, _ in oldest))


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
        return Measurement(0.0, False, "new_failure_group_none", _facts(rule))
    facts = _facts(rule, count=len(new), days=rule.lookback_days, groups=new[: SHOWN_GROUPS + 1])
    return Measurement(float(len(new)), len(new) > rule.threshold, "new_failure_group", facts, ids)


def measure_sweeper_stalled(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    last = SweeperHeartbeat.objects.aggregate(last=Max("last_run_at"))["last"]
    if last is None:
        return Measurement(None, True, "sweeper_never_ran", _facts(rule))
    age = max(0.0, (now - last).total_seconds())
    breaching = age > rule.threshold
    code = "sweeper_stalled" if breaching else "sweeper_age"
    return Measurement(age, breaching, code, _facts(rule, age=f"{age:.0f}"))


def measure_approval_waiting(rule: AlertRule, *, now: dt.datetime) -> Measurement:
    tasks = approval_waiting_tasks(pipeline=rule.pipeline or None)
    oldest = tasks.values_list("updated_at", flat=True).first()
    if oldest is None:
        return Measurement(0.0, False, "approval_waiting_none", _facts(rule))
    age = max(0.0, (now - oldest).total_seconds())
    # The tasks past the limit (the breach's size), counted only when there is one.
    count = (
        tasks.filter(updated_at__lt=now - dt.timedelta(seconds=rule.threshold)).count() if age > rule.threshold else 0
    )
    code = "approval_waiting" if count else "approval_waiting_age"
    return Measurement(age, age > rule.threshold, code, _facts(rule, age=f"{age:.0f}", count=count))


MEASURES = {
    AlertKind.OPEN_ITEMS: measure_open_items,
    AlertKind.GROWTH: measure_growth,
    AlertKind.OLDEST_AGE: measure_oldest_age,
    AlertKind.NEW_FAILURE_GROUP: measure_new_failure_group,
    AlertKind.SWEEPER_STALLED: measure_sweeper_stalled,
    AlertKind.APPROVAL_WAITING: measure_approval_waiting,
}


def rule_measure(*, rule: AlertRule, now: dt.datetime) -> Measurement:
    """The rule's current value and whether it is beyond its threshold."""
    return MEASURES[AlertKind(rule.kind)](rule, now=now)
