"""Cancel, pause and per-pipeline limits (issue #14): the engine's services against real PostgreSQL and Redis.

Driven in-process (``task_run`` on this thread, no SIGALRM): the claim, the
step boundaries, the holds and their releases, as the workers run them. The
acceptance tests run the same with worker processes.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks.delivery.enqueue import get_queue, job_id
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import PipelineControlRefused, TaskNotActionable, TaskNotCancellable
from tasks.execution import gates
from tasks.execution.runner import task_run
from tasks.lifecycle import holds
from tasks.lifecycle.cancellation import cancel_requested, task_cancel
from tasks.lifecycle.claims import task_claim
from tasks.lifecycle.controls import (
    pipeline_limits_reset,
    pipeline_limits_set,
    pipeline_pause,
    pipeline_resume,
)
from tasks.lifecycle.operator import task_compensate, task_retry_from_checkpoint
from tasks.models import (
    AttemptKind,
    AttemptOutcome,
    Checkpoint,
    DeadLetter,
    FailureReason,
    PipelineControl,
    StepAttempt,
    Task,
    TaskHold,
    TaskState,
)
from tasks.models.door import door_forced
from tasks.selectors import pipeline_states
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def _reload(task) -> Task:
    return Task.objects.get(pk=task.pk)


def _compensated(task) -> list[str]:
    return list(
        StepAttempt.objects.filter(task=task, kind=AttemptKind.COMPENSATION, outcome=AttemptOutcome.SUCCEEDED)
        .order_by("id")
        .values_list("step_name", flat=True)
    )


def _steps_started(task) -> list[str]:
    return list(
        StepAttempt.objects.filter(task=task, kind=AttemptKind.STEP).order_by("id").values_list("step_name", flat=True)
    )


def _queued_job_ids() -> set[str]:
    queue = get_queue("default")
    return set(queue.get_job_ids())


# --- cancel ---------------------------------------------------------------------------


def test_a_queued_task_is_cancelled_at_once_and_its_job_finds_nothing_to_do():
    seen = []

    def receiver(**kw):
        seen.append((kw["actor"], kw["state_before"]))

    cancel_requested.connect(receiver)
    try:
        task = task_submit(pipeline="t_cancellable", input={})
        result = task_cancel(task_id=task.pk, actor="client:billing", reason="customer asked")
    finally:
        # Only this test's receiver: the console's audit receiver stays connected for the tests after it.
        cancel_requested.disconnect(receiver)
    task = _reload(task)
    assert result.requested_now
    assert task.state == TaskState.CANCELLED
    assert task.failure_reason == FailureReason.CANCELLED
    assert task.failure_message == "cancelled by client:billing: customer asked"
    assert task.finished_at is not None and task.total_attempts == 0
    assert seen == [("client:billing", "queued")]
    # The job submitted with it is still in Redis: when it runs, the claim finds nothing.
    assert task_run(task_id=str(task.pk), worker="w1") == "skipped"
    assert _steps_started(task) == []
    assert not DeadLetter.objects.filter(task=task).exists()


def test_cancelling_twice_is_one_cancel():
    task = task_submit(pipeline="t_cancellable", input={})
    first = task_cancel(task_id=task.pk, actor="client:a", reason="once")
    again = task_cancel(task_id=task.pk, actor="client:b", reason="twice")
    assert first.requested_now and not again.requested_now
    task = _reload(task)
    assert task.cancel_requested_by == "client:a" and task.cancel_reason == "once"


def test_a_finished_task_is_not_cancellable_and_nothing_changes():
    task = task_submit(pipeline="t_cancellable", input={})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    with pytest.raises(TaskNotCancellable) as raised:
        task_cancel(task_id=task.pk, actor="client:a")
    assert raised.value.state == TaskState.SUCCEEDED
    assert _reload(task).cancel_requested_at is None


def test_another_clients_task_is_no_such_task():
    from tasks.lifecycle.clients import api_client_create

    owner, other = api_client_create(name="owner")[0], api_client_create(name="other")[0]
    task = task_submit(pipeline="t_cancellable", input={}, client=owner)
    with pytest.raises(TaskNotActionable):
        task_cancel(task_id=task.pk, actor="client:other", client=other)
    assert _reload(task).state == TaskState.QUEUED


def test_a_running_task_stops_at_its_next_boundary_and_its_completed_steps_are_compensated_once():
    # Step two cancels its own task mid-step (a canceller arriving while it runs): step two finishes,
    # step three never starts, steps two and one are undone in reverse order.
    task = task_submit(pipeline="t_cancellable", input={"cancel_during": "c_two"})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.CANCELLED
    task = _reload(task)
    assert _steps_started(task) == ["c_one", "c_two"]
    assert _compensated(task) == ["c_two", "c_one"]
    assert task.state == TaskState.CANCELLED and task.failed_step == "c_three"
    # The attempt counted for step three was never made.
    assert task.total_attempts == 2
    assert not DeadLetter.objects.filter(task=task).exists()
    # A second delivery of the task changes nothing and compensates nothing again.
    assert task_run(task_id=str(task.pk), worker="w2") == "skipped"
    assert _compensated(task) == ["c_two", "c_one"]


def test_a_step_that_fails_after_its_task_was_cancelled_ends_the_task_cancelled_not_failed():
    task = task_submit(pipeline="t_cancellable", input={"cancel_during": "c_two", "fail_in": "c_two"})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.CANCELLED
    assert _compensated(task) == ["c_one"]
    assert not DeadLetter.objects.filter(task=task).exists()
    assert _reload(task).failure_reason == FailureReason.CANCELLED


def test_a_retry_scheduled_task_is_cancelled_at_once_and_its_completed_step_compensated():
    task = task_submit(pipeline="t_flaky_first", input={})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.RETRY_SCHEDULED
    task_cancel(task_id=task.pk, actor="operator:alice", reason="not needed")
    assert _reload(task).state == TaskState.COMPENSATING
    # The compensation is delivered as any other; here run in-process.
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.CANCELLED
    assert _compensated(task) == ["flaky_done"]
    assert _steps_started(task) == ["flaky_done", "flaky_retry"]


def test_a_pipeline_that_parks_cancels_leaves_its_steps_and_opens_a_dead_letter_an_operator_compensates():
    task = task_submit(pipeline="t_cancel_parked", input={"cancel_during": "c_two"})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.CANCELLED
    assert _compensated(task) == []
    item = DeadLetter.objects.get(task=task)
    assert item.reason_code == FailureReason.CANCELLED and item.status == "open"
    assert "on_cancel=PARK" in item.error_message
    assert _reload(task).in_dlq
    # Retrying a cancelled task is refused; compensating it undoes its steps and it stays cancelled.
    with pytest.raises(TaskNotActionable):
        task_retry_from_checkpoint(task_id=task.pk)
    task_compensate(task_id=task.pk)
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.CANCELLED
    assert _compensated(task) == ["c_two", "c_one"]
    item.refresh_from_db()
    assert item.status == "resolved" and item.resolution_code == "compensated"
    assert not _reload(task).in_dlq


def test_a_cancel_whose_compensation_cannot_finish_ends_compensation_failed_with_its_dead_letter(monkeypatch):
    task = task_submit(pipeline="t_cancellable", input={"cancel_during": "c_one"})
    import tests.pipelines as test_pipelines

    def broken(ctx):
        from tasks.exceptions import PermanentError

        raise PermanentError("refund refused", code="refund_refused")

    step = test_pipelines.cancellable.steps[0]
    monkeypatch.setattr(step, "compensate", broken)
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.COMPENSATION_FAILED
    item = DeadLetter.objects.get(task=task)
    assert item.reason_code == FailureReason.CANCELLED and item.status == "open"
    assert "refund_refused" in item.compensation_error


# --- pause ---------------------------------------------------------------------------


def test_a_paused_pipeline_holds_its_tasks_without_using_attempts_and_resume_releases_them(clean_redis):
    pipeline_pause(pipeline="t_cancellable", actor="supervisor:sam", reason="platform down")
    tasks = [task_submit(pipeline="t_cancellable", input={"n": n}) for n in range(3)]
    for task in tasks:
        assert task_run(task_id=str(task.pk), worker="w1") == "skipped"
    for task in tasks:
        task = _reload(task)
        assert (task.state, task.hold, task.step_attempt, task.total_attempts) == ("queued", "paused", 0, 0)
    # Held tasks are not lost deliveries: the sweeper leaves them alone (no job is enqueued for them).
    clean_redis.flushall()
    sweep_once()
    assert _queued_job_ids() == set()

    pipeline_resume(pipeline="t_cancellable", actor="supervisor:sam", reason="platform back")
    jobs = _queued_job_ids()
    assert {job_id(task.pk, _reload(task).fencing_token) for task in tasks} <= jobs
    for task in tasks:
        assert _reload(task).hold == ""
        assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED


def test_a_running_task_waits_at_its_step_boundary_while_its_pipeline_is_paused():
    task = task_submit(pipeline="t_cancellable", input={"pause_during": "c_one"})
    claim = task_claim(task_id=str(task.pk), owner="w1")
    # The pause lands while step one runs: step one's write reads it, and the task waits before step two.
    from tasks.execution import runner

    original = runner._run_one_attempt

    def pause_then_run(claim_, pipeline_):
        if claim_.task.current_step == 0:
            pipeline_pause(pipeline="t_cancellable", actor="supervisor:sam", reason="hold on")
        original(claim_, pipeline_)

    runner._run_one_attempt = pause_then_run
    try:
        runner._run_steps(claim)
    finally:
        runner._run_one_attempt = original
    task = _reload(task)
    assert (task.state, task.hold, task.current_step) == ("queued", "paused", 1)
    assert (task.step_attempt, task.total_attempts) == (0, 1)
    assert task.lease_owner == "" and task.lease_expires_at is None
    assert _steps_started(task) == ["c_one"]
    pipeline_resume(pipeline="t_cancellable", actor="supervisor:sam", reason="go on")
    assert task_run(task_id=str(task.pk), worker="w2") == TaskState.SUCCEEDED
    assert _steps_started(task) == ["c_one", "c_two", "c_three"]
    assert _reload(task).total_attempts == 3


def test_a_task_whose_deadline_passes_while_paused_fails_deadline_exceeded():
    pipeline_pause(pipeline="t_cancellable", actor="supervisor:sam", reason="down")
    task = task_submit(pipeline="t_cancellable", input={}, deadline=1)
    assert task_run(task_id=str(task.pk), worker="w1") == "skipped"
    assert _reload(task).hold == TaskHold.PAUSED
    with door_forced():
        Task.objects.filter(pk=task.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    sweep_once()  # releases held tasks past their deadline, paused or not
    assert _reload(task).hold == ""
    task_run(task_id=str(task.pk), worker="w1")
    task = _reload(task)
    assert task.failure_reason == FailureReason.DEADLINE_EXCEEDED
    assert _steps_started(task) == []


def test_pause_and_resume_refuse_what_makes_no_sense():
    with pytest.raises(PipelineControlRefused):
        pipeline_pause(pipeline="no_such_pipeline", actor="s", reason="r")
    with pytest.raises(PipelineControlRefused):
        pipeline_resume(pipeline="t_cancellable", actor="s", reason="r")
    with pytest.raises(PipelineControlRefused):
        pipeline_pause(pipeline="t_cancellable", actor="s", reason="  ")
    assert not PipelineControl.objects.filter(pipeline="t_cancellable", paused=True).exists()


# --- limits ---------------------------------------------------------------------------


def test_max_concurrency_holds_a_task_until_the_running_one_frees_its_slot():
    first = task_submit(pipeline="t_one_at_a_time", input={"n": 1})
    second = task_submit(pipeline="t_one_at_a_time", input={"n": 2})
    running = task_claim(task_id=str(first.pk), owner="w1")
    assert running is not None
    assert task_claim(task_id=str(second.pk), owner="w2") is None
    assert _reload(second).hold == TaskHold.CONCURRENCY
    assert _reload(second).total_attempts == 0
    # The running task ends its run: the held one is released (delivered) at once.
    from tasks.execution import runner

    runner._run_steps(running)
    assert _reload(first).state == TaskState.SUCCEEDED
    assert _reload(second).hold == ""
    assert job_id(second.pk, _reload(second).fencing_token) in _queued_job_ids()
    assert task_run(task_id=str(second.pk), worker="w2") == TaskState.SUCCEEDED


def test_a_slot_of_a_task_whose_worker_died_frees_when_the_sweeper_hands_the_task_on(settings):
    first = task_submit(pipeline="t_one_at_a_time", input={"n": 1})
    second = task_submit(pipeline="t_one_at_a_time", input={"n": 2})
    assert task_claim(task_id=str(first.pk), owner="dead-worker") is not None
    assert task_claim(task_id=str(second.pk), owner="w2") is None
    with door_forced():
        Task.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    report = sweep_once()
    assert report.requeued == 1
    assert _reload(first).state == TaskState.QUEUED
    assert _reload(second).hold == ""  # the freed slot released it


def test_a_rate_limit_holds_the_third_start_in_a_second_until_its_turn():
    tasks = [task_submit(pipeline="t_two_per_second", input={"n": n}) for n in range(2)]
    # Two tasks of two steps: the first task's two starts use both permits of this second.
    assert task_run(task_id=str(tasks[0].pk), worker="w1") == TaskState.SUCCEEDED
    assert task_claim(task_id=str(tasks[1].pk), owner="w2") is None
    held = _reload(tasks[1])
    assert held.hold == TaskHold.RATE and held.total_attempts == 0
    assert held.retry_at is not None and held.retry_at > timezone.now()


def test_a_supervisor_overrides_limits_until_reset():
    pipeline_limits_set(pipeline="t_one_at_a_time", actor="s", reason="more room", max_concurrency=3)
    states = {state.name: state for state in pipeline_states()}
    assert states["t_one_at_a_time"].gate.max_concurrency == 3
    assert states["t_one_at_a_time"].declared_max_concurrency == 1
    tasks = [task_submit(pipeline="t_one_at_a_time", input={"n": n}) for n in range(4)]
    claims = [task_claim(task_id=str(task.pk), owner=f"w{n}") for n, task in enumerate(tasks)]
    assert [claim is not None for claim in claims] == [True, True, True, False]
    pipeline_limits_reset(pipeline="t_one_at_a_time", actor="s", reason="back to normal")
    assert gates.gate_of(pipeline="t_one_at_a_time").max_concurrency == 1
    with pytest.raises(PipelineControlRefused):
        pipeline_limits_set(pipeline="t_one_at_a_time", actor="s", reason="r", rate_limit="fast")
    with pytest.raises(PipelineControlRefused):
        pipeline_limits_set(pipeline="t_one_at_a_time", actor="s", reason="r", max_concurrency=0)


def test_no_checkpoint_is_left_behind_by_a_cancel_of_a_queued_task():
    task = task_submit(pipeline="t_cancellable", input={})
    task_cancel(task_id=task.pk, actor="client:a")
    assert not Checkpoint.objects.filter(task=task).exists()


def test_a_task_held_by_its_claim_and_released_before_its_job_ends_is_delivered_again(monkeypatch):
    # A real RQ worker (in this process) runs the held task's job. The release comes while that job is still
    # running: the hold's own recheck finds the slot freed (here: the running task ends right then), as a
    # worker's release after a freed slot may. RQ deletes a job it finished; the release's delivery must outlive it.
    from tasks.delivery.enqueue import redis_client
    from tasks.delivery.worker import ReliabilityWorker
    from tasks.execution import runner

    first = task_submit(pipeline="t_one_at_a_time", input={"n": 1})
    second = task_submit(pipeline="t_one_at_a_time", input={"n": 2})
    running = task_claim(task_id=str(first.pk), owner="w1")
    get_queue("default").remove(job_id(first.pk, 0))  # the first task runs here, not in the worker
    original_recheck = holds.hold_recheck

    def slot_frees_meanwhile(**kwargs):
        from django.db import transaction

        transaction.on_commit(lambda: runner._run_steps(running))
        original_recheck(**kwargs)

    monkeypatch.setattr(holds, "hold_recheck", slot_frees_meanwhile)
    ReliabilityWorker([get_queue("default")], connection=redis_client()).work(burst=True)
    assert _reload(first).state == TaskState.SUCCEEDED
    assert _reload(second).state == TaskState.SUCCEEDED
