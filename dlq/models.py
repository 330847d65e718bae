"""The console's records: its view of dead letters, the audit log, bulk operations; alerting's models.

Dead letters are the engine's (``tasks.models.DeadLetter``, written by
``tasks.lifecycle.dead_letters``); ``DLQItem`` is the console's proxy of them, which
carries the operators' permissions and the admin pages (``/admin/dlq/dlqitem/``).
Alerting's models live in ``dlq.alerting.models`` (imported from there); this
module imports it so the app registers them.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

import dlq.alerting.models  # noqa: F401 (its models are this app's: importing them registers them)
from tasks import models as engine_models

# The engine's models this module's proxies stand on: imported from tasks.models, never from here.
_ENGINE_MODELS = {"DeadLetter", "Task"}


def __getattr__(name: str):
    if name in _ENGINE_MODELS:
        # ImportError, not AttributeError: ``from dlq.models import Task`` shows this message as it is.
        raise ImportError(f"dlq.models does not export {name}: from tasks.models import {name}")
    raise AttributeError(f"module 'dlq.models' has no attribute {name!r}")


class DLQItem(engine_models.DeadLetter):
    """A dead letter as the console shows it: the operators' permissions and admin pages hang on this proxy."""

    class Meta:
        proxy = True
        verbose_name = _("dead-letter item")
        verbose_name_plural = _("dead-letter queue")
        ordering = ["-created_at"]
        permissions = [
            ("retry_dlqitem", _("Can retry a dead letter from its checkpoint")),
            ("retry_from_start_dlqitem", _("Can retry a compensated dead letter from the start")),
            ("compensate_dlqitem", _("Can compensate a dead letter")),
            ("close_dlqitem", _("Can close (resolve) a dead letter")),
            ("bulk_dlqitem", _("Can act on dead letters in bulk")),
            ("approve_bulk_dlqitem", _("Can approve another operator's bulk action")),
        ]


class ConsoleTask(engine_models.Task):
    """A task as the console's operators act on it: the cancel and approval permissions hang on this proxy.

    The task pages stay on the engine's model (``/admin/tasks/task/``); the
    proxy only carries the console's permissions (``dlq.cancel_task``, ``dlq.decide_approval``), as
    ``DLQItem`` carries the dead-letter actions', so the engine needs no
    permission of the console's.
    """

    class Meta:
        proxy = True
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        default_permissions = ()
        permissions = [
            ("cancel_task", _("Can cancel a task")),
            # The approval inbox (dlq.approvals): a decision is a signal to a task waiting at an approval wait.
            ("decide_approval", _("Can approve or reject a task waiting for approval")),
        ]


class AuditOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", _("succeeded")
    DENIED = "denied", _("denied: no permission")
    REFUSED = "refused", _("refused: not possible in this state")
    FAILED = "failed", _("failed")


class AuditEntry(models.Model):
    """One append-only row per operator action (on PostgreSQL a trigger rejects UPDATE and DELETE)."""

    created_at = models.DateTimeField(_("created"), auto_now_add=True, db_index=True)
    actor = models.CharField(_("actor"), max_length=150)
    action = models.CharField(_("action"), max_length=50)
    target_type = models.CharField(_("target type"), max_length=50)
    target_id = models.CharField(_("target id"), max_length=64)
    task_id = models.UUIDField(_("task id"), null=True, blank=True, db_index=True)
    state_before = models.CharField(_("state before"), max_length=40, blank=True, default="")
    state_after = models.CharField(_("state after"), max_length=40, blank=True, default="")
    reason = models.TextField(_("reason"), blank=True, default="")
    outcome = models.CharField(_("outcome"), max_length=20, choices=AuditOutcome.choices)
    # In English (or a resolution code, a limits change's JSON) for readers of this column alone; pages word the
    # code and its parameters in the reader's language (dlq.audit_details). Entries without a code show ``detail``.
    detail = models.TextField(_("detail"), blank=True, default="")
    detail_code = models.CharField(_("detail code"), max_length=50, blank=True, default="", db_default="")
    detail_params = models.JSONField(_("detail parameters"), blank=True, default=dict, db_default={})
    client_ip = models.GenericIPAddressField(_("client IP address"), null=True, blank=True)
    bulk_operation = models.ForeignKey(
        "BulkOperation",
        verbose_name=_("bulk action"),
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )

    class Meta:
        verbose_name = _("audit entry")
        verbose_name_plural = _("audit log")
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target_idx")]

    def __str__(self) -> str:
        # No action code here: pages show the title in the reader's language, and the action has its own field.
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.target_type}:{self.target_id}"


class BulkStatus(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval", _("awaiting approval")
    RUNNING = "running", _("running")
    PAUSED = "paused", _("paused")
    CANARY_FAILED = "canary_failed", _("stopped: canary failure rate too high")
    CANCELLED = "cancelled", _("cancelled")
    COMPLETED = "completed", _("completed")


class BulkOperation(models.Model):
    """An action applied to every DLQ item matching a filter, in the background, canary first."""

    action = models.CharField(_("action"), max_length=30)
    filter_query = models.TextField(_("filter"), help_text=_("the DLQ list filter it was started from"))
    item_ids = models.JSONField(_("items"), default=list, help_text=_("the matching items, fixed when requested"))
    reason = models.TextField(_("reason"))
    resolution_code = models.CharField(_("resolution"), max_length=40, blank=True, default="")
    requested_by = models.CharField(_("requested by"), max_length=150)
    approved_by = models.CharField(_("approved by"), max_length=150, blank=True, default="")
    status = models.CharField(_("status"), max_length=30, choices=BulkStatus.choices)
    total = models.PositiveIntegerField(_("total"), default=0)
    processed = models.PositiveIntegerField(_("processed"), default=0)
    succeeded = models.PositiveIntegerField(_("succeeded"), default=0)
    failed = models.PositiveIntegerField(_("failed"), default=0)
    canary_size = models.PositiveIntegerField(_("canary size"), default=10)
    canary_max_failure_rate = models.FloatField(_("canary's highest failure rate"), default=0.2)
    rate_per_second = models.FloatField(_("items per second"), default=5.0)
    client_ip = models.GenericIPAddressField(_("client IP address"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    class Meta:
        verbose_name = _("bulk action")
        verbose_name_plural = _("bulk actions")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return _("bulk action #%(id)s (%(status)s)") % {"id": self.pk, "status": self.get_status_display()}

    @property
    def progress_percent(self) -> int:
        return int(100 * self.processed / self.total) if self.total else 100
