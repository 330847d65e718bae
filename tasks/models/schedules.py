"""Schedules and the slots they fired: written only by ``tasks.lifecycle.schedules`` (the write door).

A schedule declared in code (``Pipeline(schedules=...)``) has a row the sweeper keeps in step with the code; one
added in the console exists only as its row. A slot fired is a ``ScheduleRun``: its unique (schedule, slot) index
is what makes one task per slot, whatever the number of sweepers, their crashes and restarts.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from tasks.models.door import DoorManager


class ScheduleSource(models.TextChoices):
    CODE = "code", _("code")
    CONSOLE = "console", _("console")


class PipelineSchedule(models.Model):
    """A schedule: its definition, paused or not, its next slot and what its last slots did."""

    name = models.CharField(_("name"), max_length=150, unique=True)
    pipeline = models.CharField(_("pipeline"), max_length=100)
    # The definition (tasks.pipelines.schedules.Schedule): a cron expression in a time zone, or an interval in seconds.
    cron = models.CharField(_("cron"), max_length=100, blank=True, default="")
    every_seconds = models.FloatField(_("every (seconds)"), null=True, blank=True)
    timezone = models.CharField(_("time zone"), max_length=64, default="UTC")
    input = models.JSONField(_("input"), null=True, blank=True)
    overlap = models.CharField(_("overlap"), max_length=10, default="skip")
    # Null: one interval.
    catch_up_seconds = models.FloatField(_("catch-up window (seconds)"), null=True, blank=True)
    source = models.CharField(_("source"), max_length=10, choices=ScheduleSource.choices)
    paused = models.BooleanField(_("paused"), default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")
    # Null: nothing to fire (a code schedule no longer declared).
    next_slot_at = models.DateTimeField(_("next slot"), null=True, blank=True)
    last_slot_at = models.DateTimeField(_("last slot"), null=True, blank=True)
    # The task of the last slot fired (no foreign key: retention purges tasks, the schedule stays).
    last_task_id = models.UUIDField(_("last task"), null=True, blank=True)
    slots_skipped = models.PositiveIntegerField(_("slots skipped (overlap)"), default=0)
    last_skipped_at = models.DateTimeField(_("last slot skipped"), null=True, blank=True)
    slots_missed = models.PositiveIntegerField(_("slots missed (outage)"), default=0)
    last_error = models.TextField(_("last error"), blank=True, default="")
    changed_by = models.CharField(_("changed by"), max_length=150, blank=True, default="")
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ["name"]
        indexes = [models.Index(fields=["next_slot_at"], name="schedule_next_slot_idx")]
        permissions = [("pause_pipelineschedule", _("Can pause and resume a schedule"))]

    def __str__(self) -> str:
        return self.name


class ScheduleRun(models.Model):
    """A slot a schedule fired: the task it submitted, or why it could not."""

    schedule = models.ForeignKey(PipelineSchedule, on_delete=models.CASCADE, related_name="runs", db_index=False)
    slot_at = models.DateTimeField(_("slot"))
    task_id = models.UUIDField(_("task"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True, default="")
    fired_at = models.DateTimeField(_("fired at"), auto_now_add=True)

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        verbose_name = _("schedule run")
        verbose_name_plural = _("schedule runs")
        constraints = [models.UniqueConstraint(fields=["schedule", "slot_at"], name="schedule_run_unique_slot")]

    def __str__(self) -> str:
        return f"{self.schedule_id} {self.slot_at:%Y-%m-%dT%H:%M:%SZ}"
