"""The console's event metrics: alert transitions and notification deliveries (the engine's are in tasks.metrics)."""

from __future__ import annotations

from prometheus_client import Counter

from tasks.metrics import on_commit, safely

ALERT_EVENTS = Counter("reliability_alert_events", "Alert transitions by rule and kind.", ["rule", "kind"])
ALERT_NOTIFICATIONS = Counter(
    "reliability_alert_notifications",
    "Notification delivery attempts by channel and outcome.",
    ["channel", "channel_kind", "outcome"],
)


def alert_event_recorded(*, rule: str, kind: str) -> None:
    on_commit(lambda: ALERT_EVENTS.labels(rule, kind).inc())


def alert_notification_attempted(*, channel: str, channel_kind: str, outcome: str) -> None:
    safely(lambda: ALERT_NOTIFICATIONS.labels(channel, channel_kind, outcome).inc())
