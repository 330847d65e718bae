"""The dead-letter record: one unresolved item per failed task, part of the task's failure outcome.

The engine owns it: the item is opened, re-opened, moved and resolved by
``tasks.lifecycle.dead_letters`` in the transaction that writes the task's outcome, so
"every FAILED, COMPENSATED or COMPENSATION_FAILED task has exactly one open
item" holds without the console. The console (``dlq``) shows it through a
proxy model (``dlq.models.DLQItem``) that carries the operators' permissions
and admin pages.

The table keeps the name it had when the console owned the model
(``dlq_dlqitem``): moving the model moved no data.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from tasks.models.door import DoorManager
from tasks.reason_texts import reason_sentence


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


def resolution_label(code: str) -> str:
    """A resolution code's label in the active language; an unknown code (or "") as it is."""
    return str(ResolutionCode(code).label) if code in ResolutionCode.values else code


class DeadLetter(models.Model):
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="dlq_items", verbose_name=_("task"))
    pipeline = models.CharField(_("pipeline"), max_length=100)
    reason_code = models.CharField(_("reason code"), max_length=40)
    reason = models.TextField(_("reason"), help_text=_("the explanation of the failure, in English"))
    # The facts of the reason's sentence (tasks.reason_texts): pages make it in the reader's language.
    # Empty on items written before it existed; those show ``reason``.
    reason_params = models.JSONField(_("reason parameters"), default=dict, db_default={}, blank=True)
    error_code = models.CharField(_("error code"), max_length=100, blank=True, default="")
    error_class = models.CharField(_("error class"), max_length=200, blank=True, default="")
    error_message = models.TextField(_("error message"), blank=True, default="")
    failing_step = models.CharField(_("failing step"), max_length=100, blank=True, default="")
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    input_snapshot = models.JSONField(
        _("input snapshot"), default=dict, help_text=_("task input with secrets redacted")
    )
    fingerprint = models.CharField(
        _("fingerprint"), max_length=300, help_text=_("pipeline:step:error code, for grouping")
    )
    status = models.CharField(_("status"), max_length=20, choices=DLQStatus.choices, default=DLQStatus.OPEN)
    compensation_error = models.TextField(_("compensation error"), blank=True, default="")
    resolution_code = models.CharField(_("resolution"), max_length=40, blank=True, default="")
    resolution_note = models.TextField(_("resolution note"), blank=True, default="")
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    resolved_at = models.DateTimeField(_("resolved"), null=True, blank=True)

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        db_table = "dlq_dlqitem"
        verbose_name = _("dead-letter item")
        verbose_name_plural = _("dead-letter queue")
        ordering = ["-created_at"]
        # No admin shows this model; the console's proxy holds the permissions.
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(
                fields=["task"],
                condition=~Q(status="resolved"),
                name="dlq_one_unresolved_item_per_task",
            ),
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

    @property
    def reason_shown(self) -> str:
        """The reason in the active language (the stored English one for items without parameters)."""
        if not self.reason_params:
            return self.reason
        return reason_sentence(reason=self.reason_code, params=self.reason_params)

    @property
    def resolution_shown(self) -> str:
        """The resolution code's label in the active language ("" while unresolved)."""
        return resolution_label(self.resolution_code)
