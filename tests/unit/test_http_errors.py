"""HTTP errors by status, as raise_for_status() raises them: 408/425/429/5xx transient, other 4xx permanent."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest
import requests

from tasks.execution.classify import classify
from tasks.outbound.http_errors import retry_after_seconds


def http_error(status: int, headers: dict[str, str] | None = None) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    response.headers.update(headers or {})
    response.url = "https://payments.example/v1/charges"
    try:
        response.raise_for_status()
    except requests.HTTPError as exc:
        return exc
    raise AssertionError(f"{status} raised nothing")


@pytest.mark.parametrize(
    ("status", "transient", "uncertain"),
    [
        (500, True, True),
        (502, True, True),
        (503, True, True),
        (504, True, True),
        (599, True, True),
        (408, True, True),
        (425, True, False),
        (429, True, False),
        (400, False, False),
        (401, False, False),
        (403, False, False),
        (404, False, False),
        (409, False, False),
        (422, False, False),
    ],
)
def test_raise_for_status_is_classified_by_status(status, transient, uncertain):
    result = classify(http_error(status))
    assert (result.transient, result.code, result.effect_uncertain) == (transient, f"http_{status}", uncertain)
    assert result.error_class == "requests.exceptions.HTTPError"


def test_retry_after_in_seconds_is_carried():
    assert classify(http_error(429, {"Retry-After": "2"})).retry_after == 2.0
    assert classify(http_error(503, {"Retry-After": "0.5"})).retry_after == 0.5


def test_retry_after_as_an_http_date_is_seconds_from_now():
    when = formatdate(1_800_000_030, usegmt=True)
    assert retry_after_seconds(when, now=1_800_000_000) == pytest.approx(30.0)
    assert retry_after_seconds(formatdate(1_700_000_000, usegmt=True), now=1_800_000_000) == 0.0  # already past
    later = formatdate(time.time() + 20, usegmt=True)
    assert 15 <= classify(http_error(503, {"Retry-After": later})).retry_after <= 20


@pytest.mark.parametrize("value", [None, "", "soon", "-1", "nan", "86401", "Wed, 99 Foo 2026 00:00:00 GMT"])
def test_an_unusable_retry_after_is_ignored(value):
    assert retry_after_seconds(value, now=1_800_000_000) is None


def test_a_permanent_status_carries_no_retry_after():
    assert classify(http_error(409, {"Retry-After": "5"})).retry_after is None
