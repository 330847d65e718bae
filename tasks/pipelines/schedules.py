"""Schedules: a pipeline's tasks submitted by the clock (``Pipeline(..., schedules=[Schedule(...)])``).

A ``Schedule`` is a value: a cron expression in a time zone (parsed by croniter) or a fixed interval, the input
of the tasks it submits, what to do when its previous task is still running (``overlap``) and how late a slot
may still run after an outage (``catch_up_window``). It computes its slots; the sweeper fires them
(``tasks.lifecycle.schedules``), one task per slot whatever the number of sweepers.

An interval's slots are counted from the Unix epoch (UTC), so every sweeper and every restart agrees on them:
``every=timedelta(minutes=5)`` fires at :00, :05, :10... A cron slot is a wall-clock time of the schedule's time
zone: ``0 3 * * *`` in Europe/Berlin is 02:00 UTC in winter and 01:00 UTC in summer; a wall-clock time the
spring change skips runs at the first time after it (croniter's rule), one the autumn change repeats runs once,
at its first occurrence.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from tasks.exceptions import ConfigurationError

__all__ = ["Overlap", "Schedule", "schedules_named"]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The shortest interval: a slot per second is already more than a sweeper loop can fire on time.
MIN_EVERY = timedelta(seconds=1)
# A schedule's name is part of its tasks' idempotency keys ("schedule:<name>:<slot>"), at most 255 characters.
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_:.\-/,*? ]{0,149}$")
NAME_MAX_LENGTH = 150
# Missed slots counted one by one at most this far (a cron schedule down for years is counted up to here).
MISSED_COUNT_CAP = 10_000


class Overlap(enum.StrEnum):
    """A slot that comes while the schedule's previous task is unfinished."""

    SKIP = "skip"  # no new task: the slot is counted as skipped
    ALLOW = "allow"  # a new task anyway


@dataclass(frozen=True)
class Schedule:
    """When to submit a pipeline's task, and its input: ``cron`` (with ``timezone``) or ``every``, not both.

    ``name`` defaults to ``<pipeline>:<cron>`` or ``<pipeline>:every <seconds>s`` (set when the pipeline is
    declared); ``overlap`` is ``"skip"`` (the default) or ``"allow"``; ``catch_up_window`` (default one
    interval) is how late a missed slot may still run after an outage: at most one, the latest.
    """

    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    input: Any = field(default_factory=dict)
    name: str | None = None
    overlap: Overlap | str = Overlap.SKIP
    catch_up_window: timedelta | None = None
    # The pipeline it submits to: set by Pipeline(schedules=...), or given for a schedule added in the console.
    pipeline: str | None = None

    def __post_init__(self) -> None:
        what = f"schedule {self.name or self.cron or self.every!r}"
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(f"{what}: give cron or every, not both or neither")
        if self.cron is not None:
            if not isinstance(self.cron, str) or not croniter.is_valid(self.cron):
                raise ConfigurationError(f"{what}: {self.cron!r} is not a cron expression")
            object.__setattr__(self, "cron", " ".join(self.cron.split()))
        else:
            if isinstance(self.every, int | float) and not isinstance(self.every, bool):
                object.__setattr__(self, "every", timedelta(seconds=self.every))
            if not isinstance(self.every, timedelta) or self.every < MIN_EVERY:
                raise ConfigurationError(f"{what}: every must be a timedelta of at least one second")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigurationError(f"{what}: {self.timezone!r} is not a time zone name (zoneinfo)") from None
        try:
            json.dumps(self.input, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{what}: input is not JSON: {exc}") from None
        try:
            object.__setattr__(self, "overlap", Overlap(self.overlap))
        except ValueError:
            raise ConfigurationError(f"{what}: overlap is 'skip' or 'allow', not {self.overlap!r}") from None
        window = self.catch_up_window
        if isinstance(window, int | float) and not isinstance(window, bool):
            window = timedelta(seconds=window)
            object.__setattr__(self, "catch_up_window", window)
        if window is not None and (not isinstance(window, timedelta) or window < timedelta(0)):
            raise ConfigurationError(f"{what}: catch_up_window must be a timedelta, zero or more")
        if self.name is not None:
            name_check(self.name)

    @property
    def window(self) -> timedelta:
        """How late a slot may still run: ``catch_up_window``, or one interval (the first one after the epoch's
        first slot, for a cron schedule)."""
        if self.catch_up_window is not None:
            return self.catch_up_window
        if self.every is not None:
            return self.every
        first = self.slot_after(EPOCH + timedelta(days=3))
        return self.slot_after(first) - first

    @property
    def every_seconds(self) -> float | None:
        return self.every.total_seconds() if self.every is not None else None

    def describe(self) -> str:
        """``0 3 * * * (Europe/Berlin)`` or ``every 300 s``."""
        if self.cron is not None:
            return f"{self.cron} ({self.timezone})"
        return f"every {self.every_seconds:g} s"

    def slot_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (aware), in UTC."""
        if self.every is not None:
            step = _microseconds(self.every)
            return EPOCH + timedelta(microseconds=(_microseconds(moment - EPOCH) // step + 1) * step)
        zone = ZoneInfo(self.timezone)
        found = croniter(self.cron, moment.astimezone(zone))
        while True:
            slot = found.get_next(datetime)
            if not _repeated_wall_time(slot, zone):
                return slot.astimezone(UTC)

    def slot_at_or_before(self, moment: datetime) -> datetime:
        """The latest slot at or before ``moment`` (aware), in UTC."""
        if self.every is not None:
            step = _microseconds(self.every)
            return EPOCH + timedelta(microseconds=(_microseconds(moment - EPOCH) // step) * step)
        zone = ZoneInfo(self.timezone)
        found = croniter(self.cron, moment.astimezone(zone))
        slot = found.get_prev(datetime)
        while _repeated_wall_time(slot, zone):
            slot = found.get_prev(datetime)
        following = self.slot_after(slot)
        return following if following <= moment else slot.astimezone(UTC)

    def slots_between(self, start: datetime, end: datetime) -> int:
        """How many slots lie in ``[start, end)``, counted up to ``MISSED_COUNT_CAP``."""
        if end <= start:
            return 0
        if self.every is not None:
            step = _microseconds(self.every)
            first = math.ceil(_microseconds(start - EPOCH) / step)
            last = math.ceil(_microseconds(end - EPOCH) / step)
            return min(last - first, MISSED_COUNT_CAP)
        count, slot = 0, self.slot_at_or_before(start)
        if slot < start:
            slot = self.slot_after(slot)
        while slot < end and count < MISSED_COUNT_CAP:
            count += 1
            slot = self.slot_after(slot)
        return count


def _microseconds(delta: timedelta) -> int:
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _repeated_wall_time(slot: datetime, zone: ZoneInfo) -> bool:
    # The autumn change repeats an hour of wall-clock time: its second occurrence is not a slot of its own.
    first = slot.replace(tzinfo=None).replace(tzinfo=zone, fold=0)
    return first.astimezone(UTC) < slot.astimezone(UTC)


def name_check(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigurationError(
            f"schedule name {name!r}: 1 to {NAME_MAX_LENGTH} characters, lower-case letters, digits, spaces and "
            "_ : . - / , * ?, starting with a letter or digit"
        )
    return name


def default_name(pipeline: str, schedule: Schedule) -> str:
    """``<pipeline>:<cron>`` or ``<pipeline>:every <seconds>s``: stable while the declaration is."""
    when = schedule.cron if schedule.cron is not None else f"every {schedule.every_seconds:g}s"
    return f"{pipeline}:{when}".lower()[:NAME_MAX_LENGTH]


def schedules_named(pipeline: str, schedules: Any) -> list[Schedule]:
    """A pipeline's schedules, each named (its default name if none) and bound to ``pipeline``; a name given
    twice is a ``ConfigurationError``."""
    if schedules is None:
        return []
    if isinstance(schedules, Schedule) or not isinstance(schedules, list | tuple):
        raise ConfigurationError(f"pipeline {pipeline!r}: schedules is a list of Schedule")
    named, seen = [], set()
    for schedule in schedules:
        if not isinstance(schedule, Schedule):
            raise ConfigurationError(f"pipeline {pipeline!r}: schedules is a list of Schedule, not {schedule!r}")
        schedule = replace(schedule, pipeline=pipeline, name=schedule.name or default_name(pipeline, schedule))
        if schedule.name in seen:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: two schedules are named {schedule.name!r}; give each a name="
            )
        seen.add(schedule.name)
        named.append(schedule)
    return named
