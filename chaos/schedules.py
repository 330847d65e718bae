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
import time
from datetime import UTC, datetime

logger = logging.getLogger(__name__)

TICK_PIPELINE = "chaos_tick"
TICK_SCHEDULE = "chaos-tick"
TICK_SECONDS = 2.0
ACTOR = "operator:chaos"
CALL_TRIES = 5
CALL_RETRY_SECONDS = 0.5


def pause_tick() -> dict:
    """Pause the campaign's schedule (again after a database fault); the log entry: called_at, returned_at."""
    from django.db import DatabaseError, close_old_connections, connection

    from tasks.exceptions import ScheduleRefused
    from tasks.lifecycle.schedules import schedule_pause
    from tasks.models import PipelineSchedule

    entry = {"action": "pause", "schedule": TICK_SCHEDULE, "called_at": datetime.now(UTC).isoformat()}
    for attempt in range(1, CALL_TRIES + 1):
        close_old_connections()
        try:
            row = PipelineSchedule.objects.get(name=TICK_SCHEDULE)
            schedule_pause(schedule_id=row.pk, actor=ACTOR, reason="chaos campaign: the submissions are done")
            break
        except PipelineSchedule.DoesNotExist:
            entry.update(failed=True, detail="no schedule row: no sweeper synced the code's schedules")
            break
        except ScheduleRefused as exc:
            if attempt == 1:
                entry.update(failed=True, detail=str(exc))
            break  # a repeat refused: the earlier call committed although its answer was lost
        except DatabaseError as exc:
            connection.close()
            if attempt == CALL_TRIES:
                entry.update(failed=True, detail=f"{type(exc).__name__}: {exc}")
                break
            time.sleep(CALL_RETRY_SECONDS)
    entry["returned_at"] = datetime.now(UTC).isoformat()
    logger.info("schedule %s paused at %s", TICK_SCHEDULE, entry["returned_at"])
    return entry
