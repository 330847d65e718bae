"""Declaring pipelines: ``Pipeline``, its steps and their compensations, the failure policy.

A pipeline author imports ``Pipeline`` and ``FailurePolicy`` from the public surface, ``tasks``
(``tasks/__init__.py``), with the rest of what a pipeline module needs::

    from tasks import FailurePolicy, PermanentError, Pipeline, RetryPolicy, TransientError

    orders = Pipeline("orders", failure_policy=FailurePolicy.COMPENSATE)

    @orders.step(timeout=10, retry=RetryPolicy(max_attempts=4, base_delay=0.5, max_delay=8))
    def charge(ctx):
        response = ctx.http.post(f"{PAYMENTS}/charges", json={"order": ctx.input["order_id"]}, effect="charge")
        response.raise_for_status()  # 408/425/429/5xx: retried; other 4xx: permanent
        return {"charge_id": response.json()["id"]}

    @charge.compensation
    def refund(ctx):
        ctx.http.post(f"{PAYMENTS}/charges/{ctx.output['charge_id']}/refund", effect="refund").raise_for_status()
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tasks import registry
from tasks.delivery.queues import default_queue, queue_check
from tasks.exceptions import ConfigurationError
from tasks.exceptions import PermanentError as _PermanentError  # private: see __getattr__
from tasks.pipelines.attributes import attribute_names_checked
from tasks.pipelines.limits import RateLimit, concurrency_check
from tasks.pipelines.retry import DEFAULT_COMPENSATION_RETRY_POLICY, DEFAULT_RETRY_POLICY, RetryPolicy
from tasks.pipelines.schedules import Schedule, schedules_named

__all__ = ["FailurePolicy", "Pipeline", "Sleep", "Step", "Wait"]

# Names this module once re-exported; a pipeline module imports them from tasks.
_IMPORTED_FROM_TASKS = {"InvalidTaskInput", "PermanentError", "TransientError"}


def __getattr__(name: str):
    if name in _IMPORTED_FROM_TASKS:
        # ImportError, not AttributeError: ``from tasks.pipelines.pipeline import X`` shows this message as it is.
        raise ImportError(f"tasks.pipelines.pipeline no longer exports {name}: from tasks import {name}")
    raise AttributeError(f"module 'tasks.pipelines.pipeline' has no attribute {name!r}")


NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,99}$")

StepFunction = Callable[[Any], Any]


@dataclass(frozen=True)
class Sleep:
    """A sleep step's length: ``seconds`` from when the task reaches it, or ``until(ctx)``, an aware datetime."""

    seconds: float | None = None
    until: Callable[[Any], datetime] | None = None

    def wake_time(self, ctx: Any, now: datetime) -> datetime:
        """When the task reaching this sleep at ``now`` wakes; a bad ``until`` is the step's permanent error."""
        if self.until is None:
            return now + timedelta(seconds=self.seconds)
        value = self.until(ctx)
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise _PermanentError(
                f"sleep {ctx.step!r}: until() returned {value!r}, not a datetime with a time zone",
                code=SLEEP_UNTIL_INVALID,
            )
        return value


# The error code of a sleep whose until() gave something other than an aware datetime.
SLEEP_UNTIL_INVALID = "sleep_until_invalid"


@dataclass(frozen=True)
class Wait:
    """A wait step's terms: how long it waits for its signal (named as the step), and whether a person approves."""

    timeout: float
    approval: bool = False


# The error code of a wait whose signal did not come within its timeout (permanent: the failure policy applies).
SIGNAL_TIMEOUT = "signal_timeout"


class FailurePolicy(enum.StrEnum):
    """What happens when a task fails for good (``failure_policy``), or is cancelled (``on_cancel``)."""

    COMPENSATE = "compensate"  # undo completed steps now (then, on a failure, notify)
    PARK = "park"  # leave it in the DLQ for an operator to decide (FAILED, or CANCELLED with its steps as they are)


@dataclass
class Step:
    name: str
    function: StepFunction
    timeout: float | None = None
    retry: RetryPolicy | None = None
    compensate: StepFunction | None = None
    compensation_timeout: float | None = None
    compensation_retry: RetryPolicy = DEFAULT_COMPENSATION_RETRY_POLICY
    # Run the step inside the checkpoint's transaction, so its database writes
    # commit or roll back together with the checkpoint. Only for steps that do
    # not wait on the network: the transaction stays open while the step runs.
    transactional: bool = False
    # Names of the external effects this step makes under ctx.idempotency_key
    # (shown in the operator's retry preview as "key-protected").
    effects: tuple[str, ...] = ()
    # A sleep step (``Pipeline.sleep``): the task waits without a worker; its function returns the wake time.
    sleep: Sleep | None = None
    # A wait step (``Pipeline.wait``): the task waits without a worker for the signal named as the step.
    wait: Wait | None = None

    def __call__(self, ctx: Any) -> Any:
        return self.function(ctx)

    def compensation(self, function: StepFunction) -> StepFunction:
        """Decorator: declare the compensation (reverse business action) of this step."""
        self.compensate = function
        return function


@dataclass
class Pipeline:
    """An ordered list of steps with a retry policy and a failure policy.

    ``queue`` names the RQ queue its tasks run on (``critical``, ``default``
    or ``bulk``, highest priority first; ``None``: ``RELIABILITY_QUEUE``); a
    queue that is not configured is a ``ConfigurationError`` at declaration.
    ``max_concurrency`` (at most N tasks run a step at once, across every
    worker) and ``rate_limit`` (``"10/s"``, ``"600/m"``: at most N step
    starts per window) hold the pipeline back (``tasks.execution.gates``); a
    supervisor may override both at runtime. ``on_cancel`` is what a cancel
    does to the completed steps: compensate them (the default) or park the
    cancelled task in the DLQ with its steps as they are.
    ``validate_input`` (optional) receives the submitted input and returns the
    cleaned input or raises ``InvalidTaskInput``; it runs before anything is
    stored. ``on_failure`` (optional) runs once after compensation, e.g. to
    tell the user why the task failed. ``schedules`` (``Schedule`` values)
    submit its tasks by the clock (``tasks.pipelines.schedules``; the sweeper fires them).
    ``search_attributes`` names the business keys its tasks are found by in the
    console and the API (``tasks.pipelines.attributes``): read from the input at
    submission, set or changed by a step with ``ctx.set_attributes``.
    """

    name: str
    retry: RetryPolicy = DEFAULT_RETRY_POLICY
    failure_policy: FailurePolicy = FailurePolicy.COMPENSATE
    default_step_timeout: float | None = None
    validate_input: Callable[[Any], Any] | None = None
    on_failure: StepFunction | None = None
    on_failure_timeout: float | None = None
    steps: list[Step] = field(default_factory=list)
    register: bool = True
    queue: str | None = None
    max_concurrency: int | None = None
    rate_limit: str | RateLimit | None = None
    on_cancel: FailurePolicy = FailurePolicy.COMPENSATE
    schedules: list[Schedule] = field(default_factory=list)
    search_attributes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ConfigurationError(f"pipeline name {self.name!r} must match {NAME_PATTERN.pattern}")
        self.failure_policy = FailurePolicy(self.failure_policy)
        self.on_cancel = FailurePolicy(self.on_cancel)
        self.queue = queue_check(self.queue or default_queue(), pipeline=self.name)
        self.max_concurrency = concurrency_check(self.max_concurrency, pipeline=self.name)
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            self.rate_limit = RateLimit.parse(self.rate_limit, pipeline=self.name)
        self.schedules = schedules_named(self.name, self.schedules)
        self.search_attributes = attribute_names_checked(self.name, self.search_attributes)
        if self.register:
            registry.register(self)

    def step(
        self,
        function: StepFunction | None = None,
        *,
        name: str | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        compensate: StepFunction | None = None,
        compensation_timeout: float | None = None,
        compensation_retry: RetryPolicy | None = None,
        transactional: bool = False,
        effects: tuple[str, ...] = (),
    ) -> Any:
        """Decorator: append a step. Usable bare (``@p.step``) or with options."""

        def add(fn: StepFunction) -> Step:
            step_name = self._new_step_name(name or fn.__name__)
            for seconds in (timeout, compensation_timeout):
                if seconds is not None and not seconds > 0:
                    raise ConfigurationError(f"step {step_name!r}: timeouts must be positive")
            new = Step(
                name=step_name,
                function=fn,
                timeout=timeout,
                retry=retry,
                compensate=compensate,
                compensation_timeout=compensation_timeout,
                compensation_retry=compensation_retry or DEFAULT_COMPENSATION_RETRY_POLICY,
                transactional=transactional,
                effects=tuple(effects),
            )
            self.steps.append(new)
            return new

        if function is not None:
            return add(function)
        return add

    def sleep(
        self,
        name: str,
        *,
        seconds: float | None = None,
        until: Callable[[Any], datetime] | None = None,
        timeout: float | None = None,
    ) -> Step:
        """Append a durable sleep: the task waits (state ``waiting``, for ``time``) without a worker, a lease or a
        job, then goes on with the next step, whatever restarted meanwhile.

        ``seconds`` counts from when the task reaches the sleep; ``until(ctx)`` returns an aware datetime (the
        step's context: its input and earlier outputs), called once, when the task reaches it (a time already
        past: no wait). The checkpoint is ``{"slept_until": <RFC 3339>}``. ``timeout`` bounds ``until`` itself.
        """
        step_name = self._new_step_name(name)
        if (seconds is None) == (until is None):
            raise ConfigurationError(f"sleep {step_name!r}: give seconds or until, not both or neither")
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < float("inf")
        ):
            raise ConfigurationError(f"sleep {step_name!r}: seconds must be a positive number, not {seconds!r}")
        if until is not None and not callable(until):
            raise ConfigurationError(f"sleep {step_name!r}: until must be a callable (ctx) -> datetime")
        if timeout is not None and not timeout > 0:
            raise ConfigurationError(f"sleep {step_name!r}: timeouts must be positive")
        spec = Sleep(seconds=float(seconds) if seconds is not None else None, until=until)
        new = Step(name=step_name, function=_sleep_never_runs, timeout=timeout, sleep=spec)
        self.steps.append(new)
        return new

    def wait(self, name: str, *, timeout: timedelta | float, approval: bool = False) -> Step:
        """Append a wait for the signal ``name``: the task waits (state ``waiting``, for ``signal``) without a
        worker, a lease or a job until the signal comes (``task_signal``, ``POST /api/v1/tasks/{id}/signals/{name}``),
        then goes on with the next step; its checkpoint, ``ctx.outputs[name]``, is the signal's payload.

        A signal sent before the task gets here is kept and consumed here. ``timeout`` (a timedelta or seconds)
        counts from when the task reaches the wait; past it the step fails for good with code ``signal_timeout``
        and the pipeline's failure policy applies. ``approval=True`` marks a wait for a person's decision.
        """
        step_name = self._new_step_name(name)
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < float("inf"):
            raise ConfigurationError(f"wait {step_name!r}: timeout must be a positive timedelta or seconds")
        if not isinstance(approval, bool):
            raise ConfigurationError(f"wait {step_name!r}: approval is True or False")
        new = Step(name=step_name, function=_wait_never_runs, wait=Wait(timeout=float(seconds), approval=approval))
        self.steps.append(new)
        return new

    def wait_step(self, name: str) -> Step | None:
        """The wait step named ``name`` (the signal it waits for), or None."""
        return next((step for step in self.steps if step.wait is not None and step.name == name), None)

    def _new_step_name(self, step_name: str) -> str:
        if not NAME_PATTERN.match(step_name):
            raise ConfigurationError(f"step name {step_name!r} must match {NAME_PATTERN.pattern}")
        if any(existing.name == step_name for existing in self.steps):
            raise ConfigurationError(f"pipeline {self.name!r} already has a step {step_name!r}")
        return step_name

    def failure_notice(self, function: StepFunction) -> StepFunction:
        """Decorator: declare the ``on_failure`` hook."""
        self.on_failure = function
        return function

    def retry_policy_for(self, step: Step) -> RetryPolicy:
        return step.retry or self.retry

    def timeout_for(self, step: Step, default: float) -> float:
        return step.timeout or self.default_step_timeout or default

    def clean_input(self, data: Any) -> Any:
        if self.validate_input is None:
            return data
        return self.validate_input(data)


def _sleep_never_runs(ctx: Any) -> Any:
    # A sleep step's function: the runner computes its wake time from Step.sleep instead (tasks.execution.runner).
    raise _PermanentError(f"sleep {ctx.step!r} was called as a step", code=SLEEP_UNTIL_INVALID)


def _wait_never_runs(ctx: Any) -> Any:
    # A wait step's function: the runner looks for its signal instead (tasks.execution.runner).
    raise _PermanentError(f"wait {ctx.step!r} was called as a step", code=SIGNAL_TIMEOUT)
