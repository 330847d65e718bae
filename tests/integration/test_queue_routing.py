"""Every job of a task goes to its pipeline's queue: submission, retries, the sweeper's re-deliveries, operators."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from tasks.delivery import enqueue
from tasks.delivery.queues import queue_for_pipeline
from tasks.delivery.sweeper import sweep_once
from tasks.execution.runner import task_run
from tasks.lifecycle.claims import task_claim
from tasks.models import Task
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_jobs() -> dict[str, list[str]]:
    return {name: enqueue.get_queue(name).get_job_ids() for name in ("critical", "default", "bulk")}


@pytest.fixture
def queues(clean_redis, settings):
    settings.RELIABILITY_REDELIVERY_GRACE_SECONDS = 0
    return clean_redis


def test_a_submission_goes_to_its_pipelines_queue(queues):
    bulk = task_submit(pipeline="t_bulk", input={})
    critical = task_submit(pipeline="t_critical", input={})
    default = task_submit(pipeline="t_local", input={})

    assert waiting_jobs() == {
        "critical": [enqueue.job_id(critical.pk, 0)],
        "default": [enqueue.job_id(default.pk, 0)],
        "bulk": [enqueue.job_id(bulk.pk, 0)],
    }


def test_the_engines_notifications_run_on_critical():
    assert queue_for_pipeline("alert_notify") == "critical"
    assert queue_for_pipeline("task_callback") == "critical"
    # A pipeline this process does not know (not deployed here yet) goes where every worker listens.
    assert queue_for_pipeline("no_such_pipeline") == "default"


def test_the_sweeper_delivers_a_lost_job_again_on_its_pipelines_queue(queues):
    task = task_submit(pipeline="t_bulk", input={})
    queues.flushall()

    assert sweep_once().redelivered == 1
    assert waiting_jobs() == {"critical": [], "default": [], "bulk": [enqueue.job_id(task.pk, 0)]}


def test_a_job_stuck_in_another_queues_intermediate_list_is_found_and_delivered_again(queues):
    task = task_submit(pipeline="t_bulk", input={})
    bulk = enqueue.get_queue("bulk")
    # A worker of the bulk queue alone dequeued (RQ moves the job to that queue's intermediate list) and died.
    assert bulk.connection.lmove(bulk.key, bulk.intermediate_queue_key) is not None

    assert sweep_once().redelivered == 1
    assert bulk.get_job_ids() == [enqueue.job_id(task.pk, task.fencing_token)]
    assert bulk.connection.lrange(bulk.intermediate_queue_key, 0, -1) == []


def test_an_expired_lease_and_a_due_retry_go_back_on_the_pipelines_queue(queues):
    crashed = task_submit(pipeline="t_bulk", input={})
    retried = task_submit(pipeline="t_bulk", input={"transient": True})
    queues.flushall()
    assert task_claim(task_id=str(crashed.pk), owner="gone") is not None
    with door_forced():
        Task.objects.filter(pk=crashed.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        retry_at = timezone.now() - timedelta(seconds=5)
        Task.objects.filter(pk=retried.pk).update(state="retry_scheduled", retry_at=retry_at)

    report = sweep_once()

    assert (report.requeued, report.retries_started) == (1, 1)
    crashed.refresh_from_db()
    retried.refresh_from_db()
    assert sorted(waiting_jobs()["bulk"]) == sorted(
        [enqueue.job_id(crashed.pk, crashed.fencing_token), enqueue.job_id(retried.pk, retried.fencing_token)]
    )
    assert waiting_jobs()["default"] == [] and waiting_jobs()["critical"] == []


def test_a_scheduled_retry_waits_in_its_pipelines_queue_scheduler(queues):
    task = task_submit(pipeline="t_bulk", input={"transient": True})
    queues.flushall()

    task_run(task_id=str(task.pk), worker="w1")

    task.refresh_from_db()
    assert task.state == "retry_scheduled"
    job_id = enqueue.job_id(task.pk, task.fencing_token)
    assert enqueue.get_queue("bulk").scheduled_job_registry.get_job_ids() == [job_id]
    assert enqueue.get_queue("default").scheduled_job_registry.get_job_ids() == []


def test_rqworker_refuses_a_queue_that_is_not_configured():
    with pytest.raises(CommandError, match=r"unknown queue\(s\) \['critcal'\]"):
        call_command("rqworker", "critical", "critcal", "--burst")
