"""Free text is bounded: an unprivileged POST cannot grow the audit log or its pages; a bulk reason fits its items."""

from __future__ import annotations

import pytest

from dlq.actions import MAX_REASON_LENGTH
from dlq.audit import DETAIL_MAX_LENGTH, DETAIL_PARAM_MAX_LENGTH, audit_record
from dlq.audit_details import AuditDetail
from dlq.bulk import BULK_REASON_MAX_LENGTH, bulk_operation_run_slice
from dlq.models import AuditEntry, AuditOutcome, BulkOperation, BulkStatus, DLQItem
from tasks.models import DLQStatus
from tests.support import parked_dead_letters

pytestmark = pytest.mark.django_db(transaction=True)

HUGE = "A" * 2_000_000
# What one more audit row on a page may add at most: the stored reason and the row's markup.
ROW_BUDGET = MAX_REASON_LENGTH + 2000


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    pass


def size(client, url: str) -> int:
    response = client.get(url)
    assert response.status_code == 200, url
    assert "AAAAAAAAAA" * 200 not in response.content.decode(), url
    return len(response.content)


def test_a_viewers_huge_reason_is_audited_bounded_and_the_pages_stay_small(client, role_users):
    item, other = parked_dead_letters(2)
    client.force_login(role_users["viewer"])
    item_page = f"/admin/dlq/dlqitem/{item.pk}/change/"
    before = {url: size(client, url) for url in (item_page, "/admin/dlq/auditentry/")}
    posts = [
        f"/admin/dlq/dlqitem/{item.pk}/act/close/",
        f"/admin/dlq/dlqitem/selected/close/?ids={item.pk},{other.pk}",
        "/admin/dlq/dlqitem/bulk/close/",
    ]
    for url in posts:
        assert client.post(url, {"reason": HUGE, "resolution_code": "ignored"}).status_code == 403, url
    entries = AuditEntry.objects.filter(actor="viewer-r")
    assert entries.count() == len(posts) and {e.outcome for e in entries} == {AuditOutcome.DENIED}
    for entry in entries:
        assert len(entry.reason) <= MAX_REASON_LENGTH
        assert entry.reason.startswith("AAAA") and entry.reason.endswith("[truncated: 2000000 characters in all]")
    assert size(client, item_page) - before[item_page] < ROW_BUDGET
    assert (
        size(client, "/admin/dlq/auditentry/") - before["/admin/dlq/auditentry/"] < len(posts) * 1500
    )  # a row and 80 characters of reason
    denied = entries.filter(target_type="dlq_item").get()
    assert size(client, f"/admin/dlq/auditentry/{denied.pk}/change/") < 60_000
    assert DLQItem.objects.get(pk=item.pk).status == DLQStatus.OPEN


def test_entries_stored_before_the_limit_are_cut_on_display(client, role_users):
    (item,) = parked_dead_letters(1)
    client.force_login(role_users["viewer"])
    item_page = f"/admin/dlq/dlqitem/{item.pk}/change/"
    before = size(client, item_page)
    legacy = AuditEntry.objects.create(
        actor="old",
        action="close",
        target_type="dlq_item",
        target_id=str(item.pk),
        outcome="denied",
        reason=HUGE,
        detail=HUGE,
    )
    assert size(client, item_page) - before < ROW_BUDGET + DETAIL_MAX_LENGTH
    assert size(client, "/admin/dlq/auditentry/") < 200_000
    assert size(client, f"/admin/dlq/auditentry/{legacy.pk}/change/") < 60_000


def test_an_allowed_users_too_long_reason_is_a_form_error_and_changes_nothing(client, role_users):
    (item,) = parked_dead_letters(1)
    client.force_login(role_users["operator"])
    response = client.post(f"/admin/dlq/dlqitem/{item.pk}/act/retry/", {"reason": "x" * (MAX_REASON_LENGTH + 1)})
    assert response.status_code == 400 and f"at most {MAX_REASON_LENGTH} characters" in response.content.decode()
    assert len(response.content) < 60_000
    assert DLQItem.objects.get(pk=item.pk).status == DLQStatus.OPEN and not AuditEntry.objects.exists()
    # A field the action does not use is not stored either.
    client.post(f"/admin/dlq/dlqitem/{item.pk}/act/retry/", {"reason": "ok", "resolution_code": "z" * 5000})
    assert AuditEntry.objects.get(outcome=AuditOutcome.SUCCEEDED).detail == ""


def test_a_bulk_reason_too_long_for_its_prefix_is_refused_when_requested(client, role_users, settings):
    settings.RELIABILITY_BULK_RATE_PER_SECOND = 1000
    items = parked_dead_letters(2)
    client.force_login(role_users["supervisor"])
    # Long enough for one item's action, too long once "[bulk #N] " is put in front of it.
    for url in (
        "/admin/dlq/dlqitem/bulk/close/?pipeline__exact=t_parked",
        f"/admin/dlq/dlqitem/selected/close/?ids={items[0].pk},{items[1].pk}",
    ):
        response = client.post(url, {"reason": "r" * MAX_REASON_LENGTH, "resolution_code": "ignored"})
        assert response.status_code == 400, url
        assert f"at most {BULK_REASON_MAX_LENGTH} characters" in response.content.decode()
    assert not BulkOperation.objects.exists()
    # At the limit, every item gets the reason with its prefix.
    response = client.post(
        "/admin/dlq/dlqitem/bulk/close/?pipeline__exact=t_parked",
        {"reason": "r" * BULK_REASON_MAX_LENGTH, "resolution_code": "ignored"},
    )
    assert response.status_code == 302
    operation = BulkOperation.objects.get()
    while (status := bulk_operation_run_slice(operation_id=operation.pk, slice_seconds=0.5)) == "continue":
        pass
    operation.refresh_from_db()
    assert status == BulkStatus.COMPLETED and (operation.succeeded, operation.failed) == (2, 0)
    reasons = AuditEntry.objects.filter(bulk_operation_id=operation.pk, action="close").values_list("reason", flat=True)
    assert all(r == f"[bulk #{operation.pk}] " + "r" * BULK_REASON_MAX_LENGTH for r in reasons) and len(reasons) == 2


def test_a_details_parameters_are_bounded_before_they_are_stored():
    # An engine's error quoting a value it refused, a name from a request: each parameter is cut, marked.
    entry = audit_record(
        actor="supervisor",
        action="pipeline_limits_set",
        target_type="pipeline",
        target_id="t_local",
        outcome=AuditOutcome.REFUSED,
        detail=AuditDetail("limit_invalid", {"error": HUGE}),
    )
    entry.refresh_from_db()
    error = entry.detail_params["error"]
    assert len(error) <= DETAIL_PARAM_MAX_LENGTH and error.endswith("[truncated: 2000000 characters in all]")
    assert entry.detail == f"the limit is not valid: {error}" and len(entry.detail) <= DETAIL_MAX_LENGTH
