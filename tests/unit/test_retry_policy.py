import random

import pytest

from tasks.exceptions import ConfigurationError
from tasks.execution.classify import Classification
from tasks.pipelines.retry import RetryPolicy

TRANSIENT = Classification(True, "http_503", "down", "x.TransientError")
PERMANENT = Classification(False, "http_422", "bad", "x.PermanentError")


def throttled(seconds: float) -> Classification:
    return Classification(True, "rate_limited", "slow down", "x.TransientError", retry_after=seconds)


def test_backoff_ceiling_grows_exponentially_and_is_capped():
    policy = RetryPolicy(max_attempts=10, base_delay=0.5, factor=2, max_delay=3)
    assert [policy.backoff_ceiling(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_huge_attempt_numbers_do_not_overflow():
    policy = RetryPolicy(max_attempts=100, base_delay=1, factor=10, max_delay=30)
    assert policy.backoff_ceiling(99) == 30


def test_full_jitter_stays_within_zero_and_the_ceiling_and_spreads():
    policy = RetryPolicy(max_attempts=10, base_delay=1, factor=2, max_delay=8)
    rng = random.Random(7)
    delays = [policy.backoff(4, rng) for _ in range(2000)]
    assert all(0 <= d <= 8 for d in delays)
    # Full jitter covers the whole range, not a narrow band near the ceiling.
    assert min(delays) < 0.5 and max(delays) > 7.5


def test_without_jitter_the_delay_is_the_ceiling():
    policy = RetryPolicy(max_attempts=5, base_delay=1, factor=3, max_delay=100, jitter=False)
    assert policy.backoff(3) == 9


def test_transient_error_with_attempts_left_is_retried_within_cap():
    policy = RetryPolicy(max_attempts=3, base_delay=1, factor=2, max_delay=1.5)
    decision = policy.decide(attempt=2, error=TRANSIENT, now=0, deadline=None, rng=random.Random(1))
    assert decision.retry and 0 <= decision.delay <= 1.5


def test_permanent_error_is_never_retried():
    decision = RetryPolicy().decide(attempt=1, error=PERMANENT, now=0, deadline=None)
    assert not decision.retry and decision.reason == "permanent_error"


def test_attempts_are_bounded():
    policy = RetryPolicy(max_attempts=3)
    assert policy.decide(attempt=2, error=TRANSIENT, now=0, deadline=None).retry
    decision = policy.decide(attempt=3, error=TRANSIENT, now=0, deadline=None)
    assert not decision.retry and decision.reason == "attempts_exhausted"


def test_retry_after_wins_when_longer_than_backoff():
    policy = RetryPolicy(max_attempts=5, base_delay=0.1, max_delay=0.2)
    decision = policy.decide(attempt=1, error=throttled(2.0), now=0, deadline=None)
    assert decision.retry and decision.delay == 2.0


def test_backoff_wins_when_longer_than_retry_after():
    policy = RetryPolicy(max_attempts=5, base_delay=10, max_delay=10, jitter=False)
    decision = policy.decide(attempt=1, error=throttled(1.0), now=0, deadline=None)
    assert decision.delay == 10


def test_no_retry_when_next_attempt_would_start_after_the_deadline():
    policy = RetryPolicy(max_attempts=5, base_delay=4, max_delay=4, jitter=False)
    decision = policy.decide(attempt=1, error=TRANSIENT, now=100, deadline=103)
    assert not decision.retry and decision.reason == "deadline_exceeded"
    assert policy.decide(attempt=1, error=TRANSIENT, now=100, deadline=105).retry


def test_retry_after_past_the_deadline_fails_with_deadline_exceeded():
    policy = RetryPolicy(max_attempts=5, base_delay=0.1, max_delay=0.1)
    decision = policy.decide(attempt=1, error=throttled(30), now=0, deadline=10)
    assert decision.reason == "deadline_exceeded"


@pytest.mark.parametrize(
    "kwargs",
    [{"max_attempts": 0}, {"max_attempts": 101}, {"base_delay": -1}, {"max_delay": -1}, {"factor": 0.5}],
)
def test_invalid_policies_are_rejected(kwargs):
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)
