"""Schedules on real PostgreSQL: the sweeper fires one task per slot whatever the number of sweepers, none while
paused, skips a slot while the last task is unfinished (``overlap="skip"``) and fires it anyway with ``"allow"``,
and after an outage runs at most the latest missed slot."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tasks import Pipeline, Schedule, registry
from tasks.delivery.sweeper import sweep_once
from tasks.exceptions import ScheduleRefused
from tasks.lifecycle.schedules import (
    schedule_pause,
    schedule_resume,
    schedules_fire_due,
    schedules_sync,
    slot_key,
)
from tasks.models import IdempotencyRecord, PipelineSchedule, ScheduleRun, ScheduleSource, Task, TaskState
from tasks.models.door import door_forced

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean(clean_redis):
    yield


@pytest.fixture
def declare():
    """Declare a pipeline with schedules for one test (unregistered after it)."""
    names = []

    def build(name: str, *schedules: Schedule) -> Pipeline:
        pipeline = Pipeline(name, schedules=list(schedules))
        pipeline.step(lambda ctx: {"ran": True}, name="work")
        names.append(name)
        return pipeline

    yield build
    for name in names:
        registry.unregister(name)


def row(name: str) -> PipelineSchedule:
    return PipelineSchedule.objects.get(name=name)


def tasks_of(name: str) -> list[Task]:
    return list(Task.objects.filter(pipeline=name).order_by("created_at"))


def finish(task: Task) -> None:
    with door_forced():
        Task.objects.filter(pk=task.pk).update(state=TaskState.SUCCEEDED)


def test_code_schedules_become_rows_and_follow_the_code(declare):
    declare("sch_sync", Schedule(every=timedelta(minutes=1), input={"n": 1}, name="sch-sync"))
    assert schedules_sync(now=T0) == 1
    first = row("sch-sync")
    assert (first.source, first.pipeline, first.every_seconds, first.input) == (
        ScheduleSource.CODE,
        "sch_sync",
        60,
        {"n": 1},
    )
    assert first.next_slot_at == T0 + timedelta(minutes=1)
    assert schedules_sync(now=T0) == 0  # nothing changed: nothing written
    registry.unregister("sch_sync")
    declare("sch_sync", Schedule(every=timedelta(minutes=2), input={"n": 2}, name="sch-sync"))
    assert schedules_sync(now=T0 + timedelta(seconds=10)) == 1
    assert (row("sch-sync").every_seconds, row("sch-sync").input) == (120, {"n": 2})
    registry.unregister("sch_sync")
    assert schedules_sync(now=T0) == 1
    assert row("sch-sync").next_slot_at is None  # no longer declared: nothing fires


def test_a_due_slot_fires_one_task_under_the_slot_key_and_again_nothing(declare):
    declare("sch_fire", Schedule(every=timedelta(minutes=1), input={"x": 1}, name="sch-fire", overlap="allow"))
    schedules_sync(now=T0)
    slot = T0 + timedelta(minutes=1)
    sweep = schedules_fire_due(now=slot + timedelta(seconds=3))
    assert (sweep.fired, sweep.missed, sweep.skipped) == (1, 0, 0)
    [task] = tasks_of("sch_fire")
    assert task.input == {"x": 1}
    assert IdempotencyRecord.objects.get(key=slot_key("sch-fire", slot)).task_id == task.pk
    assert slot_key("sch-fire", slot) == "schedule:sch-fire:2030-01-01T12:01:00Z"
    schedule = row("sch-fire")
    assert (schedule.last_slot_at, schedule.next_slot_at, schedule.last_task_id) == (
        slot,
        slot + timedelta(minutes=1),
        task.pk,
    )
    assert schedules_fire_due(now=slot + timedelta(seconds=5)).fired == 0
    # Even with the row forced back to the same slot (no lock can help), the unique (schedule, slot) row holds.
    with door_forced():
        PipelineSchedule.objects.filter(pk=schedule.pk).update(next_slot_at=slot)
    assert schedules_fire_due(now=slot + timedelta(seconds=6)).fired == 0
    assert len(tasks_of("sch_fire")) == 1
    assert ScheduleRun.objects.filter(schedule=schedule).count() == 1


def test_two_concurrent_sweeps_fire_one_task_per_slot(declare):
    declare("sch_race", Schedule(every=timedelta(seconds=2), name="sch-race", overlap="allow"))
    schedules_sync()
    barrier = threading.Barrier(2)
    errors = []

    def sweeper():
        try:
            for _ in range(5):
                barrier.wait(timeout=30)
                sweep_once()
                # The next slot is at most two seconds away: poll until it is due, as a sweeper loop would.
                target = row("sch-race").next_slot_at
                while datetime.now(UTC) < target:
                    threading.Event().wait(0.05)
        except Exception as exc:  # reported below, on the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    runs = list(ScheduleRun.objects.filter(schedule__name="sch-race").values_list("slot_at", "task_id"))
    slots = [slot for slot, _ in runs]
    assert len(runs) >= 3 and len(slots) == len(set(slots))
    tasks = tasks_of("sch_race")
    assert len(tasks) == len(runs)
    assert {task.pk for task in tasks} == {task_id for _, task_id in runs}
    keys = set(IdempotencyRecord.objects.filter(key__startswith="schedule:sch-race:").values_list("key", flat=True))
    assert keys == {slot_key("sch-race", slot) for slot in slots}


def test_a_paused_schedule_fires_nothing_and_resumes_from_now(declare):
    declare("sch_pause", Schedule(every=timedelta(minutes=1), name="sch-pause"))
    schedules_sync(now=T0)
    schedule = row("sch-pause")
    schedule_pause(schedule_id=schedule.pk, actor="operator:sue", reason="maintenance")
    with pytest.raises(ScheduleRefused) as refused:
        schedule_pause(schedule_id=schedule.pk, actor="operator:sue", reason="again")
    assert refused.value.code == "already_paused"
    assert schedules_fire_due(now=T0 + timedelta(minutes=5)).fired == 0
    assert tasks_of("sch_pause") == []
    resumed = schedule_resume(schedule_id=schedule.pk, actor="operator:sue", reason="done")
    assert not resumed.paused and resumed.next_slot_at > datetime.now(UTC)
    assert row("sch-pause").slots_missed == 0


def test_a_change_without_a_reason_or_with_a_too_long_one_is_refused_and_changes_nothing(declare):
    declare("sch_reason", Schedule(every=timedelta(minutes=1), name="sch-reason"))
    schedules_sync(now=T0)
    schedule = row("sch-reason")
    for reason, code in (("  ", "reason_required"), ("x" * 1001, "reason_too_long")):
        with pytest.raises(ScheduleRefused) as refused:
            schedule_pause(schedule_id=schedule.pk, actor="operator:sue", reason=reason)
        assert refused.value.code == code
        assert not row("sch-reason").paused  # the pause rolled back with the refusal
    paused = schedule_pause(schedule_id=schedule.pk, actor="operator:sue", reason="  maintenance ")
    assert paused.paused


def test_skip_records_the_slot_while_the_last_task_is_unfinished_and_fires_once_it_finished(declare):
    declare("sch_skip", Schedule(every=timedelta(minutes=1), name="sch-skip"))
    schedules_sync(now=T0)
    assert schedules_fire_due(now=T0 + timedelta(minutes=1)).fired == 1
    [first] = tasks_of("sch_skip")
    assert first.state not in (TaskState.SUCCEEDED,)
    sweep = schedules_fire_due(now=T0 + timedelta(minutes=2))
    assert (sweep.fired, sweep.skipped) == (0, 1)
    schedule = row("sch-skip")
    assert (schedule.slots_skipped, schedule.last_skipped_at) == (1, T0 + timedelta(minutes=2))
    assert schedule.next_slot_at == T0 + timedelta(minutes=3)
    finish(first)
    assert schedules_fire_due(now=T0 + timedelta(minutes=3)).fired == 1
    assert len(tasks_of("sch_skip")) == 2


def test_allow_fires_while_the_last_task_is_unfinished(declare):
    declare("sch_allow", Schedule(every=timedelta(minutes=1), name="sch-allow", overlap="allow"))
    schedules_sync(now=T0)
    for minutes in (1, 2, 3):
        assert schedules_fire_due(now=T0 + timedelta(minutes=minutes)).fired == 1
    assert len(tasks_of("sch_allow")) == 3
    assert row("sch-allow").slots_skipped == 0


def test_after_an_outage_only_the_latest_missed_slot_runs_if_within_the_window(declare):
    declare("sch_gap", Schedule(every=timedelta(minutes=1), name="sch-gap", overlap="allow"))
    schedules_sync(now=T0)
    # Down from 12:00 to 12:10:30: slots 12:01 .. 12:10 missed; 12:10 is 30 s old, within one interval.
    sweep = schedules_fire_due(now=T0 + timedelta(minutes=10, seconds=30))
    assert (sweep.fired, sweep.missed) == (1, 9)
    assert [run.slot_at for run in ScheduleRun.objects.filter(schedule__name="sch-gap")] == [T0 + timedelta(minutes=10)]
    schedule = row("sch-gap")
    assert (schedule.slots_missed, schedule.next_slot_at) == (9, T0 + timedelta(minutes=11))


def test_after_an_outage_longer_than_the_window_nothing_catches_up(declare):
    declare(
        "sch_late",
        Schedule(every=timedelta(minutes=10), name="sch-late", catch_up_window=timedelta(minutes=1)),
    )
    schedules_sync(now=T0)
    # The 12:30 slot is 5 minutes old, past the 1-minute window: 12:10, 12:20 and 12:30 all missed.
    sweep = schedules_fire_due(now=T0 + timedelta(minutes=35))
    assert (sweep.fired, sweep.missed) == (0, 3)
    assert tasks_of("sch_late") == []
    assert row("sch-late").next_slot_at == T0 + timedelta(minutes=40)


def test_a_refused_submission_is_recorded_and_the_schedule_goes_on(declare):
    pipeline = declare("sch_refused", Schedule(every=timedelta(minutes=1), name="sch-refused", input={"bad": 1}))

    def refuse(data):
        from tasks import InvalidTaskInput

        raise InvalidTaskInput("no")

    pipeline.validate_input = refuse
    schedules_sync(now=T0)
    sweep = schedules_fire_due(now=T0 + timedelta(minutes=1))
    assert (sweep.fired, sweep.failed) == (0, 1)
    schedule = row("sch-refused")
    assert schedule.last_error.startswith("invalid_input") or "no" in schedule.last_error
    assert ScheduleRun.objects.get(schedule=schedule).error
    assert schedule.next_slot_at == T0 + timedelta(minutes=2)
