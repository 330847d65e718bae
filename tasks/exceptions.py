"""The engine's exception hierarchy: what pipeline authors raise and what the engine raises to its callers.

The split that drives behaviour is transient (retry) vs permanent (do not).
Every exception carries a stable ``code``: it is what attempts record and
what the DLQ stores and groups failures on. Pipeline authors import
``TransientError`` and ``PermanentError`` from the public surface, ``tasks``.
"""

from __future__ import annotations


class ReliabilityError(Exception):
    """Root of every error the project raises on purpose."""

    code = "error"

    def __init__(self, message: str = "", *, code: str | None = None, details: dict | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        if code is not None:
            self.code = code
        self.details = details or {}

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class TransientError(ReliabilityError):
    """A failure that may go away by itself: retry it (network, timeout, 5xx, 429)."""

    code = "transient"
    # Whether the far side may have acted before we lost the answer. A 429 is
    # a definite "not done"; a timeout or a 5xx is not.
    effect_uncertain = True

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        retry_after: float | None = None,
        effect_uncertain: bool | None = None,
        details: dict | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.retry_after = retry_after
        if effect_uncertain is not None:
            self.effect_uncertain = effect_uncertain


class PermanentError(ReliabilityError):
    """A failure that retrying cannot fix (validation, 4xx, business rule)."""

    code = "permanent"


class EffectRequired(PermanentError):
    """A mutating ``ctx.http`` request that names no effect: a bug in the step, raised before anything is sent."""

    code = "effect_required"


class StepTimeout(BaseException):
    """Raised inside a step when its effective timeout elapses.

    A ``BaseException`` so that a step's own ``except Exception`` cannot
    swallow the interruption and keep running past its deadline.
    """

    code = "step_timeout"


class StepCancelled(BaseException):
    """Raised inside a step that was waiting when its task was cancelled (``tasks.execution.interrupts``).

    Like ``StepTimeout``, a ``BaseException``: a step's ``except Exception``
    cannot swallow it. The step may have acted before it stopped, so its
    effect is uncertain and compensation covers it.
    """

    code = "cancelled"


class LeaseLost(ReliabilityError):
    """This worker no longer holds the task's lease; it must stop without writing."""

    code = "lease_lost"


class ConfigurationError(ReliabilityError):
    """A pipeline or setting is declared wrongly."""

    code = "configuration_error"


class UnknownPipeline(ReliabilityError):
    """No pipeline with this name is registered."""

    code = "unknown_pipeline"


class InvalidTaskInput(ReliabilityError):
    """The task input does not satisfy the pipeline's validation."""

    code = "validation_error"


class IdempotencyKeyReused(ReliabilityError):
    """The idempotency key was already used with a different request."""

    code = "idempotency_key_reused"


class IdempotencyKeyInUse(ReliabilityError):
    """A request with this idempotency key is still being processed."""

    code = "idempotency_key_in_use"


class BatchRefused(ReliabilityError):
    """An atomic batch with a bad item: nothing was stored.

    ``outcomes`` holds the bad items' outcomes (``tasks.submission.batches.BatchOutcome``: index and error);
    ``details["items"]`` the same as JSON.
    """

    code = "batch_refused"

    def __init__(self, message: str, outcomes: list) -> None:
        super().__init__(message, details={"items": [outcome.error_details() for outcome in outcomes]})
        self.outcomes = outcomes


class TaskNotCancellable(ReliabilityError):
    """The task has finished (or is undoing a failure): there is nothing left to cancel."""

    code = "task_not_cancellable"

    def __init__(self, message: str, *, state: str) -> None:
        super().__init__(message, details={"state": state})
        self.state = state


class UnknownSignal(ReliabilityError):
    """A signal whose name is not a wait step of the task's pipeline: no wait would ever consume it."""

    code = "unknown_signal"


class SignalAlreadyReceived(ReliabilityError):
    """The task already has this signal, with another payload (the same payload is the same signal)."""

    code = "signal_already_received"


class TaskFinished(ReliabilityError):
    """The task has finished: a signal sent now would never be consumed."""

    code = "task_finished"

    def __init__(self, message: str, *, state: str) -> None:
        super().__init__(message, details={"state": state})
        self.state = state


class PipelineControlRefused(ReliabilityError):
    """A pause, resume or limit change that cannot be made as asked (unknown pipeline, a bad limit).

    Each refusal has a ``code`` of its own (``already_paused``, ``not_paused``,
    ``unknown_pipeline``…) and its facts in ``details`` (``pipeline``,
    ``paused_by``), so a caller can word it in its reader's language; the
    message is English.
    """

    code = "pipeline_control_refused"


class ScheduleRefused(ReliabilityError):
    """A schedule's change that cannot be made as asked (a bad definition, a taken name, a code schedule's
    definition, a repeated pause); ``code`` says which, ``details`` its facts."""

    code = "schedule_refused"


class TaskNotActionable(ReliabilityError):
    """The task is not in a state that allows this action (someone else acted first).

    Each refusal has a ``code`` of its own (``retry_not_failed``,
    ``no_such_task``, ``task_changed``…) and its facts in ``details``
    (``state``), so a caller can word it in its reader's language; the
    message is English.
    """

    code = "task_not_actionable"
