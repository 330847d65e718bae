"""The console's event metrics: alert transitions and notification deliveries (the engine's are in
tasks.observability.metrics).

Rules and channels are labelled by id and by kind, never by name: a name is free text an operator typed
(``<script>``, quotes, newlines), unbounded in what it may say, and it changes when renamed, splitting a series.
The console's pages show which rule or channel an id is.
"""

from __future__ import annotations

from prometheus_client import Counter

from dlq.alerting.models import AlertChannelKind, AlertEventKind
from tasks.observability.metrics import on_commit, safely

ALERT_EVENTS = Counter("reliability_alert_events", "Alert transitions by rule id and kind.", ["rule_id", "kind"])
ALERT_NOTIFICATIONS = Counter(
    "reliability_alert_notifications",
    "Notification delivery attempts by channel id, channel kind and outcome.",
    ["channel_id", "channel_kind", "outcome"],
)
# A kind outside its choices (a row written by hand) is labelled this, so a label holds only known words.
OTHER_KIND = "other"


def label_kind(kind: str, choices: type) -> str:
    """``kind`` if it is one of ``choices`` (a TextChoices), else ``other``."""
    return kind if kind in choices.values else OTHER_KIND


def alert_event_recorded(*, rule_id: int, kind: str) -> None:
    on_commit(lambda: ALERT_EVENTS.labels(str(rule_id), label_kind(kind, AlertEventKind)).inc())


def alert_notification_attempted(*, channel_id: int, channel_kind: str, outcome: str) -> None:
    safely(
        lambda: ALERT_NOTIFICATIONS.labels(str(channel_id), label_kind(channel_kind, AlertChannelKind), outcome).inc()
    )
