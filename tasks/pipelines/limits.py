"""The values behind a pipeline's live limits: a rate limit, and the gate a task passes to start a step.

Pure values (no database): ``tasks.execution.gates`` applies them, the runner and
the claim ask it. A gate is what holds *now*: the declaration's limits
unless a supervisor overrode them (``PipelineControl``), and whether the
pipeline is paused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tasks.exceptions import ConfigurationError

RATE_PATTERN = re.compile(r"^\s*([1-9][0-9]{0,5})\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
WINDOW_SECONDS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
WINDOW_SECONDS |= {"h": 3600.0, "hour": 3600.0}
WINDOW_UNITS = {1.0: "s", 60.0: "m", 3600.0: "h"}
# The most slots or permits a limit may have: each is a row, and a denied start scans them.
MAX_LIMIT = 100_000


@dataclass(frozen=True)
class RateLimit:
    """At most ``count`` step starts in any window of ``window`` seconds, across every worker."""

    count: int
    window: float

    @classmethod
    def parse(cls, text: Any, *, pipeline: str = "") -> RateLimit:
        """``"10/s"``, ``"600/m"`` or ``"3600/h"``; anything else is a ``ConfigurationError``."""
        match = RATE_PATTERN.match(text) if isinstance(text, str) else None
        if match is None or int(match.group(1)) > MAX_LIMIT:
            where = f"pipeline {pipeline!r}: " if pipeline else ""
            raise ConfigurationError(
                f"{where}rate_limit {text!r} must be a whole number from 1 to {MAX_LIMIT} per second, "
                'minute or hour, like "10/s" or "600/m"'
            )
        return cls(count=int(match.group(1)), window=WINDOW_SECONDS[match.group(2)])

    def __str__(self) -> str:
        unit = WINDOW_UNITS.get(self.window)
        return f"{self.count}/{unit}" if unit else f"{self.count}/{self.window:g}s"


def concurrency_check(value: Any, *, pipeline: str = "") -> int | None:
    """A valid ``max_concurrency`` (a whole number from 1), or None for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        where = f"pipeline {pipeline!r}: " if pipeline else ""
        raise ConfigurationError(f"{where}max_concurrency {value!r} must be a whole number from 1 to {MAX_LIMIT}")
    return value


@dataclass(frozen=True)
class Gate:
    """What may start a step of a pipeline now."""

    paused: bool = False
    max_concurrency: int | None = None
    rate: RateLimit | None = None

    @property
    def limited(self) -> bool:
        return self.max_concurrency is not None or self.rate is not None


OPEN_GATE = Gate()


@dataclass(frozen=True)
class ControlValues:
    """The columns of a ``PipelineControl`` row that a gate needs (read with the claimed task)."""

    paused: bool = False
    concurrency_overridden: bool = False
    max_concurrency: int | None = None
    rate_overridden: bool = False
    rate_limit: str = ""

    @classmethod
    def from_row(cls, row: Any) -> ControlValues | None:
        if row is None:
            return None
        paused, concurrency_overridden, max_concurrency, rate_overridden, rate_limit = row
        return cls(bool(paused), bool(concurrency_overridden), max_concurrency, bool(rate_overridden), rate_limit or "")


def gate_for(*, max_concurrency: int | None, rate_limit: RateLimit | None, control: ControlValues | None) -> Gate:
    """The gate of a pipeline declared with these limits, under its control row (None: no row)."""
    if control is None:
        return Gate(False, max_concurrency, rate_limit) if (max_concurrency or rate_limit) else OPEN_GATE
    if control.concurrency_overridden:
        max_concurrency = control.max_concurrency or None
    if control.rate_overridden:
        rate_limit = _stored_rate(control.rate_limit)
    return Gate(control.paused, max_concurrency, rate_limit)


def _stored_rate(text: str) -> RateLimit | None:
    if not text:
        return None
    try:
        return RateLimit.parse(text)
    except ConfigurationError:
        return None  # only the console writes it, validated; never stop a worker over a bad row
