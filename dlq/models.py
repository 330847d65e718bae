"""Dead-letter queue items: one open item per failed task, for an operator to triage."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class DLQStatus(models.TextChoices):
    OPEN = "open", _("open")
    RETRYING = "retrying", _("retrying")
    COMPENSATING = "compensating", _("compensating")
    COMPENSATED = "compensated", _("compensated")
    RESOLVED = "resolved", _("resolved")


# Every status but RESOLVED counts as "open" for the one-item-per-task promise.
UNRESOLVED_STATUSES = (DLQStatus.OPEN, DLQStatus.RETRYING, DLQStatus.COMPENSATING, DLQStatus.COMPENSATED)


class ResolutionCode(models.TextChoices):
    FIXED_MANUALLY = "fixed_manually", _("fixed manually")
    DUPLICATE = "duplicate", _("duplicate")
    IGNORED = "ignored", _("ignored")
    NOT_A_BUG = "not_a_bug", _("expected behaviour")
    RETRIED = "retried", _("retried successfully")
    COMPENSATED = "compensated", _("compensated, nothing more to do")


class DLQItem(models.Model):
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="dlq_items")
    pipeline = models.CharField(max_length=100)
    reason_code = models.CharField(max_length=40)
    reason = models.TextField(help_text=_("human-readable explanation of the failure"))
    error_code = models.CharField(max_length=100, blank=True, default="")
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    failing_step = models.CharField(max_length=100, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    input_snapshot = models.JSONField(default=dict, help_text=_("task input with secrets redacted"))
    fingerprint = models.CharField(max_length=300, help_text=_("pipeline:step:error code, for grouping"))
    status = models.CharField(max_length=20, choices=DLQStatus.choices, default=DLQStatus.OPEN)
    compensation_error = models.TextField(blank=True, default="")
    resolution_code = models.CharField(max_length=40, blank=True, default="")
    resolution_note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("dead-letter item")
        verbose_name_plural = _("dead-letter queue")
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["task"],
                condition=~Q(status="resolved"),
                name="dlq_one_unresolved_item_per_task",
            ),
        ]
        permissions = [
            ("retry_dlqitem", _("Can retry a dead letter from its checkpoint")),
            ("retry_from_start_dlqitem", _("Can retry a compensated dead letter from the start")),
            ("compensate_dlqitem", _("Can compensate a dead letter")),
            ("close_dlqitem", _("Can close (resolve) a dead letter")),
            ("bulk_dlqitem", _("Can act on dead letters in bulk")),
            ("approve_bulk_dlqitem", _("Can approve another operator's bulk action")),
        ]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="dlq_status_created_idx"),
            models.Index(fields=["-created_at"], name="dlq_created_idx"),
            models.Index(fields=["error_class", "status"], name="dlq_error_class_status_idx"),
            models.Index(fields=["failing_step", "status"], name="dlq_step_status_idx"),
            models.Index(fields=["resolved_at"], name="dlq_resolved_idx"),
            models.Index(fields=["pipeline", "status"], name="dlq_pipeline_status_idx"),
            models.Index(fields=["fingerprint", "status"], name="dlq_fingerprint_status_idx"),
            models.Index(fields=["reason_code", "status"], name="dlq_reason_status_idx"),
        ]

    def __str__(self) -> str:
        return f"DLQ {self.pk}: {self.pipeline}/{self.failing_step} {self.reason_code}"


class AuditOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", _("succeeded")
    DENIED = "denied", _("denied: no permission")
    REFUSED = "refused", _("refused: not possible in this state")
    FAILED = "failed", _("failed")


class AuditEntry(models.Model):
    """One append-only row per operator action (on PostgreSQL a trigger rejects UPDATE and DELETE)."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=50)
    target_type = models.CharField(max_length=50)
    target_id = models.CharField(max_length=64)
    task_id = models.UUIDField(null=True, blank=True, db_index=True)
    state_before = models.CharField(max_length=40, blank=True, default="")
    state_after = models.CharField(max_length=40, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    outcome = models.CharField(max_length=20, choices=AuditOutcome.choices)
    detail = models.TextField(blank=True, default="")
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    bulk_operation = models.ForeignKey(
        "BulkOperation", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )

    class Meta:
        verbose_name = _("audit entry")
        verbose_name_plural = _("audit log")
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target_idx")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target_type}:{self.target_id}"


class BulkStatus(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval", _("awaiting approval")
    RUNNING = "running", _("running")
    PAUSED = "paused", _("paused")
    CANARY_FAILED = "canary_failed", _("stopped: canary failure rate too high")
    CANCELLED = "cancelled", _("cancelled")
    COMPLETED = "completed", _("completed")


class BulkOperation(models.Model):
    """An action applied to every DLQ item matching a filter, in the background, canary first."""

    action = models.CharField(max_length=30)
    filter_query = models.TextField(help_text=_("the DLQ list filter it was started from"))
    item_ids = models.JSONField(default=list, help_text=_("the matching items, fixed when requested"))
    reason = models.TextField()
    resolution_code = models.CharField(max_length=40, blank=True, default="")
    requested_by = models.CharField(max_length=150)
    approved_by = models.CharField(max_length=150, blank=True, default="")
    status = models.CharField(max_length=30, choices=BulkStatus.choices)
    total = models.PositiveIntegerField(default=0)
    processed = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    canary_size = models.PositiveIntegerField(default=10)
    canary_max_failure_rate = models.FloatField(default=0.2)
    rate_per_second = models.FloatField(default=5.0)
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("bulk action")
        verbose_name_plural = _("bulk actions")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} on {self.total} items ({self.status})"

    @property
    def progress_percent(self) -> int:
        return int(100 * self.processed / self.total) if self.total else 100


# --- alerting -------------------------------------------------------------------------


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
    ``dlq.alerting`` transitions, each a conditional UPDATE on ``version``:
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
