"""A viewer's POST to any page that writes is refused and audited, and changes nothing."""

from __future__ import annotations

import pytest

from dlq.alerting.models import AlertChannel, AlertRule
from dlq.models import AuditEntry, AuditOutcome, DLQItem
from tasks.execution.runner import task_run
from tasks.lifecycle.clients import api_client_create
from tasks.models import DLQStatus, Task
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_viewers_writes_through_model_pages_are_refused_and_audited(client, role_users, clean_redis):
    task = task_submit(pipeline="t_parked", input={"fail": True})
    task_run(task_id=str(task.pk), worker="w1")
    item = DLQItem.objects.get(task=task)
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url="https://receiver.example/h", secret="s")
    rule = AlertRule.objects.create(name="open", kind="open_items", threshold=5)
    api_client, _token = api_client_create(name="ci")
    counts = (AlertChannel.objects.count(), AlertRule.objects.count())
    client.force_login(role_users["viewer"])
    posts = [
        (f"/admin/dlq/alertchannel/{channel.pk}/change/", {"name": "x", "kind": "log", "url": "", "secret": ""}),
        ("/admin/dlq/alertchannel/add/", {"name": "mine", "kind": "log"}),
        (f"/admin/dlq/alertchannel/{channel.pk}/delete/", {"post": "yes"}),
        (f"/admin/dlq/alertrule/{rule.pk}/change/", {"name": "x", "kind": "open_items", "threshold": "0"}),
        ("/admin/dlq/alertrule/add/", {"name": "mine", "kind": "open_items", "threshold": "0"}),
        (f"/admin/dlq/alertrule/{rule.pk}/delete/", {"post": "yes"}),
        (f"/admin/tasks/task/{task.pk}/change/", {"pipeline": "other"}),
        ("/admin/dlq/dlqitem/", {"action": "act_close", "_selected_action": [item.pk], "index": "0"}),
        (f"/admin/dlq/dlqitem/{item.pk}/change/", {"status": "resolved"}),
        ("/admin/tasks/apiclient/", {"action": "revoke", "_selected_action": [api_client.pk]}),
    ]
    for url, data in posts:
        assert client.post(url, data).status_code == 403, url
    denied = AuditEntry.objects.filter(actor="viewer-r", outcome=AuditOutcome.DENIED)
    assert denied.count() == len(posts), list(denied.values_list("action", flat=True))
    assert {"change_alertchannel", "add_alertrule", "delete_alertrule", "act_close_dlqitem", "revoke_apiclient"} <= set(
        denied.values_list("action", flat=True)
    )
    channel.refresh_from_db()
    assert (channel.name, channel.secret) == ("hook", "s")
    assert (AlertChannel.objects.count(), AlertRule.objects.count()) == counts
    assert AlertRule.objects.get(pk=rule.pk).threshold == 5 and Task.objects.get(pk=task.pk).pipeline == "t_parked"
    assert DLQItem.objects.get(pk=item.pk).status == DLQStatus.OPEN
    api_client.refresh_from_db()
    assert api_client.revoked_at is None
