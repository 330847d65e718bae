"""Reads of schedules: the ones the code declares, and the definition a row holds."""

from __future__ import annotations

from datetime import timedelta

from tasks import registry
from tasks.models import PipelineSchedule
from tasks.pipelines.schedules import Schedule


def schedule_of(row: PipelineSchedule) -> Schedule:
    """The ``Schedule`` value of a row (its definition as stored)."""
    return Schedule(
        cron=row.cron or None,
        every=timedelta(seconds=row.every_seconds) if row.every_seconds is not None else None,
        timezone=row.timezone,
        input=row.input if row.input is not None else {},
        name=row.name,
        overlap=row.overlap,
        catch_up_window=timedelta(seconds=row.catch_up_seconds) if row.catch_up_seconds is not None else None,
        pipeline=row.pipeline,
    )


def declared_schedules() -> dict[str, Schedule]:
    """Every registered pipeline's schedules, by name."""
    return {
        schedule.name: schedule
        for pipeline in registry.all_pipelines()
        for schedule in getattr(pipeline, "schedules", ())
    }
