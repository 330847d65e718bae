"""Bad input never makes a 500: each case found by probing the running console gets its documented 4xx."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

from tasks.exceptions import InvalidTaskInput
from tasks.execution.runner import task_run
from tasks.models import IdempotencyRecord, Task
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def submit(client, token, raw: bytes | str, key: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.generic("POST", "/api/v1/tasks", raw, content_type="application/json", **headers)


@pytest.mark.parametrize(
    "raw",
    [
        '{"pipeline": "report", "input": {"user_id": "u\\u0000", "topic": "sales"}}',
        '{"pipeline": "t_local", "input": {"note": "a\\u0000b"}}',
        '{"pipeline": "t_local", "input": {"a\\u0000": {"b": ["x"]}}}',
        '{"pipeline": "t_local", "input": {"note": ["\\ud800"]}}',
        '{"pipeline": "t_local", "input": {"\\udc00x": 1}}',
        '{"pipeline": "report", "input": {"user_id": "u1", "topic": "sales", "k\\u0000": 1}}',
        '{"pipeline": "rep\\u0000ort", "input": {"user_id": "u1", "topic": "sales"}}',
        '{"pipeline": "report", "input": {"user_id": "u\\ud800", "topic": "sales"}}',
        '{"pipeline": "report", "input": {"user_id": "u1", "topic": "sales", "\\udfff": 1}}',
        '{"pipeline": "r\\ud800", "input": {"user_id": "u1", "topic": "sales"}}',
    ],
    ids=[
        "nul-value",
        "any-nul-value",
        "any-nul-key",
        "any-surrogate-value",
        "any-surrogate-key",
        "nul-key",
        "nul-pipeline",
        "surrogate-value",
        "surrogate-key",
        "surrogate-pipeline",
    ],
)
def test_nul_and_lone_surrogates_in_a_submission_are_400_and_store_nothing(client, token, raw):
    response = submit(client, token, raw, key="k-bad")
    assert response.status_code in {400, 422}, response.content[:300]
    assert response.json()["error"]["code"] in {"validation_error", "invalid_json", "unknown_pipeline"}
    assert Task.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
    # The key was not taken by the refused request: a good body with it is accepted.
    good = submit(client, token, json.dumps({"pipeline": "report", "input": {"user_id": "u1", "topic": "x"}}), "k-bad")
    assert good.status_code == 201


def test_a_surrogate_pair_is_an_ordinary_character(client, token):
    raw = '{"pipeline": "t_local", "input": {"note": "\\ud83d\\ude00 ok"}}'
    response = submit(client, token, raw)
    assert response.status_code == 201
    assert Task.objects.get().input == {"note": "\U0001f600 ok"}


@pytest.mark.parametrize("path", ["a%ED%A0%80b", "%FF%FE", "%C3%A9t%C3%A9"])
def test_an_idempotency_key_no_request_could_use_is_a_404(client, token, path):
    response = client.get(f"/api/v1/idempotency-keys/{path}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/idempotency-keys/a%00b",
        "/api/v1/idempotency-keys/%00",
        "/api/v1/tasks/a%00b",
        "/api/v1/tasks?cursor=a%00b",
    ],
)
def test_a_nul_character_in_an_api_url_is_a_400(client, token, path):
    response = client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400 and response.json()["error"]["code"] == "validation_error"


def test_a_body_over_djangos_upload_limit_is_413_not_500(client, token, settings):
    size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1024
    raw = json.dumps({"pipeline": "report", "input": {"pad": "x" * size}})
    response = submit(client, token, raw)
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


def test_a_form_posted_to_the_api_is_a_415_not_a_500(client, token):
    # A form's body, once read as a form (the NUL check reads the console's forms), could not be read again.
    task = submit(client, token, json.dumps({"pipeline": "t_local", "input": {}})).json()
    for data in ({}, {"reason": "a%00b"}):
        response = client.post(f"/api/v1/tasks/{task['id']}/cancel", data, HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert Task.objects.get(pk=task["id"]).state == "queued"


def test_python_submission_refuses_a_nul_character_and_stores_nothing():
    with pytest.raises(InvalidTaskInput, match="NUL"):
        task_submit(pipeline="t_local", input={"note": "a\x00b"}, idempotency_key="py-nul")
    assert Task.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize("kind", ["nul", "surrogate"])
def test_a_step_output_postgresql_cannot_store_is_the_steps_permanent_error(kind):
    task = task_submit(pipeline="t_local", input={"unstorable_output": kind})
    task_run(task_id=str(task.pk), worker="w1")  # no bookkeeping error escapes: the step failed, recorded
    task.refresh_from_db()
    assert task.state in {"compensated", "failed"} and task.in_dlq
    failed = task.attempts.get(step_name="local_b")
    assert failed.error_code == "output_not_json"


@pytest.fixture
def admin_client(client):
    user = get_user_model().objects.create_superuser("root", password="pw-for-tests-only")
    client.force_login(user)
    return client


ADMIN_LISTS = [
    "/admin/dlq/dlqitem/",
    "/admin/dlq/dlqitem/bulk/close/",
    "/admin/tasks/task/",
    "/admin/dlq/bulkoperation/",
    "/admin/dlq/auditentry/",
]


@pytest.mark.parametrize("path", ADMIN_LISTS)
@pytest.mark.parametrize(
    "query",
    ["pipeline=a%00b", "fingerprint=a%00b", "bogus=1", "q=a%00b", "status=%00", "pipeline=%ED%A0%80", "o=99"],
)
def test_admin_lists_answer_bad_query_strings_without_a_500(admin_client, path, query):
    response = admin_client.get(f"{path}?{query}")
    assert response.status_code in {200, 302, 400, 404}, (path, query, response.status_code)


@pytest.mark.parametrize(
    "query",
    [
        "/admin/dlq/auditentry/?client_ip__gt=-1",  # an inet PostgreSQL refuses
        "/admin/tasks/task/?pipeline__regex=%28",  # a regular expression PostgreSQL refuses
        "/admin/dlq/dlqitem/?status__range=1",  # a lookup that fails only when the SQL is compiled
        "/admin/dlq/dlqitem/?pipeline=a%00b",  # text PostgreSQL cannot even compare with
        "/admin/dlq/dlqitem/?fingerprint=a%00b",
    ],
)
def test_a_filter_the_database_refuses_is_the_admins_invalid_filter_redirect(admin_client, query):
    response = admin_client.get(query)
    assert response.status_code == 302 and response["Location"].endswith("?e=1")
    page = admin_client.get(response["Location"])
    assert page.status_code == 200
    assert "That filter cannot be applied" in page.content.decode()


def test_a_nul_character_in_an_admin_form_is_a_400_and_changes_nothing(admin_client):
    from dlq.models import AuditEntry, DLQItem

    task = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    task_run(task_id=str(task.pk), worker="w1")
    item = DLQItem.objects.get(task=task)
    before, status = AuditEntry.objects.count(), item.status
    response = admin_client.post(
        f"/admin/dlq/dlqitem/{item.pk}/act/close/", {"reason": "dup\x00licate", "resolution": "duplicate"}
    )
    assert response.status_code == 400
    assert AuditEntry.objects.count() == before
    item.refresh_from_db()
    assert item.status == status and item.resolved_at is None
