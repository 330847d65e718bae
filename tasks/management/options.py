"""Option values of the engine's (and the console's) management commands, parsed into one CommandError line.

Commands take their options as text and parse them here, so a bad value ends
the command with exit status 1 and one readable line, not argparse's usage dump.
"""

from __future__ import annotations

import math
from datetime import timedelta

from django.core.management.base import CommandError


def days_option(name: str, value: str | None) -> timedelta:
    """A positive number of days (fractions allowed: 0.5 is 12 hours)."""
    if value is None:
        raise CommandError(f"{name} DAYS is required")
    try:
        days = float(str(value).strip())
    except ValueError:
        raise CommandError(f"{name} must be a positive number of days, not {value!r}") from None
    if not math.isfinite(days) or days <= 0:
        raise CommandError(f"{name} must be a positive number of days, not {value!r}")
    try:
        return timedelta(days=days)
    except OverflowError:
        raise CommandError(f"{name} {value!r} is too many days") from None


def count_option(name: str, value: str, *, maximum: int) -> int:
    """A whole number from 1 to ``maximum``."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise CommandError(f"{name} must be a whole number from 1 to {maximum}, not {value!r}") from None
    if not 1 <= number <= maximum:
        raise CommandError(f"{name} must be a whole number from 1 to {maximum}, not {value!r}")
    return number


def ratio_option(name: str, value: str) -> float:
    """A number from 0 to 100."""
    try:
        ratio = float(str(value).strip())
    except ValueError:
        raise CommandError(f"{name} must be a number from 0 to 100, not {value!r}") from None
    if not 0 <= ratio <= 100:  # also refuses nan
        raise CommandError(f"{name} must be a number from 0 to 100, not {value!r}")
    return ratio
