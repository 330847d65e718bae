"""The dashboard's per-minute charts (tasks finished by outcome, retries) and its auto-refresh control."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from dlq.activity import ACTIVITY_HOURS, minute_activity, retries_per_minute, tasks_finished_per_minute
from tasks.models import AttemptKind, AttemptOutcome, StepAttempt, Task, TaskState
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import plan_uses_index, planner_statistics_of_a_live_table

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 12, 1, 12, 30, 40, tzinfo=UTC)
MINUTES = ACTIVITY_HOURS * 60
SVG_NS = "{http://www.w3.org/2000/svg}"


def finished(state: str, at: datetime) -> Task:
    task = task_submit(pipeline="t_local", input={})
    with door_forced():
        Task.objects.filter(pk=task.pk).update(state=state, finished_at=at)
    return task


def attempt(at: datetime, *, retried: bool, kind: str = AttemptKind.STEP) -> StepAttempt:
    task = task_submit(pipeline="t_local", input={})
    return StepAttempt.objects.create(
        task=task,
        kind=kind,
        step_index=0,
        step_name="local_a",
        attempt=1,
        started_at=at - timedelta(seconds=1),
        finished_at=at,
        outcome=AttemptOutcome.TRANSIENT_ERROR if retried else AttemptOutcome.PERMANENT_ERROR,
        retry_delay_seconds=2.5 if retried else None,
    )


def index_of(at: datetime) -> int:
    """The chart point of the minute ``at`` falls in (the last point is NOW's minute)."""
    current = NOW.replace(second=0, microsecond=0)
    return MINUTES - 1 - int((current - at.replace(second=0, microsecond=0)).total_seconds() // 60)


@pytest.fixture
def admin_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-for-tests-only"))
    return client


def test_tasks_finished_are_counted_per_minute_and_outcome(clean_redis):
    five_ago = NOW - timedelta(minutes=5, seconds=10)  # 12:25:30
    for _ in range(3):
        finished(TaskState.SUCCEEDED, five_ago)
    finished(TaskState.FAILED, five_ago + timedelta(seconds=20))  # the same minute
    finished(TaskState.COMPENSATED, NOW - timedelta(seconds=30))  # this minute
    finished(TaskState.COMPENSATION_FAILED, NOW - timedelta(hours=2, minutes=59))  # the first minute shown
    finished(TaskState.CANCELLED, NOW - timedelta(minutes=1))
    finished(TaskState.SUCCEEDED, NOW - timedelta(hours=3, minutes=1))  # before the window
    task_submit(pipeline="t_local", input={})  # not finished

    activity = minute_activity(now=NOW)

    assert len(activity.minutes) == MINUTES and activity.hours == ACTIVITY_HOURS
    assert activity.minutes[0] == datetime(2026, 12, 1, 9, 31, tzinfo=UTC)
    assert activity.minutes[-1] == datetime(2026, 12, 1, 12, 30, tzinfo=UTC)
    outcomes = ("succeeded", "failed", "compensated", "compensation_failed", "cancelled")
    expected = {state: [0] * MINUTES for state in outcomes}
    expected["succeeded"][index_of(five_ago)] = 3
    expected["failed"][index_of(five_ago)] = 1
    expected["compensated"][MINUTES - 1] = 1
    expected["compensation_failed"][0] = 1
    expected["cancelled"][MINUTES - 2] = 1
    assert activity.finished == expected
    assert activity.total_finished == 7


def test_retries_are_the_attempts_followed_by_a_scheduled_retry(clean_redis):
    ten_ago = NOW - timedelta(minutes=10)
    attempt(ten_ago, retried=True)
    attempt(ten_ago + timedelta(seconds=5), retried=True, kind=AttemptKind.COMPENSATION)
    attempt(ten_ago, retried=False)  # a permanent error: no retry
    attempt(NOW - timedelta(hours=4), retried=True)  # before the window
    attempt(NOW, retried=True)

    activity = minute_activity(now=NOW)

    expected = [0] * MINUTES
    expected[index_of(ten_ago)] = 2
    expected[MINUTES - 1] = 1
    assert activity.retries == expected and activity.total_retries == 3


def test_each_chart_is_one_grouped_query_through_its_index(clean_redis, django_assert_num_queries):
    start, end = NOW - timedelta(hours=3), NOW
    with django_assert_num_queries(2):
        minute_activity(now=NOW)
    # What production looks like to the planner: most tasks unfinished, most attempts not retried.
    planner_statistics_of_a_live_table()
    template = task_submit(pipeline="t_local", input={})
    with door_forced():
        StepAttempt.objects.bulk_create(
            StepAttempt(
                task=template, kind=AttemptKind.STEP, step_index=0, step_name="local_a", attempt=n, started_at=NOW
            )
            for n in range(1, 2001)
        )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {StepAttempt._meta.db_table}")
    # With sequential scans off, PostgreSQL picks the partial indexes only if the queries imply their predicates.
    finished_sql = Task.objects.filter(finished_at__gte=start, finished_at__lt=end)
    retried_sql = StepAttempt.objects.filter(retry_delay_seconds__isnull=False, finished_at__gte=start)
    for query, index in ((finished_sql, "task_finished_idx"), (retried_sql, "attempt_retried_idx")):
        plan = plan_uses_index(query.values_list("finished_at"), index)
        assert index in plan, plan
    assert tasks_finished_per_minute(start=start, end=end) == {}
    assert retries_per_minute(start=start, end=end) == {}


def _charts(body: str) -> dict[str, ET.Element]:
    charts = {}
    for section in ("ops-finished", "ops-retries"):
        match = re.search(rf'id="{section}".*?(<svg[^>]* class="svg-chart".*?</svg>)', body, re.DOTALL)
        assert match, f"no chart in #{section}"
        charts[section] = ET.fromstring(match.group(1))
    return charts


def test_the_dashboard_draws_both_charts(admin_client, clean_redis):
    now = datetime.now(UTC)
    for _ in range(2):
        finished(TaskState.SUCCEEDED, now - timedelta(minutes=1))
    finished(TaskState.FAILED, now - timedelta(minutes=1))
    attempt(now - timedelta(minutes=2), retried=True)

    response = admin_client.get("/admin/dashboard/")

    assert response.status_code == 200
    activity = response.context["dashboard"].activity
    assert activity.total_finished == 3 and activity.total_retries == 1
    charts = _charts(response.content.decode())
    lines = charts["ops-finished"].findall(f"{SVG_NS}polyline")
    assert [line.find(f"{SVG_NS}title").text for line in lines] == [
        "succeeded",
        "failed",
        "compensated",
        "compensation failed",
        "cancelled",
    ]
    assert all(len(line.get("points").split()) == MINUTES for line in lines)
    retries = charts["ops-retries"].findall(f"{SVG_NS}polyline")
    assert len(retries) == 1 and len(retries[0].get("points").split()) == MINUTES


def test_the_dashboard_refreshes_itself_every_15_seconds_with_a_pause_control(admin_client, clean_redis):
    body = admin_client.get("/admin/dashboard/").content.decode()
    assert re.search(r'<div class="ops-refresh" id="ops-refresh" data-seconds="15"', body)
    assert 'id="ops-refresh-toggle"' in body and "Pause auto-refresh" in body
    assert 'data-resume-label="Resume auto-refresh"' in body
    assert re.search(r'<script src="/static/dlq/dashboard_refresh\.js" defer>', body)
    # The figures the script swaps in come from the same page: one element holds them all.
    assert body.index('id="ops-live"') < body.index('id="ops-open-items"') < body.index('id="ops-finished"')
    chinese = admin_client.get("/admin/dashboard/", HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
    assert "Pause auto-refresh" not in chinese
