"""What each step did: attempts, checkpoints and the side-effect ledger."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from tasks.models.door import DoorManager


class AttemptKind(models.TextChoices):
    STEP = "step", _("step")
    COMPENSATION = "compensation", _("compensation")
    FAILURE_NOTICE = "failure_notice", _("failure notice")


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", _("succeeded")
    TRANSIENT_ERROR = "transient_error", _("transient error")
    PERMANENT_ERROR = "permanent_error", _("permanent error")
    TIMEOUT = "timeout", _("timed out")
    CRASHED = "crashed", _("worker lost (lease expired)")
    SKIPPED_DEADLINE = "deadline_exceeded", _("not started: deadline exceeded")
    # Interrupted by a cancel while it waited (tasks.execution.interrupts): it may have acted, like a timeout.
    CANCELLED = "cancelled", _("interrupted: task cancelled")


class StepAttempt(models.Model):
    """One row per attempt of a step, of a compensation or of the failure notice."""

    # Looked up through the composite index that starts with task (one index less to write per step).
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="attempts", db_index=False)
    kind = models.CharField(max_length=20, choices=AttemptKind.choices, default=AttemptKind.STEP)
    generation = models.PositiveIntegerField(default=0)
    step_index = models.IntegerField()
    step_name = models.CharField(max_length=100)
    attempt = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True, default="")
    fencing_token = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=32, choices=AttemptOutcome.choices)
    error_code = models.CharField(max_length=100, blank=True, default="")
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    # Kept for engineers on the server; never shown in payload views or the API.
    traceback = models.TextField(blank=True, default="")
    retry_delay_seconds = models.FloatField(null=True, blank=True, help_text=_("delay before the next attempt"))
    retry_after_seconds = models.FloatField(null=True, blank=True, help_text=_("Retry-After sent by the far side"))
    # What the step logged during the attempt (tasks.observability.attempt_log), redacted: a list of {"at", "level",
    # "logger", "message"}, its first lines within RELIABILITY_ATTEMPT_LOG_LINES and _BYTES; NULL when it logged
    # nothing.
    log = models.JSONField(null=True, blank=True, help_text=_("what the step logged during the attempt"))
    # Lines past those limits, counted, not kept. A database default too: rows written by raw SQL get 0. Not a
    # PositiveIntegerField: its CHECK would make adding the column scan the whole table under an exclusive lock.
    log_dropped = models.IntegerField(
        default=0, db_default=0, help_text=_("lines the step logged past the attempt's log limits")
    )

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        verbose_name = _("step attempt")
        verbose_name_plural = _("step attempts")
        ordering = ["started_at", "id"]
        indexes = [
            models.Index(fields=["task", "kind", "step_index"], name="attempt_task_step_idx"),
            # Failed attempts only: most attempts succeed, and a success would add an entry no one looks up.
            models.Index(fields=["error_code"], name="attempt_error_code_idx", condition=~models.Q(error_code="")),
        ]

    def __str__(self) -> str:
        return f"{self.step_name} #{self.attempt} {self.outcome}"

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class Checkpoint(models.Model):
    """A completed step and its output, keyed by the step's name; a resumed task starts after the last one."""

    # Looked up through the composite index that starts with task (one index less to write per step).
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    # Where the step stood in the pipeline when it ran (for ordering and pages; the key is the name).
    step_index = models.PositiveIntegerField()
    step_name = models.CharField(max_length=100)
    output = models.JSONField(null=True, blank=True)
    # Whether the step declared a compensation when it ran: one that is gone
    # since fails the task's compensation instead of being skipped silently (None:
    # unknown, a checkpoint written before tasks 0014 or by a tool that bypasses the runner).
    has_compensation = models.BooleanField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        verbose_name = _("checkpoint")
        verbose_name_plural = _("checkpoints")
        ordering = ["step_index"]
        constraints = [models.UniqueConstraint(fields=["task", "step_name"], name="checkpoint_unique_step_name")]

    def __str__(self) -> str:
        return f"{self.task_id} step {self.step_index} {self.step_name}"


class EffectStatus(models.TextChoices):
    DONE = "done", _("done")
    UNCERTAIN = "uncertain", _("may have happened")
    COMPENSATED = "compensated", _("compensated")


class SideEffect(models.Model):
    """The ledger of external effects: each key a step used, and whether it was undone."""

    # Looked up through the composite index that starts with task (one index less to write per step).
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="side_effects", db_index=False)
    generation = models.PositiveIntegerField(default=0)
    step_index = models.IntegerField()
    step_name = models.CharField(max_length=100)
    effect_name = models.CharField(max_length=100)
    effect_key = models.CharField(max_length=255, unique=True)
    status = models.CharField(max_length=20, choices=EffectStatus.choices, default=EffectStatus.DONE)
    created_at = models.DateTimeField(auto_now_add=True)
    compensated_at = models.DateTimeField(null=True, blank=True)

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        verbose_name = _("side effect")
        verbose_name_plural = _("side-effect ledger")
        ordering = ["step_index", "id"]
        indexes = [models.Index(fields=["task", "generation", "step_index"], name="effect_task_step_idx")]

    def __str__(self) -> str:
        return f"{self.effect_key} ({self.status})"
