"""Selected rows follow the bulk rules: two or more items are a bulk action (permission, approval, canary, rate)."""

from __future__ import annotations

import pytest

from dlq.bulk import bulk_operation_run_slice
from dlq.models import AuditEntry, AuditOutcome, BulkOperation, BulkStatus, DLQItem
from tasks.models import DLQStatus
from tests.support import compensated_dead_letters, parked_dead_letters

pytestmark = pytest.mark.django_db(transaction=True)

CLOSE = {"reason": "noise from the load test", "resolution_code": "ignored"}


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    pass


def selected_url(action: str, items: list[DLQItem]) -> str:
    return f"/admin/dlq/dlqitem/selected/{action}/?ids={','.join(str(i.pk) for i in items)}"


def statuses(items) -> set[str]:
    return set(DLQItem.objects.filter(pk__in=[i.pk for i in items]).values_list("status", flat=True))


def run_until_stopped(operation_id: int) -> str:
    for _ in range(200):
        status = bulk_operation_run_slice(operation_id=operation_id, slice_seconds=0.5)
        if status != "continue":
            return status
    raise AssertionError("bulk operation did not stop")


def test_an_operator_without_the_bulk_permission_cannot_act_on_several_selected_rows(client, role_users):
    items = parked_dead_letters(3)
    client.force_login(role_users["operator"])
    assert client.get(selected_url("close", items)).status_code == 403
    response = client.post(selected_url("close", items), CLOSE, REMOTE_ADDR="10.9.8.7")
    assert response.status_code == 403
    assert statuses(items) == {DLQStatus.OPEN} and not BulkOperation.objects.exists()
    denied = AuditEntry.objects.get(actor="operator-r")
    assert (denied.action, denied.outcome, denied.client_ip) == ("bulk_close", AuditOutcome.DENIED, "10.9.8.7")
    assert not AuditEntry.objects.filter(outcome=AuditOutcome.SUCCEEDED).exists()


def test_the_list_tells_an_operator_that_several_rows_are_a_bulk_action(client, role_users):
    items = parked_dead_letters(2)
    client.force_login(role_users["operator"])
    data = {"action": "act_close", "_selected_action": [i.pk for i in items], "index": "0"}
    page = client.post("/admin/dlq/dlqitem/", data, follow=True)
    assert page.status_code == 200 and b"Acting on several items at once is a bulk action" in page.content
    assert statuses(items) == {DLQStatus.OPEN}
    assert AuditEntry.objects.get(actor="operator-r").outcome == AuditOutcome.DENIED
    one = client.post("/admin/dlq/dlqitem/", {**data, "_selected_action": [items[0].pk]})
    assert one.status_code == 302 and one["Location"] == f"/admin/dlq/dlqitem/selected/close/?ids={items[0].pk}"


def test_one_selected_row_stays_a_single_action(client, role_users):
    item, other = parked_dead_letters(2)
    client.force_login(role_users["operator"])
    response = client.post(selected_url("close", [item]), CLOSE)
    assert response.status_code == 302 and response["Location"] == "/admin/dlq/dlqitem/"
    assert statuses([item]) == {DLQStatus.RESOLVED} and statuses([other]) == {DLQStatus.OPEN}
    assert not BulkOperation.objects.exists()
    entry = AuditEntry.objects.get(action="close")
    assert entry.outcome == AuditOutcome.SUCCEEDED and entry.bulk_operation_id is None


def test_a_selection_over_the_threshold_waits_for_a_second_supervisor(client, role_users, settings):
    settings.RELIABILITY_BULK_APPROVAL_THRESHOLD = 3
    settings.RELIABILITY_BULK_RATE_PER_SECOND = 1000
    items = parked_dead_letters(5)
    client.force_login(role_users["supervisor"])
    page = client.get(selected_url("close", items))
    assert page.status_code == 200 and b"5 items are selected" in page.content
    response = client.post(selected_url("close", items), CLOSE)
    operation = BulkOperation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/admin/dlq/bulkoperation/{operation.pk}/change/"
    assert operation.status == BulkStatus.AWAITING_APPROVAL and operation.requested_by == "supervisor-r"
    assert sorted(operation.item_ids) == sorted(i.pk for i in items) and operation.total == 5
    assert operation.filter_query.startswith("ids=")
    assert run_until_stopped(operation.pk) == BulkStatus.AWAITING_APPROVAL
    assert statuses(items) == {DLQStatus.OPEN}  # nothing closed before the approval
    approve = f"/admin/dlq/bulkoperation/{operation.pk}/control/approve/"
    client.post(approve)  # the requester cannot approve their own
    assert BulkOperation.objects.get(pk=operation.pk).status == BulkStatus.AWAITING_APPROVAL
    client.force_login(role_users["supervisor2"])
    assert client.post(approve).status_code == 302
    assert run_until_stopped(operation.pk) == BulkStatus.COMPLETED
    assert statuses(items) == {DLQStatus.RESOLVED}
    assert AuditEntry.objects.filter(bulk_operation_id=operation.pk, action="close").count() == 5


def test_a_selection_under_the_threshold_runs_canary_first_at_the_rate_limit(client, role_users, settings):
    settings.RELIABILITY_BULK_APPROVAL_THRESHOLD = 100
    settings.RELIABILITY_BULK_CANARY_SIZE = 2
    settings.RELIABILITY_BULK_RATE_PER_SECOND = 1000
    items = compensated_dead_letters(4)  # retry from checkpoint is refused for compensated tasks: the canary fails
    client.force_login(role_users["supervisor"])
    response = client.post(selected_url("retry", items), {"reason": "try them all"})
    assert response.status_code == 302
    operation = BulkOperation.objects.get()
    assert operation.status == BulkStatus.RUNNING and operation.processed == 0  # nothing acted on in the request
    assert (operation.canary_size, operation.rate_per_second) == (2, 1000)
    assert run_until_stopped(operation.pk) == BulkStatus.CANARY_FAILED
    operation.refresh_from_db()
    assert operation.processed == 2 and operation.failed == 2  # the other two were never tried
    assert AuditEntry.objects.filter(action="bulk_canary_stop", bulk_operation_id=operation.pk).count() == 1
