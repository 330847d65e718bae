"""What a step sees: its task's input, earlier outputs, the deadline, stable effect keys and its log."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tasks.exceptions import StepTimeout
from tasks.observability.attempt_log import step_logger


def effect_key(task_id: uuid.UUID | str, generation: int, step: str, effect: str) -> str:
    """The idempotency key of one external effect.

    Derived only from (task, generation, step, effect): identical on every
    retry and after a crash, distinct between tasks and between effects.
    """
    return f"rc-{task_id}-g{generation}-{step}-{effect}"


class StepContext:
    """Passed to every step, compensation and failure notice."""

    def __init__(
        self,
        *,
        task_id: uuid.UUID,
        pipeline: str,
        step: str,
        input: Any,
        outputs: Mapping[str, Any],
        deadline: datetime | None,
        call_deadline: float,
        attempt: int,
        generation: int,
        output: Any = None,
        failure: Mapping[str, Any] | None = None,
        search_attributes: tuple[str, ...] = (),
    ) -> None:
        self.task_id = task_id
        self.pipeline = pipeline
        self.step = step
        self.input = input
        self.outputs = outputs
        #: The task's overall deadline (aware datetime) or None.
        self.deadline = deadline
        #: Epoch seconds after which this attempt no longer wants an answer:
        #: the earlier of the task deadline and the step timeout.
        self.call_deadline = call_deadline
        self.attempt = attempt
        self.generation = generation
        #: For compensations: the output of the step being undone (None if it
        #: never returned, e.g. it timed out).
        self.output = output
        #: For the failure notice: reason, code and message of the failure.
        self.failure = failure
        self.used_keys: dict[str, str] = {}
        # Effects the far side confirmed (a 2xx answer through ctx.http): done even if the step then fails.
        self.acted_keys: dict[str, str] = {}
        self._http = None
        # The pipeline's declared search attributes, and what this attempt set (written with its checkpoint).
        self.search_attributes = search_attributes
        self.attribute_changes: dict[str, str | None] | None = None

    @property
    def log(self) -> logging.Logger:
        """The step's logger: its lines are kept with this attempt (``tasks.observability.attempt_log``, INFO and above
        by default) and written to the process's log with the attempt's ids, like any logger's inside a step."""
        return step_logger()

    @property
    def http(self):
        """A ``requests.Session`` for this attempt: deadline headers and timeout, effect keys
        (``tasks.outbound.http``)."""
        if self._http is None:
            from tasks.outbound.http import StepSession  # requests is imported only by steps that call out

            self._http = StepSession(self)
        return self._http

    def set_attributes(self, **values: Any) -> None:
        """Set or change the task's search attributes (``None`` removes one), kept if this attempt succeeds: written
        with the step's checkpoint. A name the pipeline did not declare, or a value that is not a string or
        number of at most 200 characters, fails the step (a permanent error)."""
        from tasks.exceptions import PermanentError
        from tasks.pipelines.attributes import AttributeRefused, attributes_changed

        changes = {**(self.attribute_changes or {}), **values}
        try:
            attributes_changed(self.search_attributes, None, changes)  # checked now: the step fails here
        except AttributeRefused as exc:
            raise PermanentError(str(exc), code=exc.code) from None
        self.attribute_changes = changes

    def remaining(self) -> float:
        """Seconds left for this attempt (step timeout and task deadline both count)."""
        return max(0.0, self.call_deadline - time.time())

    def check_time(self) -> float:
        """Return the seconds left, or raise ``StepTimeout`` when none are."""
        left = self.remaining()
        if left <= 0:
            raise StepTimeout(f"no time left for step {self.step!r}")
        return left

    @property
    def call_deadline_ms(self) -> int:
        return int(self.call_deadline * 1000)

    def idempotency_key(self, name: str) -> str:
        """A stable key for the external effect ``name`` of this step (record it in the ledger)."""
        key = effect_key(self.task_id, self.generation, self.step, name)
        self.used_keys[name] = key
        return key
