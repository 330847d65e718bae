"""Completion callbacks end to end: the real API, real workers, a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import socket

import pytest
import requests

from tasks.lifecycle.clients import api_client_create, api_client_signing_secret
from tasks.models import DeadLetter, SideEffect, StepAttempt, Task
from tasks.outbound.callback_events import CALLBACK_PIPELINE
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

CLIENT = "callback-live"
# Callbacks to the receiver on 127.0.0.1 only; retries fast enough for a test.
CALLBACK_ENV = {"RELIABILITY_CALLBACK_ALLOWED_HOSTS": "127.0.0.1", "RELIABILITY_CALLBACK_RETRY_BASE_SECONDS": 0.2}
TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}


@pytest.fixture
def token():
    return api_client_create(name=CLIENT)[1]


def submit(server, token: str, callback_url: str, **data) -> requests.Response:
    body = {"pipeline": "t_local", "input": data, "callback_url": callback_url}
    return requests.post(
        f"{server.url}/api/v1/tasks", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def finished(pipeline: str) -> list[Task]:
    return list(Task.objects.filter(pipeline=pipeline, state__in=TERMINAL))


def test_a_receiver_that_fails_twice_gets_one_logical_callback_signed_and_fresh(
    start_api_server, start_workers, webhook_receiver, token
):
    server = start_api_server(**CALLBACK_ENV)
    pool = start_workers(2, **CALLBACK_ENV)
    webhook_receiver.fail_next = 2

    response = submit(server, token, webhook_receiver.url)
    assert response.status_code == 201, response.text
    task_id = response.json()["id"]

    wait_for(lambda: webhook_receiver.accepted(), timeout=60, message=f"the callback\n{pool.logs()}")
    callback = wait_for(lambda: finished(CALLBACK_PIPELINE), timeout=30, message="the callback task to finish")[0]
    assert callback.state == "succeeded", pool.logs()
    received = webhook_receiver.all()
    assert [r.answered for r in received] == [500, 500, 200]
    # One logical callback: one key on every attempt, the same body, each attempt signed when it was sent.
    assert len({r.idempotency_key for r in received}) == 1 and received[0].idempotency_key
    assert len({r.body for r in received}) == 1
    # Sent through ctx.http: the callback task's effect key, in its ledger; its id and deadline headers.
    assert received[0].idempotency_key == f"rc-{callback.pk}-g0-send_callback-callback"
    assert SideEffect.objects.get(task_id=callback.pk).effect_key == received[0].idempotency_key
    assert all(r.headers["x-task-id"] == str(callback.pk) and r.headers["x-request-deadline"] for r in received)
    secret = api_client_signing_secret(name=CLIENT)
    assert all(r.callback_signature_valid(secret) for r in received)
    assert not any(r.callback_signature_valid("whsec_another") for r in received)
    assert all(abs(r.received_at - r.signed_at) <= 5 for r in received)  # well within a 300 s tolerance
    assert all(r.headers["content-type"] == "application/json" for r in received)

    # The body: the event and the task as GET shows it.
    body = received[-1].json
    headers = {"Authorization": f"Bearer {token}"}
    shown = requests.get(f"{server.url}/api/v1/tasks/{task_id}", headers=headers, timeout=30)
    assert body == {"event": "task.succeeded", "task": shown.json()}
    assert Task.objects.filter(pipeline=CALLBACK_PIPELINE).count() == 1
    assert len(webhook_receiver.all()) == 3  # nothing more after it was accepted


def test_a_disallowed_or_redirecting_callback_url_is_refused(start_api_server, start_workers, webhook_receiver, token):
    server = start_api_server(**CALLBACK_ENV)
    port = webhook_receiver.server.server_address[1]
    for url in (
        "http://169.254.169.254/latest/meta-data/",
        f"http://localhost:{port}/hook",  # the same address under a name that is not allowed
        f"ftp://127.0.0.1:{port}/hook",
        f"http://user:secret@127.0.0.1:{port}/hook",
    ):
        refused = submit(server, token, url)
        assert refused.status_code == 400, (url, refused.text)
        assert refused.json()["error"]["code"] == "validation_error"
    assert not Task.objects.exists()

    # An allowed receiver that answers with a redirect: never followed, the callback fails at once.
    webhook_receiver.redirect_to = f"http://127.0.0.1:{port}/latest/meta-data"
    pool = start_workers(1, **CALLBACK_ENV)
    task_id = submit(server, token, webhook_receiver.url).json()["id"]
    callback = wait_for(lambda: finished(CALLBACK_PIPELINE), timeout=60, message=f"the callback\n{pool.logs()}")[0]
    assert callback.state == "failed" and callback.failure_code == "callback_redirect", callback.failure_message
    assert callback.failure_reason == "permanent_error" and callback.in_dlq
    assert [(r.path, r.answered) for r in webhook_receiver.all()] == [("/hook", 302)]  # nothing at the target
    original = Task.objects.get(pk=task_id)
    assert original.state == "succeeded" and not original.in_dlq


def test_a_receiver_down_for_good_parks_the_callback_in_the_dlq_and_leaves_the_task_alone(
    start_api_server, start_workers, token
):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**CALLBACK_ENV, "RELIABILITY_CALLBACK_MAX_ATTEMPTS": 3}
    server = start_api_server(**env)
    pool = start_workers(2, **env)

    task_id = submit(server, token, f"http://127.0.0.1:{port}/hook").json()["id"]
    wait_for(lambda: Task.objects.get(pk=task_id).state in TERMINAL, timeout=60, message="the task")
    before = Task.objects.filter(pk=task_id).values().get()
    assert before["state"] == "succeeded"

    callback = wait_for(lambda: finished(CALLBACK_PIPELINE), timeout=90, message=f"the callback\n{pool.logs()}")[0]
    assert callback.state == "failed" and callback.failure_reason == "attempts_exhausted", callback.failure_message
    attempts = StepAttempt.objects.filter(task_id=callback.pk).order_by("started_at")
    assert attempts.count() == 3 and all(a.outcome != "succeeded" for a in attempts)
    item = DeadLetter.objects.get(task_id=callback.pk)
    assert item.status == "open" and item.reason_code == "attempts_exhausted"
    assert "whsec_" not in str(item.input_snapshot) + item.error_message

    # The task it reported on: not a field changed, no dead letter of its own.
    assert Task.objects.filter(pk=task_id).values().get() == before
    assert not DeadLetter.objects.filter(task_id=task_id).exists()
