"""The engine's services against real PostgreSQL and Redis, driven in-process."""

from __future__ import annotations

import json
import threading
import uuid
import zlib
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import ProgrammingError, connection
from django.utils import timezone

from dlq.models import DLQItem
from tasks import registry
from tasks.delivery import sweeper
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import (
    IdempotencyKeyReused,
    InvalidTaskInput,
    LeaseLost,
    PipelineControlRefused,
    TaskNotActionable,
    UnknownPipeline,
)
from tasks.execution.attempts import AttemptRecord
from tasks.execution.runner import task_run
from tasks.lifecycle.claims import task_claim
from tasks.lifecycle.controls import pipeline_limits_reset, pipeline_pause, pipeline_resume
from tasks.lifecycle.operator import task_close, task_compensate, task_retry_from_checkpoint, task_retry_from_start
from tasks.lifecycle.outcomes import step_succeeded
from tasks.models import (
    AttemptKind,
    AttemptOutcome,
    Checkpoint,
    DLQStatus,
    EffectStatus,
    ResolutionCode,
    SideEffect,
    StepAttempt,
    Task,
)
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def test_same_key_and_input_returns_the_same_task():
    first = task_submit(pipeline="t_local", input={"n": 1}, idempotency_key="order-1")
    again = task_submit(pipeline="t_local", input={"n": 1}, idempotency_key="order-1")
    assert again.pk == first.pk
    assert Task.objects.count() == 1


def test_same_key_with_other_input_is_refused_and_creates_nothing():
    first = task_submit(pipeline="t_local", input={"n": 1}, idempotency_key="order-2")
    with pytest.raises(IdempotencyKeyReused) as raised:
        task_submit(pipeline="t_local", input={"n": 2}, idempotency_key="order-2")
    assert raised.value.details["task_id"] == str(first.pk)
    assert Task.objects.count() == 1
    assert Task.objects.get().input == {"n": 1}


def test_distinct_keys_make_distinct_tasks():
    a = task_submit(pipeline="t_local", input={"n": 1}, idempotency_key="k-a")
    b = task_submit(pipeline="t_local", input={"n": 1}, idempotency_key="k-b")
    assert a.pk != b.pk


@pytest.mark.parametrize(
    ("pipeline", "data", "error"),
    [
        ("report", {"user_id": "u1"}, InvalidTaskInput),
        ("report", {"user_id": "u1", "topic": "x", "extra": 1}, InvalidTaskInput),
        ("report", ["not", "an", "object"], InvalidTaskInput),
        ("nope", {}, UnknownPipeline),
    ],
)
def test_invalid_submissions_store_nothing(pipeline, data, error):
    with pytest.raises(error):
        task_submit(pipeline=pipeline, input=data)
    assert Task.objects.count() == 0


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "ключ"])
def test_bad_idempotency_keys_are_refused(key):
    with pytest.raises(InvalidTaskInput):
        task_submit(pipeline="t_local", input={}, idempotency_key=key)
    assert Task.objects.count() == 0


def test_submission_puts_a_job_in_redis(clean_redis):
    import django_rq

    task = task_submit(pipeline="t_local", input={})
    queue = django_rq.get_queue("default")
    assert queue.job_ids == [f"task-{task.pk}-d0"]
    # The job payload in Redis is JSON, never a pickle.
    raw = zlib.decompress(queue.connection.hget(f"rq:job:task-{task.pk}-d0", "data"))
    assert json.loads(raw)[0] == "tasks.delivery.jobs.run_task"


def test_success_checkpoints_each_step_and_finishes():
    task = task_submit(pipeline="t_local", input={})
    assert task_run(task_id=str(task.pk), worker="w1") == "succeeded"
    task.refresh_from_db()
    assert task.state == "succeeded" and task.result == {"b": 2}
    assert list(Checkpoint.objects.filter(task=task).values_list("step_index", flat=True)) == [0, 1]
    assert SideEffect.objects.get(task=task).status == EffectStatus.DONE
    # A second delivery of a finished task does nothing.
    assert task_run(task_id=str(task.pk), worker="w2") == "skipped"
    assert StepAttempt.objects.filter(task=task).count() == 2


def test_permanent_failure_compensates_and_opens_one_dlq_item():
    task = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    assert task_run(task_id=str(task.pk), worker="w1") == "compensated"
    task.refresh_from_db()
    assert (task.failure_reason, task.failure_code, task.failed_step) == ("permanent_error", "refused", "local_b")
    item = DLQItem.objects.get(task=task)
    assert item.status == DLQStatus.COMPENSATED and item.reason_code == "permanent_error"
    assert "refused" in item.reason
    assert SideEffect.objects.get(task=task).status == EffectStatus.COMPENSATED


def test_transient_failure_schedules_a_retry():
    task = task_submit(pipeline="t_local", input={"fail_b": "transient"})
    assert task_run(task_id=str(task.pk), worker="w1") == "retry_scheduled"
    task.refresh_from_db()
    assert task.retry_at is not None and task.current_step == 1
    attempt = StepAttempt.objects.get(task=task, step_name="local_b")
    assert attempt.outcome == AttemptOutcome.TRANSIENT_ERROR and 0 <= attempt.retry_delay_seconds <= 0.02


def test_failing_compensation_ends_in_compensation_failed_and_is_not_repeated_once_done():
    task = task_submit(pipeline="t_local", input={"fail_b": "permanent", "fail_compensation": True})
    assert task_run(task_id=str(task.pk), worker="w1") == "compensation_failed"
    item = DLQItem.objects.get(task=task)
    assert item.status == DLQStatus.OPEN and "compensation" in item.compensation_error
    comp_attempts = StepAttempt.objects.filter(task=task, kind=AttemptKind.COMPENSATION)
    assert comp_attempts.count() == 5  # the compensation retry policy's budget

    with door_forced():
        Task.objects.filter(pk=task.pk).update(input={"fail_b": "permanent"})  # the operator fixed the cause
    task_compensate(task_id=task.pk)
    assert task_run(task_id=str(task.pk), worker="w1") == "compensated"
    assert comp_attempts.filter(outcome=AttemptOutcome.SUCCEEDED).count() == 1
    # Retrying again finds the compensation recorded: it does not run twice.
    with door_forced():
        Task.objects.filter(pk=task.pk).update(input={"fail_b": "permanent", "fail_compensation": True})
    assert DLQItem.objects.filter(task=task).count() == 1


def test_two_claims_for_one_delivery_one_wins():
    task = task_submit(pipeline="t_local", input={})
    first = task_claim(task_id=str(task.pk), owner="a")
    second = task_claim(task_id=str(task.pk), owner="b")
    assert first is not None and second is None


def test_a_zombie_cannot_checkpoint_or_change_state():
    task = task_submit(pipeline="t_local", input={})
    zombie = task_claim(task_id=str(task.pk), owner="zombie")
    # The zombie stalls past its lease; the sweeper re-queues and another worker claims.
    with door_forced():
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep_once().requeued == 1
    successor = task_claim(task_id=str(task.pk), owner="successor")
    assert successor is not None and successor.token > zombie.token

    record = AttemptRecord(
        kind=AttemptKind.STEP,
        step_index=0,
        step_name="local_a",
        attempt=1,
        worker="zombie",
        started_at=timezone.now(),
        finished_at=timezone.now(),
        outcome=AttemptOutcome.SUCCEEDED,
    )
    with pytest.raises(LeaseLost):
        step_succeeded(claim=zombie, record=record, output={"late": True}, used_keys={}, is_last=False)
    assert not Checkpoint.objects.filter(task=task).exists()
    with pytest.raises(LeaseLost):
        step_succeeded(claim=zombie, record=record, output={"late": True}, used_keys={}, is_last=True)
    task.refresh_from_db()
    assert task.state == "running" and task.lease_owner == "successor" and task.current_step == 0
    # The crash was counted and recorded.
    assert task.crash_count == 1
    assert StepAttempt.objects.filter(task=task, outcome=AttemptOutcome.CRASHED).count() == 1


def test_expired_leases_past_the_bound_end_as_crash_loop(settings):
    settings.RELIABILITY_MAX_CRASHES = 2
    task = task_submit(pipeline="t_local", input={})
    for _ in range(2):
        assert task_claim(task_id=str(task.pk), owner="doomed") is not None
        with door_forced():
            Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        sweep_once()
    task.refresh_from_db()
    assert (task.state, task.failure_reason) == ("compensating", "crash_loop")
    assert DLQItem.objects.get(task=task).reason_code == "crash_loop"


def test_due_retries_are_started_by_the_sweeper_without_a_scheduler():
    task = task_submit(pipeline="t_local", input={"fail_b": "transient"})
    task_run(task_id=str(task.pk), worker="w1")
    with door_forced():
        Task.objects.filter(pk=task.pk).update(retry_at=timezone.now() - timedelta(seconds=5))
    assert sweep_once().retries_started == 1
    task.refresh_from_db()
    assert task.state == "queued"


def test_deadline_passed_before_start_fails_without_an_attempt():
    task = task_submit(pipeline="t_local", input={}, deadline=0.001)
    with door_forced():
        Task.objects.filter(pk=task.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    assert task_run(task_id=str(task.pk), worker="w1") == "compensated"
    task.refresh_from_db()
    assert task.failure_reason == "deadline_exceeded"
    assert not StepAttempt.objects.filter(task=task, kind=AttemptKind.STEP).exists()


def test_the_sweeper_purges_expired_idempotency_records():
    from tasks.models import IdempotencyRecord

    task_submit(pipeline="t_local", input={}, idempotency_key="old")
    task_submit(pipeline="t_local", input={}, idempotency_key="fresh")
    IdempotencyRecord.objects.filter(key="old").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep_once().idempotency_records_purged == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["fresh"]
    # After expiry the key may be used again: a new task.
    assert task_submit(pipeline="t_local", input={"n": 2}, idempotency_key="old").input == {"n": 2}


def _lose_leases(task, times: int, owner: str = "doomed") -> list:
    """Claim ``task`` and let its lease expire ``times`` times, sweeping after each; the sweep reports."""
    reports = []
    for _ in range(times):
        assert task_claim(task_id=str(task.pk), owner=owner) is not None
        with door_forced():
            Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        reports.append(sweep_once())
    return reports


def test_a_crash_loop_of_a_parked_pipeline_fails_through_the_runners_path(settings):
    settings.RELIABILITY_MAX_CRASHES = 2
    task = task_submit(pipeline="t_parked", input={})
    reports = _lose_leases(task, 2)
    assert (reports[0].requeued, reports[1].crash_loops) == (1, 1)
    task.refresh_from_db()
    assert (task.state, task.failure_reason, task.failure_code, task.failed_step) == (
        "failed",
        "crash_loop",
        "crash_loop",
        "parked_charge",
    )
    assert task.in_dlq and task.lease_owner == "" and task.crash_count == 2
    item = DLQItem.objects.get(task=task)
    assert (item.status, item.reason_code, item.failing_step) == (DLQStatus.OPEN, "crash_loop", "parked_charge")
    assert "Workers died 2 times" in item.reason
    crashed = StepAttempt.objects.filter(task=task, outcome=AttemptOutcome.CRASHED)
    assert list(crashed.values_list("error_code", "step_name")) == [("lease_expired", "parked_charge")] * 2


def test_a_compensation_whose_workers_keep_dying_ends_like_a_failed_compensation(settings):
    settings.RELIABILITY_MAX_CRASHES = 2
    task = task_submit(pipeline="t_parked", input={"fail": True})
    assert task_run(task_id=str(task.pk), worker="w1") == "failed"
    task_compensate(task_id=task.pk)
    reports = _lose_leases(task, 2)
    assert (reports[0].requeued, reports[1].compensation_crash_loops) == (1, 1)
    task.refresh_from_db()
    assert (task.state, task.failure_reason, task.failure_code) == (
        "compensation_failed",
        "compensation_failed",
        "crash_loop",
    )
    item = DLQItem.objects.get(task=task)
    assert item.status == DLQStatus.OPEN and "lost 2 times" in item.compensation_error
    assert task.in_dlq and task.finished_at is not None


def test_the_console_adds_its_chores_to_the_engines_sweeps():
    report = sweep_once()
    # Every sweep: the console's bulk re-delivery and retention; alert evaluation runs from the loop on its interval.
    assert list(report.chores) == ["bulk_redelivered", "dlq_items_purged"]
    assert {"bulk_redelivered", "dlq_items_purged"} <= set(report.as_log())
    assert registry._CHORES["alerts_evaluated"].interval == settings.RELIABILITY_ALERT_INTERVAL_SECONDS


def test_the_sweeper_loop_runs_an_interval_chore_when_it_is_due(monkeypatch):
    runs = []
    monkeypatch.setitem(registry._CHORES, "t_counted", registry.Chore("t_counted", lambda: runs.append(1) or 1, 0.05))
    stop = threading.Event()

    def loop():
        try:
            sweeper.sweeper_loop(interval=0.02, stop=stop)
        finally:
            connection.close()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        wait_for(lambda: len(runs) >= 3, timeout=10, message="the chore to run three times")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert "t_counted" not in sweep_once().chores  # interval chores never run in a plain sweep


@pytest.fixture
def checkpoint_write_fails_once():
    """The next checkpoint is refused once with a ProgrammingError (counted by a sequence: never rolled back)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE SEQUENCE test_refusals;
            CREATE FUNCTION test_refuse_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('test_refusals') = 1 THEN
                    RAISE EXCEPTION 'permission denied for table tasks_checkpoint' USING ERRCODE = '42501';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse_checkpoint BEFORE INSERT ON tasks_checkpoint
                FOR EACH ROW EXECUTE FUNCTION test_refuse_checkpoint();
            """
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER test_refuse_checkpoint ON tasks_checkpoint; DROP FUNCTION test_refuse_checkpoint();"
            "DROP SEQUENCE test_refusals;"
        )


@pytest.mark.parametrize("write_path", ["prepared", "plain"])
def test_a_failed_checkpoint_write_is_not_the_steps_failure_and_the_lease_resumes_it(
    write_path, checkpoint_write_fails_once, settings
):
    # The step's effect happened at the far side; only the engine's own write failed.
    settings.DATABASE_POOLER = "transaction" if write_path == "plain" else "none"
    task = task_submit(pipeline="t_local", input={})

    with pytest.raises(ProgrammingError, match="permission denied"):
        task_run(task_id=str(task.pk), worker="w1")

    task.refresh_from_db()
    assert (task.state, task.current_step, task.lease_owner) == ("running", 0, "w1")
    assert not StepAttempt.objects.filter(task=task).exists()  # no failed attempt recorded: not a step failure
    assert not DLQItem.objects.filter(task=task).exists()
    # The lease runs out, the sweeper re-queues, the step runs again with the same key and the task finishes.
    with door_forced():
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep_once().requeued == 1
    assert task_run(task_id=str(task.pk), worker="w2") == "succeeded"
    task.refresh_from_db()
    assert not StepAttempt.objects.filter(task=task, kind=AttemptKind.COMPENSATION).exists()
    assert Checkpoint.objects.get(task=task, step_index=0).output == {"a": f"rc-{task.pk}-g0-local_a-a"}


def test_refusals_carry_a_code_and_their_facts_for_callers_to_word():
    queued = task_submit(pipeline="t_local", input={})
    refusals = {
        "retry_not_failed": lambda: task_retry_from_checkpoint(task_id=queued.pk),
        "retry_from_start_not_allowed": lambda: task_retry_from_start(task_id=queued.pk),
        "compensate_not_failed": lambda: task_compensate(task_id=queued.pk),
        "close_not_failed": lambda: task_close(task_id=queued.pk, resolution=ResolutionCode.IGNORED, note="n"),
    }
    for code, refused in refusals.items():
        with pytest.raises(TaskNotActionable) as raised:
            refused()
        assert (raised.value.code, raised.value.details) == (code, {"state": "queued"})
        assert raised.value.message.startswith("task is queued; only ")  # the message stays English
    with pytest.raises(TaskNotActionable) as raised:
        task_retry_from_checkpoint(task_id=uuid.uuid4())
    assert (raised.value.code, raised.value.details) == ("no_such_task", {})
    pipeline_pause(pipeline="t_cancellable", actor="operator:s", reason="r")
    controls = {
        ("already_paused", "t_cancellable"): lambda: pipeline_pause(pipeline="t_cancellable", actor="s", reason="r"),
        ("not_paused", "t_local"): lambda: pipeline_resume(pipeline="t_local", actor="s", reason="r"),
        ("limits_declared_already", "t_local"): lambda: pipeline_limits_reset(
            pipeline="t_local", actor="s", reason="r"
        ),
        ("unknown_pipeline", "nope"): lambda: pipeline_pause(pipeline="nope", actor="s", reason="r"),
    }
    for (code, pipeline), refused in controls.items():
        with pytest.raises(PipelineControlRefused) as raised:
            refused()
        assert (raised.value.code, raised.value.details["pipeline"]) == (code, pipeline)
    with pytest.raises(PipelineControlRefused) as raised:
        pipeline_pause(pipeline="t_cancellable", actor="s", reason="r")
    assert raised.value.details == {"pipeline": "t_cancellable", "paused_by": "operator:s"}
