"""A viewer in a real browser: no control that writes is shown anywhere, and every write they POST is refused."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from selenium.webdriver.common.by import By

from dlq.alerting.models import AlertChannel, AlertRule
from dlq.bulk import bulk_operation_request
from dlq.models import AuditEntry, AuditOutcome, BulkOperation, BulkStatus, DLQItem
from dlq.roles import roles_setup
from tasks.delivery.enqueue import get_queue
from tasks.lifecycle.controls import pipeline_limits_set, pipeline_pause
from tasks.models import DLQStatus, PipelineControl, Task, TaskState
from tasks.submission.submit import task_submit
from tests.browser.conftest import PASSWORD, log_in
from tests.support import compensated_dead_letters, parked_dead_letters

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

SECRET = "whsec_browser0123456789abcdefghijklmn"

# Every control inside a POST form (the log-out form aside) and every link to a page that writes.
MUTATING_CONTROLS = r"""
const found = [];
const inputs = 'input[type=submit], button, select[name=action], textarea, input[type=checkbox]';
for (const form of document.querySelectorAll('form')) {
  if (form.id === 'logout-form' || (form.getAttribute('method') || 'get').toLowerCase() !== 'post') continue;
  for (const el of form.querySelectorAll(inputs)) {
    found.push(`${form.id || 'form'}: ${el.tagName} ${el.name || el.className}`);
  }
}
const writes = /\/(add|delete|act\/[^/]+|selected\/[^/]+|bulk\/[^/]+|control\/[^/]+)\/(\?|$)|\/admin\/(rq|django_rq)\//;
for (const link of document.querySelectorAll('a[href]')) {
  if (writes.test(link.getAttribute('href'))) found.push(`link: ${link.getAttribute('href')}`);
}
return found;
"""

# A POST from the page itself, with the session's CSRF token, as a hand-made form would send it.
POST_FROM_PAGE = r"""
const [url, data, done] = arguments;
const token = document.querySelector('input[name=csrfmiddlewaretoken]').value;
const body = new URLSearchParams({csrfmiddlewaretoken: token});
for (const [key, value] of Object.entries(data)) for (const one of [].concat(value)) body.append(key, one);
fetch(url, {method: 'POST', body, credentials: 'same-origin', redirect: 'manual', headers: {'X-CSRFToken': token}})
  .then(response => done(response.status), error => done(String(error)));
"""


@pytest.fixture
def console(clean_redis, settings):
    settings.RELIABILITY_BULK_APPROVAL_THRESHOLD = 1
    roles_setup()
    for name, role in (("viewer-v", "viewer"), ("supervisor-v", "supervisor")):
        user = get_user_model().objects.create_user(name, password=PASSWORD, is_staff=True)
        user.groups.add(Group.objects.get(name=role))
    parked = parked_dead_letters(2)
    (compensated,) = compensated_dead_letters(1)
    queued = task_submit(pipeline="t_local", input={})  # jobs wait in the queue: no worker runs in this test
    # A paused pipeline and one whose limits are overridden: every action of the Pipelines page applies to one.
    pipeline_pause(pipeline="t_cancellable", actor="operator:supervisor-v", reason="incident")
    pipeline_limits_set(pipeline="t_one_at_a_time", actor="operator:supervisor-v", reason="load", max_concurrency=2)
    operation = bulk_operation_request(
        actor=get_user_model().objects.get(username="supervisor-v"),
        action="close",
        item_ids=[i.pk for i in parked],
        filter_query="pipeline=t_parked",
        reason="noise",
        resolution_code="ignored",
    )
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url="https://receiver.example/h", secret=SECRET)
    rule = AlertRule.objects.create(name="too many open", kind="open_items", threshold=50)
    return {
        "parked": parked,
        "compensated": compensated,
        "bulk": operation,
        "channel": channel,
        "rule": rule,
        "queued": queued,
    }


def test_a_viewer_sees_no_control_that_writes_and_every_write_is_refused_and_audited(
    browser_factory, live_server, console
):
    parked, compensated, operation = console["parked"], console["compensated"], console["bulk"]
    item = parked[0]
    driver = browser_factory()
    log_in(driver, live_server, "viewer-v")

    pages = [
        "/admin/",
        "/admin/dashboard/",
        "/admin/queues/",
        "/admin/dlq/dlqitem/",
        f"/admin/dlq/dlqitem/{item.pk}/change/",
        f"/admin/dlq/dlqitem/{compensated.pk}/change/",
        "/admin/dlq/bulkoperation/",
        f"/admin/dlq/bulkoperation/{operation.pk}/change/",
        "/admin/dlq/alertchannel/",
        f"/admin/dlq/alertchannel/{console['channel'].pk}/change/",
        "/admin/dlq/alertrule/",
        f"/admin/dlq/alertrule/{console['rule'].pk}/change/",
        "/admin/dlq/alertevent/",
        "/admin/dlq/auditentry/",
        "/admin/tasks/task/",
        f"/admin/tasks/task/{item.task_id}/change/",
        f"/admin/tasks/task/{console['queued'].pk}/change/",  # a task an operator could cancel
        "/admin/pipelines/",
    ]
    for page in pages:
        driver.get(f"{live_server.url}{page}")
        assert driver.find_elements(By.ID, "user-tools"), page  # the page rendered for the signed-in viewer
        assert driver.execute_script(MUTATING_CONTROLS) == [], page
    driver.get(f"{live_server.url}/admin/dlq/alertchannel/{console['channel'].pk}/change/")
    assert SECRET not in driver.page_source and "whsec_…klmn" in driver.page_source
    waiting = get_queue().count
    driver.get(f"{live_server.url}/admin/queues/")
    assert driver.find_element(By.CSS_SELECTOR, "#queue-default .queue-depth").text == str(waiting) != "0"

    ids = f"{parked[0].pk},{parked[1].pk}"
    close = {"reason": "viewer tries", "resolution_code": "ignored"}
    posts = [
        (f"/admin/dlq/dlqitem/{item.pk}/act/retry/", close),
        (f"/admin/dlq/dlqitem/{item.pk}/act/close/", close),
        (f"/admin/dlq/dlqitem/{item.pk}/act/compensate/", close),
        (f"/admin/dlq/dlqitem/{compensated.pk}/act/retry_from_start/", close),
        (f"/admin/dlq/dlqitem/selected/close/?ids={item.pk}", close),
        (f"/admin/dlq/dlqitem/selected/close/?ids={ids}", close),
        ("/admin/dlq/dlqitem/bulk/close/?pipeline__exact=t_parked", close),
        ("/admin/dlq/dlqitem/", {"action": "act_close", "_selected_action": [item.pk], "index": "0"}),
        (f"/admin/dlq/bulkoperation/{operation.pk}/control/approve/", {}),
        (f"/admin/dlq/bulkoperation/{operation.pk}/control/cancel/", {}),
        (f"/admin/dlq/alertchannel/{console['channel'].pk}/change/", {"name": "x", "kind": "log"}),
        ("/admin/dlq/alertchannel/add/", {"name": "mine", "kind": "log"}),
        (f"/admin/dlq/alertrule/{console['rule'].pk}/change/", {"name": "x", "kind": "open_items", "threshold": "0"}),
        (f"/admin/dlq/alertrule/{console['rule'].pk}/delete/", {"post": "yes"}),
        (f"/admin/tasks/task/{item.task_id}/change/", {"pipeline": "other"}),
        (f"/admin/tasks/task/{console['queued'].pk}/act/cancel/", {"reason": "viewer tries"}),
        ("/admin/pipelines/t_local/act/pause/", {"reason": "viewer tries"}),
        ("/admin/pipelines/t_cancellable/act/resume/", {"reason": "viewer tries"}),
        ("/admin/pipelines/t_local/act/set_limits/", {"reason": "viewer tries", "max_concurrency": "1"}),
        ("/admin/pipelines/t_one_at_a_time/act/reset_limits/", {"reason": "viewer tries"}),
        ("/admin/rq/queues/0/empty/", {}),
        ("/admin/rq/queues/actions/0/", {"action": "delete", "job_ids": ["x"], "next_url": "https://evil.example/"}),
    ]
    driver.get(f"{live_server.url}/admin/")
    statuses = {url: driver.execute_async_script(POST_FROM_PAGE, url, data) for url, data in posts}
    assert {url: status for url, status in statuses.items() if status not in (403, 404)} == {}
    # Each POST reached its view (a CSRF failure would not be audited) and was recorded as denied.
    denied = AuditEntry.objects.filter(actor="viewer-v")
    assert denied.count() == len(posts) and set(denied.values_list("outcome", flat=True)) == {AuditOutcome.DENIED}

    assert set(DLQItem.objects.values_list("status", flat=True)) <= {DLQStatus.OPEN, DLQStatus.COMPENSATED}
    assert BulkOperation.objects.get(pk=operation.pk).status == BulkStatus.AWAITING_APPROVAL
    channel = AlertChannel.objects.get(pk=console["channel"].pk)
    assert (channel.name, channel.secret) == ("hook", SECRET) and AlertChannel.objects.filter(name="mine").count() == 0
    assert AlertRule.objects.get(pk=console["rule"].pk).threshold == 50
    assert get_queue().count == waiting
    assert Task.objects.get(pk=console["queued"].pk).state == TaskState.QUEUED
    controls = {c.pipeline: (c.paused, c.max_concurrency) for c in PipelineControl.objects.all()}
    assert controls == {"t_cancellable": (True, None), "t_one_at_a_time": (False, 2)}
