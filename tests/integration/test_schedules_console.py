"""The Schedules page and its actions, as each role, against real PostgreSQL: supervisors add, change, pause and
resume (each audited once, in the change's transaction); a viewer sees the page and a POST is a 403 and an audit
entry."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse

from dlq.models import AuditEntry, AuditOutcome
from tasks import Pipeline, Schedule, registry
from tasks.lifecycle.schedules import schedules_fire_due, schedules_sync
from tasks.models import PipelineSchedule, ScheduleSource

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean(clean_redis):
    yield


@pytest.fixture
def nightly():
    pipeline = Pipeline("sch_console", schedules=[Schedule(every=timedelta(minutes=1), name="sch-console-code")])
    pipeline.step(lambda ctx: None, name="work")
    schedules_sync()
    yield PipelineSchedule.objects.get(name="sch-console-code")
    registry.unregister("sch_console")


def entries(**filters) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(target_type="schedule", **filters).order_by("id"))


def test_the_page_shows_each_schedule_and_its_last_runs_with_their_tasks(client, role_users, nightly):
    schedules_fire_due(now=nightly.next_slot_at + timedelta(seconds=1))
    client.force_login(role_users["viewer"])
    page = client.get(reverse("schedules"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "sch-console-code" in text and "every 60 s" in text
    run = PipelineSchedule.objects.get(pk=nightly.pk)
    assert reverse("admin:tasks_task_change", args=[run.last_task_id]) in text
    # A viewer is offered no action.
    assert "schedule-action" not in text and "schedule-add" not in text


def test_a_supervisor_pauses_and_resumes_a_code_schedule_audited(client, role_users, nightly):
    client.force_login(role_users["supervisor"])
    url = reverse("schedule_act", args=[nightly.pk, "pause"])
    assert client.get(url).status_code == 200
    assert not PipelineSchedule.objects.get(pk=nightly.pk).paused  # nothing on GET
    response = client.post(url, {"reason": "vendor maintenance"})
    assert response.status_code == 302
    assert PipelineSchedule.objects.get(pk=nightly.pk).paused
    assert schedules_fire_due(now=nightly.next_slot_at + timedelta(minutes=3)).fired == 0
    client.post(reverse("schedule_act", args=[nightly.pk, "resume"]), {"reason": "back"})
    assert not PipelineSchedule.objects.get(pk=nightly.pk).paused
    audited = entries(outcome=AuditOutcome.SUCCEEDED)
    assert [(e.action, e.actor, e.state_before, e.state_after, e.reason) for e in audited] == [
        ("schedule_paused", "supervisor-r", "running", "paused", "vendor maintenance"),
        ("schedule_resumed", "supervisor-r", "paused", "running", "back"),
    ]
    # A code schedule's definition is not changed here.
    assert client.get(reverse("schedule_change", args=[nightly.pk])).status_code == 404


def test_a_supervisor_adds_and_changes_a_console_schedule_audited(client, role_users, nightly):
    client.force_login(role_users["supervisor"])
    form = {
        "name": "weekly-digest",
        "pipeline": "sch_console",
        "cron": "0 6 * * 1",
        "timezone": "Europe/Berlin",
        "every_seconds": "",
        "input": json.dumps({"kind": "weekly"}),
        "overlap": "skip",
        "catch_up_seconds": "",
        "reason": "weekly report for sales",
    }
    assert client.get(reverse("schedule_add")).status_code == 200
    assert client.post(reverse("schedule_add"), form).status_code == 302
    added = PipelineSchedule.objects.get(name="weekly-digest")
    assert (added.source, added.cron, added.timezone, added.input) == (
        ScheduleSource.CONSOLE,
        "0 6 * * 1",
        "Europe/Berlin",
        {"kind": "weekly"},
    )
    bad = client.post(reverse("schedule_add"), {**form, "name": "other", "cron": "99 * * * *"})
    assert bad.status_code == 400 and not PipelineSchedule.objects.filter(name="other").exists()
    changed = client.post(
        reverse("schedule_change", args=[added.pk]),
        {**form, "cron": "", "every_seconds": "3600", "reason": "hourly now"},
    )
    assert changed.status_code == 302
    assert PipelineSchedule.objects.get(pk=added.pk).every_seconds == 3600
    actions = [(e.action, e.outcome) for e in entries(target_id="weekly-digest")]
    assert actions == [("schedule_added", "succeeded"), ("schedule_changed", "succeeded")]
    assert entries(target_id="other", outcome=AuditOutcome.REFUSED)


def test_a_viewer_posting_an_action_gets_403_and_an_audit_entry(client, role_users, nightly):
    client.force_login(role_users["viewer"])
    url = reverse("schedule_act", args=[nightly.pk, "pause"])
    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "let me"}).status_code == 403
    assert client.post(reverse("schedule_add"), {"name": "mine", "reason": "x"}).status_code == 403
    assert not PipelineSchedule.objects.get(pk=nightly.pk).paused
    denied = [(e.action, e.actor, e.target_id) for e in entries(outcome=AuditOutcome.DENIED)]
    assert denied == [("schedule_paused", "viewer-r", "sch-console-code"), ("schedule_added", "viewer-r", "mine")]
