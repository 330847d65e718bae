"""``POST /api/v1/tasks/batch`` in-process: each item answered as its own submission, in order."""

from __future__ import annotations

import json

import pytest

from tasks.lifecycle.clients import api_client_create
from tasks.models import IdempotencyRecord, Task
from tasks.submission.batches import MAX_BATCH_ITEMS

pytestmark = pytest.mark.django_db(transaction=True)

REPORT = {"pipeline": "report", "input": {"user_id": "u1", "topic": "sales"}}


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def post(client, token, path, body, **headers):
    return client.generic(
        "POST", path, json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}", **headers
    )


def post_batch(client, token, body, **headers):
    return post(client, token, "/api/v1/tasks/batch", body, **headers)


def post_single(client, token, body, key):
    return post(client, token, "/api/v1/tasks", body, HTTP_IDEMPOTENCY_KEY=key)


def test_each_item_is_answered_as_a_single_submission_at_its_place(client, token):
    single = post_single(client, token, REPORT, key="k-0")
    response = post_batch(
        client,
        token,
        {
            "items": [
                {**REPORT, "idempotency_key": "k-0"},
                {"pipeline": "report", "input": {"user_id": "u2", "topic": "ops"}, "idempotency_key": "k-1"},
                {"pipeline": "nope", "input": {}},
                {**REPORT, "idempotency_key": "k-1"},
            ]
        },
    )
    assert response.status_code == 200, response.content
    items = response.json()["items"]
    assert [item["index"] for item in items] == [0, 1, 2, 3]
    assert [(item["status"], item["replayed"]) for item in items] == [
        (201, True),
        (201, False),
        (422, False),
        (422, False),
    ]
    # A replay is the first answer, byte for byte as the single submission stored it.
    assert json.dumps(items[0]["task"], separators=(",", ":"), ensure_ascii=False).encode() == single.content
    assert items[1]["task"]["state"] == "queued" and items[1]["error"] is None
    assert items[2]["error"]["code"] == "unknown_pipeline" and items[2]["task"] is None
    assert items[3]["error"]["code"] == "idempotency_key_reused"
    # The batch item's key works for a single submission afterwards.
    again = post_single(client, token, {"pipeline": "report", "input": {"user_id": "u2", "topic": "ops"}}, "k-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == items[1]["task"]["id"]
    assert Task.objects.count() == 2


def test_an_atomic_batch_with_a_bad_item_is_a_422_and_stores_nothing(client, token):
    response = post_batch(
        client,
        token,
        {"items": [{**REPORT, "idempotency_key": "a"}, {"pipeline": "nope", "input": {}}], "atomic": True},
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "batch_refused"
    assert error["details"]["items"] == [
        {"index": 1, "code": "unknown_pipeline", "message": "no pipeline named 'nope' is registered"}
    ]
    assert not Task.objects.exists() and not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"items": []}, {}),
        ({"items": [REPORT] * (MAX_BATCH_ITEMS + 1)}, {}),
        ({"items": [{**REPORT, "colour": "red"}]}, {}),
        ({"items": [{**REPORT, "idempotency_key": "\u00e9"}]}, {}),
        ({"items": [REPORT], "atomic": "yes"}, {}),
        ({"tasks": [REPORT]}, {}),
        ({"items": [REPORT]}, {"HTTP_IDEMPOTENCY_KEY": "batch-key"}),
    ],
)
def test_a_bad_batch_is_a_400_and_stores_nothing(client, token, body, headers):
    response = post_batch(client, token, body, **headers)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] in ("validation_error", "idempotency_key_per_item")
    assert not Task.objects.exists()


def test_another_clients_keys_are_its_own(client, token):
    other = api_client_create(name="client-b")[1]
    first = post_batch(client, token, {"items": [{**REPORT, "idempotency_key": "same"}]}).json()["items"][0]
    second = post_batch(client, other, {"items": [{**REPORT, "idempotency_key": "same"}]}).json()["items"][0]
    assert not first["replayed"] and not second["replayed"]
    assert first["task"]["id"] != second["task"]["id"]


def test_a_batch_without_a_token_is_a_401(client):
    response = client.generic(
        "POST", "/api/v1/tasks/batch", json.dumps({"items": [REPORT]}), content_type="application/json"
    )
    assert response.status_code == 401
    assert not Task.objects.exists()
