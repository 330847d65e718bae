"""Live control of a pipeline: paused or not, and limits that override the code's (``tasks.execution.gates``).

A row exists for a pipeline once someone paused it or changed its limits,
or once a worker needed its slots or permits; a pipeline without a row runs
as its code declares. Concurrency slots and rate permits are rows too, so
the limits hold across workers and hosts and through crashes: PostgreSQL
decides, at claim time and at every step start.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class PipelineControl(models.Model):
    """An operator's hold on a pipeline: pause, and limits overriding the declaration until reset."""

    pipeline = models.CharField(_("pipeline"), max_length=100, unique=True)
    paused = models.BooleanField(_("paused"), default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")
    pause_reason = models.TextField(_("pause reason"), blank=True, default="")
    # Overrides of Pipeline(max_concurrency=..., rate_limit=...): used only while *_overridden is set.
    # An overridden limit may be "none" (max_concurrency NULL, rate_limit "").
    concurrency_overridden = models.BooleanField(_("concurrency overridden"), default=False)
    max_concurrency = models.PositiveIntegerField(_("max concurrency"), null=True, blank=True)
    rate_overridden = models.BooleanField(_("rate limit overridden"), default=False)
    rate_limit = models.CharField(_("rate limit"), max_length=20, blank=True, default="")
    # The latest start time handed to a task held by the rate limit: the next one waits a step past it,
    # so held tasks come back spread at the rate instead of all at once (tasks.execution.gates).
    rate_horizon = models.DateTimeField(null=True, blank=True, editable=False)
    limits_changed_at = models.DateTimeField(_("limits changed at"), null=True, blank=True)
    limits_changed_by = models.CharField(_("limits changed by"), max_length=150, blank=True, default="")
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("pipeline control")
        verbose_name_plural = _("pipeline controls")
        ordering = ["pipeline"]
        permissions = [
            ("pause_pipeline", _("Can pause and resume a pipeline")),
            ("limit_pipeline", _("Can change a pipeline's limits")),
        ]

    def __str__(self) -> str:
        return self.pipeline


class ConcurrencySlot(models.Model):
    """One of a pipeline's ``max_concurrency`` slots and the task run that last took it.

    A slot is free when its holder no longer runs under the fencing token it
    claimed with (finished, waiting for a retry, re-queued after its lease
    expired, or deleted): nothing has to give it back, so a worker that dies
    holding one frees it once the sweeper hands its task on.
    """

    pipeline = models.CharField(max_length=100)
    slot = models.PositiveIntegerField()
    task_id = models.UUIDField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)
    taken_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("concurrency slot")
        verbose_name_plural = _("concurrency slots")
        constraints = [models.UniqueConstraint(fields=["pipeline", "slot"], name="concurrency_slot_unique")]
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.pipeline} slot {self.slot}"


class RatePermit(models.Model):
    """One of a pipeline's N step starts per window: taken again only a window after its last use.

    With N rows, each used at most once per window, no window holds more
    than N starts, across every worker.
    """

    pipeline = models.CharField(max_length=100)
    slot = models.PositiveIntegerField()
    started_at = models.DateTimeField()

    class Meta:
        verbose_name = _("rate permit")
        verbose_name_plural = _("rate permits")
        constraints = [models.UniqueConstraint(fields=["pipeline", "slot"], name="rate_permit_unique")]
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.pipeline} permit {self.slot}"
