"""Schedules' rows: kept in step with the code, their due slots fired, and the console's changes.

The sweeper calls ``schedules_sync`` (the code's schedules as rows: one read, a write only for what changed) and
``schedules_fire_due`` on every sweep. A due slot is fired in one transaction under the schedule's row lock (SKIP
LOCKED: another sweeper moves on): a ``ScheduleRun`` row for the slot, whose unique (schedule, slot) index makes a
second firing of the same slot impossible whatever the locks did, and the task, submitted through
``task_submit`` under the idempotency key ``schedule:<name>:<slot, ISO UTC>``. Then the schedule's next slot.

After an outage only the latest missed slot runs, if it lies within the catch-up window; the others are counted
(``slots_missed``). With ``overlap="skip"``, a slot that comes while the last task is unfinished is counted
(``slots_skipped``, ``last_skipped_at``) and submits nothing.

The console adds, changes, pauses and resumes schedules here; each change sends ``schedule_changed`` inside its
transaction (the console audits it in the same commit). A code schedule's definition is the code's: only its pause
changes in the console.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.dispatch import Signal
from django.utils import timezone

from tasks import registry
from tasks.exceptions import ConfigurationError, ReliabilityError, ScheduleRefused
from tasks.lifecycle.operator_changes import ChangeKind, change_saved
from tasks.models import TERMINAL_STATES, PipelineSchedule, ScheduleRun, ScheduleSource, Task
from tasks.models.door import door
from tasks.pipelines.schedules import Schedule, name_check
from tasks.selectors.schedules import declared_schedules, schedule_of
from tasks.submission.submit import task_submit

logger = logging.getLogger(__name__)

# Schedules fired per sweep, the most overdue first (the rest in the next sweep).
BATCH_SIZE = 200
# Sent inside the change's transaction: sender=PipelineSchedule, schedule=, action=, actor=, reason=, before=,
# after=, client_ip=.
schedule_changed = Signal()
SCHEDULE_ADDED = "schedule_added"
SCHEDULE_CHANGED = "schedule_changed"
SCHEDULE_PAUSED = "schedule_paused"
SCHEDULE_RESUMED = "schedule_resumed"
# The idempotency key's prefix of a scheduled task: "schedule:<name>:<slot>".
KEY_PREFIX = "schedule"


@dataclass
class ScheduleSweep:
    """What one sweep did with the schedules' slots."""

    fired: int = 0
    skipped: int = 0  # overlap "skip": the last task was unfinished
    missed: int = 0  # outage: older than the catch-up window, or not the latest of the missed
    failed: int = 0  # the submission was refused (its error is on the schedule)


def slot_key(name: str, slot: datetime) -> str:
    """The idempotency key of the task of ``name``'s slot at ``slot``."""
    return f"{KEY_PREFIX}:{name}:{slot.astimezone(UTC).isoformat().replace('+00:00', 'Z')}"


def _definition(schedule: Schedule) -> dict[str, Any]:
    """The row's fields that hold ``schedule``'s definition."""
    window = schedule.catch_up_window
    return {
        "pipeline": schedule.pipeline,
        "cron": schedule.cron or "",
        "every_seconds": schedule.every_seconds,
        "timezone": schedule.timezone,
        "input": schedule.input,
        "overlap": str(schedule.overlap),
        "catch_up_seconds": window.total_seconds() if window is not None else None,
    }


@door
def schedules_sync(*, now: datetime | None = None) -> int:
    """Make the code's schedules rows: new ones added (first slot after now), changed definitions written (next
    slot recomputed), rows of schedules no longer declared left without a next slot. How many rows changed."""
    now = now or timezone.now()
    declared = declared_schedules()
    rows = {row.name: row for row in PipelineSchedule.objects.filter(source=ScheduleSource.CODE)}
    changed = 0
    for name, schedule in declared.items():
        definition = _definition(schedule)
        row = rows.get(name)
        if row is None:
            try:
                with transaction.atomic():
                    PipelineSchedule.objects.create(
                        name=name,
                        source=ScheduleSource.CODE,
                        next_slot_at=schedule.slot_after(now),
                        **definition,
                    )
                changed += 1
            except IntegrityError:
                # Another sweeper added it first, or the console has a schedule of this name: that one stays.
                continue
        elif row.next_slot_at is None or any(getattr(row, field) != value for field, value in definition.items()):
            updated = PipelineSchedule.objects.filter(pk=row.pk, updated_at=row.updated_at).update(
                next_slot_at=schedule.slot_after(now), last_error="", updated_at=now, **definition
            )
            changed += updated
    gone = [row.pk for name, row in rows.items() if name not in declared and row.next_slot_at is not None]
    if gone:
        changed += PipelineSchedule.objects.filter(pk__in=gone).update(next_slot_at=None, updated_at=now)
    return changed


@door
def schedules_fire_due(*, now: datetime | None = None) -> ScheduleSweep:
    """Fire the due slots of every schedule that is not paused, the most overdue first; what was done."""
    sweep = ScheduleSweep()
    now = now or timezone.now()
    due = PipelineSchedule.objects.filter(paused=False, next_slot_at__lte=now)
    for pk in list(due.order_by("next_slot_at", "pk").values_list("pk", flat=True)[:BATCH_SIZE]):
        with transaction.atomic():
            # SKIP LOCKED: a second sweeper moves on; and the row read again is no longer due once fired.
            row = due.select_for_update(skip_locked=True).filter(pk=pk).first()
            if row is not None:
                _fire(row, now, sweep)
    if sweep.fired or sweep.skipped or sweep.missed or sweep.failed:
        logger.info("schedules fired", extra={"event": "schedules_fired", **sweep.__dict__})
    return sweep


def _fire(row: PipelineSchedule, now: datetime, sweep: ScheduleSweep) -> None:
    try:
        schedule = schedule_of(row)
    except ConfigurationError as exc:
        row.last_error, row.next_slot_at = str(exc)[:1000], None
        row.save(update_fields=["last_error", "next_slot_at", "updated_at"])
        sweep.failed += 1
        return
    latest = schedule.slot_at_or_before(now)
    missed = schedule.slots_between(row.next_slot_at, latest)
    if now - latest > schedule.window:
        missed += 1  # the latest too is older than the catch-up window
    elif schedule.overlap == "skip" and _unfinished(row.last_task_id):
        row.slots_skipped += 1
        row.last_skipped_at = latest
        sweep.skipped += 1
    else:
        _submit(row, schedule, latest, sweep)
    if missed:
        row.slots_missed += missed
        sweep.missed += missed
        logger.warning(
            "schedule slots missed",
            extra={"event": "schedule_slots_missed", "schedule": row.name, "missed": missed},
        )
    row.last_slot_at = latest
    row.next_slot_at = schedule.slot_after(latest)
    row.save()


def _unfinished(task_id) -> bool:
    if task_id is None:
        return False
    return Task.objects.filter(pk=task_id).exclude(state__in=TERMINAL_STATES).exists()


def _submit(row: PipelineSchedule, schedule: Schedule, slot: datetime, sweep: ScheduleSweep) -> None:
    try:
        with transaction.atomic():
            run = ScheduleRun.objects.create(schedule=row, slot_at=slot)
    except IntegrityError:
        return  # this slot was fired already: its task stands
    try:
        with transaction.atomic():
            task = task_submit(
                pipeline=schedule.pipeline, input=schedule.input, idempotency_key=slot_key(row.name, slot)
            )
    except ReliabilityError as exc:
        run.error = row.last_error = f"{exc.code}: {exc}"[:1000]
        run.save(update_fields=["error"])
        sweep.failed += 1
        logger.warning(
            "schedule slot refused",
            extra={"event": "schedule_slot_refused", "schedule": row.name, "code": exc.code},
        )
        return
    run.task_id = row.last_task_id = task.pk
    run.save(update_fields=["task_id"])
    row.last_error = ""
    sweep.fired += 1


# --- the console's changes ----------------------------------------------------------------------------------------


@door
def schedule_add(
    *,
    name: str,
    pipeline: str,
    cron: str | None = None,
    every: timedelta | None = None,
    timezone_name: str = "UTC",
    input: Any = None,
    overlap: str = "skip",
    catch_up_window: timedelta | None = None,
    actor: str,
    reason: str,
    client_ip: str | None = None,
) -> PipelineSchedule:
    """Add a console schedule (first slot after now); ``ScheduleRefused`` for a bad definition or a taken name."""
    schedule = _checked(
        name=name,
        pipeline=pipeline,
        cron=cron,
        every=every,
        timezone=timezone_name,
        input=input,
        overlap=overlap,
        catch_up_window=catch_up_window,
    )
    try:
        with transaction.atomic():
            row = PipelineSchedule(
                name=schedule.name,
                source=ScheduleSource.CONSOLE,
                next_slot_at=schedule.slot_after(timezone.now()),
                changed_by=actor[:150],
                **_definition(schedule),
            )
            change_saved(
                SCHEDULE_CHANGE, row, action=SCHEDULE_ADDED, actor=actor, reason=reason, before={}, client_ip=client_ip
            )
    except IntegrityError:
        raise ScheduleRefused(
            f"a schedule named {schedule.name!r} exists already", code="name_taken", details={"name": schedule.name}
        ) from None
    return row


@door
def schedule_change(
    *,
    schedule_id: int,
    pipeline: str,
    cron: str | None = None,
    every: timedelta | None = None,
    timezone_name: str = "UTC",
    input: Any = None,
    overlap: str = "skip",
    catch_up_window: timedelta | None = None,
    actor: str,
    reason: str,
    client_ip: str | None = None,
) -> PipelineSchedule:
    """Change a console schedule's definition (its next slot recomputed from now); a code schedule's is refused."""
    with transaction.atomic():
        row, before = _locked(schedule_id)
        if row.source == ScheduleSource.CODE:
            raise ScheduleRefused(
                f"schedule {row.name!r} is declared in code: change it there",
                code="declared_in_code",
                details={"name": row.name},
            )
        schedule = _checked(
            name=row.name,
            pipeline=pipeline,
            cron=cron,
            every=every,
            timezone=timezone_name,
            input=input,
            overlap=overlap,
            catch_up_window=catch_up_window,
        )
        for field, value in _definition(schedule).items():
            setattr(row, field, value)
        row.next_slot_at = schedule.slot_after(timezone.now())
        row.changed_by = actor[:150]
        row.last_error = ""
        change_saved(
            SCHEDULE_CHANGE,
            row,
            action=SCHEDULE_CHANGED,
            actor=actor,
            reason=reason,
            before=before,
            client_ip=client_ip,
        )
    return row


@door
def schedule_pause(*, schedule_id: int, actor: str, reason: str, client_ip: str | None = None) -> PipelineSchedule:
    """Pause a schedule: none of its slots fires until it is resumed (they are not caught up)."""
    with transaction.atomic():
        row, before = _locked(schedule_id)
        if row.paused:
            raise ScheduleRefused(
                f"schedule {row.name!r} is already paused", code="already_paused", details={"name": row.name}
            )
        row.paused, row.paused_at, row.paused_by = True, timezone.now(), actor[:150]
        change_saved(
            SCHEDULE_CHANGE, row, action=SCHEDULE_PAUSED, actor=actor, reason=reason, before=before, client_ip=client_ip
        )
    return row


@door
def schedule_resume(*, schedule_id: int, actor: str, reason: str, client_ip: str | None = None) -> PipelineSchedule:
    """Resume a schedule: its next slot is the first after now (the slots of the pause are not caught up)."""
    with transaction.atomic():
        row, before = _locked(schedule_id)
        if not row.paused:
            raise ScheduleRefused(f"schedule {row.name!r} is not paused", code="not_paused", details={"name": row.name})
        row.paused = False
        if row.next_slot_at is not None:
            row.next_slot_at = schedule_of(row).slot_after(timezone.now())
        change_saved(
            SCHEDULE_CHANGE,
            row,
            action=SCHEDULE_RESUMED,
            actor=actor,
            reason=reason,
            before=before,
            client_ip=client_ip,
        )
    return row


def _checked(**fields: Any) -> Schedule:
    try:
        name_check(fields["name"])
        registry.get(fields["pipeline"])
        return Schedule(**fields)
    except ReliabilityError as exc:
        raise ScheduleRefused(str(exc), code="definition_invalid", details={"error": str(exc)}) from None


def _locked(schedule_id: int) -> tuple[PipelineSchedule, dict]:
    row = PipelineSchedule.objects.select_for_update().filter(pk=schedule_id).first()
    if row is None:
        raise ScheduleRefused("no such schedule", code="unknown_schedule", details={"id": schedule_id})
    return row, schedule_snapshot(row)


def schedule_snapshot(row: PipelineSchedule) -> dict[str, Any]:
    """What an audit entry records of a schedule before and after a change."""
    return {"paused": row.paused, "definition": schedule_of(row).describe(), "input": row.input}


SCHEDULE_CHANGE = ChangeKind(
    signal=schedule_changed,
    sender=PipelineSchedule,
    row_argument="schedule",
    snapshot=schedule_snapshot,
    refusal=ScheduleRefused,
    log_message="schedule changed",
    log_fields=lambda row: {"schedule": row.name},  # not its input: it may hold what a log must not
)
