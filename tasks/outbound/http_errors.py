"""HTTP failures by status, wherever they come from (``ctx.http``, ``requests`` and ``raise_for_status()``).

408, 425, 429 and 5xx are transient (the far side is busy, early or down:
retry, honouring ``Retry-After``); any other 4xx is permanent (the request
itself is wrong: a retry sends the same). 5xx and 408 leave the effect
uncertain, since the far side may have acted before it failed or gave up, so
compensation covers the step; 425 and 429 are refusals before any work.
"""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

TRANSIENT_STATUSES = frozenset({408, 425, 429})
UNCERTAIN_STATUSES = frozenset({408})
# A Retry-After longer than this is not believed (a misconfigured far side must not park a task for days).
MAX_RETRY_AFTER_SECONDS = 86_400.0


def status_is_transient(status: int) -> bool:
    return status in TRANSIENT_STATUSES or status >= 500


def status_effect_uncertain(status: int) -> bool:
    return status in UNCERTAIN_STATUSES or status >= 500


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from ``now``: delta-seconds or an HTTP date; ``None`` when absent or unusable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if moment.tzinfo is None:  # an HTTP date is GMT by definition
            return None
        seconds = moment.timestamp() - (time.time() if now is None else now)
        seconds = max(seconds, 0.0)
    if seconds != seconds or not 0 <= seconds <= MAX_RETRY_AFTER_SECONDS:
        return None
    return seconds
