"""The task pages: a list whose filters and searches use indexes, and a read-only page per task."""

from __future__ import annotations

import html
import re
import uuid
import xml.etree.ElementTree as ET
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_fsm import transition

from dlq.audit import audit_record
from dlq.lifecycle import POSITIONS, ROUTES, STATE_COLOURS, lifecycle_svg
from dlq.models import AuditOutcome
from tasks.execution.runner import task_run
from tasks.models import AttemptOutcome, EffectStatus, StepAttempt, Task, TaskState
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

LIST_URL = "/admin/tasks/task/"
SVG = "{http://www.w3.org/2000/svg}"


def page_url(task: Task) -> str:
    return reverse("admin:tasks_task_change", args=[task.pk])


def run(input: dict, **submit_options) -> Task:
    task = task_submit(pipeline="t_local", input=input, **submit_options)
    task_run(task_id=str(task.pk), worker="w1")
    return Task.objects.get(pk=task.pk)


def listed(response) -> set[uuid.UUID]:
    assert response.status_code == 200
    return {task.pk for task in response.context["cl"].result_list}


def seq_scan_plan(queryset) -> str:
    """The plan of ``queryset``'s WHERE clause with sequential scans priced out: any "Seq Scan" left has no index."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        return queryset.order_by().explain()


def svg_of(body: str) -> ET.Element:
    match = re.search(r'<svg [^>]*class="rc-lifecycle".*?</svg>', body, re.DOTALL)
    assert match, "no inline SVG on the page"
    return ET.fromstring(match.group(0))


def highlighted_states(svg: ET.Element) -> list[str]:
    return [
        group.get("data-state")
        for group in svg.iter(f"{SVG}g")
        if group.get("data-state") and "current" in group.get("class", "").split()
    ]


@pytest.fixture
def superuser_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-for-tests-only"))
    return client


@pytest.fixture
def viewer_client():
    """A staff member who may only view tasks."""
    user = get_user_model().objects.create_user("viewer", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task", content_type__app_label="tasks"))
    viewer = Client()
    viewer.force_login(user)
    return viewer


@pytest.fixture
def three_tasks(clean_redis):
    return {
        "succeeded": run({}),
        "compensated": run({"fail_b": "permanent"}),
        "retrying": run({"fail_b": "transient"}, idempotency_key="order-42"),
    }


# --- the list -------------------------------------------------------------------------------------------------


def test_the_list_shows_a_badge_progress_and_failure_reason_per_task(superuser_client, three_tasks):
    response = superuser_client.get(LIST_URL)
    assert listed(response) == {task.pk for task in three_tasks.values()}
    body = response.content.decode()
    assert three_tasks["compensated"].state == TaskState.COMPENSATED
    assert three_tasks["retrying"].state == TaskState.RETRY_SCHEDULED
    for state in ("succeeded", "compensated", "retry_scheduled"):
        assert f'<span class="rc-state rc-state-{state}">' in body
    assert "2/2" in body and "1/2" in body
    assert "permanent error" in body  # the failure reason's label
    assert ".rc-state-succeeded {" in body  # the badges' colours come with the page


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=compensated", {"compensated"}),
        ("state=retry_scheduled", {"retrying"}),
        ("state=running", set()),
        ("pipeline=t_local", {"succeeded", "compensated", "retrying"}),
        ("pipeline=t_elsewhere", set()),
        ("failed_step=local_b", {"compensated"}),
        ("age=1h", {"succeeded", "compensated", "retrying"}),
        ("age=older_7d", set()),
        ("state=compensated&pipeline=t_local&age=24h", {"compensated"}),
    ],
)
def test_filters(superuser_client, three_tasks, query, expected):
    response = superuser_client.get(f"{LIST_URL}?{query}")
    assert listed(response) == {three_tasks[name].pk for name in expected}
    assert "Seq Scan on tasks_task" not in seq_scan_plan(response.context["cl"].queryset)


def test_the_age_filter_splits_at_seven_days(superuser_client, three_tasks):
    old = three_tasks["succeeded"]
    with door_forced():
        Task.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=8))
    assert listed(superuser_client.get(f"{LIST_URL}?age=older_7d")) == {old.pk}
    assert old.pk not in listed(superuser_client.get(f"{LIST_URL}?age=7d"))


def test_filter_choices_are_the_pipelines_and_failing_steps_in_the_table(superuser_client, three_tasks):
    body = superuser_client.get(LIST_URL).content.decode()
    assert "?pipeline=t_local" in body
    assert "?failed_step=local_b" in body
    assert "?failed_step=local_a" not in body  # no task failed there


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("order-42", {"retrying"}),  # idempotency key, exact
        ("order-4", set()),  # not a prefix search on keys
        ("refused", {"compensated"}),  # error code, exact; also the message
        ("REFUS", {"compensated"}),  # part of the error message, any case
        ("not-a-uuid-at-all", set()),
        ("1234", set()),
        (str(uuid.uuid4()), set()),
    ],
)
def test_search(superuser_client, three_tasks, term, expected):
    response = superuser_client.get(LIST_URL, {"q": term})
    assert listed(response) == {three_tasks[name].pk for name in expected}
    assert "Seq Scan on tasks_task" not in seq_scan_plan(response.context["cl"].queryset)


def test_search_by_task_id_with_or_without_hyphens(superuser_client, three_tasks):
    task = three_tasks["succeeded"]
    assert listed(superuser_client.get(LIST_URL, {"q": str(task.pk)})) == {task.pk}
    assert listed(superuser_client.get(LIST_URL, {"q": f"  {task.pk.hex.upper()} "})) == {task.pk}


def test_the_list_loads_a_fixed_number_of_queries_whatever_the_number_of_tasks(
    superuser_client, clean_redis, django_assert_max_num_queries
):
    run({})
    run({"fail_b": "permanent"})
    with CaptureQueriesContext(connection) as with_two:
        assert superuser_client.get(LIST_URL).status_code == 200
    for index in range(12):
        run({"fail_b": "permanent"} if index % 2 else {}, idempotency_key=f"key-{index}")
    with django_assert_max_num_queries(len(with_two.captured_queries)):
        response = superuser_client.get(LIST_URL)
    assert len(listed(response)) == 14


def test_the_list_never_counts_past_the_cap(superuser_client, monkeypatch):
    monkeypatch.setattr("reliability_console.paginator.COUNT_CAP", 3)
    with door_forced():
        Task.objects.bulk_create([Task(pipeline="t_local", total_steps=2) for _ in range(5)])
    assert "more than 3 tasks" in superuser_client.get(LIST_URL).content.decode()
    assert "more than 3 results" in superuser_client.get(f"{LIST_URL}?pipeline=t_local").content.decode()
    with door_forced():
        Task.objects.filter(pk__in=Task.objects.values("pk")[:2]).delete()
    body = superuser_client.get(LIST_URL).content.decode()
    assert "3 tasks" in body and "more than" not in body


def test_the_list_is_sorted_newest_first_through_the_creation_index(superuser_client, three_tasks):
    response = superuser_client.get(LIST_URL)
    newest_first = [task.pk for task in response.context["cl"].result_list]
    assert newest_first == [
        task.pk for task in sorted(three_tasks.values(), key=lambda task: task.created_at, reverse=True)
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = response.context["cl"].queryset[:100].explain()
    assert "task_created_idx" in plan


@pytest.mark.parametrize("order", ["1", "-2", "9", "x", "4.1"])
def test_an_order_on_a_column_without_an_index_falls_back_to_newest_first(superuser_client, three_tasks, order):
    response = superuser_client.get(f"{LIST_URL}?o={order}&state=compensated")
    assert listed(response) == {three_tasks["compensated"].pk}
    assert response.context["cl"].queryset.query.order_by[0] == "-created_at"


def test_the_list_can_be_sorted_oldest_first(superuser_client, three_tasks):
    created = superuser_client.get(LIST_URL).context["cl"].list_display.index("created")
    response = superuser_client.get(f"{LIST_URL}?o={created}")
    oldest_first = [task.pk for task in response.context["cl"].result_list]
    assert oldest_first == [task.pk for task in sorted(three_tasks.values(), key=lambda task: task.created_at)]


def test_the_search_indexes_exist_on_postgresql():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'tasks_task'")
        indexes = {row[0] for row in cursor.fetchall()}
        cursor.execute("SELECT stxname FROM pg_statistic_ext")
        statistics = {row[0] for row in cursor.fetchall()}
    assert {
        "task_state_created_idx",
        "task_failed_step_created_idx",
        "task_failure_code_idx",
        "task_failure_message_trgm_idx",
    } <= indexes
    assert "task_failure_message_upper_stats" in statistics


# --- one task's page ------------------------------------------------------------------------------------------


def test_the_task_page_shows_progress_lifecycle_timeline_checkpoints_ledger_dlq_and_audit(
    superuser_client, clean_redis
):
    task = run({"fail_b": "permanent", "api_token": "s3cr3t"})
    assert task.state == TaskState.COMPENSATED
    item = task.dlq_items.get()
    for actor in ("first-operator", "second-operator"):
        audit_record(
            actor=actor,
            action="close",
            target_type="dlqitem",
            target_id=str(item.pk),
            outcome=AuditOutcome.REFUSED,
            task_id=task.pk,
            state_before="compensated",
            state_after="compensated",
            reason=f"reason of {actor}",
        )
    audit_record(actor="other-task", action="close", target_type="dlqitem", target_id="0", outcome="refused")

    response = superuser_client.get(page_url(task))
    assert response.status_code == 200
    body = response.content.decode()

    assert "1 / 2 steps" in body
    assert '<progress max="2" value="1">' in body
    assert highlighted_states(svg_of(body)) == [TaskState.COMPENSATED]

    attempts = StepAttempt.objects.filter(task=task)
    assert body.count('<tr class="rc-attempt">') == attempts.count() >= 3  # a, b, compensation of a
    assert "<code>refused</code>" in body
    assert "Compensation" in body or "compensation" in body
    timeline = body[body.index('id="rc-timeline"') :]
    assert timeline.index("local_a") < timeline.index("local_b")  # ordered by start

    checkpoints = body[body.index('id="rc-checkpoints"') : body.index('id="rc-ledger"')]
    assert checkpoints.count('<tr class="rc-checkpoint">') == 1 and "local_a" in checkpoints

    ledger = body[body.index('id="rc-ledger"') : body.index('id="rc-dlq"')]
    effect = task.side_effects.get()
    assert effect.status == EffectStatus.COMPENSATED
    assert effect.effect_key in ledger and 'class="rc-effect-compensated"' in ledger

    assert f'href="{reverse("admin:dlq_dlqitem_change", args=[item.pk])}"' in body

    audit = body[body.index('id="rc-audit"') :]
    assert audit.count('<tr class="rc-audit-entry">') == 2 and "other-task" not in audit
    assert audit.index("second-operator") < audit.index("first-operator")  # newest first

    # Secrets and tracebacks stay out, although the input has one and the attempt has the other.
    assert "s3cr3t" not in body and "[redacted]" in body
    assert attempts.filter(outcome=AttemptOutcome.PERMANENT_ERROR).exclude(traceback="").exists()
    assert "Traceback" not in body


def test_a_retry_scheduled_task_shows_the_delay_before_the_next_attempt(superuser_client, clean_redis):
    task = run({"fail_b": "transient"})
    assert task.state == TaskState.RETRY_SCHEDULED
    attempt = StepAttempt.objects.get(task=task, step_name="local_b")
    assert attempt.retry_delay_seconds is not None
    body = superuser_client.get(page_url(task)).content.decode()
    assert highlighted_states(svg_of(body)) == [TaskState.RETRY_SCHEDULED]
    assert f"{attempt.retry_delay_seconds:.3f} s" in body
    assert "<code>flaky</code>" in body
    assert "1 / 2 steps" in body


def test_a_succeeded_task_shows_its_redacted_result(superuser_client, clean_redis):
    task = run({"password": "hunter2-secret"})
    body = superuser_client.get(page_url(task)).content.decode()
    assert "2 / 2 steps" in body
    assert highlighted_states(svg_of(body)) == [TaskState.SUCCEEDED]
    assert "hunter2-secret" not in body
    result = html.unescape(body[body.index('id="rc-result"') :])
    assert '"b": 2' in result


def test_a_task_of_an_unregistered_pipeline_names_its_steps_from_its_attempts(superuser_client):
    task = Task.objects.create(pipeline="t_retired", total_steps=2, current_step=1)
    StepAttempt.objects.create(
        task=task, step_index=0, step_name="retired_step", attempt=1, outcome=AttemptOutcome.SUCCEEDED
    )
    response = superuser_client.get(page_url(task))
    assert response.status_code == 200
    steps = response.content.decode()
    assert "retired_step" in steps[steps.index('class="rc-steps"') :]


def test_task_pages_are_read_only(superuser_client, viewer_client, clean_redis):
    task = run({"fail_b": "permanent"})
    for http in (superuser_client, viewer_client):
        assert http.post(page_url(task), {"pipeline": "other"}).status_code == 403
        assert http.post(reverse("admin:tasks_task_delete", args=[task.pk]), {"post": "yes"}).status_code == 403
        assert http.get(reverse("admin:tasks_task_add")).status_code == 403
    assert Task.objects.filter(pk=task.pk, pipeline="t_local").exists()


def test_a_viewer_sees_the_pages_but_no_link_to_a_dlq_item_it_cannot_open(viewer_client, clean_redis):
    task = run({"fail_b": "permanent"})
    assert listed(viewer_client.get(LIST_URL)) == {task.pk}
    body = viewer_client.get(page_url(task)).content.decode()
    item = task.dlq_items.get()
    assert f"#{item.pk}" in body
    assert reverse("admin:dlq_dlqitem_change", args=[item.pk]) not in body


def test_the_pages_load_nothing_from_other_hosts(superuser_client, three_tasks):
    for url in (LIST_URL, page_url(three_tasks["compensated"])):
        body = superuser_client.get(url).content.decode()
        assert not re.search(r"""(src|href)=["'](https?:)?//""", body), url


# --- the lifecycle drawing ------------------------------------------------------------------------------------


def fsm_changes() -> set[tuple[str, str]]:
    """The changes of state of the FSM on Task, read with django-fsm-2's introspection (no copy of them here)."""
    return {
        (str(transition.source), str(transition.target))
        for transition in Task().get_all_state_transitions()
        if transition.source != transition.target
    }


def arrows(svg: ET.Element) -> list[tuple[str, str]]:
    return [
        (group.get("data-source"), group.get("data-target"))
        for group in svg.iter(f"{SVG}g")
        if "transition" in group.get("class", "").split()
    ]


@pytest.mark.parametrize("state", TaskState.values)
def test_lifecycle_svg_is_valid_svg_highlighting_one_state(state):
    svg = ET.fromstring(lifecycle_svg(state))
    assert svg.tag == f"{SVG}svg"
    assert highlighted_states(svg) == [state]
    states = {group.get("data-state") for group in svg.iter(f"{SVG}g") if group.get("data-state")}
    assert states == set(TaskState.values)
    assert len(arrows(svg)) == len(fsm_changes())


def test_lifecycle_svg_highlights_nothing_for_an_unknown_state():
    assert highlighted_states(ET.fromstring(lifecycle_svg("<script>"))) == []
    assert "<script>" not in lifecycle_svg("<script>")


def test_the_drawing_has_one_arrow_for_each_change_of_state_the_fsm_has_and_no_other():
    drawn = arrows(ET.fromstring(lifecycle_svg(TaskState.RUNNING)))
    assert len(drawn) == len(set(drawn))
    assert set(drawn) == fsm_changes()
    # What the transitions that keep the state do (advance, a lease taken over) is no arrow.
    assert ("running", "running") not in drawn and ("succeeded", "queued") not in drawn


def test_a_transition_added_to_the_model_is_drawn_and_one_taken_away_is_not(monkeypatch):
    state = Task._meta.get_field("state")

    def replay(self) -> None:
        """A transition the model does not have: SUCCEEDED back to QUEUED."""

    added = transition(field=state, source=TaskState.SUCCEEDED, target=TaskState.QUEUED)(replay)
    monkeypatch.setitem(state.transitions[Task], "replay", added)
    monkeypatch.delitem(state.transitions[Task], "compensate_cancelled")
    assert ("succeeded", "queued") in fsm_changes() and ("cancelled", "compensating") not in fsm_changes()
    drawn = set(arrows(ET.fromstring(lifecycle_svg(TaskState.SUCCEEDED))))
    assert ("succeeded", "queued") in drawn  # with no route of its own: a straight arrow
    assert ("cancelled", "compensating") not in drawn  # its route is still in ROUTES
    assert drawn == fsm_changes()


def test_every_route_of_the_layout_is_a_change_the_fsm_has():
    assert {(source.value, target.value) for source, target in ROUTES} <= fsm_changes()


def test_every_state_has_a_place_and_a_colour():
    assert set(POSITIONS) == set(TaskState) == set(STATE_COLOURS)


def test_a_state_without_a_place_fails_loudly(monkeypatch):
    monkeypatch.delitem(POSITIONS, TaskState.CANCELLED)
    with pytest.raises(LookupError, match="no place for state 'cancelled'"):
        lifecycle_svg(TaskState.QUEUED)


def test_a_waiting_task_shows_its_start_and_its_state_on_the_drawing(superuser_client):
    task = task_submit(pipeline="t_local", input={}, run_at=timedelta(hours=2))
    body = superuser_client.get(page_url(task)).content.decode()
    assert highlighted_states(svg_of(body)) == [TaskState.WAITING]
    assert 'id="rc-waiting"' in body and "Next attempt at" not in body
    assert f"it starts at {timezone.localtime(task.retry_at):%Y-%m-%d %H:%M:%S}" in body
