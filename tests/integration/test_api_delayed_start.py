"""``run_at`` and ``delay_seconds`` on ``POST /api/v1/tasks`` (and a batch's items): the task waits, and says so."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from tasks.models import Task, TaskState

pytestmark = pytest.mark.django_db(transaction=True)

REPORT = {"pipeline": "report", "input": {"user_id": "u1", "topic": "sales"}}


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def post(client, token, body, path="/api/v1/tasks", **headers):
    return client.generic(
        "POST", path, json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}", **headers
    )


def test_run_at_creates_a_waiting_task_that_says_until_when(client, token):
    run_at = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    response = post(client, token, {**REPORT, "run_at": run_at.isoformat()})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "waiting"
    assert body["waiting"]["for"] == "start" and body["waiting"]["name"] is None
    assert datetime.fromisoformat(body["waiting"]["until"]) == run_at
    assert (
        client.get(f"/api/v1/tasks/{body['id']}", HTTP_AUTHORIZATION=f"Bearer {token}").json()["waiting"]
        == (body["waiting"])
    )


def test_delay_seconds_counts_from_now_and_a_repeat_with_the_key_is_the_same_request(client, token):
    before = timezone.now()
    first = post(client, token, {**REPORT, "delay_seconds": 30}, HTTP_IDEMPOTENCY_KEY="d-1")
    assert first.status_code == 201, first.content
    until = datetime.fromisoformat(first.json()["waiting"]["until"])
    assert before + timedelta(seconds=30) <= until <= timezone.now() + timedelta(seconds=30)
    again = post(client, token, {**REPORT, "delay_seconds": 30}, HTTP_IDEMPOTENCY_KEY="d-1")
    assert (again.status_code, again["Idempotent-Replayed"], again.content) == (201, "true", first.content)
    other = post(client, token, {**REPORT, "delay_seconds": 31}, HTTP_IDEMPOTENCY_KEY="d-1")
    assert (other.status_code, other.json()["error"]["code"]) == (422, "idempotency_key_reused")
    assert Task.objects.count() == 1


@pytest.mark.parametrize(
    "extra",
    [
        {"run_at": "2030-01-01T00:00:00+00:00", "delay_seconds": 5},  # both
        {"run_at": "tomorrow"},
        {"run_at": "2030-01-01T00:00:00"},  # no offset: which 00:00?
        {"run_at": 1767225600},  # a number is not an RFC 3339 time
        {"delay_seconds": -1},
        {"delay_seconds": 400 * 86400},
        {"delay_seconds": "5"},
        {"delay_seconds": 120, "deadline_seconds": 60},  # it could never run
    ],
)
def test_a_bad_start_is_a_400_and_stores_nothing(client, token, extra):
    response = post(client, token, {**REPORT, **extra}, HTTP_IDEMPOTENCY_KEY="bad")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "validation_error"
    assert not Task.objects.exists()


def test_a_batch_item_may_start_later(client, token):
    response = post(
        client,
        token,
        {"items": [{**REPORT, "delay_seconds": 60}, REPORT, {**REPORT, "delay_seconds": -1}]},
        path="/api/v1/tasks/batch",
    )
    # A value the schema forbids refuses the request, as for any other field of an item.
    assert response.status_code == 400, response.content
    response = post(client, token, {"items": [{**REPORT, "delay_seconds": 60}, REPORT]}, path="/api/v1/tasks/batch")
    assert response.status_code == 200, response.content
    assert [item["task"]["state"] for item in response.json()["items"]] == ["waiting", "queued"]
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.WAITING, TaskState.QUEUED}
