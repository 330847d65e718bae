"""Schedules on real sweeper and worker processes: ``every=2 s`` for 20 s with two sweepers, one SIGKILLed and
restarted meanwhile (every slot of the window has exactly one task, and no slot two); a paused schedule fires
nothing; ``skip`` skips the slots while a slow task runs and the console says so."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from tasks.lifecycle.schedules import schedule_add, schedule_pause, slot_key
from tasks.models import IdempotencyRecord, PipelineSchedule, ScheduleRun, Task
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

SWEEP_INTERVAL = 0.25
MODULES = "tasks.demo.report_pipeline,tests.pipelines,tests.schedule_pipelines"
NAME = "t-every-2s"
WINDOW = timedelta(seconds=20)
EVERY = timedelta(seconds=2)
SECOND = timedelta(seconds=1)
BY_TEST = {"actor": "test", "reason": "acceptance"}


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


def test_a_paused_schedule_fires_nothing_and_skip_lets_a_slow_task_finish_first(
    start_sweeper, start_workers, client, django_user_model
):
    """Two console schedules every second on real processes: one paused before any sweeper saw it fires nothing
    while the other fires; the other's slots while its slow task (4 s) runs are skipped, counted and shown on
    the Schedules page, and the slot after the task finished fires."""
    paused = schedule_add(
        name="t-paused-1s", pipeline="t_long", every=SECOND, input={"seconds": 0}, overlap="allow", **BY_TEST
    )
    schedule_pause(schedule_id=paused.pk, **BY_TEST)
    slow = schedule_add(name="t-slow-1s", pipeline="t_long", every=SECOND, input={"seconds": 4}, **BY_TEST)
    start_workers(1)
    start_sweeper(RELIABILITY_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)

    first = wait_for(lambda: ScheduleRun.objects.filter(schedule=slow).first(), timeout=60, message="a slot fired")
    skipped_slot = wait_for(
        lambda: (
            PipelineSchedule.objects.filter(pk=slow.pk, last_skipped_at__isnull=False)
            .values_list("last_skipped_at", flat=True)
            .first()
        ),
        timeout=60,
        message="a slot skipped",
    )
    finished = wait_for(
        lambda: Task.objects.filter(pk=first.task_id, state="succeeded").values_list("finished_at", flat=True).first(),
        timeout=60,
        message="the slow task finished",
    )
    second = wait_for(
        lambda: ScheduleRun.objects.filter(schedule=slow, slot_at__gt=first.slot_at).order_by("slot_at").first(),
        timeout=60,
        message="a slot after the slow task",
    )

    slow.refresh_from_db()
    skipped = slow.slots_skipped
    # No slot between the first and the first after its task finished fired (second is the next run); the
    # sweeper ran meanwhile (a slot per second, the task took 4 s) and counted them skipped (or, stalled past a
    # slot's catch-up window on a loaded machine, missed).
    assert second.slot_at > finished - SECOND
    assert slow.slots_skipped >= 1 and first.slot_at < skipped_slot < finished
    # The paused schedule, due every second all along, fired nothing.
    assert not ScheduleRun.objects.filter(schedule=paused).exists()
    assert not Task.objects.filter(idempotency_key__startswith="schedule:t-paused-1s:").exists()
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get(reverse("schedules")).content.decode()
    row = page[page.index("t-slow-1s") :]
    shown = re.search(r"<td>(\d+)<br>", row[: row.index("</tr>")])
    slow.refresh_from_db()  # the second task runs 4 s too: more slots may have been skipped since
    assert shown is not None and skipped <= int(shown.group(1)) <= slow.slots_skipped
