"""Operator actions in the DLQ console: permissions, reasons, audit, races, previews, bulk, four eyes."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import DatabaseError, connection, transaction
from django.utils import timezone, translation

from dlq.actions import ActionDenied, ActionRefused, ReasonRequired, dlq_item_act
from dlq.admin.common import detail_label
from dlq.bulk import (
    RUN_BULK_ENTRY_POINT,
    BulkRefused,
    bulk_operation_approve,
    bulk_operation_control,
    bulk_operation_request,
    bulk_operation_run_slice,
)
from dlq.models import AuditEntry, AuditOutcome, BulkOperation, BulkStatus, DLQItem
from dlq.roles import roles_setup
from tasks.delivery.enqueue import get_queue, job_id
from tasks.execution.context import effect_key
from tasks.execution.runner import task_run
from tasks.models import DLQStatus, EffectStatus, SideEffect, Task
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import index_scans, plan_uses_index, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ACTIONS = ["retry", "retry_from_start", "compensate", "close"]
ALLOWED = {
    "viewer": set(),
    "operator": {"retry", "close"},
    "supervisor": {"retry", "retry_from_start", "compensate", "close"},
}


@pytest.fixture(autouse=True)
def _setup(clean_redis):
    roles_setup()


@pytest.fixture
def users():
    made = {}
    for role in ("viewer", "operator", "supervisor"):
        user = get_user_model().objects.create_user(f"{role}1", password="x-test-only", is_staff=True)
        user.groups.add(Group.objects.get(name=role))
        made[role] = user
    second = get_user_model().objects.create_user("supervisor2", password="x-test-only", is_staff=True)
    second.groups.add(Group.objects.get(name="supervisor"))
    made["supervisor2"] = second
    return made


def rows(response) -> int:
    return response.content.decode().count('<td class="field-pipeline">')


def fresh(user):
    # Permissions are cached per user object; reload to see group changes.
    return get_user_model().objects.get(pk=user.pk)


def parked_item(**input_) -> DLQItem:
    task = task_submit(pipeline="t_parked", input={"fail": True, **input_})
    task_run(task_id=str(task.pk), worker="w1")
    return DLQItem.objects.get(task=task)


def compensated_item() -> DLQItem:
    task = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    task_run(task_id=str(task.pk), worker="w1")
    return DLQItem.objects.get(task=task)


def item_for(action: str) -> DLQItem:
    return compensated_item() if action == "retry_from_start" else parked_item()


@pytest.mark.parametrize("role", ["viewer", "operator", "supervisor"])
@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_checks_its_own_permission_and_audits(client, users, role, action):
    item = item_for(action)
    client.force_login(users[role])
    data = {"reason": "ticket OPS-1", "resolution_code": "ignored"}
    response = client.post(f"/admin/dlq/dlqitem/{item.pk}/act/{action}/", data, REMOTE_ADDR="10.1.2.3")
    entry = AuditEntry.objects.filter(target_id=str(item.pk), action=action).get()
    assert entry.actor == users[role].username and entry.client_ip == "10.1.2.3"
    if action in ALLOWED[role]:
        assert response.status_code == 302
        assert entry.outcome == AuditOutcome.SUCCEEDED and entry.reason == "ticket OPS-1"
        assert entry.state_before and entry.state_after
    else:
        assert response.status_code == 403
        assert entry.outcome == AuditOutcome.DENIED
        assert DLQItem.objects.get(pk=item.pk).status == item.status


@pytest.mark.parametrize("action", ACTIONS)
def test_anonymous_users_are_sent_to_login_and_nothing_happens(client, action):
    item = item_for(action)
    response = client.post(f"/admin/dlq/dlqitem/{item.pk}/act/{action}/", {"reason": "x"})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert DLQItem.objects.get(pk=item.pk).status == item.status


def test_a_reason_is_required(client, users):
    item = parked_item()
    client.force_login(users["supervisor"])
    response = client.post(f"/admin/dlq/dlqitem/{item.pk}/act/retry/", {"reason": "   "})
    assert response.status_code == 400 and b"give a reason" in response.content
    assert Task.objects.get(pk=item.task_id).state == "failed"
    with pytest.raises(ReasonRequired):
        dlq_item_act(item_id=item.pk, action="close", actor=fresh(users["supervisor"]), reason="x")


def test_confirmation_page_on_get_then_act_on_post_with_message(client, users):
    item = parked_item()
    client.force_login(users["operator"])
    page = client.get(f"/admin/dlq/dlqitem/{item.pk}/act/retry/")
    assert page.status_code == 200 and b"Retry preview" in page.content and b'name="reason"' in page.content
    assert Task.objects.get(pk=item.task_id).state == "failed"  # GET changes nothing
    done = client.post(f"/admin/dlq/dlqitem/{item.pk}/act/retry/", {"reason": "fixed upstream"}, follow=True)
    assert b"done: task failed" in done.content
    assert Task.objects.get(pk=item.task_id).state == "queued"
    assert DLQItem.objects.get(pk=item.pk).status == DLQStatus.RETRYING


def test_the_retry_preview_lists_skipped_and_rerun_steps_with_their_protection(client, users):
    item = parked_item()
    client.force_login(users["operator"])
    page = client.get(f"/admin/dlq/dlqitem/{item.pk}/act/retry/").content.decode()
    preview = page.split('id="retry-preview"')[1].split("</table>")[0]
    rows = preview.split("<tr class=")[1:]
    assert [row.split('"')[1] for row in rows] == ["skipped", "skipped", "runs-again"]
    assert "parked_charge" in rows[0] and "checkpoint is kept" in rows[0]
    assert "parked_finish" in rows[2] and "no declared external effects" in rows[2]
    start = compensated_item()
    client.force_login(users["supervisor"])
    page = client.get(f"/admin/dlq/dlqitem/{start.pk}/act/retry_from_start/").content.decode()
    assert page.count('class="runs-again"') == 2


def test_the_retry_preview_names_effects_a_step_used_without_declaring_them(client, users):
    # A step on ctx.http need not declare effects=(...): what it used is in the ledger, and the preview says so.
    item = parked_item()
    task = Task.objects.get(pk=item.task_id)
    SideEffect.objects.create(
        task=task,
        generation=task.generation,
        step_index=2,
        step_name="parked_finish",
        effect_name="shipment",
        effect_key=effect_key(task.pk, task.generation, "parked_finish", "shipment"),
        status=EffectStatus.UNCERTAIN,
    )
    client.force_login(users["operator"])
    page = client.get(f"/admin/dlq/dlqitem/{item.pk}/act/retry/").content.decode()
    rows = page.split('id="retry-preview"')[1].split("</table>")[0].split("<tr class=")[1:]
    assert "parked_finish" in rows[2] and "key-protected (shipment): the same keys as before" in rows[2]


def test_buttons_a_user_cannot_use_are_not_shown(client, users):
    item = parked_item()
    for role, expected in (
        ("viewer", set()),
        ("operator", {"retry", "close"}),
        ("supervisor", {"retry", "compensate", "close"}),
    ):
        client.force_login(users[role])
        page = client.get(f"/admin/dlq/dlqitem/{item.pk}/change/").content.decode()
        shown = {action for action in ACTIONS if f'class="action-{action}"' in page}
        assert shown == expected, role


def test_two_operators_racing_on_one_item_one_wins_the_other_is_told(users):
    item = parked_item()
    barrier = threading.Barrier(2)
    outcomes = []

    def act(user):
        barrier.wait(timeout=10)
        try:
            dlq_item_act(item_id=item.pk, action="retry", actor=fresh(user), reason="race")
            outcomes.append("done")
        except ActionRefused as exc:
            outcomes.append(f"refused: {exc.message}")
        finally:
            connection.close()

    threads = [threading.Thread(target=act, args=(users[name],)) for name in ("operator", "supervisor")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(o.split(":")[0] for o in outcomes) == ["done", "refused"], outcomes
    task = Task.objects.get(pk=item.task_id)
    assert task.state == "queued" and task.fencing_token == 2  # moved exactly once
    audited = AuditEntry.objects.filter(target_id=str(item.pk)).values_list("outcome", flat=True)
    assert sorted(audited) == [AuditOutcome.REFUSED, AuditOutcome.SUCCEEDED]


def test_an_operator_cannot_act_on_a_task_a_worker_already_moved(users):
    item = parked_item()
    dlq_item_act(item_id=item.pk, action="retry", actor=fresh(users["operator"]), reason="first")
    with pytest.raises(ActionRefused):
        dlq_item_act(item_id=item.pk, action="compensate", actor=fresh(users["supervisor"]), reason="late")


def test_a_retried_task_that_succeeds_resolves_its_item(users):
    item = parked_item()
    with door_forced():
        Task.objects.filter(pk=item.task_id).update(input={"fail": True, "fixed": True})
    dlq_item_act(item_id=item.pk, action="retry", actor=fresh(users["operator"]), reason="fixed")
    assert task_run(task_id=str(item.task_id), worker="w2") == "succeeded"
    item.refresh_from_db()
    assert item.status == DLQStatus.RESOLVED and item.resolution_code == "retried"


def test_a_task_that_fails_again_after_retry_reopens_its_one_item(users):
    item = parked_item()
    dlq_item_act(item_id=item.pk, action="retry", actor=fresh(users["operator"]), reason="try again")
    task_run(task_id=str(item.task_id), worker="w2")
    assert DLQItem.objects.filter(task_id=item.task_id).count() == 1
    assert DLQItem.objects.get(task_id=item.task_id).status == DLQStatus.OPEN


def test_close_resolves_with_a_code_and_note(users):
    item = parked_item()
    dlq_item_act(
        item_id=item.pk, action="close", actor=fresh(users["operator"]), reason="dup of #7", resolution_code="duplicate"
    )
    item.refresh_from_db()
    assert (item.status, item.resolution_code, item.resolution_note) == (DLQStatus.RESOLVED, "duplicate", "dup of #7")
    assert not Task.objects.get(pk=item.task_id).in_dlq


def test_a_refusal_is_stored_as_a_code_with_its_facts_and_worded_for_each_reader(client, users):
    item = parked_item()
    operator = fresh(users["operator"])
    dlq_item_act(item_id=item.pk, action="close", actor=operator, reason="dup", resolution_code="duplicate")
    # The actor reads Chinese: the message is Chinese, the entry is language-neutral (its English kept beside).
    with translation.override("zh-hans"), pytest.raises(ActionRefused) as raised:
        dlq_item_act(item_id=item.pk, action="retry", actor=operator, reason="again")
    assert raised.value.message == "该死信已被解决"
    closed, refused = AuditEntry.objects.filter(target_id=str(item.pk)).order_by("pk")
    assert (closed.detail_code, closed.detail_params, closed.detail) == (
        "resolution",
        {"resolution": "duplicate"},
        "duplicate",  # the code, as earlier releases stored (and word) it
    )
    assert (refused.outcome, refused.detail_code, refused.detail_params) == (AuditOutcome.REFUSED, "item_resolved", {})
    assert refused.detail == "this dead letter was already resolved" and refused.task_id == item.task_id
    client.force_login(users["operator"])
    for language, worded in (("en", "this dead letter was already resolved"), ("zh-Hans", "该死信已被解决")):
        for url in (f"/admin/dlq/auditentry/{refused.pk}/change/", f"/admin/dlq/dlqitem/{item.pk}/change/"):
            assert worded in client.get(url, HTTP_ACCEPT_LANGUAGE=language).content.decode(), (language, url)


def test_an_engine_refusal_is_stored_by_the_engines_code_and_facts(client, users):
    item = parked_item()
    # A cancel that came while the failing step still ran: the engine refuses a retry the console's check allowed.
    with door_forced():
        Task.objects.filter(pk=item.task_id).update(cancel_requested_at=timezone.now(), cancel_requested_by="client:a")
    with translation.override("zh-hans"), pytest.raises(ActionRefused) as raised:
        dlq_item_act(item_id=item.pk, action="retry", actor=fresh(users["operator"]), reason="again")
    assert raised.value.message == "任务已被取消：请对其进行补偿，或关闭其死信"
    entry = AuditEntry.objects.get(target_id=str(item.pk))
    assert (entry.detail_code, entry.detail_params, entry.task_id) == ("retry_cancelled", {}, item.task_id)
    assert entry.detail == "the task was cancelled: compensate it or close its dead letter"
    client.force_login(users["operator"])
    page = client.get(f"/admin/tasks/task/{item.task_id}/change/", HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
    assert "任务已被取消：请对其进行补偿，或关闭其死信" in page  # the task page lists the refusal


def test_a_refusal_after_another_operator_acted_names_the_tasks_state(users):
    item = parked_item()
    dlq_item_act(item_id=item.pk, action="retry", actor=fresh(users["operator"]), reason="first")
    with pytest.raises(ActionRefused, match="not possible while the task is queued"):
        dlq_item_act(item_id=item.pk, action="compensate", actor=fresh(users["supervisor"]), reason="late")
    entry = AuditEntry.objects.get(target_id=str(item.pk), outcome=AuditOutcome.REFUSED)
    assert (entry.detail_code, entry.detail_params) == ("item_state_changed", {"state": "queued"})
    assert entry.detail == "not possible while the task is queued: someone may have acted first"
    with translation.override("zh-hans"):
        assert detail_label(entry) == "任务处于 排队中 状态，无法执行：可能已有其他人先行操作"


def test_the_audit_table_rejects_update_and_delete_on_postgresql(users):
    item = parked_item()
    dlq_item_act(item_id=item.pk, action="retry", actor=fresh(users["operator"]), reason="r")
    for statement in ("UPDATE dlq_auditentry SET actor = 'mallory'", "DELETE FROM dlq_auditentry"):
        with pytest.raises(DatabaseError, match="append-only"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(statement)
    assert AuditEntry.objects.filter(actor="operator1").count() == 1


# --- bulk by filter ---------------------------------------------------------------


def run_until_stopped(operation_id, limit=200):
    for _ in range(limit):
        status = bulk_operation_run_slice(operation_id=operation_id, slice_seconds=0.5)
        if status != "continue":
            return status
    raise AssertionError("bulk operation did not stop")


def test_bulk_stops_by_itself_when_the_canary_fails(users, settings):
    settings.RELIABILITY_BULK_RATE_PER_SECOND = 1000
    items = [compensated_item() for _ in range(14)]  # retry from checkpoint is refused for compensated tasks
    operation = bulk_operation_request(
        actor=fresh(users["supervisor"]), action="retry", item_ids=[i.pk for i in items], filter_query="", reason="r"
    )
    assert run_until_stopped(operation.pk) == BulkStatus.CANARY_FAILED
    operation.refresh_from_db()
    assert operation.processed == 10 and operation.failed == 10 and operation.status == BulkStatus.CANARY_FAILED
    stop = AuditEntry.objects.get(action="bulk_canary_stop")
    assert (stop.detail_code, stop.detail_params, stop.reason) == ("canary_failed", {"failed": 10, "canary": 10}, "r")
    assert stop.detail == "10 of 10 canary items failed"
    with translation.override("zh-hans"):
        assert detail_label(stop) == "10 个金丝雀条目中有 10 个失败"
    request = AuditEntry.objects.get(action="bulk_request")
    assert (request.detail_code, request.detail_params) == ("bulk_items", {"action": "retry", "total": 14})
    assert request.detail == "Retry from checkpoint on 14 items"
    with translation.override("zh-hans"):
        assert detail_label(request) == "对 14 个条目执行“从检查点重试”"


def test_bulk_proceeds_at_its_rate_limit(users, settings):
    settings.RELIABILITY_BULK_RATE_PER_SECOND = 10
    items = [parked_item() for _ in range(12)]
    operation = bulk_operation_request(
        actor=fresh(users["supervisor"]),
        action="close",
        item_ids=[i.pk for i in items],
        filter_query="pipeline=t_parked",
        reason="cleanup",
        resolution_code="ignored",
    )
    started = time.monotonic()
    assert run_until_stopped(operation.pk) == BulkStatus.COMPLETED
    elapsed = time.monotonic() - started
    operation.refresh_from_db()
    assert (operation.processed, operation.succeeded, operation.failed) == (12, 12, 0)
    assert elapsed >= 11 / 10 * 0.9  # 12 items at 10 per second
    stamps = list(
        AuditEntry.objects.filter(bulk_operation_id=operation.pk, action="close")
        .order_by("created_at")
        .values_list("created_at", flat=True)
    )
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert len(stamps) == 12 and min(gaps) >= 0.09
    assert all(DLQItem.objects.get(pk=i.pk).status == DLQStatus.RESOLVED for i in items)


def test_a_bulk_retry_puts_each_task_back_on_its_pipelines_queue_and_runs_on_default(users, settings):
    settings.RELIABILITY_BULK_RATE_PER_SECOND = 1000
    failed = []
    for _ in range(3):
        task = task_submit(pipeline="t_bulk", input={"fail": True})
        task_run(task_id=str(task.pk), worker="w1")
        failed.append(DLQItem.objects.get(task=task))
    get_queue("bulk").empty()  # the submissions' jobs (the tasks above ran in this process)
    operation = bulk_operation_request(
        actor=fresh(users["supervisor"]), action="retry", item_ids=[i.pk for i in failed], filter_query="", reason="r"
    )
    # The operation's own job waits on default, not behind a bulk backlog.
    assert [job.func_name for job in get_queue("default").jobs] == [RUN_BULK_ENTRY_POINT]

    assert run_until_stopped(operation.pk) == BulkStatus.COMPLETED

    retried = Task.objects.filter(pk__in=[i.task_id for i in failed])
    assert sorted(get_queue("bulk").get_job_ids()) == sorted(job_id(t.pk, t.fencing_token) for t in retried)
    assert get_queue("critical").get_job_ids() == []


def test_bulk_can_be_paused_resumed_and_cancelled(users, settings):
    settings.RELIABILITY_BULK_RATE_PER_SECOND = 1000
    items = [parked_item() for _ in range(6)]
    supervisor = fresh(users["supervisor"])
    operation = bulk_operation_request(
        actor=supervisor,
        action="close",
        item_ids=[i.pk for i in items],
        filter_query="",
        reason="r",
        resolution_code="ignored",
    )
    bulk_operation_run_slice(operation_id=operation.pk, slice_seconds=0.0001)
    bulk_operation_control(actor=supervisor, operation_id=operation.pk, command="pause")
    processed = BulkOperation.objects.get(pk=operation.pk).processed
    assert bulk_operation_run_slice(operation_id=operation.pk) == BulkStatus.PAUSED
    assert BulkOperation.objects.get(pk=operation.pk).processed == processed
    bulk_operation_control(actor=supervisor, operation_id=operation.pk, command="resume")
    bulk_operation_run_slice(operation_id=operation.pk, slice_seconds=0.0001)
    bulk_operation_control(actor=supervisor, operation_id=operation.pk, command="cancel")
    stopped_at = BulkOperation.objects.get(pk=operation.pk).processed
    assert bulk_operation_run_slice(operation_id=operation.pk) == BulkStatus.CANCELLED
    final = BulkOperation.objects.get(pk=operation.pk)
    assert final.status == BulkStatus.CANCELLED and final.processed == stopped_at < 6
    with pytest.raises(BulkRefused):
        bulk_operation_control(actor=supervisor, operation_id=operation.pk, command="resume")


def test_large_bulk_needs_a_second_supervisor(users, settings):
    settings.RELIABILITY_BULK_APPROVAL_THRESHOLD = 3
    items = [parked_item() for _ in range(5)]
    requester = fresh(users["supervisor"])
    operation = bulk_operation_request(
        actor=requester,
        action="close",
        item_ids=[i.pk for i in items],
        filter_query="",
        reason="r",
        resolution_code="ignored",
    )
    assert operation.status == BulkStatus.AWAITING_APPROVAL
    assert bulk_operation_run_slice(operation_id=operation.pk) == BulkStatus.AWAITING_APPROVAL
    with pytest.raises(BulkRefused, match="cannot approve their own"):
        bulk_operation_approve(actor=requester, operation_id=operation.pk)
    refused = AuditEntry.objects.get(action="bulk_approve", outcome=AuditOutcome.REFUSED)
    assert (refused.detail_code, refused.detail) == (
        "bulk_self_approval",
        "the requester cannot approve their own bulk action",
    )
    with pytest.raises(ActionDenied):
        bulk_operation_approve(actor=fresh(users["operator"]), operation_id=operation.pk)
    bulk_operation_approve(actor=fresh(users["supervisor2"]), operation_id=operation.pk)
    operation.refresh_from_db()
    assert operation.status == BulkStatus.RUNNING and operation.approved_by == "supervisor2"


def test_bulk_by_filter_from_the_admin_freezes_the_matching_items(client, users, settings):
    settings.RELIABILITY_BULK_APPROVAL_THRESHOLD = 1000
    parked = [parked_item() for _ in range(3)]
    compensated_item()
    client.force_login(users["supervisor"])
    page = client.get("/admin/dlq/dlqitem/bulk/close/?pipeline__exact=t_parked")
    assert page.status_code == 200 and b"3 items match" in page.content
    response = client.post(
        "/admin/dlq/dlqitem/bulk/close/?pipeline__exact=t_parked", {"reason": "noise", "resolution_code": "ignored"}
    )
    assert response.status_code == 302
    operation = BulkOperation.objects.get()
    assert (
        sorted(operation.item_ids) == sorted(i.pk for i in parked)
        and operation.filter_query == "pipeline__exact=t_parked"
    )
    client.force_login(users["operator"])
    assert client.post("/admin/dlq/dlqitem/bulk/close/", {"reason": "x"}).status_code == 403


def test_failure_groups_and_fingerprint_filter_on_the_list(client, users):
    for _ in range(3):
        parked_item()
    compensated_item()
    client.force_login(users["viewer"])
    page = client.get("/admin/dlq/dlqitem/").content.decode()
    groups = page.split('id="failure-groups"')[1].split("</table>")[0]
    assert groups.count('class="failure-group"') == 2
    assert groups.index("parked_finish") < groups.index("local_b")  # the bigger group first
    grouped = client.get("/admin/dlq/dlqitem/", {"fingerprint": "t_parked:parked_finish:refused"})
    assert grouped.status_code == 200 and rows(grouped) == 3


def test_the_filtered_list_reads_its_status_and_pipeline_index_in_the_lists_order(client, users):
    for _ in range(2):
        parked_item()
    client.force_login(users["viewer"])
    response = client.get("/admin/dlq/dlqitem/", {"status__exact": "open", "pipeline__exact": "t_parked"})
    assert rows(response) == 2
    changelist = response.context["cl"]
    assert changelist.queryset.query.order_by[-1] == "-pk"  # the admin's tie-break: newest first, then by id
    # What the capped count and the page read: the first matching rows in the list's order. With the
    # id in the index key they come from the index in that order, no sort: a sort meant reading every
    # match (or PostgreSQL preferred dlq_created_idx and filtered 137,000 rows of a million for 10,001).
    plan = plan_uses_index(changelist.queryset.values_list("pk")[:10001], "dlq_status_pipeline_created_idx")
    # An Index Only Scan or an Index Scan, by the visibility map; either reads the index in the list's order.
    ordered = {
        ("Index Only Scan", "dlq_status_pipeline_created_idx"),
        ("Index Scan", "dlq_status_pipeline_created_idx"),
    }
    assert ordered & set(index_scans(plan)), plan
    assert "Sort" not in plan, plan


def test_list_search_by_task_id_key_and_message(client, users):
    item = parked_item()
    client.force_login(users["viewer"])
    for term in (str(item.task_id), "refused", "far side"):
        assert rows(client.get("/admin/dlq/dlqitem/", {"q": term})) == 1, term
    assert rows(client.get("/admin/dlq/dlqitem/", {"q": "nothing-like-this"})) == 0


def test_login_attempts_are_throttled(client, users):
    for _ in range(5):
        client.post("/admin/login/?next=/admin/", {"username": "operator1", "password": "wrong"})
    locked = client.post("/admin/login/?next=/admin/", {"username": "operator1", "password": "x-test-only"})
    assert locked.status_code in (403, 429)
    assert "_auth_user_id" not in client.session


def test_a_bulk_action_runs_in_the_background_on_a_real_worker(users, start_workers, client):
    items = [parked_item() for _ in range(4)]
    operation = bulk_operation_request(
        actor=fresh(users["supervisor"]),
        action="close",
        item_ids=[i.pk for i in items],
        filter_query="pipeline=t_parked",
        reason="noise",
        resolution_code="ignored",
    )
    start_workers(1)
    wait_for(
        lambda: BulkOperation.objects.get(pk=operation.pk).status == BulkStatus.COMPLETED,
        timeout=60,
        message="the bulk action to complete",
    )
    assert all(DLQItem.objects.get(pk=i.pk).status == DLQStatus.RESOLVED for i in items)
    client.force_login(users["viewer"])
    page = client.get(f"/admin/dlq/bulkoperation/{operation.pk}/change/").content.decode()
    assert "4 of 4 processed" in page and 'class="bulk-pause"' not in page
