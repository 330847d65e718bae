"""The ``Schedule`` value: checked at declaration, and its slots (cron in a time zone across DST, intervals)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tasks import ConfigurationError, Pipeline, Schedule
from tasks.pipelines.schedules import Overlap


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"cron": "0 3 * * *", "every": timedelta(minutes=5)},
        {"cron": "61 * * * *"},
        {"cron": "not cron"},
        {"every": timedelta(0)},
        {"every": timedelta(milliseconds=500)},
        {"every": timedelta(seconds=-5)},
        {"every": "5 minutes"},
        {"cron": "0 3 * * *", "timezone": "Mars/Olympus"},
        {"cron": "0 3 * * *", "input": {"when": datetime.now()}},
        {"cron": "0 3 * * *", "input": float("nan")},
        {"cron": "0 3 * * *", "overlap": "queue"},
        {"cron": "0 3 * * *", "catch_up_window": timedelta(seconds=-1)},
        {"cron": "0 3 * * *", "name": "Has Capitals"},
        {"cron": "0 3 * * *", "name": ""},
    ],
)
def test_a_wrong_declaration_is_a_configuration_error(kwargs):
    with pytest.raises(ConfigurationError):
        Schedule(**kwargs)


def test_defaults_and_names_given_by_the_pipeline():
    pipeline = Pipeline(
        "sched_unit_names",
        register=False,
        schedules=[
            Schedule(cron="0  3 * * *", timezone="Europe/Berlin", input={"kind": "digest"}),
            Schedule(every=timedelta(minutes=5)),
            Schedule(every=2, name="fast"),
        ],
    )
    nightly, frequent, fast = pipeline.schedules
    assert (nightly.name, frequent.name, fast.name) == (
        "sched_unit_names:0 3 * * *",
        "sched_unit_names:every 300s",
        "fast",
    )
    assert {s.pipeline for s in pipeline.schedules} == {"sched_unit_names"}
    assert nightly.overlap is Overlap.SKIP and nightly.window == timedelta(days=1)
    assert frequent.window == timedelta(minutes=5) and fast.every == timedelta(seconds=2)


def test_two_schedules_of_one_name_are_refused():
    with pytest.raises(ConfigurationError, match="two schedules"):
        Pipeline(
            "sched_unit_twice",
            register=False,
            schedules=[Schedule(cron="0 3 * * *"), Schedule(cron="0 3 * * *", input={"other": 1})],
        )
    with pytest.raises(ConfigurationError, match="list of Schedule"):
        Pipeline("sched_unit_bad", register=False, schedules=Schedule(cron="0 3 * * *"))


def test_an_interval_counts_from_the_epoch():
    every = Schedule(every=timedelta(minutes=5))
    assert every.slot_after(utc(2025, 1, 1, 10, 2, 30)) == utc(2025, 1, 1, 10, 5)
    assert every.slot_after(utc(2025, 1, 1, 10, 5)) == utc(2025, 1, 1, 10, 10)
    assert every.slot_at_or_before(utc(2025, 1, 1, 10, 5)) == utc(2025, 1, 1, 10, 5)
    assert every.slot_at_or_before(utc(2025, 1, 1, 10, 9, 59)) == utc(2025, 1, 1, 10, 5)
    assert every.slots_between(utc(2025, 1, 1, 10, 0), utc(2025, 1, 1, 10, 30)) == 6
    assert every.slots_between(utc(2025, 1, 1, 10, 0, 1), utc(2025, 1, 1, 10, 30)) == 5
    two = Schedule(every=timedelta(seconds=2))
    assert two.slot_after(utc(2025, 1, 1, 0, 0, 1)) == utc(2025, 1, 1, 0, 0, 2)


def test_a_nightly_berlin_slot_follows_the_clock_across_both_dst_changes():
    nightly = Schedule(cron="0 3 * * *", timezone="Europe/Berlin")
    # Spring: 2025-03-30 02:00 CET becomes 03:00 CEST.
    first = nightly.slot_after(utc(2025, 3, 28, 12))
    second = nightly.slot_after(first)
    third = nightly.slot_after(second)
    assert (first, second, third) == (utc(2025, 3, 29, 2), utc(2025, 3, 30, 1), utc(2025, 3, 31, 1))
    assert second - first == timedelta(hours=23)
    # Autumn: 2025-10-26 03:00 CEST becomes 02:00 CET.
    before = nightly.slot_after(utc(2025, 10, 24, 12))
    after = nightly.slot_after(before)
    assert (before, after) == (utc(2025, 10, 25, 1), utc(2025, 10, 26, 2))
    assert after - before == timedelta(hours=25)
    assert nightly.slot_at_or_before(utc(2025, 3, 30, 1)) == utc(2025, 3, 30, 1)
    assert nightly.slot_at_or_before(utc(2025, 3, 30, 0, 59)) == utc(2025, 3, 29, 2)


def test_a_wall_time_the_autumn_change_repeats_fires_once_and_one_spring_skips_fires_once():
    half_past_two = Schedule(cron="30 2 * * *", timezone="Europe/Berlin")
    autumn = half_past_two.slot_after(utc(2025, 10, 25, 12))
    assert autumn == utc(2025, 10, 26, 0, 30)  # 02:30 CEST, the first of the two
    assert half_past_two.slot_after(autumn) == utc(2025, 10, 27, 1, 30)
    assert half_past_two.slot_at_or_before(utc(2025, 10, 26, 1, 45)) == autumn
    spring = half_past_two.slot_after(utc(2025, 3, 29, 12))
    assert spring == utc(2025, 3, 30, 1)  # 02:30 does not exist that night: the first time after it
    assert half_past_two.slot_after(spring) == utc(2025, 3, 31, 0, 30)
    assert half_past_two.slots_between(utc(2025, 10, 25, 12), utc(2025, 10, 28)) == 2
