"""Cancel (issue #14, point 1) against real workers, the real API server and the platform simulator.

Tasks of ``t_live_cancel`` (tests/pipelines.py) run four steps that each charge
the platform, undone by a refund. The tests count what really happened on
both sides: the attempts and compensation attempts the workers recorded, and
the charges, refunds and work calls the platform saw (each call names its
step in its ``Idempotency-Key``, ``rc-<task>-g<generation>-<step>-<effect>``).
No wall-clock assertion: a waiting step "ends well before it would have" is
shown by polling for the cancel with a timeout much shorter than the wait.
"""

from __future__ import annotations

import uuid

import pytest
import requests

from dlq.models import AuditEntry
from tasks.delivery.enqueue import get_queue, job_id
from tasks.lifecycle import cancellation
from tasks.lifecycle.clients import api_client_create
from tasks.models import AttemptKind, AttemptOutcome, EffectStatus, SideEffect, StepAttempt, Task
from tests.pipelines import LIVE_CANCEL_STEPS
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

PIPELINE = "t_live_cancel"
# The slow step waits this long at the platform (or asleep); its timeout is 120 s. Every wait for the cancel
# below gives up long before, so a test that passes shows the step did not wait it out.
LONG_WAIT_MS = 60_000
CANCELLED_WITHIN_SECONDS = 15


@pytest.fixture
def clients():
    """Two API clients' tokens: the owner of the tasks, and another."""
    return api_client_create(name="owner")[1], api_client_create(name="stranger")[1]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit(server, token: str, **input_) -> str:
    body = {"pipeline": PIPELINE, "input": {"user_id": f"u-{uuid.uuid4().hex[:8]}", **input_}}
    response = requests.post(f"{server.url}/api/v1/tasks", json=body, headers=auth(token), timeout=10)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def cancel(server, token: str, task_id: str, reason: str | None = None) -> requests.Response:
    body = {"reason": reason} if reason is not None else None
    return requests.post(f"{server.url}/api/v1/tasks/{task_id}/cancel", json=body, headers=auth(token), timeout=10)


def state_of(task_id: str, *states: str, timeout: float = 60, pool=None) -> Task:
    def reached():
        task = Task.objects.get(pk=task_id)
        return task if task.state in states else None

    try:
        return wait_for(reached, timeout=timeout, message=f"task {task_id} to be {' or '.join(states)}")
    except AssertionError:
        if pool is not None:
            print(pool.logs()[-6000:])
        raise


def steps_started(task_id) -> list[str]:
    return list(
        StepAttempt.objects.filter(task_id=task_id, kind=AttemptKind.STEP)
        .order_by("started_at", "id")
        .values_list("step_name", flat=True)
    )


def compensations(task_id) -> list[tuple[str, str]]:
    return list(
        StepAttempt.objects.filter(task_id=task_id, kind=AttemptKind.COMPENSATION)
        .order_by("started_at", "id")
        .values_list("step_name", "outcome")
    )


def platform_steps(platform, task_id, kind: str) -> list[str]:
    """The steps whose ``kind`` calls (charge, refund, work) the platform acted on, in arrival order."""
    steps = []
    for call in platform.calls(task_id=str(task_id)):
        if call["kind"] == kind and call["effect"]:
            steps.append(call["idempotency_key"].removeprefix(f"rc-{task_id}-g0-").rsplit("-", 1)[0])
    return steps


def steps_called(platform, task_id) -> set[str]:
    """Every step any call of the task named, effect or not."""
    return {
        call["idempotency_key"].removeprefix(f"rc-{task_id}-g0-").rsplit("-", 1)[0]
        for call in platform.calls(task_id=str(task_id))
    }


def cancel_audit(task_id) -> list[tuple[str, str, str, str, str]]:
    """The audit log's entries for the task (the console's receiver of ``cancel_requested`` writes them)."""
    return list(
        AuditEntry.objects.filter(task_id=task_id).values_list("action", "actor", "state_before", "reason", "outcome")
    )


def assert_all_refunded(platform, task_id) -> None:
    charges = [charge for charge in platform.state()["charges"].values() if charge["task_id"] == str(task_id)]
    assert charges and all(charge["refunded"] for charge in charges), charges


def test_a_queued_task_is_cancelled_at_once_its_job_does_nothing_and_a_finished_one_is_not_cancellable(
    start_api_server, start_workers, platform, clients
):
    owner, stranger = clients
    server = start_api_server()
    task_id = submit(server, owner)
    delivery = job_id(task_id, Task.objects.get(pk=task_id).fencing_token)

    # Another client's task does not exist for it, and stays as it was.
    refused = cancel(server, stranger, task_id, reason="not mine")
    assert (refused.status_code, refused.json()["error"]["code"]) == (404, "not_found")
    assert Task.objects.get(pk=task_id).cancel_requested_at is None

    first = cancel(server, owner, task_id, reason="customer asked")
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["state"] == "cancelled" and body["cancel"]["reason"] == "customer asked"
    # A repeat is the same cancel: the same answer, nothing rewritten (the first reason stays).
    again = cancel(server, owner, task_id, reason="asked twice")
    assert again.status_code == 200 and again.json()["cancel"] == body["cancel"]
    task = Task.objects.get(pk=task_id)
    assert (task.state, task.failure_reason, task.cancel_requested_by) == ("cancelled", "cancelled", "client:owner")
    assert task.failure_message == "cancelled by client:owner: customer asked"
    # One cancel, one audit entry, written by the API server's process in the cancel's transaction.
    assert cancel_audit(task_id) == [("task_cancelled", "client:owner", "queued", "customer asked", "succeeded")]

    # Its job is still in Redis: a real worker takes it (and drops it: no result is kept), finding nothing to do.
    assert delivery in get_queue().get_job_ids()
    pool = start_workers(1)
    wait_for(lambda: get_queue().fetch_job(delivery) is None, timeout=60, message="the cancelled task's job to run")
    skipped = [line for line in pool.workers[0].output().splitlines() if "event=delivery_skipped" in line]
    assert [line for line in skipped if f"task_id={task_id}" in line and "pipeline=" in line], skipped
    assert steps_started(task_id) == [] and compensations(task_id) == []
    assert platform.calls(task_id=task_id) == []

    # A finished task answers 409 with its state, and keeps it.
    done_id = submit(server, owner)
    state_of(done_id, "succeeded", pool=pool)
    finished = cancel(server, owner, done_id)
    assert finished.status_code == 409
    error = finished.json()["error"]
    assert (error["code"], error["details"]["state"]) == ("task_not_cancellable", "succeeded")
    assert Task.objects.get(pk=done_id).state == "succeeded"
    assert cancel(server, stranger, done_id).status_code == 404


def test_a_retry_scheduled_task_is_cancelled_at_once_and_its_completed_step_compensated_once(
    start_api_server, start_workers, platform, clients
):
    owner, _ = clients
    server = start_api_server()
    task_id = submit(server, owner, work_ms={"lc_two": 10})
    # Step two's work is refused with a 429 asking for a minute: its retry is scheduled far ahead.
    platform.set_faults(rules=[{"path_prefix": "/v1/work", "task_id": task_id, "status": 429, "retry_after": 60}])
    pool = start_workers(2)
    waiting = state_of(task_id, "retry_scheduled", pool=pool)
    assert (waiting.current_step, steps_started(task_id)) == (1, ["lc_one", "lc_two"])

    response = cancel(server, owner, task_id, reason="no longer needed")
    # Step one is being undone: the cancel is under way (202), then the task ends cancelled.
    assert response.status_code == 202 and response.json()["state"] == "compensating", response.text
    task = state_of(task_id, "cancelled", timeout=30, pool=pool)
    assert task.failure_reason == "cancelled" and not task.in_dlq
    assert compensations(task_id) == [("lc_one", AttemptOutcome.SUCCEEDED)]
    assert platform_steps(platform, task_id, "refund") == ["lc_one"]
    assert_all_refunded(platform, task_id)
    # The retry never came: step two was tried once (its work refused, nothing charged), no later step began.
    assert steps_started(task_id) == ["lc_one", "lc_two"]
    assert platform_steps(platform, task_id, "charge") == ["lc_one"]
    assert steps_called(platform, task_id) == {"lc_one", "lc_two"}
    assert cancel_audit(task_id) == [
        ("task_cancelled", "client:owner", "retry_scheduled", "no longer needed", "succeeded")
    ]


def _cancelled_while_waiting(platform, task_id, pool) -> Task:
    """Checks common to a cancel that interrupted step two while it waited: what ran, what was undone."""
    task = state_of(task_id, "cancelled", timeout=CANCELLED_WITHIN_SECONDS, pool=pool)
    assert (task.failure_reason, task.failed_step) == ("cancelled", "lc_two")
    attempts = list(
        StepAttempt.objects.filter(task_id=task_id, kind=AttemptKind.STEP)
        .order_by("started_at", "id")
        .values_list("step_name", "outcome")
    )
    assert attempts == [("lc_one", AttemptOutcome.SUCCEEDED), ("lc_two", AttemptOutcome.CANCELLED)]
    # Its effect was uncertain, so step two is undone too, then step one: each once, in reverse order.
    assert compensations(task_id) == [("lc_two", AttemptOutcome.SUCCEEDED), ("lc_one", AttemptOutcome.SUCCEEDED)]
    assert platform_steps(platform, task_id, "refund") == ["lc_two", "lc_one"]
    assert_all_refunded(platform, task_id)
    assert not steps_called(platform, task_id) & {"lc_three", "lc_four"}
    assert set(LIVE_CANCEL_STEPS) - set(steps_started(task_id)) == {"lc_three", "lc_four"}
    assert not task.in_dlq
    # The worker's line of the interrupt (written on the thread that saw the cancel) names the attempt it stopped.
    output = "".join(worker.output() for worker in pool.workers)
    interrupted = [line for line in output.splitlines() if "event=attempt_interrupted" in line and task_id in line]
    assert interrupted and all(
        f"pipeline={PIPELINE} " in line and "step=lc_two step_index=1 " in line for line in interrupted
    ), interrupted
    return task


def test_a_running_task_waiting_at_the_platform_is_interrupted_by_the_cancel_command_and_compensated(
    start_api_server, start_workers, platform, clients
):
    # A 90 s lease: the heartbeat (every 30 s) cannot be what stops the step within CANCELLED_WITHIN_SECONDS;
    # only the "cancel-task" command the API server publishes to the lease holder can.
    owner, _ = clients
    server = start_api_server(RELIABILITY_LEASE_SECONDS=90)
    pool = start_workers(2, RELIABILITY_LEASE_SECONDS=90)
    task_id = submit(server, owner, work_ms={"lc_two": LONG_WAIT_MS})

    def waiting_at_the_platform():
        work = [w for w in platform.state()["work"] if w["task_id"] == task_id and w["finished_ms"] is None]
        return work and Task.objects.filter(pk=task_id, state="running", current_step=1).exists()

    wait_for(waiting_at_the_platform, timeout=60, message="step two to wait at the platform")
    response = cancel(server, owner, task_id, reason="stop now")
    assert response.status_code == 202 and response.json()["state"] == "running", response.text

    task = _cancelled_while_waiting(platform, task_id, pool)
    assert task.cancel_requested_by == "client:owner"
    # The interrupted work call is in the ledger as uncertain, undone with its step.
    effects = dict(SideEffect.objects.filter(task_id=task_id, step_name="lc_two").values_list("effect_name", "status"))
    assert effects.get("work") == EffectStatus.COMPENSATED
    again = cancel(server, owner, task_id, reason="again")
    assert again.status_code == 200 and again.json()["cancel"]["reason"] == "stop now"
    assert cancel_audit(task_id) == [("task_cancelled", "client:owner", "running", "stop now", "succeeded")]


def test_a_sleeping_step_is_interrupted_by_the_heartbeat_when_the_cancel_command_is_lost(
    start_workers, platform, monkeypatch
):
    # The canceller (this process) tells no worker: the worker's heartbeat (a third of the 3 s lease) must see
    # the request on the task's row and stop the step, asleep for a minute.
    from tasks.submission.submit import task_submit

    monkeypatch.setattr(cancellation, "_tell_lease_holder", lambda **_: None)
    pool = start_workers(1)
    task = task_submit(pipeline=PIPELINE, input={"user_id": "u-sleeper", "sleep_s": {"lc_two": LONG_WAIT_MS / 1000}})
    task_id = str(task.pk)
    wait_for(
        lambda: Task.objects.filter(pk=task_id, state="running", current_step=1).exists(),
        timeout=60,
        message="step two to be asleep",
    )
    result = cancellation.task_cancel(task_id=task_id, actor="operator:olga", reason="wrong customer")
    assert result.requested_now and result.state_before == "running"
    task = _cancelled_while_waiting(platform, task_id, pool)
    assert task.failure_message == "cancelled by operator:olga: wrong customer"
    assert cancel_audit(task_id) == [("task_cancelled", "olga", "running", "wrong customer", "succeeded")]
