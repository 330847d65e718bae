"""/metrics: who may scrape it, and that its figures are the database's."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from dlq.alerting.models import AlertChannel, AlertRule
from dlq.models import DLQItem
from tasks.delivery.sweeper import sweeper_heartbeat
from tasks.execution.runner import task_run
from tasks.models import DLQStatus
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def samples(body: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def scrape(client: Client, **headers):
    return client.get("/metrics", headers=headers)


def test_metrics_are_refused_when_nothing_is_configured(client, settings):
    settings.RELIABILITY_METRICS_TOKEN = ""
    settings.RELIABILITY_METRICS_ALLOWED_NETWORKS = []
    response = scrape(client, Authorization="Bearer anything")
    assert response.status_code == 403 and b"RELIABILITY_METRICS_TOKEN" in response.content


def test_a_token_is_required_and_checked(client, settings, clean_redis):
    settings.RELIABILITY_METRICS_TOKEN = "scrape-me"
    settings.RELIABILITY_METRICS_ALLOWED_NETWORKS = []
    assert scrape(client).status_code == 401
    assert scrape(client).headers["WWW-Authenticate"].startswith("Bearer")
    assert scrape(client, Authorization="Bearer wrong").status_code == 401
    assert scrape(client, Authorization="Basic scrape-me").status_code == 401
    response = scrape(client, Authorization="Bearer scrape-me")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")


def test_allowed_networks_admit_by_client_address(settings, clean_redis):
    import ipaddress

    settings.RELIABILITY_METRICS_TOKEN = ""
    settings.RELIABILITY_METRICS_ALLOWED_NETWORKS = [ipaddress.ip_network("10.0.0.0/8")]
    assert Client(REMOTE_ADDR="192.168.1.5").get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    settings.RELIABILITY_METRICS_TOKEN = "t"  # both configured: both needed
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 401
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics", headers={"Authorization": "Bearer t"}).status_code == 200


def test_state_figures_match_the_database(client, settings, clean_redis):
    settings.RELIABILITY_METRICS_TOKEN = "t"
    AlertRule.objects.all().delete()
    AlertChannel.objects.all().delete()
    ok = task_submit(pipeline="t_local", input={})
    failing = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    queued = task_submit(pipeline="t_local", input={})
    task_run(task_id=str(ok.pk), worker="w1")
    task_run(task_id=str(failing.pk), worker="w1")
    sweeper_heartbeat(name="s1")
    AlertChannel.objects.create(name="hook", kind="webhook", consecutive_failures=3, total_failures=7)
    AlertRule.objects.create(name="any", kind="open_items", threshold=0)
    from dlq.alerting.rules import alerts_evaluate

    alerts_evaluate()

    figures = samples(scrape(client, Authorization="Bearer t").content.decode())

    def by(name: str, *label_names: str) -> dict:
        return {
            tuple(dict(key)[label] for label in label_names): value
            for (sample, key), value in figures.items()
            if sample == name
        }

    from django.db.models import Count

    from tasks.models import Task

    db_states = {(p, s): n for p, s, n in Task.objects.values_list("pipeline", "state").annotate(Count("pk"))}
    assert by("reliability_tasks_recent", "pipeline", "state") == db_states
    assert db_states[("t_local", "succeeded")] == 1 and db_states[("t_local", "compensated")] == 1
    assert by("reliability_tasks_active", "pipeline", "state") == {
        ("t_local", "queued"): 1,
        ("alert_notify", "queued"): 1,
    }
    assert queued.state == "queued"
    assert by("reliability_dlq_open_items", "pipeline", "reason") == {("t_local", "permanent_error"): 1}
    assert DLQItem.objects.exclude(status=DLQStatus.RESOLVED).count() == 1
    assert by("reliability_dlq_oldest_open_item_age_seconds", "pipeline")[("t_local",)] >= 0
    assert by("reliability_sweeper_runs_total")[()] == 1
    assert 0 <= by("reliability_sweeper_seconds_since_last_run")[()] < 60
    assert by("reliability_redis_up")[()] == 1
    # Every submission enqueued a job on its pipeline's queue and no worker consumed them (the tasks above ran
    # in-process): the alert's notification on critical, the t_local tasks on default.
    jobs = by("reliability_queue_jobs", "queue", "status")
    assert {queue: n for (queue, status), n in jobs.items() if status == "queued"} == {
        "critical": 1,
        "default": 3,
        "bulk": 0,
    }
    assert by("reliability_queue_depth", "queue") == {("critical",): 1, ("default",): 3, ("bulk",): 0}
    oldest = by("reliability_queue_oldest_job_age_seconds", "queue")
    # The default queue's head (the first submission) has waited longest; an empty queue's age is 0.
    assert oldest[("bulk",)] == 0 and 0 <= oldest[("critical",)] <= oldest[("default",)] < 60
    assert oldest[("default",)] > 0
    assert by("reliability_workers")[()] == 0
    rule, channel = str(AlertRule.objects.get(name="any").pk), str(AlertChannel.objects.get(name="hook").pk)
    assert by("reliability_alert_rule_firing", "rule_id", "rule_kind") == {(rule, "open_items"): 1}
    assert by("reliability_alert_channel_consecutive_failures", "channel_id", "channel_kind") == {
        (channel, "webhook"): 3
    }
    assert by("reliability_alert_channel_failures_total", "channel_id", "channel_kind") == {(channel, "webhook"): 7}
    # Event counters of this (single) process are there too.
    assert (
        by("reliability_step_attempts_total", "pipeline", "step", "outcome")[("t_local", "local_b", "permanent_error")]
        >= 1
    )


# Names an operator may type: markup, a quote, a newline (the exposition format escapes the last two).
HOSTILE_NAMES = ("<script>alert(1)</script>", 'a"b\nc')


def test_rules_and_channels_are_labelled_by_id_never_by_name(client, settings, clean_redis, webhook_receiver):
    from dlq.alerting.models import AlertDelivery
    from dlq.alerting.rules import alerts_evaluate

    settings.RELIABILITY_METRICS_TOKEN = "t"
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [f"127.0.0.1:{webhook_receiver.server.server_address[1]}"]
    webhook_receiver.fail_next = 100  # every delivery fails (HTTP 500)
    AlertRule.objects.all().delete()
    AlertChannel.objects.all().delete()
    task_run(task_id=str(task_submit(pipeline="t_local", input={"fail_b": "permanent"}).pk), worker="w1")
    channels = [
        AlertChannel.objects.create(name=name, kind="webhook", url=webhook_receiver.url) for name in HOSTILE_NAMES
    ]
    rules = [AlertRule.objects.create(name=name, kind="open_items", threshold=0) for name in HOSTILE_NAMES]
    assert len(alerts_evaluate().events) == 2  # both fire
    deliveries = AlertDelivery.objects.all()
    assert deliveries.count() == 4
    for delivery in deliveries:
        task_run(task_id=str(delivery.task_id), worker="w1")  # one attempt each, answered 500
    assert len(webhook_receiver.all()) == 4

    body = scrape(client, Authorization="Bearer t").content.decode()
    for text in (*HOSTILE_NAMES, "<script>", "alert(1)", 'a\\"b', "\\nc"):
        assert text not in body, text
    figures = samples(body)

    def by(name: str, *label_names: str) -> dict:
        return {
            tuple(dict(key)[label] for label in label_names): value
            for (sample, key), value in figures.items()
            if sample == name
        }

    rule_ids, channel_ids = [str(rule.pk) for rule in rules], [str(channel.pk) for channel in channels]
    assert by("reliability_alert_rule_firing", "rule_id", "rule_kind") == {(pk, "open_items"): 1 for pk in rule_ids}
    events = by("reliability_alert_events_total", "rule_id", "kind")
    assert all(events[(pk, "firing")] == 1 for pk in rule_ids)
    streaks = by("reliability_alert_channel_consecutive_failures", "channel_id", "channel_kind")
    assert streaks == {(pk, "webhook"): 2 for pk in channel_ids}
    attempts = by("reliability_alert_notifications_total", "channel_id", "channel_kind", "outcome")
    assert all(attempts[(pk, "webhook", "failed")] == 2 for pk in channel_ids)
    labels = {label for (_sample, key) in figures for label, _value in key}
    assert not labels & {"rule", "channel"}


def test_the_page_answers_when_redis_is_down(client, settings, clean_redis, redis_server):
    settings.RELIABILITY_METRICS_TOKEN = "t"
    redis_server.stop()
    try:
        response = scrape(client, Authorization="Bearer t")
    finally:
        redis_server.start()
    assert response.status_code == 200
    assert samples(response.content.decode())[("reliability_redis_up", frozenset())] == 0


def test_every_scraped_name_is_declared_where_the_deploy_files_look(client, settings, clean_redis):
    from tests.unit.test_prometheus_files import exported_metric_names

    settings.RELIABILITY_METRICS_TOKEN = "t"
    task_run(task_id=str(task_submit(pipeline="t_local", input={"fail_b": "permanent"}).pk), worker="w1")
    sweeper_heartbeat(name="s1")
    names = {name for name, _labels in samples(scrape(client, Authorization="Bearer t").content.decode())}
    ours = {name for name in names if name.startswith("reliability_")}
    assert ours and ours <= exported_metric_names(), ours - exported_metric_names()


def test_an_expired_lease_counts_as_a_crash(client, settings, clean_redis):
    from datetime import timedelta

    from django.utils import timezone

    from tasks.delivery.sweeper import sweep_once
    from tasks.lifecycle.claims import task_claim
    from tasks.models import Task

    settings.RELIABILITY_METRICS_TOKEN = "t"

    def crashes() -> tuple[float, float]:
        figures = samples(scrape(client, Authorization="Bearer t").content.decode())
        lease = ("reliability_lease_expirations_total", frozenset({("pipeline", "t_local")}))
        crashed = (
            "reliability_step_attempts_total",
            frozenset(
                {("pipeline", "t_local"), ("step", "local_a"), ("outcome", "crashed"), ("error_code", "lease_expired")}
            ),
        )
        return figures.get(lease, 0), figures.get(crashed, 0)

    before = crashes()
    task = task_submit(pipeline="t_local", input={})
    assert task_claim(task_id=str(task.pk), owner="doomed") is not None
    with door_forced():
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    assert sweep_once().requeued == 1
    after = crashes()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
