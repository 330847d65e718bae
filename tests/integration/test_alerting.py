"""Alert rules on PostgreSQL: every rule type fires and stays quiet, the lifecycle, concurrent evaluators, channels."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from dlq.alerting import measures as alert_measures
from dlq.alerting.models import AlertChannel, AlertDelivery, AlertDeliveryStatus, AlertEvent, AlertRule, AlertState
from dlq.alerting.rules import alert_rule_evaluate, alerts_evaluate
from dlq.models import DLQItem
from tasks.execution.runner import task_run
from tasks.models import DLQStatus, IdempotencyRecord, SweeperHeartbeat, Task
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import rule_form

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_default_rules(clean_redis):
    # The migration's defaults (and its log channel) would fire alongside the rule under test.
    AlertRule.objects.all().delete()
    AlertChannel.objects.all().delete()


def dead_letter(*, pipeline="t_other", step="s1", code="boom", age=timedelta(0), resolved=False) -> DLQItem:
    task = task_submit(pipeline="t_local", input={})
    item = DLQItem.objects.create(
        task=task,
        pipeline=pipeline,
        reason_code="permanent_error",
        reason="made by a test",
        error_code=code,
        failing_step=step,
        fingerprint=f"{pipeline}:{step}:{code}",
        status=DLQStatus.RESOLVED if resolved else DLQStatus.OPEN,
    )
    if age:
        with door_forced():
            DLQItem.objects.filter(pk=item.pk).update(created_at=timezone.now() - age)
    return item


def rule(kind: str, threshold: float, **fields) -> AlertRule:
    return AlertRule.objects.create(name=f"{kind} {threshold}", kind=kind, threshold=threshold, **fields)


def evaluate(rule_: AlertRule, now=None) -> AlertEvent | None:
    return alert_rule_evaluate(rule=AlertRule.objects.get(pk=rule_.pk), now=now or timezone.now())


# --- each rule type fires, and does not --------------------------------------------------


def test_open_items_fires_above_n_overall():
    r = rule("open_items", 2)
    dead_letter(), dead_letter()
    assert evaluate(r) is None
    third = dead_letter()
    event = evaluate(r)
    assert event.kind == "firing" and event.value == 3 and event.threshold == 2
    assert third.pk in event.dlq_item_ids


def test_open_items_per_pipeline_ignores_other_pipelines_and_resolved_items():
    r = rule("open_items", 1, pipeline="orders")
    dead_letter(pipeline="orders"), dead_letter(pipeline="billing"), dead_letter(pipeline="billing")
    dead_letter(pipeline="orders", resolved=True)
    assert evaluate(r) is None
    assert AlertRule.objects.get(pk=r.pk).last_value == 1
    dead_letter(pipeline="orders")
    assert evaluate(r).value == 2


def test_growth_fires_on_more_than_m_new_items_within_the_window():
    r = rule("growth", 2, window_seconds=600)
    dead_letter(age=timedelta(minutes=20)), dead_letter(age=timedelta(minutes=30))
    dead_letter(), dead_letter()
    assert evaluate(r) is None  # two in the window, not more than M=2
    dead_letter()
    event = evaluate(r)
    assert event.kind == "firing" and event.value == 3


def test_oldest_open_item_older_than_t_fires_and_a_young_one_does_not():
    r = rule("oldest_age", 3600)
    dead_letter(age=timedelta(minutes=30))
    dead_letter(age=timedelta(hours=5), resolved=True)  # resolved items do not count
    assert evaluate(r) is None
    old = dead_letter(age=timedelta(hours=2))
    event = evaluate(r)
    assert event.kind == "firing" and 7000 < event.value < 7400
    assert event.dlq_item_ids[0] == old.pk


def test_a_new_failure_group_fires_and_a_known_one_does_not():
    r = rule("new_failure_group", 0, window_seconds=3600, lookback_days=7)
    dead_letter(code="known", age=timedelta(days=2))
    dead_letter(code="known")  # seen two days ago: not new
    dead_letter(code="ancient", age=timedelta(days=9))
    assert evaluate(r) is None
    dead_letter(code="ancient")  # last seen 9 days ago, outside D=7: new again
    event = evaluate(r)
    assert event.kind == "firing" and event.value == 1
    assert "t_other:s1:ancient" in event.summary


def test_sweeper_not_run_for_s_seconds_fires_and_a_recent_sweep_does_not():
    r = rule("sweeper_stalled", 60)
    SweeperHeartbeat.objects.create(name="s1", last_run_at=timezone.now() - timedelta(seconds=10))
    assert evaluate(r) is None
    SweeperHeartbeat.objects.filter(name="s1").update(last_run_at=timezone.now() - timedelta(seconds=300))
    event = evaluate(r)
    assert event.kind == "firing" and event.value >= 300 and "delivery is at risk" in event.summary


def test_no_sweeper_ever_counts_as_stalled():
    event = evaluate(rule("sweeper_stalled", 60))
    assert event.kind == "firing" and event.value is None


# --- lifecycle --------------------------------------------------------------------------


def test_lifecycle_fires_once_renotifies_after_the_interval_and_resolves_once():
    channel = AlertChannel.objects.create(name="log", kind="log")
    r = rule("open_items", 0, renotify_seconds=600)
    item = dead_letter()
    start = timezone.now()
    assert evaluate(r, start).kind == "firing"
    assert evaluate(r, start + timedelta(seconds=1)) is None
    assert evaluate(r, start + timedelta(seconds=599)) is None
    assert evaluate(r, start + timedelta(seconds=600)).kind == "renotify"
    assert evaluate(r, start + timedelta(seconds=700)) is None
    with door_forced():
        DLQItem.objects.filter(pk=item.pk).update(status=DLQStatus.RESOLVED)
    resolved = evaluate(r, start + timedelta(seconds=701))
    assert resolved.kind == "resolved" and resolved.value == 0
    assert evaluate(r, start + timedelta(seconds=702)) is None
    current = AlertRule.objects.get(pk=r.pk)
    assert current.state == AlertState.RESOLVED and current.firing_since is None and current.version == 3
    assert list(AlertEvent.objects.filter(rule=r).order_by("id").values_list("kind", flat=True)) == [
        "firing",
        "renotify",
        "resolved",
    ]
    # One delivery task per event and channel, keyed by both.
    deliveries = AlertDelivery.objects.filter(channel=channel).select_related("task")
    assert deliveries.count() == 3
    for delivery in deliveries:
        assert delivery.task.pipeline == "alert_notify"
        assert delivery.task.idempotency_key == f"alert-{delivery.event_id}-{channel.pk}"
    # A resolved rule fires again on a new breach.
    dead_letter()
    assert evaluate(r, start + timedelta(seconds=800)).kind == "firing"


def test_a_stale_evaluator_loses_the_transition():
    r = rule("open_items", 0)
    dead_letter()
    first, second = AlertRule.objects.get(pk=r.pk), AlertRule.objects.get(pk=r.pk)
    now = timezone.now()
    assert alert_rule_evaluate(rule=first, now=now).kind == "firing"
    assert alert_rule_evaluate(rule=second, now=now) is None
    assert AlertEvent.objects.count() == 1


def test_concurrent_evaluators_make_one_event_and_one_delivery():
    AlertChannel.objects.create(name="log", kind="log")
    rule("open_items", 0)
    dead_letter()
    barrier = threading.Barrier(4)
    errors = []

    def run():
        try:
            barrier.wait(timeout=10)
            alerts_evaluate()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert AlertEvent.objects.count() == 1
    assert AlertDelivery.objects.count() == 1
    assert Task.objects.filter(pipeline="alert_notify").count() == 1


def test_a_rule_disabled_while_firing_stops_without_a_notification():
    r = rule("open_items", 0)
    dead_letter()
    evaluate(r)
    AlertRule.objects.filter(pk=r.pk).update(enabled=False)
    assert evaluate(r) is None
    assert AlertRule.objects.get(pk=r.pk).state == AlertState.OK
    assert AlertEvent.objects.count() == 1


def test_a_broken_rule_does_not_stop_the_others(monkeypatch):
    def broken(rule, *, now):
        raise RuntimeError("boom")

    monkeypatch.setitem(alert_measures.MEASURES, "growth", broken)
    rule("growth", 0)
    healthy = rule("open_items", 0)
    dead_letter()
    report = alerts_evaluate()
    assert len(report.errors) == 1 and "boom" in report.errors[0]
    assert [event.rule_id for event in report.events] == [healthy.pk]


def test_default_rules_and_log_channel_come_from_the_migration():
    from importlib import import_module

    from django.apps import apps

    migration = import_module("dlq.migrations.0006_default_alert_rules")
    migration.forwards(apps, None)
    migration.forwards(apps, None)  # idempotent
    kinds = set(AlertRule.objects.values_list("kind", flat=True))
    assert kinds == {"open_items", "growth", "oldest_age", "new_failure_group", "sweeper_stalled"}
    assert AlertChannel.objects.filter(kind="log").count() == 1


# --- channels -------------------------------------------------------------------------------


def _deliver(event: AlertEvent) -> list[Task]:
    tasks = [delivery.task for delivery in event.deliveries.select_related("task")]
    for task in tasks:
        task_run(task_id=str(task.pk), worker="w1")
    return [Task.objects.get(pk=task.pk) for task in tasks]


def test_webhook_body_is_signed_and_links_to_the_items(webhook_receiver, settings):
    settings.RELIABILITY_CONSOLE_URL = "https://console.example"
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=webhook_receiver.url, secret="s3cret")
    r = rule("open_items", 0)
    item = dead_letter()
    event = evaluate(r)
    assert [task.state for task in _deliver(event)] == ["succeeded"]
    (received,) = webhook_receiver.accepted()
    assert received.signature_valid("s3cret") and not received.signature_valid("other")
    # The time and the idempotency key are signed: a replay later, or under another key, does not verify.
    signed_at = int(dict(p.split("=", 1) for p in received.headers["reliability-signature"].split(","))["t"])
    assert abs(signed_at - time.time()) < 60
    assert not received.signature_valid("s3cret", now=signed_at + 301)
    assert not replace(received, headers={**received.headers, "idempotency-key": "other"}).signature_valid("s3cret")
    assert "x-reliability-signature" not in received.headers  # the body-only signature is gone
    body = received.json
    assert body["status"] == "firing" and body["rule"]["name"] == r.name
    assert body["value"] == 1 and body["threshold"] == 0
    assert body["links"]["dlq_items"] == [f"https://console.example/admin/dlq/dlqitem/{item.pk}/change/"]
    assert body["links"]["rule"] == f"https://console.example/admin/dlq/alertrule/{r.pk}/change/"
    assert received.idempotency_key.startswith("rc-")
    delivery = AlertDelivery.objects.get(event=event)
    assert delivery.status == AlertDeliveryStatus.SENT and delivery.attempts == 1
    assert AlertChannel.objects.get(pk=channel.pk).last_success_at is not None


def test_slack_channel_gets_a_text_body(webhook_receiver):
    AlertChannel.objects.create(name="slack", kind="slack", url=webhook_receiver.url)
    dead_letter()
    _deliver(evaluate(rule("open_items", 0)))
    (received,) = webhook_receiver.accepted()
    assert set(received.json) == {"text"} and received.json["text"].startswith("[FIRING] open_items 0")


def test_email_channel_uses_django_mail():
    AlertChannel.objects.create(name="mail", kind="email", email_to="ops@example.com, oncall@example.com")
    dead_letter()
    _deliver(evaluate(rule("open_items", 0)))
    (message,) = mail.outbox
    assert message.to == ["ops@example.com", "oncall@example.com"]
    assert message.subject.startswith("[FIRING]")


def test_a_failing_channel_is_counted_and_retried_but_other_channels_deliver(webhook_receiver, settings):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [*settings.RELIABILITY_ALERT_ALLOWED_HOSTS, f"127.0.0.1:{dead_port}"]
    broken = AlertChannel.objects.create(name="broken", kind="webhook", url=f"http://127.0.0.1:{dead_port}/")
    AlertChannel.objects.create(name="good", kind="webhook", url=webhook_receiver.url)
    dead_letter()
    states = _deliver(evaluate(rule("open_items", 0)))
    assert sorted(task.state for task in states) == ["retry_scheduled", "succeeded"]
    broken.refresh_from_db()
    assert broken.consecutive_failures == 1 and broken.total_failures == 1
    assert "connection failed" in broken.last_error
    assert len(webhook_receiver.accepted()) == 1


def test_a_permanently_refused_delivery_ends_in_the_dlq_and_is_marked_failed():
    AlertChannel.objects.create(name="nourl", kind="webhook", url="")
    dead_letter()
    event = evaluate(rule("open_items", 0))
    (task,) = _deliver(event)
    assert task.state == "compensated"
    assert DLQItem.objects.filter(task=task, pipeline="alert_notify").exists()
    assert AlertDelivery.objects.get(event=event).status == AlertDeliveryStatus.FAILED


def test_rule_channels_limit_where_a_rule_notifies():
    chosen = AlertChannel.objects.create(name="chosen", kind="log")
    AlertChannel.objects.create(name="other", kind="log")
    r = rule("open_items", 0)
    r.channels.add(chosen)
    dead_letter()
    event = evaluate(r)
    assert list(event.deliveries.values_list("channel__name", flat=True)) == ["chosen"]
    assert IdempotencyRecord.objects.filter(key=f"alert-{event.pk}-{chosen.pk}").exists()


# --- admin --------------------------------------------------------------------------------


def test_admin_pages_show_rules_channels_and_history(admin_client):
    channel = AlertChannel.objects.create(
        name="hook", kind="webhook", url="http://x.invalid/", consecutive_failures=2, last_error="HTTP 500"
    )
    r = rule("open_items", 0)
    dead_letter()
    event = evaluate(r)
    for url in (
        "/admin/dlq/alertrule/",
        f"/admin/dlq/alertrule/{r.pk}/change/",
        "/admin/dlq/alertrule/add/",
        f"/admin/dlq/alertchannel/{channel.pk}/change/",
        f"/admin/dlq/alertevent/{event.pk}/change/",
        "/admin/dlq/alertevent/",
    ):
        assert admin_client.get(url).status_code == 200, url
    channels = admin_client.get("/admin/dlq/alertchannel/").content.decode()
    assert "failing: HTTP 500" in channels
    assert admin_client.get("/admin/dlq/alertevent/add/").status_code == 403  # history is read-only


def test_editing_a_rule_in_the_admin_keeps_its_state_and_fences_evaluators(admin_client):
    r = rule("open_items", 0)
    dead_letter()
    evaluate(r)
    stale = AlertRule.objects.get(pk=r.pk)
    response = admin_client.post(f"/admin/dlq/alertrule/{r.pk}/change/", rule_form(name=r.name))
    assert response.status_code == 302, response.content.decode()[:2000]
    edited = AlertRule.objects.get(pk=r.pk)
    assert edited.threshold == 5 and edited.state == AlertState.FIRING and edited.version == stale.version + 1
    # An evaluator that read the rule before the edit cannot apply its transition (a due re-notification).
    assert alert_rule_evaluate(rule=stale, now=timezone.now() + timedelta(hours=2)) is None
    assert not AlertEvent.objects.filter(kind="renotify").exists()
    resolved = evaluate(r)
    assert resolved.kind == "resolved" and resolved.threshold == 5
