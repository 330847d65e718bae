"""Chunked request bodies (``Transfer-Encoding: chunked``, no ``Content-Length``) through a real gunicorn.

Issue 25, finding (d): a chunked 300 KB body was read as empty (a 400 for a
missing field) instead of refused as too large. The Django test client cannot
send a chunked body: ``requests`` with a generator body does, and a raw
socket sends one gunicorn cannot decode.
"""

from __future__ import annotations

import json
import socket

import pytest
import requests

from tasks.lifecycle.clients import api_client_create
from tasks.models import IdempotencyRecord, Task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

REPORT = {"pipeline": "report", "input": {"user_id": "alice", "topic": "sales"}}
LIMIT = 262_144  # RELIABILITY_MAX_REQUEST_BYTES's default


def in_pieces(body: bytes, size: int = 4096):
    """``body`` as a generator: requests sends it chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.fixture
def server(start_api_server):
    return start_api_server()


@pytest.fixture
def headers():
    token = api_client_create(name="chunked-client")[1]
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def test_a_chunked_body_over_the_limit_is_413_and_creates_nothing(server, headers):
    body = json.dumps({**REPORT, "input": {"user_id": "alice", "topic": "x" * 300_000}}).encode()
    response = requests.post(f"{server.url}/api/v1/tasks", data=in_pieces(body), headers=headers, timeout=30)
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert "Content-Length" not in response.request.headers
    assert response.status_code == 413, response.text
    assert response.json() == {
        "error": {
            "code": "payload_too_large",
            "message": f"the body must be at most {LIMIT} bytes",
            "details": {"limit": LIMIT},
        }
    }
    assert Task.objects.count() == 0 and IdempotencyRecord.objects.count() == 0


def test_a_chunked_body_under_the_limit_is_submitted_and_a_chunked_cancel_is_read(server, headers):
    created = requests.post(
        f"{server.url}/api/v1/tasks",
        data=in_pieces(json.dumps(REPORT).encode(), size=7),
        headers={**headers, "Idempotency-Key": "chunked-1"},
        timeout=30,
    )
    assert created.request.headers.get("Transfer-Encoding") == "chunked"
    assert created.status_code == 201, created.text
    task = Task.objects.get(pk=created.json()["id"])
    assert task.input == REPORT["input"]
    replayed = requests.post(
        f"{server.url}/api/v1/tasks", json=REPORT, headers={**headers, "Idempotency-Key": "chunked-1"}, timeout=30
    )
    assert replayed.headers.get("Idempotent-Replayed") == "true"  # the same body, however it was sent

    reason = json.dumps({"reason": "sent in pieces"}).encode()
    cancelled = requests.post(
        f"{server.url}/api/v1/tasks/{task.pk}/cancel", data=in_pieces(reason, size=5), headers=headers, timeout=30
    )
    assert cancelled.status_code in (200, 202), cancelled.text
    task.refresh_from_db()
    assert task.cancel_reason == "sent in pieces"


def test_a_chunked_body_gunicorn_cannot_decode_is_a_400_not_a_500(server, headers):
    request = (
        "POST /api/v1/tasks HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{server.port}\r\n"
        f"Authorization: {headers['Authorization']}\r\n"
        "Content-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n"
        "Connection: close\r\n"
        "\r\n"
        "zz\r\n{}\r\n0\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 400"), answer[:500]
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["code"] == "invalid_json"
    assert Task.objects.count() == 0
