"""The retention purge of finished tasks, against real PostgreSQL: what it deletes, what it never deletes, its batches.

Tasks are made by the engine itself where that is cheap (``task_submit`` and
``task_run`` of the in-process ``t_local`` and ``t_parked`` pipelines, an
operator's close through ``tasks.lifecycle.operator``); states the engine only passes
through (running, compensating, …) are written directly. Ages are set by
moving ``finished_at`` (and ``resolved_at``) into the past.
"""

from __future__ import annotations

import subprocess
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from dlq.alerting.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule
from dlq.audit import audit_record
from dlq.models import AuditEntry, AuditOutcome
from tasks import registry
from tasks.execution.runner import task_run
from tasks.lifecycle import retention
from tasks.lifecycle.operator import task_close
from tasks.lifecycle.retention import TASKS_KIND, _candidates, finished_tasks_purge, finished_tasks_purge_due
from tasks.models import (
    TERMINAL_STATES,
    UNRESOLVED_STATUSES,
    Checkpoint,
    DeadLetter,
    DLQStatus,
    IdempotencyRecord,
    ResolutionCode,
    RetentionPurge,
    SideEffect,
    StepAttempt,
    Task,
    TaskState,
)
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import manage, plan_uses_index, planner_statistics_of_a_live_table, process_env

pytestmark = pytest.mark.django_db(transaction=True)

RETENTION = timedelta(days=30)
OLD = timedelta(days=45)
NON_TERMINAL_STATES = [state for state in TaskState if state not in TERMINAL_STATES]


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def _age(task: Task, by: timedelta = OLD) -> Task:
    with door_forced():
        Task.objects.filter(pk=task.pk).update(finished_at=timezone.now() - by)
    return Task.objects.get(pk=task.pk)


def succeeded(*, age: timedelta = OLD, **submit) -> Task:
    """A t_local task run to success (two attempts, two checkpoints, one ledger row), finished ``age`` ago."""
    task = task_submit(pipeline="t_local", input=submit.pop("input", {}), **submit)
    assert task_run(task_id=str(task.pk), worker="w1") == "succeeded"
    return _age(task, age)


def compensated_and_closed(*, age: timedelta = OLD, resolved_age: timedelta = OLD) -> Task:
    """A t_local task that failed, was compensated, and whose dead letter an operator closed ``resolved_age`` ago."""
    task = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    assert task_run(task_id=str(task.pk), worker="w1") == "compensated"
    task_close(task_id=task.pk, resolution=ResolutionCode.FIXED_MANUALLY, note="done by hand")
    with door_forced():
        DeadLetter.objects.filter(task_id=task.pk).update(resolved_at=timezone.now() - resolved_age)
    return _age(task, age)


def written(state: TaskState, *, age: timedelta = OLD, in_dlq: bool = False) -> Task:
    """A task row in ``state`` (the engine only passes through some states), ``finished_at`` ``age`` ago."""
    return Task.objects.create(
        pipeline="t_local", state=state, in_dlq=in_dlq, total_steps=2, finished_at=timezone.now() - age
    )


def dead_letter(task: Task, status: DLQStatus, *, resolved_age: timedelta | None = None) -> DeadLetter:
    return DeadLetter.objects.create(
        task=task,
        pipeline=task.pipeline,
        reason_code="permanent_error",
        reason="made by a test",
        fingerprint="t_local:local_b:refused",
        status=status,
        resolved_at=None if resolved_age is None else timezone.now() - resolved_age,
    )


def purge(**options):
    return finished_tasks_purge(**{"older_than": RETENTION, "batch_size": 100, **options})


def remaining(*tasks: Task) -> set:
    return set(Task.objects.filter(pk__in=[task.pk for task in tasks]).values_list("pk", flat=True))


# --- what goes ---------------------------------------------------------------------------------------------


def test_old_finished_tasks_go_with_every_row_they_own_and_their_audit_entries_stay():
    done = succeeded()
    closed = compensated_and_closed()
    keyed = succeeded(idempotency_key="order-9")
    IdempotencyRecord.objects.filter(key="order-9").update(expires_at=timezone.now() - timedelta(seconds=1))
    audit_record(
        actor="operator1",
        action="close",
        target_type="dlqitem",
        target_id="1",
        outcome=AuditOutcome.SUCCEEDED,
        task_id=closed.pk,
    )
    # The console's alert deliveries refer to their notification task and keep their history without it.
    rule = AlertRule.objects.create(name="t_rule", kind="open_items", threshold=1)
    event = AlertEvent.objects.create(rule=rule, kind="firing", rule_version=1, threshold=1, summary="s")
    delivery = AlertDelivery.objects.create(
        event=event, channel=AlertChannel.objects.create(name="t_log", kind="log"), task=done
    )
    ids = [done.pk, closed.pk, keyed.pk]
    owned = {
        model: model.objects.filter(task_id__in=ids).count()
        for model in (StepAttempt, Checkpoint, SideEffect, DeadLetter, IdempotencyRecord)
    }
    assert all(owned.values()), owned

    report = purge()

    assert report.tasks == 3 and report.complete
    assert remaining(done, closed, keyed) == set()
    for model in owned:
        assert not model.objects.filter(task_id__in=ids).exists(), model
    assert report.rows == {
        "tasks.Task": 3,
        **{model._meta.label: count for model, count in owned.items()},
    }
    assert AuditEntry.objects.filter(task_id=closed.pk).count() == 1
    delivery.refresh_from_db()
    assert delivery.task_id is None


def test_a_task_finished_within_the_retention_stays():
    recent = succeeded(age=timedelta(days=29))
    old = succeeded()
    assert purge().tasks == 1
    assert remaining(recent, old) == {recent.pk}


# --- what never goes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", NON_TERMINAL_STATES)
def test_an_unfinished_task_never_goes(state):
    # Even with a finish time long past (a retried compensation keeps its old one).
    unfinished = written(state)
    finished = written(TaskState.SUCCEEDED)
    assert purge(older_than=timedelta(seconds=1)).tasks == 1
    assert remaining(unfinished, finished) == {unfinished.pk}


@pytest.mark.parametrize("status", UNRESOLVED_STATUSES)
@pytest.mark.parametrize("in_dlq", [True, False], ids=["flagged", "flag-out-of-step"])
def test_a_task_with_an_open_dead_letter_never_goes(status, in_dlq):
    # in_dlq keeps it out of the purge's index; the dead letter itself keeps it even if the flag were wrong.
    held = written(TaskState.COMPENSATED if status == DLQStatus.COMPENSATED else TaskState.FAILED, in_dlq=in_dlq)
    dead_letter(held, status)
    finished = written(TaskState.SUCCEEDED)
    assert purge(older_than=timedelta(seconds=1)).tasks == 1
    assert remaining(held, finished) == {held.pk}
    assert DeadLetter.objects.filter(task=held, status=status).exists()


def test_a_task_parked_in_the_dead_letter_queue_by_the_engine_stays_until_closed_and_old():
    task = task_submit(pipeline="t_parked", input={"fail": True})
    assert task_run(task_id=str(task.pk), worker="w1") == "failed"
    _age(task)
    assert purge().tasks == 0
    task_close(task_id=task.pk, resolution=ResolutionCode.IGNORED, note="test account")
    # Closed just now: the task and its item stay for the retention after the close.
    assert purge().tasks == 0
    with door_forced():
        DeadLetter.objects.filter(task_id=task.pk).update(resolved_at=timezone.now() - OLD)
    assert purge().tasks == 1
    assert not DeadLetter.objects.filter(task_id=task.pk).exists()


def test_a_task_whose_idempotency_record_is_inside_its_ttl_stays_and_its_key_still_replays():
    task = succeeded(idempotency_key="invoice-42", input={"n": 1})
    assert purge().tasks == 0
    replay = task_submit(pipeline="t_local", input={"n": 1}, idempotency_key="invoice-42")
    assert replay.pk == task.pk
    IdempotencyRecord.objects.filter(key="invoice-42").update(expires_at=timezone.now())
    assert purge().tasks == 1
    assert not IdempotencyRecord.objects.filter(key="invoice-42").exists()


def test_a_task_locked_by_someone_else_is_skipped_not_waited_for():
    locked, free = written(TaskState.SUCCEEDED), written(TaskState.SUCCEEDED)
    holding, release = threading.Event(), threading.Event()

    def hold_lock():
        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=locked.pk)
                holding.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert holding.wait(10)
        report = purge()
    finally:
        release.set()
        holder.join()
    assert report.tasks == 1 and report.complete
    assert remaining(locked, free) == {locked.pk}
    assert purge().tasks == 1


# --- how it runs -------------------------------------------------------------------------------------------


def test_a_dry_run_counts_what_would_go_and_changes_nothing():
    succeeded(), compensated_and_closed()
    kept = written(TaskState.RUNNING)
    before = {model: model.objects.count() for model in (Task, StepAttempt, Checkpoint, SideEffect, DeadLetter)}

    dry = purge(dry_run=True)

    assert {model: model.objects.count() for model in before} == before
    assert not RetentionPurge.objects.exists()
    real = purge()
    assert dry.tasks == real.tasks == 2
    assert dry.rows == real.rows
    assert dry.rows["tasks.StepAttempt"] > 0 and dry.rows["tasks.DeadLetter"] == 1
    assert remaining(kept) == {kept.pk}


def test_each_transaction_deletes_at_most_one_batch():
    for _ in range(7):
        written(TaskState.SUCCEEDED)
    per_batch = []

    def count(report):
        per_batch.append(report.tasks - sum(per_batch))
        assert connection.in_atomic_block is False  # each batch has committed before the next starts

    report = purge(batch_size=3, on_batch=count)

    assert per_batch == [3, 3, 1]
    assert (report.tasks, report.batches, report.complete) == (7, 3, True)


def test_a_time_limited_run_stops_after_the_batch_that_reaches_it_and_the_next_run_goes_on():
    for _ in range(5):
        written(TaskState.SUCCEEDED)
    first = purge(batch_size=2, max_seconds=0)
    assert (first.tasks, first.batches, first.complete) == (2, 1, False)
    assert not RetentionPurge.objects.get(kind=TASKS_KIND).caught_up
    assert purge(batch_size=2).tasks == 3
    assert RetentionPurge.objects.get(kind=TASKS_KIND).caught_up


def test_between_batches_the_purge_pauses_in_proportion_to_the_batch(monkeypatch):
    for _ in range(5):
        written(TaskState.SUCCEEDED)
    pauses, batches = [], []
    monkeypatch.setattr(retention.time, "sleep", pauses.append)

    purge(batch_size=2, pause_ratio=2.5, on_batch=lambda report: batches.append(report.seconds))

    # After each full batch, none after the last (it found fewer than a batch: nothing is left).
    assert len(batches) == 3 and len(pauses) == 2
    assert all(0 < pause <= 2.5 * batches[-1] for pause in pauses)


def test_the_candidates_are_read_from_the_purge_index():
    planner_statistics_of_a_live_table()
    cutoff = timezone.now() - RETENTION
    for after in (None, (cutoff, written(TaskState.SUCCEEDED).pk)):
        query = _candidates(cutoff, after).select_for_update(skip_locked=True, of=("self",))
        plan = plan_uses_index(query.values_list("finished_at", "pk")[:500], "task_purge_candidates_idx")
        assert "task_purge_candidates_idx" in plan, plan


def test_a_purge_is_recorded_for_the_dashboard_and_counted_in_metrics():
    before = REGISTRY.get_sample_value("reliability_tasks_purged_total") or 0
    purge()
    record = RetentionPurge.objects.get(kind=TASKS_KIND)
    assert record.last_purged_at is None and record.total_items == 0

    succeeded(), succeeded()
    report = purge()

    record.refresh_from_db()
    assert (record.last_items, record.last_rows, record.total_items) == (2, report.total_rows, 2)
    assert record.last_cutoff == report.cutoff and record.last_purged_at >= record.last_cutoff
    assert REGISTRY.get_sample_value("reliability_tasks_purged_total") == before + 2
    assert REGISTRY.get_sample_value("reliability_purged_rows_total", {"table": "tasks.StepAttempt"}) >= 4


def test_the_sweeper_purges_with_the_configured_retention_and_not_at_all_when_it_is_zero(settings):
    chore = registry._CHORES["finished_tasks_purged"]
    assert chore.run is finished_tasks_purge_due
    assert chore.interval == settings.RELIABILITY_PURGE_INTERVAL_SECONDS
    old, recent = succeeded(age=timedelta(days=10)), succeeded(age=timedelta(days=2))
    settings.RELIABILITY_TASK_RETENTION_DAYS = 0
    assert finished_tasks_purge_due() == 0
    settings.RELIABILITY_TASK_RETENTION_DAYS = 7
    assert finished_tasks_purge_due() == 1
    assert remaining(old, recent) == {recent.pk}


# --- the command -------------------------------------------------------------------------------------------


def test_the_command_purges_and_reports(capsys):
    succeeded(), succeeded(age=timedelta(days=1))
    call_command("purge_finished_tasks", "--older-than", "30", "--dry-run")
    assert "would delete 1 tasks" in capsys.readouterr().out and Task.objects.count() == 2
    call_command("purge_finished_tasks", "--older-than", "0.5", "--batch-size", "1")
    out = capsys.readouterr().out
    assert "deleted 2 tasks" in out and "in 2 batches" in out
    assert not Task.objects.exists()


@pytest.mark.processes
@pytest.mark.parametrize(
    "arguments",
    [
        ["--older-than", "-3"],
        ["--older-than", "thirty"],
        ["--older-than", "0"],
        [],
        ["--older-than", "30", "--batch-size", "many"],
        ["--older-than", "30", "--pause-ratio", "-1"],
    ],
    ids=["negative", "not-a-number", "zero", "missing", "bad-batch-size", "bad-pause-ratio"],
)
def test_the_command_refuses_bad_input_with_one_line_and_a_non_zero_exit(arguments):
    task = succeeded()
    result = subprocess.run(
        manage("purge_finished_tasks", *arguments), env=process_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: "), result.stderr
    assert remaining(task) == {task.pk}
