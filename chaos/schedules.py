"""The campaign's schedule: a tick every 2 s, fired by the deployment's sweeper under every fault, paused at the end.

``chaos_tick`` (``chaos.pipelines``) declares ``Schedule(every=2 s, overlap="allow")``: every slot of the run
starts one task (a step that only returns), or is counted missed when no sweeper could fire it within its
catch-up window (the injected faults stall the sweeper: a database cut, a Redis restart). When the submissions
are done the campaign pauses the schedule through the engine (``tasks.lifecycle.schedules.schedule_pause``), so
the run settles, and keeps when it called and when the pause returned: no slot after that may fire.
``chaos.schedule_invariants`` judges the schedule's rows, its runs and their tasks.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from chaos.controls import ACTOR, call_through_faults

logger = logging.getLogger(__name__)

TICK_PIPELINE = "chaos_tick"
TICK_SCHEDULE = "chaos-tick"
TICK_SECONDS = 2.0


def pause_tick() -> dict:
    """Pause the campaign's schedule (again after a database fault); the log entry: called_at, returned_at."""
    from tasks.exceptions import ScheduleRefused
    from tasks.lifecycle.schedules import schedule_pause
    from tasks.models import PipelineSchedule

    def pause() -> None:
        row = PipelineSchedule.objects.filter(name=TICK_SCHEDULE).first()
        if row is None:
            raise ScheduleRefused("no schedule row: no sweeper synced the code's schedules")
        schedule_pause(schedule_id=row.pk, actor=ACTOR, reason="chaos campaign: the submissions are done")

    entry = {"action": "pause", "schedule": TICK_SCHEDULE, "called_at": datetime.now(UTC).isoformat()}
    entry |= call_through_faults(pause, refused=ScheduleRefused)
    entry["returned_at"] = datetime.now(UTC).isoformat()
    logger.info("schedule %s paused at %s", TICK_SCHEDULE, entry["returned_at"])
    return entry
