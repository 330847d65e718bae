"""Alert rules as small state machines (ok → firing → resolved) and their notifications.

Every transition is one conditional UPDATE on the rule's ``version`` (and
state) plus, in the same transaction, its ``AlertEvent`` and one
``alert_notify`` task per channel. Two evaluators that see the same change
race on that UPDATE: one wins and notifies, the other finds nothing to do.
Delivery runs on the engine (retries, backoff, DLQ), after commit, so a
slow or failing channel never holds up the evaluation of other rules.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dlq import metrics
from dlq.alert_measures import Measurement, rule_measure
from dlq.models import (
    AlertChannel,
    AlertDelivery,
    AlertDeliveryStatus,
    AlertEvent,
    AlertEventKind,
    AlertRule,
    AlertState,
)

logger = logging.getLogger(__name__)

NOTIFY_PIPELINE = "alert_notify"


@dataclass
class EvaluationReport:
    evaluated: int = 0
    events: list[AlertEvent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def alerts_evaluate(*, now: dt.datetime | None = None) -> EvaluationReport:
    """Evaluate every enabled rule once; safe to run in several processes at the same time."""
    now = now or timezone.now()
    report = EvaluationReport()
    for rule in AlertRule.objects.all():
        try:
            event = alert_rule_evaluate(rule=rule, now=now)
        except Exception as exc:
            # One broken rule (or an outage mid-way) must not stop the others.
            logger.exception("alert rule failed", extra={"event": "alert_rule_failed", "rule": rule.name})
            report.errors.append(f"{rule.name}: {exc}")
            continue
        report.evaluated += 1
        if event is not None:
            report.events.append(event)
    return report


def alert_rule_evaluate(*, rule: AlertRule, now: dt.datetime) -> AlertEvent | None:
    """Measure ``rule`` and apply at most one transition; return the event it made, if any."""
    if not rule.enabled:
        if rule.state == AlertState.FIRING:
            # A rule switched off while firing stops firing without a notification.
            _transition(rule, state=AlertState.OK, event_kind=None, measurement=None, now=now, firing_since=None)
        return None
    measurement = rule_measure(rule=rule, now=now)
    if measurement.breaching:
        if rule.state != AlertState.FIRING:
            return _transition(
                rule,
                state=AlertState.FIRING,
                event_kind=AlertEventKind.FIRING,
                measurement=measurement,
                now=now,
                firing_since=now,
                last_notified_at=now,
            )
        due = rule.last_notified_at is None or now - rule.last_notified_at >= dt.timedelta(
            seconds=rule.renotify_seconds
        )
        if due:
            return _transition(
                rule,
                state=AlertState.FIRING,
                event_kind=AlertEventKind.RENOTIFY,
                measurement=measurement,
                now=now,
                last_notified_at=now,
            )
    elif rule.state == AlertState.FIRING:
        return _transition(
            rule,
            state=AlertState.RESOLVED,
            event_kind=AlertEventKind.RESOLVED,
            measurement=measurement,
            now=now,
            firing_since=None,
        )
    # No transition: remember the value for the admin and the dashboard (not versioned).
    AlertRule.objects.filter(pk=rule.pk).update(last_value=measurement.value, last_evaluated_at=now)
    return None


def _transition(
    rule: AlertRule,
    *,
    state: str,
    event_kind: str | None,
    measurement: Measurement | None,
    now: dt.datetime,
    **fields,
) -> AlertEvent | None:
    with transaction.atomic():
        updated = AlertRule.objects.filter(pk=rule.pk, version=rule.version, state=rule.state).update(
            state=state,
            version=F("version") + 1,
            last_value=measurement.value if measurement else rule.last_value,
            last_evaluated_at=now,
            **fields,
        )
        if not updated:
            # Another evaluator (or an edit in the admin) changed the rule since we read it.
            logger.info("alert transition lost", extra={"event": "alert_transition_lost", "rule": rule.name})
            return None
        if event_kind is None or measurement is None:
            return None
        event = AlertEvent.objects.create(
            rule=rule,
            kind=event_kind,
            rule_version=rule.version + 1,
            value=measurement.value,
            threshold=rule.threshold,
            summary=measurement.summary,
            dlq_item_ids=list(measurement.dlq_item_ids),
        )
        alert_notifications_submit(event=event)
        metrics.alert_event_recorded(rule=rule.name, kind=event_kind)
    logger.log(
        logging.INFO if event_kind == AlertEventKind.RESOLVED else logging.WARNING,
        "alert %s",
        event_kind,
        extra={"event": f"alert_{event_kind}", "rule": rule.name, "value": measurement.value},
    )
    return event


def alert_channels_for(rule: AlertRule) -> list[AlertChannel]:
    """The rule's enabled channels; a rule with none chosen uses every enabled channel."""
    if rule.channels.exists():
        return list(rule.channels.filter(enabled=True))
    return list(AlertChannel.objects.filter(enabled=True))


def alert_notifications_submit(*, event: AlertEvent) -> list[AlertDelivery]:
    """One delivery row and one ``alert_notify`` task per channel, in the caller's transaction."""
    from tasks.services import task_submit

    deliveries = []
    for channel in alert_channels_for(event.rule):
        delivery = AlertDelivery.objects.create(event=event, channel=channel)
        task = task_submit(
            pipeline=NOTIFY_PIPELINE,
            input={"delivery_id": delivery.pk},
            idempotency_key=f"alert-{event.pk}-{channel.pk}",
        )
        delivery.task = task
        delivery.save(update_fields=["task"])
        deliveries.append(delivery)
    return deliveries


# --- delivery bookkeeping (called by the alert_notify step) --------------------------


def alert_delivery_sent(*, delivery: AlertDelivery) -> None:
    now = timezone.now()
    with transaction.atomic():
        AlertDelivery.objects.filter(pk=delivery.pk).update(
            status=AlertDeliveryStatus.SENT, attempts=F("attempts") + 1, delivered_at=now, last_error=""
        )
        AlertChannel.objects.filter(pk=delivery.channel_id).update(consecutive_failures=0, last_success_at=now)
    metrics.alert_notification_attempted(
        channel=delivery.channel.name, channel_kind=delivery.channel.kind, outcome="sent"
    )


def alert_delivery_attempt_failed(*, delivery: AlertDelivery, error: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        AlertDelivery.objects.filter(pk=delivery.pk).update(attempts=F("attempts") + 1, last_error=error[:2000])
        AlertChannel.objects.filter(pk=delivery.channel_id).update(
            consecutive_failures=F("consecutive_failures") + 1,
            total_failures=F("total_failures") + 1,
            last_error=error[:2000],
            last_failure_at=now,
        )
    metrics.alert_notification_attempted(
        channel=delivery.channel.name, channel_kind=delivery.channel.kind, outcome="failed"
    )
    logger.warning(
        "alert notification failed",
        extra={"event": "alert_notification_failed", "channel": delivery.channel.name, "error": error[:300]},
    )


def alert_delivery_given_up(*, delivery_id: int) -> None:
    AlertDelivery.objects.filter(pk=delivery_id).exclude(status=AlertDeliveryStatus.SENT).update(
        status=AlertDeliveryStatus.FAILED
    )


# --- the periodic job ------------------------------------------------------------------


class EvaluationSchedule:
    """Decides, in memory, whether evaluation is due: the sweeper asks on every sweep for free."""

    def __init__(self, interval: float | None = None, *, start_due: bool = False) -> None:
        self.interval = interval or settings.RELIABILITY_ALERT_INTERVAL_SECONDS
        self._next = time.monotonic() if start_due else time.monotonic() + self.interval
        self._lock = threading.Lock()

    def run_if_due(self) -> EvaluationReport | None:
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                return None
            self._next = now + self.interval
        return alerts_evaluate()
