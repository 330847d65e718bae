"""The task: its lifecycle as django-fsm-2 transitions, its lease and its fencing token.

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

from tasks.models.door import DoorManager


class TaskState(models.TextChoices):
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    RETRY_SCHEDULED = "retry_scheduled", _("retry scheduled")
    # Without a job, a lease or a worker until its time (``wait_for`` says for what; ``retry_at`` when).
    WAITING = "waiting", _("waiting")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    COMPENSATING = "compensating", _("compensating")
    COMPENSATED = "compensated", _("compensated")
    COMPENSATION_FAILED = "compensation_failed", _("compensation failed")
    # Stopped on request (tasks.lifecycle.cancellation): its completed steps were compensated, or the pipeline
    # parks cancels.
    CANCELLED = "cancelled", _("cancelled")


TERMINAL_STATES = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.COMPENSATED, TaskState.COMPENSATION_FAILED, TaskState.CANCELLED}
)
# States a cancel acts on at once (nothing of the task is running) or at the next step boundary (running).
CANCELLABLE_STATES = (TaskState.QUEUED, TaskState.RETRY_SCHEDULED, TaskState.WAITING, TaskState.RUNNING)
LEASED_STATES = (TaskState.RUNNING, TaskState.COMPENSATING)


class FailureReason(models.TextChoices):
    PERMANENT_ERROR = "permanent_error", _("permanent error")
    ATTEMPTS_EXHAUSTED = "attempts_exhausted", _("attempts exhausted")
    DEADLINE_EXCEEDED = "deadline_exceeded", _("deadline exceeded")
    CRASH_LOOP = "crash_loop", _("crash loop")
    COMPENSATION_FAILED = "compensation_failed", _("compensation failed")
    # The pipeline's completed steps are no longer its first steps (tasks.pipelines.changes).
    PIPELINE_CHANGED = "pipeline_changed", _("pipeline changed")
    # A client or an operator cancelled it (its dead letter: compensation could not finish, or cancels are parked).
    CANCELLED = "cancelled", _("cancelled")


class TaskHold(models.TextChoices):
    """Why a QUEUED task waits without a delivery (``tasks.execution.gates``): it starts when released, attempts
    unused."""

    NONE = "", _("not held")
    PAUSED = "paused", _("pipeline paused")
    CONCURRENCY = "concurrency", _("concurrency limit")
    RATE = "rate", _("rate limit")


class WaitKind(models.TextChoices):
    """What a WAITING task waits for; "" for every other task."""

    NONE = "", _("nothing")
    # Submitted to start later (``run_at``, a Django task's ``run_after``): the sweeper starts it at retry_at.
    START = "start", _("its start time")
    # At a sleep step (``Pipeline.sleep``): the sweeper wakes it at retry_at and it goes on after the sleep.
    TIME = "time", _("a time")
    # At a wait step (``Pipeline.wait``): the signal it names wakes it; the sweeper at retry_at, its timeout.
    SIGNAL = "signal", _("a signal")


class Task(ConcurrentTransitionMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    pipeline = models.CharField(max_length=100)
    input = models.JSONField(default=dict)
    state = FSMField(max_length=32, choices=TaskState.choices, default=TaskState.QUEUED, protected=True)

    current_step = models.PositiveIntegerField(default=0, help_text=_("index of the next step to run"))
    total_steps = models.PositiveIntegerField(default=0)
    # The pipeline's step names as declared when the task was submitted (or
    # last continued on a changed declaration): current_step indexes this
    # list, and a worker compares it with the pipeline it runs
    # (tasks.pipelines.changes). Rows written by tools that bypass submission
    # get the database default, an empty list: "as now declared".
    step_names = models.JSONField(default=list, db_default=[], blank=True)
    step_attempt = models.PositiveIntegerField(default=0, help_text=_("attempts made at the current step"))
    total_attempts = models.PositiveIntegerField(default=0)
    # Incremented by "retry from start": side-effect keys include it, so a
    # task that was compensated and started again makes new, distinct effects.
    generation = models.PositiveIntegerField(default=0)

    deadline = models.DateTimeField(null=True, blank=True)
    # When a scheduled retry is due; for a task held by its pipeline's rate limit, or waiting, when it may start.
    retry_at = models.DateTimeField(null=True, blank=True)
    # Why a QUEUED task waits without a job (tasks.execution.gates); "" for every other task. The sweeper's
    # lost-delivery check skips held tasks: they are released (delivered) when they may start.
    hold = models.CharField(max_length=16, choices=TaskHold.choices, blank=True, default="", db_default="")
    # What a WAITING task waits for (its time is retry_at); "" for every other task.
    wait_for = models.CharField(max_length=16, choices=WaitKind.choices, blank=True, default="", db_default="")
    # The end of the wait its current step began: a sleep's wake time (``Pipeline.sleep``), a signal wait's
    # timeout (``Pipeline.wait``). Set when the task began to wait there, cleared with the step's checkpoint; kept
    # after the wake, so the claim that follows finds the wait begun (and maybe over) instead of beginning it again.
    wait_until = models.DateTimeField(null=True, blank=True)

    # A cancel (tasks.lifecycle.cancellation): when and by whom it was asked for, and why. Set once; a running
    # task stops at its next step boundary (or its waiting step is interrupted) once it sees it.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=150, blank=True, default="", db_default="")
    cancel_reason = models.TextField(blank=True, default="", db_default="")

    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)
    crash_count = models.PositiveIntegerField(default=0)
    # True while the task has an unresolved dead letter. Written only by
    # tasks.lifecycle.dead_letters, in the transaction that changes the item; the runner
    # reads it to resolve the item when a retried task succeeds.
    in_dlq = models.BooleanField(default=False)

    result = models.JSONField(null=True, blank=True)
    failure_reason = models.CharField(max_length=40, choices=FailureReason.choices, blank=True, default="")
    failure_code = models.CharField(max_length=100, blank=True, default="")
    failure_message = models.TextField(blank=True, default="")
    failed_step = models.CharField(max_length=100, blank=True, default="")

    # Indexed by task_client_created_idx (client first); no separate index.
    client = models.ForeignKey(
        "tasks.ApiClient", null=True, blank=True, on_delete=models.PROTECT, related_name="tasks", db_index=False
    )
    # Copied from the submission for search; uniqueness lives in IdempotencyRecord
    # (records expire, after which a key may be used again).
    idempotency_scope = models.CharField(max_length=100, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    # Search attributes (tasks.pipelines.attributes): the declared business keys of the task as text, from its input and
    # its steps' ctx.set_attributes; NULL when it has none. A GIN index (jsonb_path_ops, migration 0029) answers
    # a containment search; it is not in the model state (built CONCURRENTLY in raw SQL, as 0005's).
    attributes = models.JSONField(_("search attributes"), null=True, blank=True)
    # The W3C trace context the task's runs belong to (tasks.observability.tracing, RELIABILITY_TRACING):
    # {"traceparent", "tracestate"} of the span that submitted it, and "retry_of" (the step, attempt and traceparent of
    # the last
    # failed attempt, which the next attempt's span links to). NULL when it was submitted with tracing off.
    trace_context = models.JSONField(_("trace context"), null=True, blank=True)
    # Where the engine POSTs the task's terminal state (tasks.outbound.callback_events); empty: no callback.
    # The database default too: code that inserts tasks without the column (the
    # previous release during a rolling deploy, devtools' SQL) still works.
    callback_url = models.CharField(_("callback URL"), max_length=2048, blank=True, default="", db_default="")
    # The RQ job that carries this task's first delivery together with others of its batch (tasks.submission.batches);
    # it counts only until the task is first claimed or held (fencing token 0) or delivered again, which clears it.
    # Empty: every delivery is a job of the task's own (tasks.delivery.enqueue.job_id).
    batch_job = models.CharField(max_length=64, blank=True, default="", db_default="")

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = DoorManager()  # bulk writes only inside tasks.lifecycle (tasks.models.door)

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["idempotency_key"], name="task_idempotency_key_idx"),
            models.Index(fields=["client", "-created_at", "-id"], name="task_client_created_idx"),
            models.Index(fields=["state", "lease_expires_at"], name="task_state_lease_idx"),
            models.Index(fields=["state", "retry_at"], name="task_state_retry_idx"),
            # The sweeper walks waiting tasks oldest first by keyset on (updated_at, id) (tasks.delivery.sweeper).
            models.Index(fields=["state", "updated_at", "id"], name="task_state_updated_id_idx"),
            models.Index(fields=["pipeline", "-created_at"], name="task_pipeline_created_idx"),
            models.Index(fields=["-created_at"], name="task_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline} {self.id} ({self.get_state_display()})"

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
        """Record a write made outside ``save()`` (``tasks.lifecycle.fenced_writes``): the next guard starts here."""
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
    def from_db(cls, db, field_names, values, **kwargs):
        # kwargs: what newer Django versions pass on (6.1's fetch_mode).
        instance = super().from_db(db, field_names, values, **kwargs)
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

    @transition(field=state, source=TaskState.WAITING, target=TaskState.QUEUED)
    def wake(self) -> None:
        """Its wait is over: its start time or its sleep's end came, its signal came, its wait's timeout passed (the
        claim's attempt then fails the step), or its deadline (the claim then fails it)."""
        self.wait_for = WaitKind.NONE
        self.retry_at = None

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.WAITING)
    def begin_wait(self, *, wait_for: str, until) -> None:
        """At a sleep step (``wait_for`` TIME) or a wait step (SIGNAL): wait without a worker, a lease or a job until
        ``until`` (the sleep's end, the wait's timeout), or until the signal comes.

        The attempt counted for the step was not made, and is given back (the claim after the wake counts it).
        """
        self._attempt_not_made()
        self._release_lease()
        self.wait_for = wait_for
        self.retry_at = until
        self.wait_until = until

    @transition(field=state, source=[TaskState.QUEUED, TaskState.RUNNING], target=TaskState.QUEUED)
    def hold_back(self, *, hold: str, until=None) -> None:
        """Wait without a delivery (its pipeline is paused, or at a limit) until released; no attempt is used.

        From RUNNING, the task waits at a step boundary: the attempt counted
        for the next step (``advance``) was not made, and is given back.
        """
        if self.state == TaskState.RUNNING:
            self._attempt_not_made()
            self._release_lease()
        else:
            # Held by its claim: the delivery that brought it ends here, its RQ job still running, and RQ
            # deletes that job id when the job returns. The release is a new delivery: a new token, so a
            # new job id (``tasks.delivery.enqueue.job_id``) that the finishing job cannot take with it.
            self.fencing_token += 1
        self.hold = hold
        self.retry_at = until

    @transition(field=state, source=TaskState.QUEUED, target=TaskState.RUNNING)
    def claim(self, *, owner: str, lease_seconds: float) -> None:
        self._take_lease(owner, lease_seconds)
        self.step_attempt += 1
        self.total_attempts += 1
        self.hold = TaskHold.NONE
        self.retry_at = None

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.RUNNING)
    def advance(self) -> None:
        # Only unindexed columns change, so PostgreSQL can write the step's
        # progress as a HOT update (no index entries). The lease is kept alive
        # by the worker's heartbeat, not by each step.
        self.current_step += 1
        self.step_attempt = 1
        self.total_attempts += 1
        self.wait_until = None

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.SUCCEEDED)
    def succeed(self, *, result) -> None:
        self.current_step = self.total_steps
        self.result = result
        self.wait_until = None
        self._release_lease()
        self.finished_at = timezone.now()

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.RETRY_SCHEDULED)
    def schedule_retry(self, *, retry_at) -> None:
        self.retry_at = retry_at
        self._release_lease()

    @transition(field=state, source=[TaskState.QUEUED, TaskState.RUNNING], target=TaskState.FAILED)
    def fail(self, *, reason: FailureReason, code: str, message: str, step: str) -> None:
        self.failure_reason = reason
        self.failure_code = code[:100]
        self.failure_message = message
        self.failed_step = step[:100]
        self.retry_at = None
        self.finished_at = timezone.now()
        self._release_lease()

    def count_lost_lease(self) -> None:
        """Count a lease that expired (its worker died or hung) and fence that worker off.

        Not a transition: it goes with one (re-queue, or failing a crash loop).
        """
        self.fencing_token += 1
        self.crash_count += 1

    @transition(field=state, source=TaskState.RUNNING, target=TaskState.QUEUED)
    def requeue_after_lease_expiry(self) -> None:
        self.count_lost_lease()
        self._release_lease()

    @transition(
        field=state,
        source=[TaskState.QUEUED, TaskState.RETRY_SCHEDULED, TaskState.WAITING, TaskState.RUNNING],
        target=TaskState.CANCELLED,
    )
    def cancel(self, *, message: str, at_boundary: bool = False) -> None:
        """End the task on its cancel: nothing of it needs undoing, or its pipeline parks cancels."""
        self._cancelled(message, at_boundary)
        self.finished_at = timezone.now()

    @transition(
        field=state,
        source=[TaskState.QUEUED, TaskState.RETRY_SCHEDULED, TaskState.WAITING, TaskState.RUNNING],
        target=TaskState.COMPENSATING,
    )
    def cancel_with_compensation(
        self, *, message: str, owner: str = "", lease_seconds: float = 0, at_boundary: bool = False
    ) -> None:
        """Stop the task on its cancel and undo its completed steps (``finish_cancel`` ends it)."""
        self._cancelled(message, at_boundary)
        if owner:
            self.lease_owner = owner
            self.lease_expires_at = lease_expiry(lease_seconds)

    def _cancelled(self, message: str, at_boundary: bool) -> None:
        if at_boundary:
            self._attempt_not_made()
        self.failure_reason = FailureReason.CANCELLED
        self.failure_code = FailureReason.CANCELLED.value
        self.failure_message = message
        self.retry_at = None
        self.hold = TaskHold.NONE
        self.wait_for = WaitKind.NONE
        self._release_lease()

    @transition(field=state, source=TaskState.COMPENSATING, target=TaskState.CANCELLED)
    def finish_cancel(self) -> None:
        self._release_lease()
        self.finished_at = timezone.now()

    @transition(field=state, source=TaskState.CANCELLED, target=TaskState.COMPENSATING)
    def compensate_cancelled(self) -> None:
        """An operator compensates a cancelled task whose pipeline parks cancels (its steps were left as they are)."""
        self.crash_count = 0
        self.finished_at = None
        self._release_lease()

    def _attempt_not_made(self) -> None:
        # advance() counted an attempt of the next step, which never started.
        if self.step_attempt > 0:
            self.step_attempt -= 1
            self.total_attempts = max(self.total_attempts - 1, 0)

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
        self.count_lost_lease()
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

    @transition(
        field=state,
        source=[TaskState.FAILED, TaskState.COMPENSATION_FAILED],
        target=TaskState.QUEUED,
        conditions=[lambda task: not task.is_cancelled],
    )
    def retry_from_checkpoint(self) -> None:
        self._clear_failure()
        self.step_attempt = 0
        self.crash_count = 0

    @transition(
        field=state,
        source=[TaskState.COMPENSATED, TaskState.FAILED],
        target=TaskState.QUEUED,
        conditions=[lambda task: task.can_retry_from_start],
    )
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
        # A wait or sleep the failed step had begun begins anew (a retried approval waits its whole timeout again).
        self.wait_until = None
        self._release_lease()
        self.fencing_token += 1

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def is_cancelled(self) -> bool:
        """Whether a cancel was asked for: the task ends CANCELLED (or COMPENSATION_FAILED), never runs again."""
        return self.cancel_requested_at is not None

    @property
    def can_retry_from_start(self) -> bool:
        """Compensated tasks start again; so do tasks parked because their pipeline changed under them."""
        if self.state == TaskState.COMPENSATED:
            return True
        return (
            self.state == TaskState.FAILED
            and self.failure_reason == FailureReason.PIPELINE_CHANGED
            and not self.is_cancelled
        )

    def step_name_at(self, index: int) -> str:
        """The recorded name of step ``index``; "" when none was recorded there."""
        return self.step_names[index] if 0 <= index < len(self.step_names or ()) else ""

    @property
    def trace_id(self) -> str:
        """The id of the trace the task belongs to (32 hex digits), "" when it has none (``trace_context``)."""
        traceparent = (self.trace_context or {}).get("traceparent") or ""
        parts = traceparent.split("-")
        return parts[1] if len(parts) >= 4 and len(parts[1]) == 32 else ""

    @property
    def current_step_name(self) -> str:
        """The recorded name of the step the task is at (or waits at); "" past the last."""
        return self.step_name_at(self.current_step)


@functools.cache
def _fsm_fields(model: type[models.Model]) -> tuple[models.Field, ...]:
    return tuple(field for field in model._meta.fields if isinstance(field, FSMFieldMixin))


# Cached: one expression object per lease length, so a fenced write compiles it once
# (tasks.lifecycle.fenced_writes). Saving resolves a copy; the shared object is never changed.
@functools.lru_cache(maxsize=32)
def lease_expiry(lease_seconds: float):
    """An expression for "database now + lease": leases never trust a worker's clock."""
    return models.ExpressionWrapper(
        Now() + datetime.timedelta(seconds=lease_seconds), output_field=models.DateTimeField()
    )
