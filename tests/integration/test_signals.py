"""Waits for a signal (``Pipeline.wait``) and signals (``task_signal``, ``POST /api/v1/tasks/{id}/signals/{name}``):
whatever the order of the signal and the wait, the task goes on once; a timeout fails the step for good; bad
signals are refused with their codes and change nothing."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection

from tasks import Pipeline
from tasks.delivery.enqueue import get_queue
from tasks.delivery.queues import queue_names
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import (
    ConfigurationError,
    IdempotencyKeyReused,
    InvalidTaskInput,
    SignalAlreadyReceived,
    TaskFinished,
    TaskNotActionable,
    UnknownSignal,
)
from tasks.execution.runner import task_run
from tasks.lifecycle import waits
from tasks.lifecycle.signals import task_signal
from tasks.models import Checkpoint, Signal, Task, TaskState, WaitKind
from tasks.selectors import task_representation
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

APPROVED = {"approved": True, "by": "manager", "reason": "within policy"}


@pytest.fixture(autouse=True)
def _clean(clean_redis):
    yield


def jobs_waiting() -> int:
    return sum(get_queue(name).count for name in queue_names())


def delivered(task):
    """As a worker would: the task's queued job taken (the test runs the task in-process)."""
    for name in queue_names():
        get_queue(name).empty()
    return task


def row(task) -> Task:
    return Task.objects.get(pk=task.pk)


def outputs(task) -> dict:
    return {c.step_name: c.output for c in Checkpoint.objects.filter(task_id=task.pk)}


def test_a_signal_during_the_wait_wakes_the_task_and_its_payload_is_the_checkpoint():
    task = delivered(task_submit(pipeline="t_approval", input={"amount": 25}))
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    waiting = row(task)
    assert (waiting.wait_for, waiting.current_step, waiting.lease_owner) == (WaitKind.SIGNAL, 1, "")
    assert waiting.retry_at == waiting.wait_until and waiting.retry_at is not None
    assert task_representation(waiting)["waiting"] == {
        "for": "signal",
        "name": "manager_approval",
        "until": waiting.retry_at,
    }
    assert jobs_waiting() == 0
    # No signal yet: a sweep and a stray delivery leave it waiting.
    assert sweep_once().waits_ended == 0
    assert task_run(task_id=str(task.pk), worker="w2") == "skipped"

    result = task_signal(task_id=task.pk, name="manager_approval", payload=APPROVED)
    assert (result.replayed, result.woke) == (False, True)
    assert row(task).state == TaskState.QUEUED and jobs_waiting() == 1
    assert task_run(task_id=str(task.pk), worker="w2") == TaskState.SUCCEEDED
    assert outputs(task)["manager_approval"] == APPROVED
    assert row(task).result == {"paid": True, "decision": APPROVED}
    assert row(task).wait_until is None


def test_a_signal_sent_before_the_wait_is_kept_and_consumed_when_the_task_gets_there():
    task = delivered(task_submit(pipeline="t_approval", input={}))
    result = task_signal(task_id=task.pk, name="manager_approval", payload={"approved": False, "reason": "no"})
    assert (result.replayed, result.woke) == (False, False)
    assert row(task).state == TaskState.QUEUED
    # The task never waits: its wait finds the signal.
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    assert row(task).result["paid"] is False  # rejected: the pipeline decides
    assert row(task).total_attempts == 3


def test_a_signal_that_comes_while_the_task_decides_to_wait_still_wakes_it(monkeypatch):
    """The signal commits after the wait's attempt looked for it and before the task's wait is written: the wait
    finds it under the row's lock and delivers the task again at once."""
    task = delivered(task_submit(pipeline="t_approval", input={}))
    real = waits.task_save_guarded

    def signal_first(task_row, fields):
        sender = threading.Thread(target=_send_in_own_connection, args=(task_row.pk,))
        sender.start()
        sender.join(timeout=10)
        real(task_row, fields)

    monkeypatch.setattr(waits, "task_save_guarded", signal_first)
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.QUEUED
    assert jobs_waiting() == 1
    monkeypatch.undo()
    assert task_run(task_id=str(task.pk), worker="w2") == TaskState.SUCCEEDED
    assert outputs(task)["manager_approval"] == APPROVED


def _send_in_own_connection(task_id) -> None:
    try:
        task_signal(task_id=task_id, name="manager_approval", payload=APPROVED)
    finally:
        connection.close()


def test_the_same_signal_again_is_the_first_and_another_payload_is_refused():
    task = delivered(task_submit(pipeline="t_approval", input={}))
    first = task_signal(task_id=task.pk, name="manager_approval", payload=APPROVED, idempotency_key="k-1")
    again = task_signal(task_id=task.pk, name="manager_approval", payload=dict(APPROVED), idempotency_key="k-1")
    assert again.replayed and again.signal.pk == first.signal.pk
    with pytest.raises(SignalAlreadyReceived):
        task_signal(task_id=task.pk, name="manager_approval", payload={"approved": False})
    assert Signal.objects.filter(task_id=task.pk).count() == 1


def test_bad_signals_are_refused_and_change_nothing():
    task = delivered(task_submit(pipeline="t_approval", input={}))
    with pytest.raises(UnknownSignal):
        task_signal(task_id=task.pk, name="not_declared", payload=None)
    with pytest.raises(UnknownSignal):
        task_signal(task_id=task.pk, name="draft_refund", payload=None)  # a step, not a wait
    with pytest.raises(InvalidTaskInput, match="at most 65536 bytes"):
        task_signal(task_id=task.pk, name="manager_approval", payload={"text": "x" * 70000})
    with pytest.raises(InvalidTaskInput):
        task_signal(task_id=task.pk, name="manager_approval", payload={"when": object()})
    with pytest.raises(TaskNotActionable):
        task_signal(task_id="not-a-uuid", name="manager_approval", payload=None)
    assert not Signal.objects.exists()
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING


def test_a_finished_task_refuses_a_signal():
    task = delivered(task_submit(pipeline="t_approval", input={}))
    task_signal(task_id=task.pk, name="manager_approval", payload=APPROVED)
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    # The same signal is still the same answer; a new one meets a finished task.
    assert task_signal(task_id=task.pk, name="manager_approval", payload=APPROVED).replayed
    other = delivered(task_submit(pipeline="t_approval", input={}))
    from tasks.lifecycle.cancellation import task_cancel

    task_cancel(task_id=other.pk, actor="operator:test")
    with pytest.raises(TaskFinished):
        task_signal(task_id=other.pk, name="manager_approval", payload=APPROVED)


def test_another_signal_with_a_used_key_is_refused():
    pipeline = Pipeline("t_two_waits", register=True, failure_policy="park")
    pipeline.wait("first", timeout=30)
    pipeline.wait("second", timeout=30)
    task = delivered(task_submit(pipeline="t_two_waits", input={}))
    task_signal(task_id=task.pk, name="first", payload=1, idempotency_key="same")
    with pytest.raises(IdempotencyKeyReused):
        task_signal(task_id=task.pk, name="second", payload=2, idempotency_key="same")


def test_no_signal_within_the_timeout_fails_the_step_and_the_policy_compensates():
    task = delivered(task_submit(pipeline="t_approval_short", input={}))
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    wait_for(lambda: sweep_once().waits_ended == 1, timeout=10, message="a sweep to wake the task at its timeout")
    state = task_run(task_id=str(task.pk), worker="w2")
    assert state in (TaskState.COMPENSATED, TaskState.COMPENSATING)
    failed = row(task)
    assert (failed.failure_code, failed.failed_step) == ("signal_timeout", "manager_approval")
    # A signal now is too late: the task is finished (or undoing its failure, which no signal changes).
    if failed.state == TaskState.COMPENSATED:
        with pytest.raises(TaskFinished):
            task_signal(task_id=task.pk, name="manager_approval", payload=APPROVED)


def test_a_waiting_task_is_cancelled_at_once():
    task = delivered(task_submit(pipeline="t_approval", input={}))
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    from tasks.lifecycle.cancellation import task_cancel

    task_cancel(task_id=task.pk, actor="operator:test")
    assert row(task).state == TaskState.CANCELLED


@pytest.mark.parametrize(
    ("timeout", "message"),
    [(0, "positive"), (-5, "positive"), (timedelta(0), "positive"), ("1h", "positive"), (True, "positive")],
)
def test_a_wait_declared_wrong_is_refused(timeout, message):
    pipeline = Pipeline("t_wait_wrong", register=False)
    with pytest.raises(ConfigurationError, match=message):
        pipeline.wait("approval", timeout=timeout)


# --- the API ---------------------------------------------------------------------------------------------------


def post_signal(client, token, task_id, name, body, **headers):
    return client.generic(
        "POST",
        f"/api/v1/tasks/{task_id}/signals/{name}",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        **headers,
    )


def submit(client, token) -> str:
    response = client.generic(
        "POST",
        "/api/v1/tasks",
        json.dumps({"pipeline": "t_approval", "input": {}}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_the_api_stores_a_signal_and_answers_a_repeat_with_the_first_answer(client, token):
    task_id = submit(client, token)
    delivered(None)
    assert task_run(task_id=task_id, worker="w1") == TaskState.WAITING
    waiting = client.get(f"/api/v1/tasks/{task_id}", HTTP_AUTHORIZATION=f"Bearer {token}").json()["waiting"]
    assert (waiting["for"], waiting["name"]) == ("signal", "manager_approval")

    first = post_signal(client, token, task_id, "manager_approval", {"payload": APPROVED}, HTTP_IDEMPOTENCY_KEY="a")
    assert first.status_code == 202, first.content
    assert first.json()["name"] == "manager_approval" and first.json()["task_id"] == task_id
    assert Task.objects.get(pk=task_id).state == TaskState.QUEUED
    again = post_signal(client, token, task_id, "manager_approval", {"payload": APPROVED}, HTTP_IDEMPOTENCY_KEY="a")
    assert (again.status_code, again.content) == (202, first.content)


@pytest.mark.parametrize(
    ("name", "body", "status", "code"),
    [
        ("manager_approval", {"payload": {"approved": False}}, 409, "signal_already_received"),
        ("nobody_waits_for_this", {"payload": 1}, 422, "unknown_signal"),
        ("manager_approval", {"payload": "x" * 70000}, 400, "validation_error"),
        ("manager_approval", {"payload": 1, "extra": 2}, 400, "validation_error"),
    ],
)
def test_the_api_refuses_bad_signals_with_their_codes(client, token, name, body, status, code):
    task_id = submit(client, token)
    assert post_signal(client, token, task_id, "manager_approval", {"payload": APPROVED}).status_code == 202
    before = list(Signal.objects.values_list("name", "payload"))
    response = post_signal(client, token, task_id, name, body)
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code
    assert list(Signal.objects.values_list("name", "payload")) == before


def test_the_api_answers_task_finished_and_404_for_another_clients_task(client, token):
    task_id = submit(client, token)
    from tasks.lifecycle.cancellation import task_cancel
    from tasks.lifecycle.clients import api_client_create

    task_cancel(task_id=task_id, actor="operator:test")
    response = post_signal(client, token, task_id, "manager_approval", {"payload": APPROVED})
    assert (response.status_code, response.json()["error"]["code"]) == (409, "task_finished")
    other = api_client_create(name="client-b")[1]
    live = submit(client, token)
    response = post_signal(client, other, live, "manager_approval", {"payload": APPROVED})
    assert response.status_code == 404
    assert not Signal.objects.filter(task_id=live).exists()


def test_an_operators_retry_of_a_timed_out_wait_waits_its_whole_timeout_again():
    from tasks.lifecycle.operator import task_retry_from_checkpoint

    task = delivered(task_submit(pipeline="t_approval", input={}))
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    # Its timeout came (forged: the wait's end moved into the past), the sweeper woke it, the step failed: parked.
    from tasks.models.door import door_forced

    with door_forced():
        Task.objects.filter(pk=task.pk).update(retry_at=row(task).created_at, wait_until=row(task).created_at)
    assert sweep_once().waits_ended == 1
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.FAILED
    assert row(task).failure_code == "signal_timeout"
    task_retry_from_checkpoint(task_id=task.pk)
    delivered(None)
    assert task_run(task_id=str(task.pk), worker="w2") == TaskState.WAITING
    assert row(task).wait_until > row(task).created_at + timedelta(seconds=20)
