"""The API's request bodies in-process: duplicate keys refused at any depth, chunked bodies read within the limit.

Chunked bodies through a real gunicorn are in tests/acceptance/test_chunked_bodies_live.py; here the WSGI
server is played by the environ it would hand over (``wsgi.input_terminated``, no ``CONTENT_LENGTH``), which
lets a test count how much of the body the API read.
"""

from __future__ import annotations

import io
import json

import pytest

from tasks.models import IdempotencyRecord, Task

pytestmark = pytest.mark.django_db(transaction=True)

REPORT = {"pipeline": "report", "input": {"user_id": "u1", "topic": "sales"}}


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def post_raw(client, token, raw: str, path: str = "/api/v1/tasks"):
    return client.generic("POST", path, raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        # The finding: the last "pipeline" won, a task of the other pipeline was created.
        ('{"pipeline": "report", "input": {"user_id": "u1", "topic": "sales"}, "pipeline": "t_local"}', "pipeline"),
        ('{"pipeline": "report", "input": {"user_id": "u1", "topic": "sales", "user_id": "u2"}}', "user_id"),
        ('{"pipeline": "t_local", "input": {"a": [{"b": {"c": 1, "c": 2}}]}}', "c"),
        ('{"pipeline": "report", "input": {"user_id": "u1", "topic": "sales"}, "pipeline": "report"}', "pipeline"),
        ('{"pipeline": "t_local", "input": {"\\u00e9": 1, "\u00e9": 2}}', "\u00e9"),
    ],
    ids=["top level", "in the input", "deep in a list", "the same value twice", "spelled two ways"],
)
def test_a_duplicate_key_is_invalid_json_naming_the_key_and_creates_nothing(client, token, raw, key):
    response = post_raw(client, token, raw)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and error["details"] == {"key": key}
    assert json.dumps(key) in error["message"]
    assert Task.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


def test_a_cancel_body_with_a_duplicate_key_is_refused_and_cancels_nothing(client, token):
    task_id = post_raw(client, token, json.dumps({"pipeline": "t_local", "input": {}})).json()["id"]
    response = post_raw(client, token, '{"reason": "a", "reason": "b"}', path=f"/api/v1/tasks/{task_id}/cancel")
    assert response.status_code == 400 and response.json()["error"]["details"] == {"key": "reason"}
    assert Task.objects.get(pk=task_id).cancel_requested_at is None


def test_equal_keys_in_different_objects_are_not_duplicates(client, token):
    raw = '{"pipeline": "t_local", "input": {"a": {"name": 1}, "b": {"name": 2}, "name": 3}}'
    assert post_raw(client, token, raw).status_code == 201


class ServerStream(io.RawIOBase):
    """A WSGI server's decoded chunked body: ``size`` bytes of a JSON string, and how many were read."""

    def __init__(self, body: bytes) -> None:
        self.body = io.BytesIO(body)
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        piece = self.body.read(size)
        self.read_bytes += len(piece)
        return piece


def post_chunked(client, token, stream, *, terminated: bool = True):
    environ = {
        "wsgi.input": stream,
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "",
        "HTTP_TRANSFER_ENCODING": "chunked",
    }
    if terminated:
        environ["wsgi.input_terminated"] = True
    return client.generic("POST", "/api/v1/tasks", HTTP_AUTHORIZATION=f"Bearer {token}", **environ)


def test_a_chunked_body_is_read_and_submitted(client, token):
    stream = ServerStream(json.dumps(REPORT).encode())
    response = post_chunked(client, token, stream)
    assert response.status_code == 201, response.content
    assert Task.objects.get().input == REPORT["input"]


def test_a_chunked_body_over_the_limit_is_413_after_reading_the_limit_and_one_byte(client, token, settings):
    limit = settings.RELIABILITY_MAX_REQUEST_BYTES
    stream = ServerStream(json.dumps({**REPORT, "input": {"blob": "x" * (20 * limit)}}).encode())
    response = post_chunked(client, token, stream)
    assert response.status_code == 413
    assert response.json()["error"] == {
        "code": "payload_too_large",
        "message": f"the body must be at most {limit} bytes",
        "details": {"limit": limit},
    }
    assert stream.read_bytes == limit + 1
    assert Task.objects.count() == 0


def test_a_chunked_body_of_exactly_the_limit_is_accepted(client, token, settings):
    body = json.dumps({**REPORT, "input": {"user_id": "u1", "topic": "x"}}).encode()
    settings.RELIABILITY_MAX_REQUEST_BYTES = len(body)
    assert post_chunked(client, token, ServerStream(body)).status_code == 201


def test_a_chunked_body_the_server_does_not_end_is_411_and_is_not_read(client, token):
    stream = ServerStream(json.dumps(REPORT).encode())
    response = post_chunked(client, token, stream, terminated=False)
    assert response.status_code == 411 and response.json()["error"]["code"] == "length_required"
    assert stream.read_bytes == 0 and Task.objects.count() == 0
