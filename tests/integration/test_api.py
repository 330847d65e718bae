"""The submission API in-process (Django test client) on PostgreSQL: codes, shapes, idempotency rules."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from tasks.execution.runner import task_run
from tasks.lifecycle.clients import api_client_create, api_client_revoke
from tasks.models import IdempotencyRecord, Task
from tasks.submission.idempotency import idempotency_purge_expired

pytestmark = pytest.mark.django_db(transaction=True)

REPORT = {"pipeline": "report", "input": {"user_id": "u1", "topic": "sales"}}


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


@pytest.fixture
def other_token():
    return api_client_create(name="client-b")[1]


def post(client, token, body, key=None, content_type="application/json", raw=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    data = raw if raw is not None else json.dumps(body)
    return client.generic("POST", "/api/v1/tasks", data, content_type=content_type, **headers)


def get(client, token, path):
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")


def error_code(response) -> str:
    return response.json()["error"]["code"]


def test_create_returns_201_with_the_task_representation(client, token):
    response = post(client, token, REPORT)
    assert response.status_code == 201 and "Idempotent-Replayed" not in response
    body = response.json()
    assert body["pipeline"] == "report" and body["state"] == "queued" and body["failure"] is None
    assert [s["name"] for s in body["steps"]] == ["charge_quota", "generate_report", "upload_file", "notify_user"]
    assert all(s["state"] == "pending" and s["attempts"] == 0 for s in body["steps"])
    assert body["current_step"] == "charge_quota"
    assert Task.objects.get(pk=body["id"]).client.name == "client-a"


def test_same_key_same_body_replays_the_first_response_byte_for_byte(client, token):
    first = post(client, token, REPORT, key="k-1")
    second = post(client, token, REPORT, key="k-1")
    assert (first.status_code, second.status_code) == (201, 201)
    assert second.content == first.content
    assert second["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Task.objects.count() == 1
    record = get(client, token, "/api/v1/idempotency-keys/k-1").json()
    assert record["replays"] == 1 and record["first_response_status"] == 201
    assert record["task_id"] == first.json()["id"] and len(record["request_fingerprint"]) == 64


def test_same_key_different_body_is_422_and_changes_nothing(client, token):
    first = post(client, token, REPORT, key="k-2")
    other = post(client, token, {**REPORT, "input": {"user_id": "u2", "topic": "x"}}, key="k-2")
    assert other.status_code == 422 and error_code(other) == "idempotency_key_reused"
    assert Task.objects.count() == 1
    assert Task.objects.get().input == REPORT["input"]
    assert get(client, token, f"/api/v1/tasks/{first.json()['id']}").status_code == 200


def test_keys_are_scoped_per_client(client, token, other_token):
    a = post(client, token, REPORT, key="shared")
    b = post(client, other_token, REPORT, key="shared")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"] and "Idempotent-Replayed" not in b


def test_a_client_sees_only_its_own_tasks(client, token, other_token):
    task_id = post(client, token, REPORT).json()["id"]
    assert get(client, other_token, f"/api/v1/tasks/{task_id}").status_code == 404
    assert get(client, other_token, "/api/v1/tasks").json()["items"] == []
    assert get(client, other_token, "/api/v1/idempotency-keys/none").status_code == 404


def test_revoked_and_missing_tokens_get_401(client, token):
    assert client.get("/api/v1/tasks").status_code == 401
    assert error_code(client.get("/api/v1/tasks")) == "unauthenticated"
    assert get(client, "rc_not-a-token", "/api/v1/tasks").status_code == 401
    api_client_revoke(name="client-a")
    response = post(client, token, REPORT)
    assert response.status_code == 401 and error_code(response) == "unauthenticated"
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"raw": "{not json"}, 400, "invalid_json"),
        ({"raw": '{"pipeline": "report", "input": {"n": NaN}}'}, 400, "invalid_json"),
        ({"raw": b'{"pipeline": "\xff"}'}, 400, "invalid_json"),
        ({"raw": "[" * 5000 + "]" * 5000}, 400, "invalid_json"),
        ({"raw": '{"pipeline": "report", "input": {"n": ' + "9" * 5000 + "}}"}, 400, "invalid_json"),
        ({"raw": '{"pipeline": "report", "input": {"a": ' + "[" * 70 + "]" * 70 + "}}"}, 400, "invalid_json"),
        ({"body": {"pipeline": "report"}}, 400, "validation_error"),
        ({"body": {**REPORT, "extra": 1}}, 400, "validation_error"),
        ({"body": {**REPORT, "deadline_seconds": -1}}, 400, "validation_error"),
        ({"body": {**REPORT, "deadline_seconds": True}}, 400, "validation_error"),
        ({"body": {"pipeline": 7, "input": {}}}, 400, "validation_error"),
        ({"body": {"pipeline": "report", "input": {"user_id": "u1"}}}, 400, "validation_error"),
        ({"body": {"pipeline": "report", "input": []}}, 400, "validation_error"),
        ({"body": {"pipeline": "nope", "input": {}}}, 422, "unknown_pipeline"),
        ({"body": REPORT, "content_type": "text/plain"}, 415, "unsupported_media_type"),
        ({"body": {"pipeline": "report", "input": {"blob": "x" * 300_000}}}, 413, "payload_too_large"),
        ({"body": REPORT, "key": "bad\tkey"}, 400, "validation_error"),
        ({"body": REPORT, "key": "k" * 256}, 400, "validation_error"),
    ],
)
def test_bad_requests_get_a_clear_error_and_store_nothing(client, token, kwargs, status, code):
    response = post(client, token, kwargs.pop("body", None), **kwargs)
    assert response.status_code == status, response.content[:300]
    body = response.json()
    assert body["error"]["code"] == code and body["error"]["message"]
    assert Task.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


def test_validation_errors_name_the_fields(client, token):
    response = post(client, token, {"pipeline": "report", "input": {"user_id": "", "topic": "t", "x": 1}})
    details = response.json()["error"]["details"]
    assert set(details) == {"user_id", "x"}


def test_a_refused_request_leaves_its_key_usable(client, token):
    assert post(client, token, {"pipeline": "nope", "input": {}}, key="k-3").status_code == 422
    assert post(client, token, REPORT, key="k-3").status_code == 201


def test_unknown_paths_and_ids_are_json_404(client, token):
    for path in ("/api/v1/tasks/not-a-uuid", "/api/v1/tasks/00000000-0000-0000-0000-000000000000", "/api/v2/x"):
        response = get(client, token, path)
        assert response.status_code == 404 and error_code(response) == "not_found"


def test_list_filters_and_paginates_newest_first(client, token):
    ids = [post(client, token, {**REPORT, "input": {"user_id": f"u{i}", "topic": "t"}}).json()["id"] for i in range(5)]
    post(client, token, {"pipeline": "t_local", "input": {}})
    page = get(client, token, "/api/v1/tasks?pipeline=report&limit=2").json()
    seen = [item["id"] for item in page["items"]]
    while page["next_cursor"]:
        page = get(client, token, f"/api/v1/tasks?pipeline=report&limit=2&cursor={page['next_cursor']}").json()
        seen += [item["id"] for item in page["items"]]
    assert seen == list(reversed(ids))
    assert len(get(client, token, "/api/v1/tasks?state=queued").json()["items"]) == 6
    assert get(client, token, "/api/v1/tasks?state=succeeded").json()["items"] == []
    for bad in ("state=nope", "limit=0", "limit=101", "cursor=%%%"):
        response = get(client, token, f"/api/v1/tasks?{bad}")
        assert response.status_code == 400 and error_code(response) == "validation_error", bad


def test_a_task_is_followed_to_its_terminal_state_with_steps_and_failure(client, token):
    task_id = post(client, token, {"pipeline": "t_local", "input": {"fail_b": "permanent"}}).json()["id"]
    task_run(task_id=task_id, worker="w")
    body = get(client, token, f"/api/v1/tasks/{task_id}").json()
    assert body["state"] == "compensated"
    assert body["failure"] == {"reason": "permanent_error", "code": "refused", "message": "refused", "step": "local_b"}
    assert [(s["name"], s["state"], s["attempts"]) for s in body["steps"]] == [
        ("local_a", "compensated", 1),
        ("local_b", "failed", 1),
    ]
    assert body["steps"][1]["last_error_code"] == "refused"


def test_expired_records_are_purged_and_the_key_can_be_used_again(client, token):
    first = post(client, token, REPORT, key="k-old").json()["id"]
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert get(client, token, "/api/v1/idempotency-keys/k-old").status_code == 404
    assert idempotency_purge_expired() == 1
    again = post(client, token, REPORT, key="k-old")
    assert again.status_code == 201 and again.json()["id"] != first


def test_expired_record_is_replaced_even_before_the_purge(client, token):
    post(client, token, REPORT, key="k-exp")
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    other = post(client, token, {**REPORT, "input": {"user_id": "u9", "topic": "t"}}, key="k-exp")
    assert other.status_code == 201 and Task.objects.count() == 2


def test_openapi_document_and_docs_page(client):
    schema = client.get("/api/v1/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    assert {"/api/v1/tasks", "/api/v1/tasks/{task_id}", "/api/v1/idempotency-keys/{key}"} <= set(schema["paths"])
    # Each step's attempts with what the step logged (issue 24), null in a callback's body.
    components = schema["components"]["schemas"]
    attempt_logs = components["StepOut"]["properties"]["attempt_logs"]
    assert {"$ref": "#/components/schemas/AttemptLogOut"} == attempt_logs["anyOf"][0]["items"]
    assert set(components["AttemptLogOut"]["properties"]) == {
        "kind",
        "attempt",
        "outcome",
        "started_at",
        "finished_at",
        "log",
        "log_dropped",
    }
    assert set(components["LogLineOut"]["properties"]) == {"at", "level", "logger", "message"}
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_create_api_token_prints_the_token_alone_on_the_last_line(capsys):
    call_command("create_api_token", "cli-client")
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith("rc_") and " " not in last_line
    from tasks.models import ApiClient

    stored = ApiClient.objects.get(name="cli-client")
    assert last_line not in stored.token_hash and stored.token_hash != last_line


def test_a_nul_byte_in_the_pipeline_filter_is_a_400(client, token):
    # Found by the Schemathesis fuzz test: PostgreSQL text cannot hold NUL, the query used to raise (500).
    response = get(client, token, "/api/v1/tasks?pipeline=a%00b")
    assert response.status_code == 400 and error_code(response) == "validation_error"
