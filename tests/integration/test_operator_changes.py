"""An operator's audited change ends one way for a pipeline's controls and a schedule alike (issue 42, point 3):
``tasks.lifecycle.operator_changes.change_saved`` checks and strips the reason (a missing or too long one refuses
the change and keeps nothing), saves the row, sends the kind's signal (the audit entry, in the same transaction)
and logs one line."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from dlq.models import AuditEntry
from tasks import Pipeline, registry
from tasks.exceptions import PipelineControlRefused, ScheduleRefused
from tasks.lifecycle import pipeline_limits_set, pipeline_pause, schedule_add
from tasks.models import PipelineControl, PipelineSchedule

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pipeline():
    declared = Pipeline("oc_pipeline")
    declared.step(lambda ctx: None, name="work")
    yield declared
    registry.unregister("oc_pipeline")


def add(name: str, reason: str) -> PipelineSchedule:
    return schedule_add(
        name=name, pipeline="oc_pipeline", every=timedelta(minutes=5), actor="operator:sue", reason=reason
    )


CHANGES = {
    "pause": (lambda reason: pipeline_pause(pipeline="oc_pipeline", actor="operator:sue", reason=reason)),
    "limits": (
        lambda reason: pipeline_limits_set(
            pipeline="oc_pipeline", actor="operator:sue", reason=reason, max_concurrency=3
        )
    ),
    "schedule": (lambda reason: add("oc-every-5m", reason)),
}
REFUSALS = {"pause": PipelineControlRefused, "limits": PipelineControlRefused, "schedule": ScheduleRefused}


def kept() -> tuple:
    control = PipelineControl.objects.filter(pipeline="oc_pipeline").first()
    return (
        control and (control.paused, control.max_concurrency),
        PipelineSchedule.objects.filter(name="oc-every-5m").exists(),
        AuditEntry.objects.count(),
    )


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_missing_or_too_long_reason_refuses_the_change_and_keeps_nothing(pipeline, change):
    before = kept()
    for reason, code in (("", "reason_required"), ("   ", "reason_required"), ("r" * 1001, "reason_too_long")):
        with pytest.raises(REFUSALS[change]) as refused:
            CHANGES[change](reason)
        assert refused.value.code == code
        assert kept() == before, reason[:10]


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_the_reason_is_stripped_once_for_the_row_the_audit_entry_and_the_log(pipeline, change, caplog):
    with caplog.at_level(logging.INFO, logger="tasks.lifecycle.operator_changes"):
        CHANGES[change]("  the platform is down \n")
    (entry,) = AuditEntry.objects.all()
    assert (entry.reason, entry.actor) == ("the platform is down", "sue")  # the console names its users
    (line,) = [record for record in caplog.records if record.name == "tasks.lifecycle.operator_changes"]
    assert line.by == "operator:sue" and line.event == entry.action
    if change == "pause":
        assert PipelineControl.objects.get(pipeline="oc_pipeline").pause_reason == "the platform is down"
    if change == "schedule":
        # Its input is the schedule's business: the line names the schedule, not what it submits.
        assert line.schedule == "oc-every-5m" and not hasattr(line, "input")
