"""Alerting's records: rules and their state machines, channels, events (the history) and deliveries."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class AlertKind(models.TextChoices):
    OPEN_ITEMS = "open_items", _("open DLQ items above N")
    GROWTH = "growth", _("more than M new DLQ items within a window")
    OLDEST_AGE = "oldest_age", _("oldest open DLQ item older than T seconds")
    NEW_FAILURE_GROUP = "new_failure_group", _("a failure group not seen in the last D days")
    SWEEPER_STALLED = "sweeper_stalled", _("the sweeper has not run for S seconds")


class AlertState(models.TextChoices):
    OK = "ok", _("ok")
    FIRING = "firing", _("firing")
    RESOLVED = "resolved", _("resolved")


class AlertChannelKind(models.TextChoices):
    WEBHOOK = "webhook", _("webhook (JSON, HMAC-signed)")
    SLACK = "slack", _("Slack-compatible incoming webhook")
    EMAIL = "email", _("e-mail")
    LOG = "log", _("log")


class AlertChannel(models.Model):
    """Where notifications go. Failure counters are written by the delivery step, never by hand."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=AlertChannelKind.choices)
    url = models.URLField(max_length=500, blank=True, default="", help_text=_("webhook and Slack channels"))
    secret = models.CharField(
        max_length=200, blank=True, default="", help_text=_("HMAC-SHA256 key for the X-Reliability-Signature header")
    )
    email_to = models.TextField(blank=True, default="", help_text=_("comma-separated addresses (e-mail channels)"))
    enabled = models.BooleanField(default=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    total_failures = models.PositiveBigIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("alert channel")
        verbose_name_plural = _("alert channels")
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def email_addresses(self) -> list[str]:
        return [part.strip() for part in self.email_to.split(",") if part.strip()]


class AlertRule(models.Model):
    """A condition over the DLQ or the sweeper, and its state machine: ok → firing → resolved.

    ``state`` and the notification fields change only through
    ``dlq.alerting.rules`` transitions, each a conditional UPDATE on ``version``:
    of two evaluators that see the same change, one wins and notifies.
    """

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=30, choices=AlertKind.choices)
    pipeline = models.CharField(max_length=100, blank=True, default="", help_text=_("empty: every pipeline"))
    threshold = models.FloatField(
        help_text=_("N items, M new items, T or S seconds; fires when the value is above it (0 for new groups)")
    )
    window_seconds = models.PositiveIntegerField(
        default=3600, help_text=_("growth: the window W; new failure group: how recent a first occurrence is new")
    )
    lookback_days = models.PositiveIntegerField(default=7, help_text=_("new failure group: D days"))
    renotify_seconds = models.PositiveIntegerField(default=3600, help_text=_("re-notify while still firing"))
    enabled = models.BooleanField(default=True)
    channels = models.ManyToManyField(
        AlertChannel, blank=True, related_name="rules", help_text=_("none selected: every enabled channel")
    )

    state = models.CharField(max_length=20, choices=AlertState.choices, default=AlertState.OK, editable=False)
    version = models.PositiveBigIntegerField(default=0, editable=False)
    last_value = models.FloatField(null=True, blank=True, editable=False)
    last_evaluated_at = models.DateTimeField(null=True, blank=True, editable=False)
    firing_since = models.DateTimeField(null=True, blank=True, editable=False)
    last_notified_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = _("alert rule")
        verbose_name_plural = _("alert rules")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AlertEventKind(models.TextChoices):
    FIRING = "firing", _("firing")
    RENOTIFY = "renotify", _("still firing (re-notification)")
    RESOLVED = "resolved", _("resolved")


class AlertEvent(models.Model):
    """One notification-worthy transition of a rule (the history)."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=20, choices=AlertEventKind.choices)
    rule_version = models.PositiveBigIntegerField(help_text=_("the rule version this transition created"))
    value = models.FloatField(null=True, blank=True)
    threshold = models.FloatField()
    summary = models.TextField()
    dlq_item_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = _("alert event")
        verbose_name_plural = _("alert history")
        ordering = ["-created_at", "-id"]
        constraints = [
            # The transition that made this event is unique: a second writer cannot add a twin.
            models.UniqueConstraint(fields=["rule", "rule_version"], name="alert_event_one_per_rule_version"),
        ]

    def __str__(self) -> str:
        return f"{self.rule} {self.kind} at {self.created_at:%Y-%m-%d %H:%M:%S}"


class AlertDeliveryStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    SENT = "sent", _("sent")
    FAILED = "failed", _("failed")


class AlertDelivery(models.Model):
    """One event to one channel, delivered by an ``alert_notify`` task."""

    event = models.ForeignKey(AlertEvent, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=20, choices=AlertDeliveryStatus.choices, default=AlertDeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("alert delivery")
        verbose_name_plural = _("alert deliveries")
        constraints = [models.UniqueConstraint(fields=["event", "channel"], name="alert_delivery_one_per_channel")]

    def __str__(self) -> str:
        return f"event {self.event_id} → {self.channel_id} ({self.status})"
