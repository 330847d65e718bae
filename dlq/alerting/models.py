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
    # A task waiting at an approval wait (Pipeline.wait(..., approval=True)) longer than T seconds.
    APPROVAL_WAITING = "approval_waiting", _("a task waiting for approval longer than T seconds")


class AlertState(models.TextChoices):
    OK = "ok", _("ok")
    FIRING = "firing", _("firing")
    RESOLVED = "resolved", _("resolved")


class AlertChannelKind(models.TextChoices):
    WEBHOOK = "webhook", _("webhook (JSON, HMAC-signed)")
    SLACK = "slack", _("Slack-compatible incoming webhook")
    EMAIL = "email", _("e-mail")
    LOG = "log", _("log")


# The kinds that POST to the channel's URL (checked by dlq.alerting.url_checks).
URL_CHANNEL_KINDS = frozenset({AlertChannelKind.WEBHOOK, AlertChannelKind.SLACK})


class AlertChannel(models.Model):
    """Where notifications go. Failure counters are written by the delivery step, never by hand."""

    name = models.CharField(_("name"), max_length=100, unique=True)
    kind = models.CharField(_("kind"), max_length=20, choices=AlertChannelKind.choices)
    url = models.URLField(_("URL"), max_length=500, blank=True, default="", help_text=_("webhook and Slack channels"))
    secret = models.CharField(
        _("secret"),
        max_length=200,
        blank=True,
        default="",
        help_text=_("HMAC-SHA256 key for the X-Reliability-Signature header"),
    )
    email_to = models.TextField(
        _("e-mail to"), blank=True, default="", help_text=_("comma-separated addresses (e-mail channels)")
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    consecutive_failures = models.PositiveIntegerField(_("consecutive failures"), default=0)
    total_failures = models.PositiveBigIntegerField(_("total failures"), default=0)
    last_error = models.TextField(_("last error"), blank=True, default="")
    last_failure_at = models.DateTimeField(_("last failure"), null=True, blank=True)
    last_success_at = models.DateTimeField(_("last success"), null=True, blank=True)
    # Set when the engine refused the channel's URL at send time (tasks.outbound.policy: the allow-list changed, or the
    # name now resolves to an address it may not reach) and switched the channel off: why, as a rule code and its
    # facts, worded in the reader's language (dlq.alerting.url_checks). Cleared when a supervisor saves the
    # channel enabled with a URL that passes.
    disabled_reason_code = models.CharField(_("disabled because"), max_length=50, blank=True, default="")
    disabled_reason_params = models.JSONField(default=dict, blank=True)
    disabled_at = models.DateTimeField(_("disabled at"), null=True, blank=True)

    class Meta:
        verbose_name = _("alert channel")
        verbose_name_plural = _("alert channels")
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    @property
    def email_addresses(self) -> list[str]:
        return [part.strip() for part in self.email_to.split(",") if part.strip()]


class AlertRule(models.Model):
    """A condition over the DLQ or the sweeper, and its state machine: ok → firing → resolved.

    ``state`` and the notification fields change only through
    ``dlq.alerting.rules`` transitions, each a conditional UPDATE on ``version``:
    of two evaluators that see the same change, one wins and notifies.
    """

    name = models.CharField(_("name"), max_length=100, unique=True)
    kind = models.CharField(_("kind"), max_length=30, choices=AlertKind.choices)
    pipeline = models.CharField(
        _("pipeline"), max_length=100, blank=True, default="", help_text=_("empty: every pipeline")
    )
    threshold = models.FloatField(
        _("threshold"),
        help_text=_("N items, M new items, T or S seconds; fires when the value is above it (0 for new groups)"),
    )
    window_seconds = models.PositiveIntegerField(
        _("window (seconds)"),
        default=3600,
        help_text=_("growth: the window W; new failure group: how recent a first occurrence is new"),
    )
    lookback_days = models.PositiveIntegerField(
        _("lookback (days)"), default=7, help_text=_("new failure group: D days")
    )
    renotify_seconds = models.PositiveIntegerField(
        _("re-notify after (seconds)"), default=3600, help_text=_("re-notify while still firing")
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    channels = models.ManyToManyField(
        AlertChannel,
        verbose_name=_("channels"),
        blank=True,
        related_name="rules",
        help_text=_("none selected: every enabled channel"),
    )

    state = models.CharField(
        _("state"), max_length=20, choices=AlertState.choices, default=AlertState.OK, editable=False
    )
    version = models.PositiveBigIntegerField(_("version"), default=0, editable=False)
    last_value = models.FloatField(_("last value"), null=True, blank=True, editable=False)
    last_evaluated_at = models.DateTimeField(_("last evaluated"), null=True, blank=True, editable=False)
    firing_since = models.DateTimeField(_("firing since"), null=True, blank=True, editable=False)
    last_notified_at = models.DateTimeField(_("last notified"), null=True, blank=True, editable=False)

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

    rule = models.ForeignKey(AlertRule, verbose_name=_("rule"), on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(_("kind"), max_length=20, choices=AlertEventKind.choices)
    rule_version = models.PositiveBigIntegerField(
        _("rule version"), help_text=_("the rule version this transition created")
    )
    value = models.FloatField(_("value"), null=True, blank=True)
    threshold = models.FloatField(_("threshold"))
    summary = models.TextField(_("summary"), help_text=_("in English, as notifications send it"))
    # The summary's sentence (dlq.alerting.summaries) and its facts: pages show it in the reader's language.
    # Empty on events recorded before they existed; those show ``summary``.
    summary_code = models.CharField(_("summary code"), max_length=40, blank=True, default="", db_default="")
    summary_params = models.JSONField(_("summary parameters"), default=dict, db_default={}, blank=True)
    dlq_item_ids = models.JSONField(_("dead letters"), default=list, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = _("alert event")
        verbose_name_plural = _("alert history")
        ordering = ["-created_at", "-id"]
        constraints = [
            # The transition that made this event is unique: a second writer cannot add a twin.
            models.UniqueConstraint(fields=["rule", "rule_version"], name="alert_event_one_per_rule_version"),
        ]

    def __str__(self) -> str:
        return _("%(rule)s: %(kind)s at %(time)s") % {
            "rule": self.rule,
            "kind": self.get_kind_display(),
            "time": f"{self.created_at:%Y-%m-%d %H:%M:%S}",
        }

    @property
    def summary_shown(self) -> str:
        """The summary in the active language (the stored English one for events without a code)."""
        from dlq.alerting.summaries import SUMMARIES, summary_sentence

        if self.summary_code not in SUMMARIES:
            return self.summary
        return summary_sentence(code=self.summary_code, params=self.summary_params)


class AlertDeliveryStatus(models.TextChoices):
    PENDING = "pending", _("pending")
    SENT = "sent", _("sent")
    FAILED = "failed", _("failed")


class AlertDelivery(models.Model):
    """One event to one channel, delivered by an ``alert_notify`` task."""

    event = models.ForeignKey(AlertEvent, verbose_name=_("event"), on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(
        AlertChannel, verbose_name=_("channel"), on_delete=models.CASCADE, related_name="deliveries"
    )
    task = models.ForeignKey(
        "tasks.Task", verbose_name=_("task"), null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(
        _("status"), max_length=20, choices=AlertDeliveryStatus.choices, default=AlertDeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    last_error = models.TextField(_("last error"), blank=True, default="")
    delivered_at = models.DateTimeField(_("delivered"), null=True, blank=True)

    class Meta:
        verbose_name = _("alert delivery")
        verbose_name_plural = _("alert deliveries")
        constraints = [models.UniqueConstraint(fields=["event", "channel"], name="alert_delivery_one_per_channel")]

    def __str__(self) -> str:
        return _("event %(event)s → channel %(channel)s (%(status)s)") % {
            "event": self.event_id,
            "channel": self.channel_id,
            "status": self.get_status_display(),
        }
