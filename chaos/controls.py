"""The campaign's operator: pauses a pipeline once during the run and resumes it, through the engine's services.

The moment of the pause follows from the seed (but it waits for a worker to be taking jobs: on a loaded
machine workers may start after the planned moment, and a pause nothing runs into tests little); how long
it lasts from ``--pause-seconds``. The log keeps,
for each action, when the campaign called the service and when it returned: the change committed in
between, so the checker knows the pipeline was paused from the pause's return at the latest until the
resume's call at the earliest (``chaos.control_invariants``). A call the database fails (an injected
``pg_terminate_backend``, a restart) is made again; a repeat the engine refuses because the first one had
committed after all (its answer was lost) counts as done.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

logger = logging.getLogger(__name__)

ACTOR = "operator:chaos"
# The pause starts inside this share of the duration (faults fall between 10 % and 80 % of it).
PAUSE_START = (0.25, 0.4)
# Without --pause-seconds: this share of the duration, within these bounds (seconds).
PAUSE_SHARE = 0.1
PAUSE_BOUNDS = (5.0, 30.0)
# A pause must end by this share of the duration, so its backlog has time to drain before the run ends.
PAUSE_END_BY = 0.8
# The longest pause, as a share of the duration.
MAX_PAUSE_SHARE = 0.4
CALL_TRIES = 5
CALL_RETRY_SECONDS = 0.5
READY_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class PlannedPause:
    pipeline: str
    at: float  # seconds after the start
    seconds: float


def default_pause_seconds(duration: float) -> float:
    """PAUSE_SHARE of the duration within PAUSE_BOUNDS, and never more than MAX_PAUSE_SHARE of it."""
    low, high = PAUSE_BOUNDS
    return round(min(max(duration * PAUSE_SHARE, low), high, duration * MAX_PAUSE_SHARE), 1)


def pause_plan(*, seed: int, duration: float, pipeline: str, seconds: float) -> PlannedPause | None:
    """When the pipeline is paused, for how long; None when ``seconds`` is 0 (no pause)."""
    if seconds <= 0:
        return None
    rng = random.Random(f"pause-{seed}")
    at = rng.uniform(*PAUSE_START) * duration
    return PlannedPause(pipeline=pipeline, at=round(min(at, PAUSE_END_BY * duration - seconds), 2), seconds=seconds)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def call_through_faults(call: Callable[[], object], *, refused: type[Exception]) -> dict:
    """Make an operator's ``call`` to the engine, again after a database fault; what failed, if it did.

    A call the database fails (an injected ``pg_terminate_backend``, a restart) is made again, up to CALL_TRIES
    times; a repeat the engine refuses (``refused``) because the first one had committed after all (its answer
    was lost) counts as done. Returns ``{}``, or ``{"failed": True, "detail": …}``.
    """
    from django.db import DatabaseError, close_old_connections, connection

    for attempt in range(1, CALL_TRIES + 1):
        close_old_connections()
        try:
            call()
            return {}
        except refused as exc:
            # Refused outright: not the campaign's doing, so not done; a repeat refused was done before.
            return {"failed": True, "detail": str(exc)} if attempt == 1 else {}
        except DatabaseError as exc:
            connection.close()
            if attempt == CALL_TRIES:
                return {"failed": True, "detail": f"{type(exc).__name__}: {exc}"}
            time.sleep(CALL_RETRY_SECONDS)  # the server or the pooler is coming back from a fault
    return {}


class PipelineOperator:
    """Carries out a planned pause and its resume; ``log`` holds what it did (the record's ``controls``)."""

    def __init__(self, *, workers_ready: Callable[[], bool] = lambda: True) -> None:
        self.log: list[dict] = []
        self.workers_ready = workers_ready
        self._started = 0.0

    def run(self, planned: PlannedPause | None, started: float, stop: threading.Event) -> None:
        if planned is None:
            return
        self._started = started
        if stop.wait(max(0.0, started + planned.at - time.monotonic())):
            return
        while not self.workers_ready():
            if stop.wait(READY_POLL_SECONDS):
                return
        self._act("pause", planned.pipeline)
        if not stop.wait(planned.seconds):
            self._act("resume", planned.pipeline)

    def _act(self, action: str, pipeline: str) -> None:
        from tasks.exceptions import PipelineControlRefused
        from tasks.lifecycle.controls import pipeline_pause, pipeline_resume

        service = pipeline_pause if action == "pause" else pipeline_resume
        entry = {"action": action, "pipeline": pipeline, "called_at": _now()}
        entry |= call_through_faults(
            lambda: service(pipeline=pipeline, actor=ACTOR, reason=f"chaos campaign: {action}"),
            refused=PipelineControlRefused,
        )
        entry["returned_at"] = _now()
        entry["at"] = round(time.monotonic() - self._started, 2)  # seconds after the start, as a fault's
        self.log.append(entry)
        logger.info("pipeline %s %s at %s", pipeline, action, entry["returned_at"])
