"""Retry policy: a small immutable value that turns (attempt, error, clock) into a decision."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tasks.exceptions import ConfigurationError
from tasks.execution.classify import Classification
from tasks.models import FailureReason

# Upper bound for any policy: an attempt budget is always finite.
MAX_ATTEMPTS_CEILING = 100


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay: float = 0.0
    # Why not retrying: permanent error, attempts exhausted or deadline exceeded.
    reason: FailureReason | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter, for errors classified transient.

    The delay before attempt ``n + 1`` is drawn uniformly from
    ``[0, min(max_delay, base_delay * factor ** (n - 1))]``. A ``Retry-After``
    from the far side wins when it is longer. ``transient_errors`` adds
    exception types (beyond the built-in classification) that are retried.
    """

    max_attempts: int = 5
    base_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 60.0
    jitter: bool = True
    transient_errors: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_CEILING:
            raise ConfigurationError(f"max_attempts must be between 1 and {MAX_ATTEMPTS_CEILING}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ConfigurationError("delays must not be negative")
        if self.factor < 1:
            raise ConfigurationError("factor must be at least 1")

    def backoff_ceiling(self, attempt: int) -> float:
        """The largest delay full jitter may pick after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base_delay * self.factor**exponent
        except OverflowError:
            raw = self.max_delay
        return min(self.max_delay, raw)

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = self.backoff_ceiling(attempt)
        if not self.jitter:
            return ceiling
        return (rng or random).uniform(0.0, ceiling)

    def decide(
        self,
        *,
        attempt: int,
        error: Classification,
        now: float,
        deadline: float | None,
        rng: random.Random | None = None,
    ) -> RetryDecision:
        """Decide what follows failed attempt number ``attempt`` (epoch seconds for ``now``/``deadline``)."""
        if not error.transient:
            return RetryDecision(retry=False, reason=FailureReason.PERMANENT_ERROR)
        if attempt >= self.max_attempts:
            return RetryDecision(retry=False, reason=FailureReason.ATTEMPTS_EXHAUSTED)
        delay = self.backoff(attempt, rng)
        if error.retry_after is not None and error.retry_after > delay:
            delay = error.retry_after
        if deadline is not None and now + delay >= deadline:
            return RetryDecision(retry=False, delay=delay, reason=FailureReason.DEADLINE_EXCEEDED)
        return RetryDecision(retry=True, delay=delay)


DEFAULT_RETRY_POLICY = RetryPolicy()
DEFAULT_COMPENSATION_RETRY_POLICY = RetryPolicy(max_attempts=5, base_delay=0.5, factor=2.0, max_delay=5.0)
