"""A step that calls an HTTP API with plain requests and raise_for_status(), run by real workers (issue #13, point 2).

The report-platform simulator answers scripted statuses; the engine must retry 503, 429 (honouring its
Retry-After) as transient and fail a 409 at once as permanent `http_409`, with nothing written in between.
"""

from __future__ import annotations

import pytest

from tasks.models import Task
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}


def finished(task_id) -> Task:
    def done():
        task = Task.objects.get(pk=task_id)
        return task if task.state in TERMINAL else None

    return wait_for(done, timeout=60, message="the task to finish")


def test_503_and_429_from_raise_for_status_are_retried_and_409_is_permanent(platform, start_workers):
    platform.set_faults(
        rules=[
            {"path_prefix": "/v1/reports", "user_id": "u-flaky", "status": 503, "times": 1},
            {"path_prefix": "/v1/reports", "user_id": "u-flaky", "status": 429, "retry_after": 2, "times": 1},
            {"path_prefix": "/v1/reports", "user_id": "u-conflict", "status": 409, "times": 5},
        ]
    )
    start_workers(2)
    flaky = task_submit(pipeline="t_raw_http", input={"user_id": "u-flaky"})
    conflict = task_submit(pipeline="t_raw_http", input={"user_id": "u-conflict"})

    flaky = finished(flaky.pk)
    assert flaky.state == "succeeded"
    attempts = list(flaky.attempts.order_by("attempt"))
    assert [(a.outcome, a.error_code) for a in attempts][:2] == [
        ("transient_error", "http_503"),
        ("transient_error", "http_429"),
    ]
    assert attempts[-1].outcome == "succeeded" and len(attempts) == 3
    assert attempts[1].retry_after_seconds == 2.0
    # The 429's Retry-After (2 s) was honoured: the third attempt started at least 2 s after the second ended.
    assert (attempts[2].started_at - attempts[1].finished_at).total_seconds() >= 2.0
    # One key for the effect on every call.
    assert {call["idempotency_key"] for call in platform.calls(str(flaky.pk))} == {
        f"rc-{flaky.pk}-g0-raw_http_report-report"
    }

    conflict = finished(conflict.pk)
    assert conflict.state == "failed" and conflict.in_dlq
    (attempt,) = conflict.attempts.all()
    assert (attempt.outcome, attempt.error_code) == ("permanent_error", "http_409")
    assert conflict.dlq_items.get().error_code == "http_409"


def test_a_retry_after_given_as_an_http_date_is_honoured(platform, start_workers):
    # RFC 9110 allows Retry-After as a date; the simulator sends ceil(now + 2 s) in IMF-fixdate form.
    platform.set_faults(
        rules=[
            {
                "path_prefix": "/v1/reports",
                "user_id": "u-dated",
                "status": 503,
                "retry_after": 2,
                "retry_after_http_date": True,
                "times": 1,
            }
        ]
    )
    start_workers(1)
    task = finished(task_submit(pipeline="t_raw_http", input={"user_id": "u-dated"}).pk)
    assert task.state == "succeeded"
    first, second = task.attempts.order_by("attempt")
    assert (first.outcome, first.error_code) == ("transient_error", "http_503")
    # A date has whole seconds: 2 s from now, rounded up, is between 1 and 3 s away when it is read.
    assert 1.0 <= first.retry_after_seconds <= 3.0
    assert first.retry_delay_seconds >= first.retry_after_seconds
    assert (second.started_at - first.finished_at).total_seconds() >= first.retry_after_seconds
