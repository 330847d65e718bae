"""A refused request costs the log one line (the audit's), never Django's warning with a traceback.

The log is the project's own: the settings' LOGGING (with its filter on ``django.request``) and its
``StructuredFormatter``, every line of the formatted output counted, tracebacks included.
"""

from __future__ import annotations

import logging

import pytest

from dlq.alerting.models import AlertChannel
from dlq.models import AuditEntry, AuditOutcome, DLQItem
from reliability_console.logging import StructuredFormatter
from tasks.execution.runner import task_run
from tasks.lifecycle.clients import api_client_create
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


class FormattedLines(logging.Handler):
    """Every line the project's formatter writes, as a handler on the root logger would write it."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(StructuredFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(self.format(record).splitlines())


@pytest.fixture
def log_lines():
    handler = FormattedLines()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler.lines
    root.removeHandler(handler)


def test_a_hundred_forged_posts_write_a_hundred_entries_and_at_most_a_hundred_log_lines(
    client, role_users, clean_redis, log_lines
):
    task = task_submit(pipeline="t_parked", input={"fail": True})
    task_run(task_id=str(task.pk), worker="w1")
    item = DLQItem.objects.get(task=task)
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url="https://receiver.example/h", secret="s")
    api_client, _token = api_client_create(name="billing")
    client.force_login(role_users["viewer"])
    forged = [
        ("/admin/tasks/apiclient/", {"action": "revoke", "_selected_action": [api_client.pk]}),
        ("/admin/dlq/dlqitem/", {"action": "act_close", "_selected_action": [item.pk], "index": "0"}),
        (f"/admin/dlq/dlqitem/{item.pk}/act/close/", {"reason": "forged", "resolution_code": "duplicate"}),
        (f"/admin/dlq/alertchannel/{channel.pk}/change/", {"name": "x", "kind": "log", "url": "", "secret": ""}),
    ]
    before = AuditEntry.objects.count()
    log_lines.clear()

    for n in range(100):
        url, data = forged[n % len(forged)]
        assert client.post(url, data).status_code == 403, url

    denied = AuditEntry.objects.filter(actor="viewer-r", outcome=AuditOutcome.DENIED)
    assert AuditEntry.objects.count() - before == denied.count() == 100
    assert len(log_lines) <= 100, "\n".join(log_lines[:60])
    assert not any("Traceback" in line for line in log_lines)
    refusals = [line for line in log_lines if "event=permission_denied" in line]
    assert len(refusals) == 100
    assert all(field in refusals[0] for field in ("action=revoke_apiclient", "actor=viewer-r", "target_id=billing"))


def test_a_refusal_nobody_audited_keeps_djangos_line_without_its_traceback(client, role_users, log_lines):
    api_client, _token = api_client_create(name="billing")
    client.force_login(role_users["viewer"])
    # First an audited refusal: its mark must not silence the next request's.
    client.post("/admin/tasks/apiclient/", {"action": "revoke", "_selected_action": [api_client.pk]})
    log_lines.clear()

    assert client.get("/admin/tasks/apiclient/").status_code == 403  # a viewer may not see API clients

    assert len(log_lines) == 1, log_lines
    assert "Forbidden (Permission denied): /admin/tasks/apiclient/" in log_lines[0]


def test_an_error_keeps_its_traceback(log_lines):
    try:
        raise RuntimeError("a real failure")
    except RuntimeError:
        logging.getLogger("django.request").error("Internal Server Error: /x", exc_info=True)
    assert any(line.startswith("Traceback") for line in log_lines)
    assert any("RuntimeError: a real failure" in line for line in log_lines)
