"""Live control in the console (issue #14): cancel from the task page, the Pipelines page and its actions, the audit
of every cancel and pipeline change (the API's too), the dashboard panel and the /metrics gauges.

Through the Django test client as each role, against real PostgreSQL and Redis; tasks are driven in-process
(``task_run``, ``task_claim``) as the workers would.
"""

from __future__ import annotations

import json
import re

import pytest
from django.db import transaction
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from dlq.models import AuditEntry, AuditOutcome
from tasks.execution.runner import task_run
from tasks.lifecycle.cancellation import task_cancel
from tasks.lifecycle.claims import task_claim
from tasks.lifecycle.controls import pipeline_pause
from tasks.models import PipelineControl, Task, TaskHold, TaskState
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

PIPELINES_URL = "/admin/pipelines/"


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


def cancel_url(task) -> str:
    return reverse("admin:tasks_task_cancel", args=[task.pk])


def task_url(task) -> str:
    return reverse("admin:tasks_task_change", args=[task.pk])


def act_url(pipeline: str, action: str) -> str:
    return reverse("pipeline_act", args=[pipeline, action])


def entries(**filters) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def running_task() -> Task:
    task = task_submit(pipeline="t_cancellable", input={})
    assert task_claim(task_id=str(task.pk), owner="w-test@host") is not None
    return Task.objects.get(pk=task.pk)


# --- cancel from the task page ------------------------------------------------------------------------------


def test_an_operator_cancels_a_queued_task_from_its_page_and_it_is_audited_once(client, role_users):
    task = task_submit(pipeline="t_cancellable", input={})
    client.force_login(role_users["operator"])

    page = client.get(task_url(task)).content.decode()
    assert f'href="{cancel_url(task)}"' in page and 'id="cancel-task-link"' in page
    confirm = client.get(cancel_url(task))
    assert confirm.status_code == 200 and 'id="confirm-form"' in confirm.content.decode()
    assert Task.objects.get(pk=task.pk).state == TaskState.QUEUED  # nothing happens on GET

    response = client.post(cancel_url(task), {"reason": "customer withdrew the order"}, follow=True)

    assert response.redirect_chain == [(task_url(task), 302)]
    assert messages_of(response) == ["Task cancelled: queued → cancelled."]
    task = Task.objects.get(pk=task.pk)
    assert task.state == TaskState.CANCELLED
    assert (task.cancel_requested_by, task.cancel_reason) == ("operator:operator-r", "customer withdrew the order")
    (entry,) = entries(action="task_cancelled")
    # The task records the engine's name; the audit log the username, as in the operator's other entries.
    assert (entry.actor, entry.outcome, entry.target_type, entry.target_id) == (
        "operator-r",
        AuditOutcome.SUCCEEDED,
        "task",
        str(task.pk),
    )
    assert (entry.task_id, entry.state_before, entry.state_after) == (task.pk, "queued", "cancelled")
    assert (entry.reason, entry.client_ip) == ("customer withdrew the order", "127.0.0.1")
    body = response.content.decode()
    assert 'id="rc-cancel-request"' in body and "customer withdrew the order" in body
    assert 'id="cancel-task-link"' not in body  # nothing left to cancel
    assert "Cancel task" in body.split('id="rc-audit"')[1]  # the entry, by the action's name


def test_a_running_task_is_asked_to_stop_at_its_next_boundary_and_a_repeat_is_refused(client, role_users):
    task = running_task()
    client.force_login(role_users["operator"])

    first = client.post(cancel_url(task), {"reason": "stop it"}, follow=True)

    assert messages_of(first) == ["Cancel requested: the task stops at its next step boundary."]
    task = Task.objects.get(pk=task.pk)
    assert task.state == TaskState.RUNNING and task.is_cancelled
    (success,) = entries(action="task_cancelled")
    assert (success.state_before, success.state_after, success.detail_code, success.detail) == (
        "running",
        "running",
        "cancel_at_boundary",
        "stops at its next step boundary",  # the English for readers of the column alone
    )
    assert "it stops at its next step boundary" in first.content.decode()

    again = client.post(cancel_url(task), {"reason": "stop it now"}, follow=True)

    assert again.redirect_chain == [(task_url(task), 302)]
    (message,) = messages_of(again)
    assert message.startswith("Not done: a cancel of this task was already requested by operator:operator-r at ")
    assert [e.outcome for e in entries(action="task_cancelled")] == [AuditOutcome.SUCCEEDED, AuditOutcome.REFUSED]
    refused = entries(action="task_cancelled", outcome=AuditOutcome.REFUSED)[0]
    assert (refused.actor, refused.detail_code, refused.reason) == ("operator-r", "cancel_repeated", "stop it now")
    assert refused.detail == "a cancel was already requested"
    assert Task.objects.get(pk=task.pk).cancel_reason == "stop it"  # the first request stands


def test_a_finished_task_is_not_cancellable_the_refusal_is_audited(client, role_users):
    task = task_submit(pipeline="t_local", input={})
    task_run(task_id=str(task.pk), worker="w1")
    client.force_login(role_users["operator"])
    assert 'id="cancel-task-link"' not in client.get(task_url(task)).content.decode()
    assert 'id="cancel-not-available"' in client.get(cancel_url(task)).content.decode()

    response = client.post(cancel_url(task), {"reason": "too late"}, follow=True)

    assert messages_of(response) == ["Not done: the task is succeeded: there is nothing left to cancel"]
    (entry,) = entries(action="task_cancelled")
    assert (entry.outcome, entry.state_before, entry.actor) == (AuditOutcome.REFUSED, "succeeded", "operator-r")
    # The engine's refusal by its code and facts, worded for each reader.
    assert (entry.detail_code, entry.detail_params) == ("task_not_cancellable", {"state": "succeeded"})
    assert entry.detail == "the task is succeeded: there is nothing left to cancel"
    shown = client.get(reverse("admin:dlq_auditentry_change", args=[entry.pk]), HTTP_ACCEPT_LANGUAGE="zh-Hans")
    assert "任务状态为已成功：已没有可取消的内容" in shown.content.decode()
    assert Task.objects.get(pk=task.pk).state == TaskState.SUCCEEDED


@pytest.mark.parametrize("reason", ["", "   ", "x" * 1001])
def test_a_cancel_without_a_reason_or_with_a_too_long_one_is_a_form_error_and_changes_nothing(
    client, role_users, reason
):
    task = task_submit(pipeline="t_cancellable", input={})
    client.force_login(role_users["operator"])

    response = client.post(cancel_url(task), {"reason": reason})

    assert response.status_code == 400 and 'id="form-error"' in response.content.decode()
    assert Task.objects.get(pk=task.pk).state == TaskState.QUEUED and not AuditEntry.objects.exists()
    # The refused text is shown again, never more than may be stored.
    assert ("x" * 1001) not in response.content.decode()


def test_a_viewer_sees_no_cancel_and_a_posted_cancel_is_refused_and_audited(client, role_users):
    task = task_submit(pipeline="t_cancellable", input={})
    client.force_login(role_users["viewer"])
    assert 'id="cancel-task-link"' not in client.get(task_url(task)).content.decode()
    assert client.get(cancel_url(task)).status_code == 403

    assert client.post(cancel_url(task), {"reason": "viewer tries"}).status_code == 403

    assert Task.objects.get(pk=task.pk).state == TaskState.QUEUED
    (entry,) = entries()
    assert (entry.actor, entry.action, entry.outcome, entry.target_id, entry.reason) == (
        "viewer-r",
        "task_cancelled",
        AuditOutcome.DENIED,
        str(task.pk),
        "viewer tries",
    )


def test_an_api_clients_cancel_is_audited_with_the_client_as_actor(client, token):
    submitted = client.post(
        "/api/v1/tasks",
        json.dumps({"pipeline": "t_cancellable", "input": {}}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    task_id = submitted.json()["id"]

    response = client.post(
        f"/api/v1/tasks/{task_id}/cancel",
        json.dumps({"reason": "order withdrawn"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    again = client.post(
        f"/api/v1/tasks/{task_id}/cancel", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert again.status_code == 200  # a repeat is the same cancel: no second entry

    (entry,) = entries(target_type="task")  # the token fixture's client creation has its own entry
    assert (entry.actor, entry.action, entry.outcome, str(entry.task_id)) == (
        "client:client-a",
        "task_cancelled",
        AuditOutcome.SUCCEEDED,
        task_id,
    )
    assert (entry.reason, entry.client_ip, entry.state_after) == ("order withdrawn", "127.0.0.1", "cancelled")


def test_a_cancel_and_its_audit_entry_commit_or_roll_back_together():
    task = task_submit(pipeline="t_cancellable", input={})
    with pytest.raises(RuntimeError), transaction.atomic():
        task_cancel(task_id=task.pk, actor="python:job", reason="rolled back")
        assert AuditEntry.objects.filter(action="task_cancelled").count() == 1  # written in the cancel's transaction
        raise RuntimeError("the caller's transaction fails")
    assert not AuditEntry.objects.exists() and Task.objects.get(pk=task.pk).state == TaskState.QUEUED
    task_cancel(task_id=task.pk, actor="python:job", reason="for real")
    assert [e.actor for e in entries(action="task_cancelled")] == ["python:job"]


def test_the_task_list_filters_cancelled_tasks(client, role_users):
    cancelled = task_submit(pipeline="t_cancellable", input={})
    task_cancel(task_id=cancelled.pk, actor="client:a", reason="no")
    task_submit(pipeline="t_cancellable", input={})
    client.force_login(role_users["viewer"])

    response = client.get("/admin/tasks/task/?state=cancelled")

    assert [task.pk for task in response.context["cl"].result_list] == [cancelled.pk]
    assert "?state=cancelled" in response.content.decode()  # offered by the filter


def test_the_task_page_says_why_a_held_task_waits(client, role_users):
    pipeline_pause(pipeline="t_local", actor="operator:someone", reason="downstream is down")
    task = task_submit(pipeline="t_local", input={})
    task_run(task_id=str(task.pk), worker="w1")
    assert Task.objects.get(pk=task.pk).hold == TaskHold.PAUSED
    client.force_login(role_users["viewer"])

    body = client.get(task_url(task)).content.decode()

    assert 'id="rc-hold"' in body and "its pipeline is paused" in body


# --- the Pipelines page ----------------------------------------------------------------------------------


def test_every_role_sees_the_pipelines_page_and_only_a_supervisor_gets_its_actions(client, role_users):
    pipeline_pause(pipeline="t_local", actor="operator:someone", reason="downstream is down")
    held = task_submit(pipeline="t_local", input={})
    task_run(task_id=str(held.pk), worker="w1")
    for role in ("viewer", "operator", "supervisor"):
        client.force_login(role_users[role])
        assert f'href="{PIPELINES_URL}"' in client.get("/admin/").content.decode(), role
        response = client.get(PIPELINES_URL)
        assert response.status_code == 200, role
        body = response.content.decode()
        local = body.split('id="pipeline-t_local"')[1].split("</tr>")[0]
        assert "by operator:someone since" in local and "downstream is down" in local
        assert 'class="pipeline-held-paused">pipeline paused: 1<' in local
        limited = body.split('id="pipeline-t_one_at_a_time"')[1].split("</tr>")[0]
        assert re.search(r'<span>1</span>\s*<div class="rc-quiet">declared: 1</div>', limited)
        assert ("/act/" in body) == (role == "supervisor"), role
    assert 'href="/admin/pipelines/t_local/act/resume/"' in body  # the supervisor's page
    assert 'href="/admin/pipelines/t_local/act/pause/"' not in body  # already paused


def test_a_supervisor_pauses_and_resumes_a_pipeline_audited_and_its_held_tasks_start(client, role_users):
    client.force_login(role_users["supervisor"])
    confirm = client.get(act_url("t_local", "pause"))
    assert confirm.status_code == 200 and not PipelineControl.objects.exists()

    paused = client.post(act_url("t_local", "pause"), {"reason": "platform incident"}, follow=True)

    assert paused.redirect_chain == [(f"{PIPELINES_URL}#pipeline-t_local", 302)]
    assert messages_of(paused) == ["Pipeline t_local paused: no step of it starts until it is resumed."]
    control = PipelineControl.objects.get(pipeline="t_local")
    assert (control.paused, control.paused_by, control.pause_reason) == (
        True,
        "operator:supervisor-r",
        "platform incident",
    )
    task = task_submit(pipeline="t_local", input={})
    task_run(task_id=str(task.pk), worker="w1")
    assert Task.objects.get(pk=task.pk).hold == TaskHold.PAUSED
    dashboard = client.get("/admin/dashboard/").content.decode()
    assert 'id="ops-paused-t_local"' in dashboard and "platform incident" in dashboard
    assert 'id="ops-hold-t_local-paused"' in dashboard

    resumed = client.post(act_url("t_local", "resume"), {"reason": "incident over"}, follow=True)

    assert messages_of(resumed) == ["Pipeline t_local resumed: its held tasks start again."]
    assert not PipelineControl.objects.get(pipeline="t_local").paused
    assert Task.objects.get(pk=task.pk).hold == TaskHold.NONE  # released: delivered again
    task_run(task_id=str(task.pk), worker="w1")
    assert Task.objects.get(pk=task.pk).state == TaskState.SUCCEEDED
    log = entries(target_type="pipeline")
    assert [(e.action, e.state_before, e.state_after, e.reason) for e in log] == [
        ("pipeline_paused", "running", "paused", "platform incident"),
        ("pipeline_resumed", "paused", "running", "incident over"),
    ]
    assert {(e.actor, e.target_id, e.outcome, e.client_ip) for e in log} == {
        ("supervisor-r", "t_local", AuditOutcome.SUCCEEDED, "127.0.0.1")
    }
    audit_list = client.get("/admin/dlq/auditentry/").content.decode()
    assert "Pause pipeline" in audit_list and "Resume pipeline" in audit_list


def test_a_supervisor_sets_and_resets_limits_audited_with_their_before_and_after(client, role_users):
    client.force_login(role_users["supervisor"])

    response = client.post(
        act_url("t_one_at_a_time", "set_limits"),
        {"max_concurrency": "3", "rate_limit": "5/s", "reason": "platform can take more"},
        follow=True,
    )

    assert messages_of(response) == ["Limits of pipeline t_one_at_a_time set: max concurrency 3, rate limit 5/s."]
    control = PipelineControl.objects.get(pipeline="t_one_at_a_time")
    assert (control.max_concurrency, control.rate_limit) == (3, "5/s")
    assert control.limits_changed_by == "operator:supervisor-r"
    page = client.get(PIPELINES_URL).content.decode().split('id="pipeline-t_one_at_a_time"')[1].split("</tr>")[0]
    assert 'class="rc-overridden">3</span>' in page and 'class="rc-overridden">5/s</span>' in page
    assert "by operator:supervisor-r at" in page
    (entry,) = entries(action="pipeline_limits_set")
    limits = {
        "before": {"max_concurrency": "declared", "rate_limit": "declared"},
        "after": {"max_concurrency": 3, "rate_limit": "5/s"},
    }
    # The limits are the code's parameters; the column keeps the JSON earlier releases word themselves.
    assert (entry.detail_code, entry.detail_params, json.loads(entry.detail)) == ("limits_changed", limits, limits)
    shown = client.get(reverse("admin:dlq_auditentry_change", args=[entry.pk])).content.decode()
    assert "max concurrency: as declared → 3; rate limit: as declared → 5/s" in shown

    no_rate = client.post(
        act_url("t_one_at_a_time", "set_limits"), {"no_rate_limit": "1", "reason": "no rate limit for now"}, follow=True
    )
    assert messages_of(no_rate) == ["Limits of pipeline t_one_at_a_time set: max concurrency 3, rate limit none."]
    control.refresh_from_db()
    assert (control.max_concurrency, control.rate_limit, control.rate_overridden) == (3, "", True)

    reset = client.post(act_url("t_one_at_a_time", "reset_limits"), {"reason": "back to normal"}, follow=True)

    assert messages_of(reset) == [
        "Pipeline t_one_at_a_time is back to the limits its code declares: max concurrency 1, rate limit none."
    ]
    control.refresh_from_db()
    assert not control.concurrency_overridden and not control.rate_overridden
    assert [e.action for e in entries(target_type="pipeline")] == [
        "pipeline_limits_set",
        "pipeline_limits_set",
        "pipeline_limits_reset",
    ]
    last = entries(action="pipeline_limits_reset")[0]
    assert json.loads(last.detail)["after"] == {"max_concurrency": "declared", "rate_limit": "declared"}


@pytest.mark.parametrize(
    "form",
    [
        {"max_concurrency": "0"},
        {"max_concurrency": "two"},
        {"max_concurrency": "100001"},
        {"rate_limit": "5/x"},
        {"rate_limit": "0/s"},
        {"rate_limit": "5 per second"},
        {"max_concurrency": "2", "no_concurrency_limit": "1"},
        {},
        {"max_concurrency": "2", "reason": ""},
        {"max_concurrency": "2", "reason": "x" * 1001},
    ],
)
def test_a_bad_limit_or_reason_is_a_form_error_that_changes_nothing(client, role_users, form):
    client.force_login(role_users["supervisor"])

    response = client.post(act_url("t_one_at_a_time", "set_limits"), {"reason": "try", **form})

    assert response.status_code == 400 and 'id="form-error"' in response.content.decode()
    assert not PipelineControl.objects.exists() and not AuditEntry.objects.exists()


def test_an_engine_refusal_is_a_message_and_audited(client, role_users):
    client.force_login(role_users["supervisor"])

    response = client.post(act_url("t_local", "resume"), {"reason": "was it paused?"}, follow=True)

    assert messages_of(response) == ["Not done: the pipeline is not paused"]
    (entry,) = entries()
    assert (entry.action, entry.outcome, entry.actor, entry.target_id) == (
        "pipeline_resumed",
        AuditOutcome.REFUSED,
        "supervisor-r",
        "t_local",
    )
    assert (entry.detail_code, entry.detail_params) == ("not_paused", {"pipeline": "t_local"})
    assert entry.detail == "pipeline t_local is not paused"
    shown = client.get(reverse("admin:dlq_auditentry_change", args=[entry.pk]), HTTP_ACCEPT_LANGUAGE="zh-Hans")
    assert "流水线 t_local 未暂停" in shown.content.decode()
    assert client.get(act_url("no_such_pipeline", "pause")).status_code == 404


@pytest.mark.parametrize("role", ["viewer", "operator"])
@pytest.mark.parametrize("action", ["pause", "resume", "set_limits", "reset_limits"])
def test_below_supervisor_a_pipeline_action_is_refused_and_audited(client, role_users, role, action):
    client.force_login(role_users[role])
    assert client.get(act_url("t_local", action)).status_code == 403

    response = client.post(act_url("t_local", action), {"reason": "let me", "max_concurrency": "1"})

    assert response.status_code == 403
    (entry,) = entries()
    assert (entry.actor, entry.outcome, entry.target_type, entry.target_id) == (
        f"{role}-r",
        AuditOutcome.DENIED,
        "pipeline",
        "t_local",
    )
    assert not PipelineControl.objects.exists()


# --- /metrics ----------------------------------------------------------------------------------------


def test_metrics_export_paused_pipelines_and_held_tasks(client, settings):
    settings.RELIABILITY_METRICS_TOKEN = "scrape-me"
    settings.RELIABILITY_METRICS_ALLOWED_NETWORKS = []
    pipeline_pause(pipeline="t_local", actor="operator:someone", reason="incident")
    for _ in range(2):
        task = task_submit(pipeline="t_local", input={})
        task_run(task_id=str(task.pk), worker="w1")
    cancelled = task_submit(pipeline="t_cancellable", input={})
    task_cancel(task_id=cancelled.pk, actor="client:a", reason="no")

    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").content.decode()

    found = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }
    assert found[("reliability_pipeline_paused", frozenset({("pipeline", "t_local")}))] == 1
    assert found[("reliability_pipeline_paused", frozenset({("pipeline", "t_one_at_a_time")}))] == 0
    assert found[("reliability_tasks_held", frozenset({("pipeline", "t_local"), ("hold", "paused")}))] == 2
    recent = frozenset({("pipeline", "t_cancellable"), ("state", "cancelled")})
    assert found[("reliability_tasks_recent", recent)] == 1
