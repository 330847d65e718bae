"""Notifications: one delivery row and one ``alert_notify`` task per channel, and their bookkeeping.

Delivery runs on the engine (``dlq.alerting.pipeline``): retries with
backoff, one idempotency key per (event, channel), and a dead letter when a
channel keeps failing. The bookkeeping functions below are called by its step.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dlq import metrics
from dlq.alerting.masking import secrets_scrubbed
from dlq.alerting.models import AlertChannel, AlertDelivery, AlertDeliveryStatus, AlertEvent, AlertRule
from tasks import task_submit

logger = logging.getLogger(__name__)

NOTIFY_PIPELINE = "alert_notify"


def alert_channels_for(rule: AlertRule) -> list[AlertChannel]:
    """The rule's enabled channels; a rule with none chosen uses every enabled channel."""
    if rule.channels.exists():
        return list(rule.channels.filter(enabled=True))
    return list(AlertChannel.objects.filter(enabled=True))


def alert_notifications_submit(*, event: AlertEvent) -> list[AlertDelivery]:
    """One delivery row and one ``alert_notify`` task per channel, in the caller's transaction."""
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


def alert_delivery_sent(*, delivery: AlertDelivery) -> None:
    now = timezone.now()
    with transaction.atomic():
        AlertDelivery.objects.filter(pk=delivery.pk).update(
            status=AlertDeliveryStatus.SENT, attempts=F("attempts") + 1, delivered_at=now, last_error=""
        )
        AlertChannel.objects.filter(pk=delivery.channel_id).update(consecutive_failures=0, last_success_at=now)
    metrics.alert_notification_attempted(
        channel_id=delivery.channel_id, channel_kind=delivery.channel.kind, outcome="sent"
    )


def alert_delivery_attempt_failed(*, delivery: AlertDelivery, error: str) -> None:
    now = timezone.now()
    error = secrets_scrubbed(error, delivery.channel)
    with transaction.atomic():
        AlertDelivery.objects.filter(pk=delivery.pk).update(attempts=F("attempts") + 1, last_error=error[:2000])
        AlertChannel.objects.filter(pk=delivery.channel_id).update(
            consecutive_failures=F("consecutive_failures") + 1,
            total_failures=F("total_failures") + 1,
            last_error=error[:2000],
            last_failure_at=now,
        )
    metrics.alert_notification_attempted(
        channel_id=delivery.channel_id, channel_kind=delivery.channel.kind, outcome="failed"
    )
    logger.warning(
        "alert notification failed",
        extra={"event": "alert_notification_failed", "channel": delivery.channel.name, "error": error[:300]},
    )


def alert_delivery_given_up(*, delivery_id: int) -> None:
    AlertDelivery.objects.filter(pk=delivery_id).exclude(status=AlertDeliveryStatus.SENT).update(
        status=AlertDeliveryStatus.FAILED
    )
