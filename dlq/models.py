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
