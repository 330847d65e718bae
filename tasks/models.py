"""The engine's durable state: tasks, step attempts, checkpoints and the side-effect ledger.

State changes go through django-fsm-2 transitions only. ``Task`` saves are
conditional on the state it was loaded in (ConcurrentTransitionMixin) and on
the fencing token a worker holds, so a concurrent writer or a zombie worker
cannot move a task backwards.
"""

from __future__ import annotations

import datetime
import functools
import uuid

from django.db import models
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django_fsm import ConcurrentTransition, ConcurrentTransitionMixin, FSMField, FSMFieldMixin, transition


class TaskState(models.TextChoices):
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    RETRY_SCHEDULED = "retry_scheduled", _("retry scheduled")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    COMPENSATING = "compensating", _("compensating")
    COMPENSATED = "compensated", _("compensated")
    COMPENSATION_FAILED = "compensation_failed", _("compensation failed")


TERMINAL_STATES = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.COMPENSATED, TaskState.COMPENSATION_FAILED}
)
LEASED_STATES = (TaskState.RUNNING, TaskState.COMPENSATING)


class FailureReason(models.TextChoices):
    PERMANENT_ERROR = "permanent_error", _("permanent error")
    ATTEMPTS_EXHAUSTED = "attempts_exhausted", _("attempts exhausted")
    DEADLINE_EXCEEDED = "deadline_exceeded", _("deadline exceeded")
    CRASH_LOOP = "crash_loop", _("crash loop")
    COMPENSATION_FAILED = "compensation_failed", _("compensation failed")


class ApiClient(models.Model):
    """A program that calls the HTTP API with a bearer token (only its hash is stored)."""

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=12, help_text=_("first characters, to recognise a token"))
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("API client")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Task(ConcurrentTransitionMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    pipeline = models.CharField(max_length=100)
    input = models.JSONField(default=dict)
    state = FSMField(max_length=32, choices=TaskState.choices, default=TaskState.QUEUED, protected=True)

    current_step = models.PositiveIntegerField(default=0, help_text=_("index of the next step to run"))
    total_steps = models.PositiveIntegerField(default=0)
    step_attempt = models.PositiveIntegerField(default=0, help_text=_("attempts made at the current step"))
    total_attempts = models.PositiveIntegerField(default=0)
    # Incremented by "retry from start": side-effect keys include it, so a
    # task that was compensated and started again makes new, distinct effects.
    generation = models.PositiveIntegerField(default=0)

    deadline = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)

    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)
    crash_count = models.PositiveIntegerField(default=0)
    # True while the task has an unresolved DLQ item: a retried task that then
    # succeeds resolves it in its finishing transaction.
    in_dlq = models.BooleanField(default=False)

    result = models.JSONField(null=True, blank=True)
    failure_reason = models.CharField(max_length=40, choices=FailureReason.choices, blank=True, default="")
    failure_code = models.CharField(max_length=100, blank=True, default="")
    failure_message = models.TextField(blank=True, default="")
    failed_step = models.CharField(max_length=100, blank=True, default="")

    # Indexed by task_client_created_idx (client first); no separate index.
    client = models.ForeignKey(
        ApiClient, null=True, blank=True, on_delete=models.PROTECT, related_name="tasks", db_index=False
    )
    # Copied from the submission for search; uniqueness lives in IdempotencyRecord
    # (records expire, after which a key may be used again).
    idempotency_scope = models.CharField(max_length=100, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["idempotency_key"], name="task_idempotency_key_idx"),
            models.Index(fields=["client", "-created_at", "-id"], name="task_client_created_idx"),
            models.Index(fields=["state", "lease_expires_at"], name="task_state_lease_idx"),
            models.Index(fields=["state", "retry_at"], name="task_state_retry_idx"),
            models.Index(fields=["state", "updated_at"], name="task_state_updated_idx"),
            models.Index(fields=["pipeline", "-created_at"], name="task_pipeline_created_idx"),
            models.Index(fields=["-created_at"], name="task_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline} {self.id} ({self.state})"

    # A worker's save is also fenced: see _do_update.
    def save(self, *args, **kwargs) -> None:
        super().save(*args, **kwargs)
        self._loaded_fencing_token = self.fencing_token

    @property
    def state_fields(self):
        # The mixin scans every field for FSM fields on each load and save; they never change.
        return _fsm_fields(type(self))

    def _update_initial_state(self) -> None:
        # The mixin keeps the state the row was read or saved in to itself;
        # a fenced write made without save() needs it too (fencing_guard).
        super()._update_initial_state()
        self._saved_state = self.state

    def fencing_guard(self) -> tuple[str, int | None]:
        """(state, fencing token) the row must still have for this instance's write to apply.

        The same condition ``save()`` applies: the state the row was read or
        last saved in, and the token it was read with (None: not fenced).
        """
        return self._saved_state, getattr(self, "_loaded_fencing_token", None)

    def mark_saved(self) -> None:
        """Record a write made outside ``save()`` (see ``tasks.fenced_writes``): the next guard starts here."""
        self._update_initial_state()
        self._loaded_fencing_token = self.fencing_token

    # --- fencing --------------------------------------------------------------
    # A save made by a worker is conditional on the fencing token the worker
    # read when it loaded the row (on top of the mixin's state condition).
    def _do_update(self, base_qs, using, pk_val, values, update_fields, forced_update, *args, **kwargs):
        loaded_token = getattr(self, "_loaded_fencing_token", None)
        if loaded_token is None:
            return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update, *args, **kwargs)
        fenced = base_qs.filter(fencing_token=loaded_token)
        updated = super()._do_update(fenced, using, pk_val, values, update_fields, forced_update, *args, **kwargs)
        if not updated and base_qs.filter(pk=pk_val).exists():
            raise ConcurrentTransition("the task was taken over by a newer lease holder")
        return updated

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        instance._loaded_fencing_token = instance.__dict__.get("fencing_token")
        return instance

    def _take_lease(self, owner: str, lease_seconds: float) -> None:
        self.fencing_token = (self.fencing_token or 0) + 1
        self.lease_owner = owner
        self.lease_expires_at = lease_expiry(lease_seconds)

    def _release_lease(self) -> None:
        self.lease_owner = ""
        self.lease_expires_at = None

    # --- transitions (guard and state change only; services do the rest) -----
    @transition(field=state, source=TaskState.RETRY_SCHEDULED, target=TaskState.QUEUED)
    def make_due(self) -> None:
        self.retry_at = None

    @transition(field=state, source=TaskState.QUEUED, target=TaskState.RUNNING)
    def claim(self, *, owner: str, lease_seconds: float) -> None:
        self._take_lease(owner, lease_seconds)
        self.step_attempt += 1
        self.total_attempts += 1

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.RUNNING)
    def advance(self) -> None:
        # Only unindexed columns change, so PostgreSQL can write the step's
        # progress as a HOT update (no index entries). The lease is kept alive
        # by the worker's heartbeat, not by each step.
        self.current_step += 1
        self.step_attempt = 1
        self.total_attempts += 1

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.SUCCEEDED)
    def succeed(self, *, result) -> None:
        self.current_step = self.total_steps
        self.result = result
        self.in_dlq = False
        self._release_lease()
        self.finished_at = timezone.now()

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.RETRY_SCHEDULED)
    def schedule_retry(self, *, retry_at) -> None:
        self.retry_at = retry_at
        self._release_lease()

    @transition(field=state, source=[TaskState.QUEUED, TaskState.RUNNING], target=TaskState.FAILED)
    def fail(self, *, reason: str, code: str, message: str, step: str) -> None:
        self.failure_reason = reason
        self.failure_code = code[:100]
        self.failure_message = message
        self.failed_step = step[:100]
        self.retry_at = None
        self.finished_at = timezone.now()
        self.in_dlq = True
        self._release_lease()

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.QUEUED)
    def requeue_after_lease_expiry(self) -> None:
        # Bumping the token fences off the worker that lost the lease.
        self.fencing_token += 1
        self.crash_count += 1
        self._release_lease()

    @transition(field=state, source=TaskState.FAILED, target=TaskState.COMPENSATING)
    def start_compensation(self, *, owner: str = "", lease_seconds: float = 0) -> None:
        # The worker that failed the task may go straight on under its lease
        # (same token); otherwise the lease is free for whoever is delivered.
        if owner:
            self.lease_owner = owner
            self.lease_expires_at = lease_expiry(lease_seconds)
        else:
            self._release_lease()

    @transition(field=state, source=TaskState.COMPENSATING, target=TaskState.COMPENSATING)
    def claim_compensation(self, *, owner: str, lease_seconds: float) -> None:
        self._take_lease(owner, lease_seconds)

    @transition(field=state, source=TaskState.COMPENSATING, target=TaskState.COMPENSATING)
    def release_after_lease_expiry(self) -> None:
        self.fencing_token += 1
        self.crash_count += 1
        self._release_lease()

    @transition(field=state, source=TaskState.COMPENSATING, target=TaskState.COMPENSATED)
    def finish_compensation(self) -> None:
        self._release_lease()
        self.finished_at = timezone.now()

    @transition(field=state, source=TaskState.COMPENSATING, target=TaskState.COMPENSATION_FAILED)
    def fail_compensation(self, *, code: str, message: str) -> None:
        self.failure_reason = FailureReason.COMPENSATION_FAILED
        self.failure_code = code[:100]
        self.failure_message = message
        self._release_lease()
        self.finished_at = timezone.now()

    @transition(field=state, source=[TaskState.FAILED, TaskState.COMPENSATION_FAILED], target=TaskState.QUEUED)
    def retry_from_checkpoint(self) -> None:
        self._clear_failure()
        self.step_attempt = 0
        self.crash_count = 0

    @transition(field=state, source=TaskState.COMPENSATED, target=TaskState.QUEUED)
    def retry_from_start(self) -> None:
        self._clear_failure()
        self.generation += 1
        self.current_step = 0
        self.step_attempt = 0
        self.crash_count = 0

    @transition(field=state, source=TaskState.COMPENSATION_FAILED, target=TaskState.COMPENSATING)
    def retry_compensation(self) -> None:
        self.crash_count = 0
        self._release_lease()

    def _clear_failure(self) -> None:
        self.failure_reason = ""
        self.failure_code = ""
        self.failure_message = ""
        self.failed_step = ""
        self.finished_at = None
        self.result = None
        self._release_lease()
        self.fencing_token += 1

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@functools.cache
def _fsm_fields(model: type[models.Model]) -> tuple[models.Field, ...]:
    return tuple(field for field in model._meta.fields if isinstance(field, FSMFieldMixin))


# Cached: one expression object per lease length, so a fenced write compiles it once
# (tasks.fenced_writes). Saving resolves a copy; the shared object is never changed.
@functools.lru_cache(maxsize=32)
def lease_expiry(lease_seconds: float):
    """An expression for "database now + lease": leases never trust a worker's clock."""
    return models.ExpressionWrapper(
        Now() + datetime.timedelta(seconds=lease_seconds), output_field=models.DateTimeField()
    )


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


class StepAttempt(models.Model):
    """One row per attempt of a step, of a compensation or of the failure notice."""

    # Looked up through the composite index that starts with task (one index less to write per step).
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attempts", db_index=False)
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

    class Meta:
        verbose_name = _("step attempt")
        verbose_name_plural = _("step attempts")
        ordering = ["started_at", "id"]
        indexes = [
            models.Index(fields=["task", "kind", "step_index"], name="attempt_task_step_idx"),
            models.Index(fields=["error_code"], name="attempt_error_code_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.step_name} #{self.attempt} {self.outcome}"

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class Checkpoint(models.Model):
    """A completed step and its output; a resumed task starts after the last one."""

    # Looked up through the composite index that starts with task (one index less to write per step).
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    step_index = models.PositiveIntegerField()
    step_name = models.CharField(max_length=100)
    output = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("checkpoint")
        verbose_name_plural = _("checkpoints")
        ordering = ["step_index"]
        constraints = [models.UniqueConstraint(fields=["task", "step_index"], name="checkpoint_unique_step")]

    def __str__(self) -> str:
        return f"{self.task_id} step {self.step_index} {self.step_name}"


class EffectStatus(models.TextChoices):
    DONE = "done", _("done")
    UNCERTAIN = "uncertain", _("may have happened")
    COMPENSATED = "compensated", _("compensated")


class SideEffect(models.Model):
    """The ledger of external effects: each key a step used, and whether it was undone."""

    # Looked up through the composite index that starts with task (one index less to write per step).
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="side_effects", db_index=False)
    generation = models.PositiveIntegerField(default=0)
    step_index = models.IntegerField()
    step_name = models.CharField(max_length=100)
    effect_name = models.CharField(max_length=100)
    effect_key = models.CharField(max_length=255, unique=True)
    status = models.CharField(max_length=20, choices=EffectStatus.choices, default=EffectStatus.DONE)
    created_at = models.DateTimeField(auto_now_add=True)
    compensated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("side effect")
        verbose_name_plural = _("side-effect ledger")
        ordering = ["step_index", "id"]
        indexes = [models.Index(fields=["task", "generation", "step_index"], name="effect_task_step_idx")]

    def __str__(self) -> str:
        return f"{self.effect_key} ({self.status})"


class IdempotencyState(models.TextChoices):
    IN_PROGRESS = "in_progress", _("in progress")
    COMPLETED = "completed", _("completed")


class IdempotencyRecord(models.Model):
    """One logical request of one client: its fingerprint, the task it made and the first response."""

    scope = models.CharField(max_length=100, help_text=_('"python" or "client:<id>"'))
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=20, choices=IdempotencyState.choices, default=IdempotencyState.IN_PROGRESS)
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    replay_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    locked_at = models.DateTimeField(default=timezone.now, help_text=_("when the owner started processing"))
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="idempotency_unique_scope_key")]
        indexes = [models.Index(fields=["expires_at"], name="idempotency_expires_idx")]

    def __str__(self) -> str:
        return f"{self.scope}/{self.key} ({self.state})"


class SweeperHeartbeat(models.Model):
    """One row per sweeper process: when it last completed a sweep (for the dashboard and alerts)."""

    name = models.CharField(max_length=200, unique=True)
    last_run_at = models.DateTimeField()
    runs = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} at {self.last_run_at}"
