"""Alert rules as small state machines (ok → firing → resolved): evaluation and transitions.

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
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dlq import metrics
from dlq.alerting.measures import Measurement, rule_measure
from dlq.alerting.models import AlertEvent, AlertEventKind, AlertRule, AlertState
from dlq.alerting.notifications import alert_notifications_submit

logger = logging.getLogger(__name__)


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
            summary_code=measurement.summary_code,
            summary_params=measurement.summary_params,
            dlq_item_ids=list(measurement.dlq_item_ids),
        )
        alert_notifications_submit(event=event)
        metrics.alert_event_recorded(rule_id=rule.pk, kind=event_kind)
    logger.log(
        logging.INFO if event_kind == AlertEventKind.RESOLVED else logging.WARNING,
        "alert %s",
        event_kind,
        extra={"event": f"alert_{event_kind}", "rule": rule.name, "value": measurement.value},
    )
    return event
