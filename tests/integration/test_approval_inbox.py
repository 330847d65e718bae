"""The approval inbox (issue 23, point 3): the tasks waiting at an approval wait, listed for every role; operators
and supervisors approve or reject one with a reason, sent as the wait's signal through the engine's sender and
audited; viewers are refused and audited; a task that left the wait is refused and nothing changes.

Through the Django test client as each role, against real PostgreSQL and Redis; tasks are driven in-process
(``task_run``) as the workers would.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dlq.alerting.models import AlertChannel, AlertKind, AlertRule
from dlq.alerting.rules import alert_rule_evaluate
from dlq.approval_pages import PAGE_SIZE
from dlq.approvals import approval_decide
from dlq.audit_actions import APPROVAL_APPROVED, APPROVAL_REJECTED
from dlq.models import AuditEntry, AuditOutcome
from tasks.execution.runner import task_run
from tasks.lifecycle.cancellation import task_cancel
from tasks.lifecycle.signals import task_signal
from tasks.models import Checkpoint, Signal, Task, TaskState, WaitKind
from tasks.models.door import door_forced
from tasks.selectors import approval_waiting_tasks, waiting_counts
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

INBOX_URL = "/admin/approvals/"
WAIT = "manager_approval"
SECRET = "hunter2-correct-horse-battery"


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def waiting_for_approval(pipeline: str = "t_approval", **input) -> Task:
    """A task of ``pipeline`` run to its wait: WAITING for the signal ``manager_approval``."""
    task = task_submit(pipeline=pipeline, input={"amount": 25, **input})
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.WAITING
    task = Task.objects.get(pk=task.pk)
    assert (task.wait_for, task.current_step_name) == (WaitKind.SIGNAL, WAIT)
    return task


def decide_url(task, decision: str, wait: str = WAIT) -> str:
    return reverse("approval_decide", args=[task.pk, wait, decision])


def entries(**filters) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_the_inbox_lists_only_tasks_waiting_at_an_approval_wait_redacted(client, role_users):
    shown = waiting_for_approval(password=SECRET)
    # Waiting for a signal, but at a wait that is not an approval (t_approval_short's has approval=False).
    not_approval = waiting_for_approval(pipeline="t_approval_short")
    decided = waiting_for_approval()
    task_signal(task_id=decided.pk, name=WAIT, payload={"approved": True, "by": "x", "reason": "y"})
    queued = task_submit(pipeline="t_approval", input={"amount": 1})
    client.force_login(role_users["viewer"])

    response = client.get(INBOX_URL)

    assert response.status_code == 200
    assert [row.task.pk for row in response.context["rows"]] == [shown.pk]
    body = response.content.decode()
    for absent in (not_approval, decided, queued):
        assert str(absent.pk) not in body
    row = response.context["rows"][0]
    assert (row.wait, row.timeout_seconds) == (WAIT, 30.0)
    assert f'href="{reverse("admin:tasks_task_change", args=[shown.pk])}"' in body
    # The input and the earlier step's output, redacted as the task page shows them.
    assert SECRET not in body and "[redacted]" in body
    assert [step for step, _output in row.outputs] == ["draft_refund"]
    assert "&quot;refund&quot;: 25" in body
    assert shown.wait_until.strftime("%Y-%m-%d %H:%M:%S") in body or "Timeout" in body
    # A viewer sees the inbox but is offered no decision.
    assert row.decisions == [] and 'id="approvals-read-only"' in body and "decision-approve" not in body


def test_the_inbox_filters_by_pipeline_and_pages_in_a_bounded_number_of_queries(client, role_users):
    tasks = [waiting_for_approval(n=index) for index in range(PAGE_SIZE + 2)]
    client.force_login(role_users["operator"])
    client.get(INBOX_URL)  # the session and the user are read once before the count below

    with CaptureQueriesContext(connection) as queries:
        first = client.get(INBOX_URL)
    # The session, the user, the permissions (user's and groups'), the count, the page, the page's checkpoints:
    # the same whatever the page's length (no query per row).
    assert len(queries) <= 8, [query["sql"] for query in queries]
    assert len(first.context["rows"]) == PAGE_SIZE
    assert [row.task.pk for row in first.context["rows"]] == [task.pk for task in tasks[:PAGE_SIZE]]
    second = client.get(INBOX_URL, {"p": 2, "pipeline": "t_approval"})
    assert [row.task.pk for row in second.context["rows"]] == [task.pk for task in tasks[PAGE_SIZE:]]
    assert 'href="?pipeline=t_approval&amp;p=1"' in second.content.decode()

    other = client.get(INBOX_URL, {"pipeline": "t_approval_short"})
    assert other.status_code == 200 and other.context["rows"] == []
    assert 'id="approvals-unknown-pipeline"' in other.content.decode()  # it has no approval wait
    # Bad input is a message, never a 500.
    for bad in ({"p": "x"}, {"p": "-1"}, {"pipeline": "n" * 5000}, {"p": "99999"}):
        assert client.get(INBOX_URL, bad).status_code == 200


def test_an_operator_approves_with_a_reason_the_task_goes_on_and_it_is_audited(client, role_users):
    task = waiting_for_approval()
    client.force_login(role_users["operator"])
    inbox = client.get(INBOX_URL).content.decode()
    assert f'href="{decide_url(task, "approve")}"' in inbox and f'href="{decide_url(task, "reject")}"' in inbox

    confirm = client.get(decide_url(task, "approve"))
    assert confirm.status_code == 200 and 'id="confirm-form"' in confirm.content.decode()
    assert Task.objects.get(pk=task.pk).state == TaskState.WAITING  # nothing happens on GET

    response = client.post(decide_url(task, "approve"), {"reason": "within policy"}, follow=True)

    assert response.redirect_chain == [(INBOX_URL, 302)]
    assert messages_of(response) == [f"Task {task.pk} approved at {WAIT}: it goes on."]
    signal = Signal.objects.get(task_id=task.pk)
    assert (signal.name, signal.payload) == (WAIT, {"approved": True, "by": "operator-r", "reason": "within policy"})
    assert signal.sent_by == "operator:operator-r"
    assert Task.objects.get(pk=task.pk).state == TaskState.QUEUED  # woken: no longer WAITING
    (entry,) = entries(target_type="task")
    assert (entry.action, entry.outcome, entry.actor, entry.reason) == (
        APPROVAL_APPROVED,
        AuditOutcome.SUCCEEDED,
        "operator-r",
        "within policy",
    )
    assert (entry.task_id, entry.state_before, entry.state_after) == (task.pk, "waiting", "queued")
    assert entry.detail_params == {"wait": WAIT}
    # The task goes on and its next step reads the decision.
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    assert Task.objects.get(pk=task.pk).result["paid"] is True


def test_a_supervisor_rejects_and_the_pipeline_reads_the_rejection(client, role_users):
    task = waiting_for_approval()
    client.force_login(role_users["supervisor"])

    response = client.post(decide_url(task, "reject"), {"reason": "amount over the limit"}, follow=True)

    assert response.redirect_chain == [(INBOX_URL, 302)]
    payload = Signal.objects.get(task_id=task.pk).payload
    assert payload == {"approved": False, "by": "supervisor-r", "reason": "amount over the limit"}
    (entry,) = entries(target_type="task")
    assert (entry.action, entry.outcome) == (APPROVAL_REJECTED, AuditOutcome.SUCCEEDED)
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    assert Task.objects.get(pk=task.pk).result["paid"] is False
    assert Checkpoint.objects.get(task_id=task.pk, step_name=WAIT).output == payload


def test_a_viewers_post_is_a_403_audited_as_denied_and_changes_nothing(client, role_users):
    task = waiting_for_approval()
    client.force_login(role_users["viewer"])

    assert client.get(decide_url(task, "approve")).status_code == 403
    response = client.post(decide_url(task, "approve"), {"reason": "let me"})

    assert response.status_code == 403
    assert not Signal.objects.filter(task_id=task.pk).exists()
    assert Task.objects.get(pk=task.pk).state == TaskState.WAITING
    (entry,) = entries(target_type="task")
    assert (entry.action, entry.outcome, entry.actor, entry.target_id) == (
        APPROVAL_APPROVED,
        AuditOutcome.DENIED,
        "viewer-r",
        str(task.pk),
    )


@pytest.mark.parametrize("reason", ["", "   "])
def test_an_empty_reason_is_a_form_error_and_changes_nothing(client, role_users, reason):
    task = waiting_for_approval()
    client.force_login(role_users["operator"])

    response = client.post(decide_url(task, "approve"), {"reason": reason})

    assert response.status_code == 400
    assert 'id="form-error"' in response.content.decode()
    assert not Signal.objects.filter(task_id=task.pk).exists()
    assert Task.objects.get(pk=task.pk).state == TaskState.WAITING
    assert entries() == []


def test_a_task_no_longer_waiting_is_refused_with_a_message_and_nothing_changes(client, role_users):
    decided = waiting_for_approval()
    cancelled = waiting_for_approval()
    client.force_login(role_users["operator"])
    client.post(decide_url(decided, "approve"), {"reason": "first"}, follow=True)
    task_cancel(task_id=cancelled.pk, actor="client:a", reason="withdrawn")
    before = AuditEntry.objects.count()

    second = client.post(decide_url(decided, "reject"), {"reason": "second thoughts"}, follow=True)
    late = client.post(decide_url(cancelled, "approve"), {"reason": "too late"}, follow=True)
    wrong_wait = client.post(decide_url(waiting_for_approval(), "approve", wait="draft_refund"), {"reason": "x"})

    assert second.redirect_chain == [(INBOX_URL, 302)] and late.redirect_chain == [(INBOX_URL, 302)]
    assert wrong_wait.status_code == 302
    (message,) = messages_of(second)
    assert message.startswith("Not done: the task is no longer waiting for this approval (it is queued)")
    (message,) = messages_of(late)
    assert "it is cancelled" in message
    # The first decision stands; the cancelled task got no signal.
    assert Signal.objects.get(task_id=decided.pk).payload["reason"] == "first"
    assert not Signal.objects.filter(task_id=cancelled.pk).exists()
    refused = entries(outcome=AuditOutcome.REFUSED)
    assert AuditEntry.objects.count() == before + 3 and len(refused) == 3
    assert [entry.detail_code for entry in refused] == ["approval_not_waiting"] * 3
    # The confirmation page says so too, and offers nothing that would act.
    page = client.get(decide_url(decided, "approve")).content.decode()
    assert 'id="decision-not-available"' in page


def test_a_post_without_the_csrf_token_is_refused(role_users):
    task = waiting_for_approval()
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(role_users["operator"])

    response = csrf_client.post(decide_url(task, "approve"), {"reason": "forged"})

    assert response.status_code == 403
    assert not Signal.objects.filter(task_id=task.pk).exists()
    assert Task.objects.get(pk=task.pk).state == TaskState.WAITING


def test_unknown_decisions_and_tasks_are_404s(client, role_users):
    task = waiting_for_approval()
    client.force_login(role_users["operator"])
    assert client.get(decide_url(task, "maybe")).status_code == 404
    assert client.get(f"/admin/approvals/{'0' * 8}-0000-0000-0000-{'0' * 12}/{WAIT}/approve/").status_code == 404


def test_the_index_links_to_the_inbox(client, role_users):
    client.force_login(role_users["viewer"])
    assert f'href="{INBOX_URL}" id="approvals-link"' in client.get("/admin/").content.decode()


def test_waiting_counts_group_by_pipeline_wait_and_kind():
    approval = waiting_for_approval()
    waiting_for_approval(pipeline="t_approval_short")
    sleeping = task_submit(pipeline="t_sleep_seconds", input={})
    assert task_run(task_id=str(sleeping.pk), worker="w1") == TaskState.WAITING
    task_submit(pipeline="t_local", input={}, run_at=timezone.now() + timedelta(hours=1))

    counts = {(row.pipeline, row.wait, row.kind): (row.count, row.approval) for row in waiting_counts()}

    assert counts == {
        ("t_approval", WAIT, "signal"): (1, True),
        ("t_approval_short", WAIT, "signal"): (1, False),
        ("t_sleep_seconds", "cool_off", "time"): (1, False),
        ("t_local", "", "start"): (1, False),
    }
    assert list(approval_waiting_tasks().values_list("pk", flat=True)) == [approval.pk]


# --- /metrics, the dashboard, the alert rule -----------------------------------------------------------------


def waited(task: Task, *, hours: float) -> None:
    """As if ``task`` began to wait ``hours`` ago (a waiting task's ``updated_at`` is when it began)."""
    with door_forced():
        Task.objects.filter(pk=task.pk).update(updated_at=timezone.now() - timedelta(hours=hours))


def test_metrics_export_waiting_tasks_and_the_oldest_approval(client, settings):
    settings.RELIABILITY_METRICS_TOKEN = "scrape-me"
    settings.RELIABILITY_METRICS_ALLOWED_NETWORKS = []
    oldest = waiting_for_approval()
    waited(oldest, hours=2)
    waiting_for_approval()
    waiting_for_approval(pipeline="t_approval_short")
    sleeping = task_submit(pipeline="t_sleep_seconds", input={})
    task_run(task_id=str(sleeping.pk), worker="w1")
    task_submit(pipeline="t_local", input={}, run_at=timezone.now() + timedelta(hours=1))

    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").content.decode()

    found = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name in ("reliability_tasks_waiting", "reliability_approvals_oldest_waiting_seconds")
    }
    waiting = "reliability_tasks_waiting"
    assert found == {
        (waiting, frozenset({("pipeline", "t_approval"), ("wait", WAIT), ("kind", "signal")})): 2,
        (waiting, frozenset({("pipeline", "t_approval_short"), ("wait", WAIT), ("kind", "signal")})): 1,
        (waiting, frozenset({("pipeline", "t_sleep_seconds"), ("wait", "cool_off"), ("kind", "time")})): 1,
        (waiting, frozenset({("pipeline", "t_local"), ("wait", ""), ("kind", "start")})): 1,
        (
            "reliability_approvals_oldest_waiting_seconds",
            frozenset({("pipeline", "t_approval"), ("wait", WAIT)}),
        ): pytest.approx(7200, abs=60),
    }


def test_the_dashboard_counts_waiting_tasks_and_links_approvals_to_the_inbox(client, role_users):
    waiting_for_approval()
    waiting_for_approval(pipeline="t_approval_short")
    client.force_login(role_users["viewer"])

    body = client.get("/admin/dashboard/").content.decode()

    assert 'id="ops-approvals-waiting"' in body
    approval_row = body.split(f'id="ops-waiting-t_approval-signal-{WAIT}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="ops-approval"' in body and f'href="{INBOX_URL}?pipeline=t_approval">1</a>' in approval_row
    plain_row = body.split(f'id="ops-waiting-t_approval_short-signal-{WAIT}"', 1)[1].split("</tr>", 1)[0]
    assert "href=" not in plain_row and ">1</td>" in plain_row


def test_the_approval_waiting_rule_fires_past_its_limit_and_resolves_once_decided(role_users):
    AlertRule.objects.all().delete()
    AlertChannel.objects.all().delete()
    rule = AlertRule.objects.create(name="approvals", kind=AlertKind.APPROVAL_WAITING, threshold=3600)
    scoped = AlertRule.objects.create(name="other", kind=AlertKind.APPROVAL_WAITING, threshold=3600, pipeline="t_other")
    young = waiting_for_approval()
    waited(young, hours=0.5)

    def evaluate(which):
        return alert_rule_evaluate(rule=AlertRule.objects.get(pk=which.pk), now=timezone.now())

    assert evaluate(rule) is None  # the longest has waited half an hour: under the limit
    old = waiting_for_approval()
    waited(old, hours=2)
    event = evaluate(rule)
    assert event.kind == "firing" and 7100 < event.value < 7300
    assert event.summary_code == "approval_waiting" and event.summary_params["count"] == 1
    assert event.summary.startswith("1 task(s) in all pipelines waiting for approval longer than 3600s")
    assert evaluate(scoped) is None  # another pipeline's rule: nothing waits there

    approval_decide(task_id=old.pk, wait=WAIT, decision="approve", actor=role_users["operator"], reason="late but fine")
    resolved = evaluate(rule)
    assert resolved.kind == "resolved" and resolved.value < 3600
    assert AlertRule.objects.get(pk=rule.pk).state == "resolved"
