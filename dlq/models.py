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
        indexes = [
            models.Index(fields=["status", "-created_at"], name="dlq_status_created_idx"),
            models.Index(fields=["pipeline", "status"], name="dlq_pipeline_status_idx"),
            models.Index(fields=["fingerprint", "status"], name="dlq_fingerprint_status_idx"),
            models.Index(fields=["reason_code", "status"], name="dlq_reason_status_idx"),
        ]

    def __str__(self) -> str:
        return f"DLQ {self.pk}: {self.pipeline}/{self.failing_step} {self.reason_code}"
