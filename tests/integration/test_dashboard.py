"""The operator dashboard: access, each figure from data made through the engine, the SVG, Redis down, query count."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rq import Worker

from dlq.actions import ActionDenied, ActionRefused, dlq_item_act
from dlq.audit import audit_entries_purge, audit_record
from dlq.dashboard import GROWTH_HOURS, dlq_hourly_growth, task_state_counts
from dlq.models import AuditEntry, AuditOutcome, DLQItem
from dlq.svg_charts import Series, line_chart
from tasks.delivery.enqueue import get_queue
from tasks.delivery.sweeper import sweeper_heartbeat
from tasks.execution.runner import task_run
from tasks.lifecycle.cancellation import task_cancel
from tasks.lifecycle.retention import TASKS_KIND, finished_tasks_purge
from tasks.models import (
    Checkpoint,
    DLQStatus,
    RetentionPurge,
    SideEffect,
    StepAttempt,
    SweeperHeartbeat,
    Task,
    TaskState,
)
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import index_scans, statement_plan_uses_index

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/dashboard/"
SVG_NS = "{http://www.w3.org/2000/svg}"
NBSP = "\xa0"  # timesince puts one between a number and its unit
# Session, user, tasks, open items, growth (two), sweeper, operator actions, alert rules, alert
# history, rows held and the last purges: fixed whatever the data size.
PAGE_QUERIES = 17  # 12, two for paused pipelines and held tasks, one per per-minute chart (dlq.activity), waiting tasks


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser("root", password="pw-for-tests-only")


@pytest.fixture
def admin_client(client, superuser):
    client.force_login(superuser)
    return client


def _staff(username: str, *permissions: str):
    user = get_user_model().objects.create_user(username, password="pw-for-tests-only", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="dlq", codename=codename))
    return user


def _dead_letter(
    *,
    pipeline: str = "t_other",
    step: str = "s1",
    code: str = "boom",
    age: timedelta = timedelta(0),
    resolved_age: timedelta | None = None,
    now: datetime | None = None,
) -> DLQItem:
    """One DLQ item (with its own task) created ``age`` before ``now``, resolved ``resolved_age`` before if given."""
    task = task_submit(pipeline="t_local", input={})
    item = DLQItem.objects.create(
        task=task,
        pipeline=pipeline,
        reason_code="permanent_error",
        reason="made by a test",
        error_code=code,
        failing_step=step,
        fingerprint=f"{pipeline}:{step}:{code}",
        status=DLQStatus.OPEN if resolved_age is None else DLQStatus.RESOLVED,
    )
    now = now or timezone.now()
    with door_forced():
        DLQItem.objects.filter(pk=item.pk).update(
            created_at=now - age, resolved_at=None if resolved_age is None else now - resolved_age
        )
    return item


def _failed_task() -> Task:
    """A t_local task that fails permanently at local_b and is compensated: it leaves one DLQ item."""
    task = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    task_run(task_id=str(task.pk), worker="w1")
    return Task.objects.get(pk=task.pk)


def _svg(body: str) -> ET.Element:
    match = re.search(r'<svg[^>]* class="svg-chart".*?</svg>', body, re.DOTALL)
    assert match, "the page has no chart"
    return ET.fromstring(match.group(0))


# --- access ---------------------------------------------------------------------------


def test_anonymous_users_are_sent_to_the_login_page(client):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_the_dlq_view_permission_are_refused(client):
    client.force_login(_staff("no-dlq"))
    assert client.get(URL).status_code == 403
    assert 'href="/admin/dashboard/"' not in client.get("/admin/").content.decode()


def test_staff_with_the_dlq_view_permission_see_the_dashboard(client, clean_redis):
    client.force_login(_staff("viewer", "view_dlqitem"))
    response = client.get(URL)
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    assert 'href="/admin/dashboard/"' in client.get("/admin/").content.decode()


def test_the_admin_index_links_to_the_dashboard_and_keeps_the_app_list(admin_client):
    body = admin_client.get("/admin/").content.decode()
    assert 'id="operator-dashboard-module"' in body and 'href="/admin/dashboard/"' in body
    assert body.index('href="/admin/dashboard/"') < body.index('href="/admin/dlq/dlqitem/"')
    assert 'href="/admin/tasks/task/"' in body


# --- figures ----------------------------------------------------------------------------


def test_tasks_of_the_last_24_hours_are_counted_per_state(admin_client, clean_redis):
    for _ in range(2):
        task_submit(pipeline="t_local", input={})
    task_submit(pipeline="t_local", input={}, run_at=3600)
    succeeded = task_submit(pipeline="t_local", input={})
    task_run(task_id=str(succeeded.pk), worker="w1")
    _failed_task()
    cancelled = task_submit(pipeline="t_local", input={})
    task_cancel(task_id=cancelled.pk, actor="client:a", reason="not needed")
    old = task_submit(pipeline="t_local", input={})
    with door_forced():
        Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=25))

    response = admin_client.get(URL)

    assert response.status_code == 200
    states = response.context["dashboard"].task_states
    assert {row.state: row.count for row in states.counts} == {
        TaskState.QUEUED: 2,
        TaskState.RUNNING: 0,
        TaskState.RETRY_SCHEDULED: 0,
        TaskState.WAITING: 1,
        TaskState.SUCCEEDED: 1,
        TaskState.FAILED: 0,
        TaskState.COMPENSATING: 0,
        TaskState.COMPENSATED: 1,
        TaskState.COMPENSATION_FAILED: 0,
        TaskState.CANCELLED: 1,
    }
    assert states.total == 6
    body = response.content.decode()
    for state in TaskState:
        assert f'id="ops-state-{state.value}"' in body
    assert re.search(r'id="ops-state-queued"><th scope="row">Queued</th>\s*<td class="ops-number">2</td>', body)
    assert re.search(r'id="ops-state-running">.*?<td class="ops-number ops-zero">0</td>', body, re.DOTALL)


def test_open_items_oldest_age_and_failure_groups(admin_client, clean_redis):
    _failed_task()
    _failed_task()
    _dead_letter(age=timedelta(hours=5, minutes=10))
    _dead_letter(age=timedelta(hours=1))
    _dead_letter(age=timedelta(hours=9), resolved_age=timedelta(hours=2))  # resolved: left out
    _dead_letter(pipeline="t_odd", step="a b&c", code="x", age=timedelta(minutes=3))

    response = admin_client.get(URL)

    assert response.status_code == 200
    board = response.context["dashboard"]
    assert board.open_items.total == 5
    assert [(row.pipeline, row.count) for row in board.open_items.by_pipeline] == [
        ("t_local", 2),
        ("t_other", 2),
        ("t_odd", 1),
    ]
    assert board.open_items.in_other_pipelines == 0
    assert board.open_items.oldest_age == f"5{NBSP}hours"

    groups = {group.fingerprint: group for group in board.open_items.failure_groups}
    assert list(groups) == ["t_local:local_b:refused", "t_other:s1:boom", "t_odd:a b&c:x"]
    local = groups["t_local:local_b:refused"]
    assert (local.pipeline, local.failing_step, local.error_code, local.count) == ("t_local", "local_b", "refused", 2)
    other = groups["t_other:s1:boom"]
    assert other.count == 2 and other.last_seen - other.first_seen > timedelta(hours=4)

    body = response.content.decode()
    assert f"Oldest open item: 5{NBSP}hours old." in body
    assert 'id="ops-open-total">5' in body
    assert '<a href="/admin/dlq/dlqitem/?fingerprint=t_local%3Alocal_b%3Arefused">t_local:local_b:refused</a>' in body
    # The fingerprint is URL-encoded in the link and HTML-escaped in the text.
    assert '<a href="/admin/dlq/dlqitem/?fingerprint=t_odd%3Aa+b%26c%3Ax">t_odd:a b&amp;c:x</a>' in body


def test_open_items_beyond_the_top_ten_pipelines_are_summed(admin_client, clean_redis):
    for index in range(12):
        _dead_letter(pipeline=f"p{index:02d}")
    _dead_letter(pipeline="p00")

    open_items = admin_client.get(URL).context["dashboard"].open_items

    assert open_items.total == 13
    assert len(open_items.by_pipeline) == 10
    assert open_items.by_pipeline[0].pipeline == "p00" and open_items.by_pipeline[0].count == 2
    assert open_items.in_other_pipelines == 2


def test_growth_is_counted_per_hour_over_seven_days(clean_redis):
    now = timezone.now()
    created_hours_ago = [0, 0, 1, 5, 30, 100, 167]  # all inside the 168 one-hour buckets
    items = [_dead_letter(age=timedelta(hours=hours), now=now) for hours in created_hours_ago]
    outside = _dead_letter(age=timedelta(hours=168), now=now)
    resolved = {items[4].pk: 3, items[5].pk: 3, outside.pk: 2}
    for pk, hours_ago in resolved.items():
        with door_forced():
            resolved_at = now - timedelta(hours=hours_ago)
            DLQItem.objects.filter(pk=pk).update(status=DLQStatus.RESOLVED, resolved_at=resolved_at)

    growth = dlq_hourly_growth(now=now)

    assert len(growth.hours) == len(growth.created) == len(growth.resolved) == GROWTH_HOURS
    assert growth.hours[-1] == now.replace(minute=0, second=0, microsecond=0)
    assert growth.total_created == len(created_hours_ago)
    assert {GROWTH_HOURS - 1 - index: count for index, count in enumerate(growth.created) if count} == {
        0: 2,
        1: 1,
        5: 1,
        30: 1,
        100: 1,
        167: 1,
    }
    assert {GROWTH_HOURS - 1 - index: count for index, count in enumerate(growth.resolved) if count} == {3: 2, 2: 1}
    assert growth.total_resolved == 3


def test_growth_counts_each_hour_as_a_range_of_its_index_without_grouping_the_rows(clean_redis):
    now = timezone.now()
    _dead_letter(age=timedelta(hours=2), resolved_age=timedelta(hours=1), now=now)
    with CaptureQueriesContext(connection) as captured:
        growth = dlq_hourly_growth(now=now)
    assert growth.total_created == growth.total_resolved == 1
    created, resolved = (query["sql"] for query in captured.captured_queries)
    for sql, index in ((created, "dlq_created_idx"), (resolved, "dlq_resolved_idx")):
        plan = statement_plan_uses_index(sql, table=DLQItem._meta.db_table, index=index)
        # Grouped by a truncated time, every row of the week was read, truncated and hashed (44 ms at a million
        # items); a count per hour reads the same index entries and nothing else (17 ms).
        assert index in {name for _, name in index_scans(plan)}, plan
        assert "Group Key" not in plan, plan


def test_task_states_are_counted_from_the_state_and_creation_index_alone(clean_redis):
    _failed_task()
    task_submit(pipeline="t_local", input={})
    with CaptureQueriesContext(connection) as captured:
        counts = task_state_counts(now=timezone.now())
    assert {row.state: row.count for row in counts.counts if row.count} == {"compensated": 1, "queued": 1}
    (sql,) = (query["sql"] for query in captured.captured_queries)
    plan = statement_plan_uses_index(sql, table=Task._meta.db_table, index="task_state_created_idx")
    # The states bound the scan: each state's range of the day in the index, not the whole index filtered on
    # its second column. Whether PostgreSQL then reads the ranges index-only or through a bitmap depends on the
    # visibility map (how recently the table was vacuumed), not on the query.
    assert "task_state_created_idx" in {name for _, name in index_scans(plan)}, plan
    assert re.search(r"Index Cond: \(+(\(state\)::text|state) = ANY", plan), plan
    assert "Filter" not in plan, plan


def test_the_growth_chart_is_well_formed_svg_with_two_series_axes_and_a_legend(admin_client, clean_redis):
    _dead_letter(age=timedelta(hours=2))
    _dead_letter(age=timedelta(hours=50), resolved_age=timedelta(hours=1))

    body = admin_client.get(URL).content.decode()
    svg = _svg(body)

    assert svg.tag == f"{SVG_NS}svg"
    assert svg.find(f"{SVG_NS}title").text == "Dead letters per hour, last 7 days"
    lines = svg.findall(f"{SVG_NS}polyline")
    assert [line.find(f"{SVG_NS}title").text for line in lines] == ["new", "resolved"]
    assert all(len(line.get("points").split()) == GROWTH_HOURS for line in lines)
    texts = [text.text for text in svg.iter(f"{SVG_NS}text")]
    assert "new" in texts and "resolved" in texts  # the legend
    assert "0" in texts and "1" in texts  # y axis
    assert len([text for text in texts if re.fullmatch(r"\w{3} \d\d:00", text or "")]) == 7  # one x label a day
    assert "New items: 2. Resolved items: 1." in body
    assert "<script" not in body.split('id="ops-growth"')[1].split("</svg>")[0]


def test_chart_labels_are_escaped_and_the_markup_stays_xml():
    hostile = '<script>alert("x")</script> & more'
    svg = str(
        line_chart(
            title=hostile,
            description=hostile,
            series=[Series(label=hostile, values=[0, 3, 12], colour='red" onload="x')],
            x_labels={0: hostile, 2: "end"},
        )
    )
    assert "<script>" not in svg and 'onload="x"' not in svg
    root = ET.fromstring(svg)
    assert root.find(f"{SVG_NS}title").text == hostile
    # y labels in steps of 5 up to 15, the two x labels, the legend
    assert [text.text for text in root.iter(f"{SVG_NS}text")] == ["0", "5", "10", "15", hostile, "end", hostile]
    assert root.find(f"{SVG_NS}polyline").get("stroke") == 'red" onload="x'


def test_queue_lengths_and_live_workers_come_from_redis(admin_client, clean_redis):
    task_submit(pipeline="t_local", input={})
    task_submit(pipeline="t_local", input={})
    queue = get_queue()
    worker = Worker([queue], connection=queue.connection, name="dashboard-test-worker")
    worker.register_birth()
    try:
        response = admin_client.get(URL)
    finally:
        worker.register_death()

    figures = response.context["dashboard"].queue
    assert figures.available
    assert (figures.queued, figures.scheduled, figures.started, figures.failed) == (2, 0, 0, 0)
    assert figures.workers == ("dashboard-test-worker",)
    body = response.content.decode()
    assert 'id="ops-queue-queued">2<' in body
    assert "<li>dashboard-test-worker</li>" in body
    assert 'id="ops-redis-unavailable"' not in body and 'class="ops-unavailable"' not in body


def test_each_queue_shows_its_depth_and_oldest_job(admin_client, clean_redis):
    task_submit(pipeline="t_bulk", input={})
    task_submit(pipeline="t_bulk", input={})
    task_submit(pipeline="t_critical", input={})

    response = admin_client.get(URL)

    figures = response.context["dashboard"].queue
    depths = [(backlog.name, backlog.depth) for backlog in figures.queues]
    assert depths == [("critical", 1), ("default", 0), ("bulk", 2)]
    assert figures.queued == 3
    bulk = figures.queues[2]
    assert bulk.oldest_enqueued_at is not None and figures.queues[1].oldest_enqueued_at is None
    body = response.content.decode()
    row = body.split('id="ops-queue-bulk">')[1].split("</tr>")[0]
    assert '<td class="ops-number ops-queue-depth">2</td>' in row and " old</td>" in row
    assert '<td class="ops-queue-oldest">-</td>' in body.split('id="ops-queue-default">')[1].split("</tr>")[0]


def test_the_sweeper_warning_shows_when_it_never_ran_or_is_late(admin_client, clean_redis, settings):
    settings.RELIABILITY_SWEEP_INTERVAL_SECONDS = 5
    body = admin_client.get(URL).content.decode()
    assert "No sweeper has ever run" in body

    sweeper_heartbeat(name="host:1")
    response = admin_client.get(URL)
    sweeper = response.context["dashboard"].sweeper
    assert not sweeper.stale and sweeper.last_run_at is not None
    assert "Sweeper last ran at" in response.content.decode()
    assert "ops-warning" not in response.content.decode().split('id="ops-sweeper"')[1].split("</div>")[0]

    SweeperHeartbeat.objects.filter(name="host:1").update(last_run_at=timezone.now() - timedelta(seconds=16))
    response = admin_client.get(URL)
    sweeper_part = response.content.decode().split('id="ops-sweeper"')[1].split("</div>")[0]
    assert response.context["dashboard"].sweeper.stale
    assert 'class="ops-warning"' in sweeper_part and "more than 15 seconds" in sweeper_part
    assert re.search(rf"\((1[6-9]|2\d){NBSP}seconds ago\)", sweeper_part)

    # The latest heartbeat of any sweeper process counts.
    sweeper_heartbeat(name="host:2")
    assert not admin_client.get(URL).context["dashboard"].sweeper.stale


def test_operator_actions_of_the_last_24_hours_are_counted_by_outcome(admin_client, superuser, clean_redis):
    first, second = _failed_task(), _failed_task()
    first_item, second_item = first.dlq_items.get(), second.dlq_items.get()
    dlq_item_act(item_id=first_item.pk, action="close", actor=superuser, reason="done", resolution_code="ignored")
    with pytest.raises(ActionRefused):
        dlq_item_act(item_id=first_item.pk, action="close", actor=superuser, reason="again", resolution_code="ignored")
    with pytest.raises(ActionDenied):
        dlq_item_act(item_id=second_item.pk, action="retry", actor=_staff("no-retry"), reason="try")
    dlq_item_act(item_id=second_item.pk, action="retry_from_start", actor=superuser, reason="go")

    response = admin_client.get(URL)

    activity = response.context["dashboard"].operator_activity
    assert [value for value, _label in activity.outcomes] == ["succeeded", "denied", "refused", "failed"]
    assert {row.action: row.counts for row in activity.rows} == {
        "close": (1, 0, 1, 0),
        "retry": (0, 1, 0, 0),
        "retry_from_start": (1, 0, 0, 0),
    }
    assert activity.totals == (2, 1, 1, 0) and activity.total == 4
    body = response.content.decode()
    close_row = body.split('id="ops-action-close"')[1].split("</tr>")[0]
    assert "Close" in close_row and re.findall(r">(\d+)</td>", close_row) == ["1", "0", "1", "0", "2"]


def test_the_alerts_section_shows_firing_rules_and_history(admin_client, clean_redis):
    from dlq.alerting.models import AlertRule
    from dlq.alerting.rules import alerts_evaluate

    AlertRule.objects.all().delete()
    body = admin_client.get(URL).content.decode()
    assert 'id="ops-alerts-ok"' in body and "No alert events yet." in body

    AlertRule.objects.create(name="any open item", kind="open_items", threshold=0)
    _failed_task()
    alerts_evaluate()
    body = admin_client.get(URL).content.decode()
    firing = body.split('id="ops-alerts-firing"')[1].split("</ul>")[0]
    assert "any open item" in firing
    history = body.split('id="ops-alert-history"')[1].split("</table>")[0]
    assert "any open item" in history and "1 open DLQ items" in history


# --- robustness ------------------------------------------------------------------------


def test_rows_held_are_postgresqls_estimates_and_the_last_purges_are_shown(admin_client, clean_redis, settings):
    for _ in range(3):
        task_run(task_id=str(task_submit(pipeline="t_local", input={}).pk), worker="w1")
    _failed_task()
    with connection.cursor() as cursor:
        for table in ("tasks_task", "tasks_stepattempt", "tasks_checkpoint", "tasks_sideeffect", "dlq_dlqitem"):
            cursor.execute(f"ANALYZE {table}")

    response = admin_client.get(URL)

    data = response.context["dashboard"].data
    assert data.estimated
    held = {row.table: row.rows for row in data.tables}
    assert held["tasks_task"] == Task.objects.count() == 4
    assert held["tasks_stepattempt"] == StepAttempt.objects.count() > 0
    assert held["tasks_checkpoint"] == Checkpoint.objects.count() > 0
    assert held["tasks_sideeffect"] == SideEffect.objects.count() > 0
    assert held["dlq_dlqitem"] == 1
    body = response.content.decode()
    assert "Finished tasks are kept 30 days." in body and "No finished task has been purged yet." in body
    assert "Audit entries are kept forever." in body

    with door_forced():
        Task.objects.filter(state=TaskState.SUCCEEDED).update(finished_at=timezone.now() - timedelta(days=31))
    report = finished_tasks_purge(older_than=timedelta(days=30), batch_size=100)
    audit_record(actor="a", action="close", target_type="dlqitem", target_id="1", outcome=AuditOutcome.SUCCEEDED)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE dlq_auditentry SET created_at = now() - interval '10 days'")
        cursor.execute("RESET session_replication_role")
    audit_entries_purge(older_than=timedelta(days=7))
    settings.RELIABILITY_AUDIT_RETENTION_DAYS = 7

    body = admin_client.get(URL).content.decode()

    assert f"3 tasks and {report.total_rows} rows in" in body
    assert 'id="ops-purge-behind"' not in body
    assert "Audit entries are kept 7 days." in body and "Last audit purge:" in body and "1 entries." in body
    assert AuditEntry.objects.filter(action="audit_purged").count() == 1

    RetentionPurge.objects.filter(kind=TASKS_KIND).update(caught_up=False)
    assert 'id="ops-purge-behind"' in admin_client.get(URL).content.decode()


def test_the_page_renders_when_redis_is_down(admin_client, clean_redis, redis_server):
    _failed_task()
    redis_server.stop()
    try:
        response = admin_client.get(URL)
        assert response.status_code == 200
        figures = response.context["dashboard"].queue
        assert not figures.available and figures.queued is None and figures.workers is None
        body = response.content.decode()
        assert 'id="ops-redis-unavailable"' in body
        assert body.count('<span class="ops-unavailable">unavailable</span>') == 5
        # The database figures are still there.
        assert response.context["dashboard"].open_items.total == 1
        _svg(body)
    finally:
        redis_server.start()
    assert admin_client.get(URL).context["dashboard"].queue.available


def test_the_number_of_queries_does_not_depend_on_the_number_of_items(
    admin_client, superuser, clean_redis, django_assert_max_num_queries
):
    _failed_task()
    _dead_letter(age=timedelta(hours=3))
    with django_assert_max_num_queries(PAGE_QUERIES):
        assert admin_client.get(URL).status_code == 200

    for index in range(30):
        _dead_letter(
            pipeline=f"p{index % 12}",
            code=f"e{index % 7}",
            age=timedelta(hours=index * 5),
            resolved_age=timedelta(hours=index) if index % 3 == 0 else None,
        )
    for _ in range(3):
        _failed_task()
    SweeperHeartbeat.objects.create(name="other:1", last_run_at=timezone.now(), runs=1)
    item = DLQItem.objects.filter(status=DLQStatus.COMPENSATED).first()
    dlq_item_act(item_id=item.pk, action="close", actor=superuser, reason="done", resolution_code="ignored")

    with django_assert_max_num_queries(PAGE_QUERIES):
        response = admin_client.get(URL)
    assert response.status_code == 200
    assert len(response.context["dashboard"].open_items.failure_groups) == 10
