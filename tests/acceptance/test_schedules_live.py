"""A schedule on real sweeper processes: ``every=2 s`` for 20 s with two sweepers, one SIGKILLed and restarted
meanwhile; every slot of the window has exactly one task, and no slot two."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tasks.lifecycle.schedules import slot_key
from tasks.models import IdempotencyRecord, PipelineSchedule, ScheduleRun, Task
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

SWEEP_INTERVAL = 0.25
MODULES = "tasks.demo.report_pipeline,tests.pipelines,tests.schedule_pipelines"
NAME = "t-every-2s"
WINDOW = timedelta(seconds=20)
EVERY = timedelta(seconds=2)


def schedule() -> PipelineSchedule | None:
    return PipelineSchedule.objects.filter(name=NAME).first()


def fired_through(moment) -> bool:
    row = schedule()
    return row is not None and row.last_slot_at is not None and row.last_slot_at >= moment


def test_two_sweepers_one_killed_and_restarted_fire_each_slot_once(start_sweeper):
    env = {"RELIABILITY_SWEEP_INTERVAL_SECONDS": SWEEP_INTERVAL, "RELIABILITY_PIPELINE_MODULES": MODULES}
    first = start_sweeper(**env)
    start_sweeper(**env)
    first_slot = wait_for(lambda: schedule() and schedule().last_slot_at, timeout=60, message="the first slot")
    wait_for(lambda: fired_through(first_slot + WINDOW / 2), timeout=60, message="half the window")
    first.kill()
    start_sweeper(**env)
    wait_for(lambda: fired_through(first_slot + WINDOW), timeout=60, message="the whole window")
    row = schedule()
    slots = list(
        ScheduleRun.objects.filter(schedule=row, slot_at__lte=first_slot + WINDOW)
        .order_by("slot_at")
        .values_list("slot_at", flat=True)
    )
    expected = [first_slot + EVERY * n for n in range(int(WINDOW / EVERY) + 1)]
    assert slots == expected, f"missed {row.slots_missed}"
    runs = ScheduleRun.objects.filter(schedule=row, slot_at__in=expected)
    task_ids = [run.task_id for run in runs]
    assert None not in task_ids and len(set(task_ids)) == len(expected)
    assert Task.objects.filter(pk__in=task_ids, pipeline="t_every_two_seconds").count() == len(expected)
    keys = IdempotencyRecord.objects.filter(key__in=[slot_key(NAME, slot) for slot in expected])
    assert sorted(keys.values_list("task_id", flat=True)) == sorted(task_ids)
