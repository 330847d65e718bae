"""Alerting and metrics end to end: real workers deliver to a real webhook receiver; /metrics sums processes."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import Count
from prometheus_client.parser import text_string_to_metric_families

from dlq.alerting.models import AlertChannel, AlertEvent, AlertRule
from dlq.alerting.rules import alerts_evaluate
from dlq.models import DLQItem
from tasks.execution.runner import task_run
from tasks.models import AttemptKind, DLQStatus, StepAttempt, Task
from tasks.models.door import door_forced
from tasks.submission.submit import task_submit
from tests.support import ManagedProcess, manage, pid_of_owner, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}
SECRET = "whsec-test"


@pytest.fixture(autouse=True)
def only_test_rules():
    AlertRule.objects.all().delete()
    AlertChannel.objects.all().delete()


def all_terminal(pipeline: str | None = None) -> bool:
    tasks = Task.objects.filter(pipeline=pipeline) if pipeline else Task.objects.all()
    return not tasks.exclude(state__in=TERMINAL).exists()


def test_webhook_gets_one_firing_renotify_after_the_interval_and_one_resolved(start_workers, webhook_receiver):
    AlertChannel.objects.create(name="hook", kind="webhook", url=webhook_receiver.url, secret=SECRET)
    rule = AlertRule.objects.create(name="more than 2 open", kind="open_items", threshold=2, renotify_seconds=3)
    pool = start_workers(2)
    webhook_receiver.fail_next = 2  # the first notification meets two 500s before it is accepted

    # Dead letters arrive one at a time; the rule fires on the third.
    for count in (1, 2, 3):
        task_submit(pipeline="t_local", input={"fail_b": "permanent", "n": count})
        wait_for(lambda count=count: DLQItem.objects.count() == count, timeout=30, message=f"{count} dead letters")
        events = alerts_evaluate().events
        assert [event.kind for event in events] == ([] if count < 3 else ["firing"]), pool.logs()
    firing = AlertEvent.objects.get(rule=rule, kind="firing")

    wait_for(lambda: webhook_receiver.accepted(), timeout=30, message="the firing notification")
    attempts = webhook_receiver.all()
    assert [r.answered for r in attempts] == [500, 500, 200]
    assert len({r.idempotency_key for r in attempts}) == 1 and attempts[0].idempotency_key
    assert len({r.body for r in attempts}) == 1  # the same signed body on every retry

    # Still firing: nothing new until renotify_seconds have passed, then exactly one re-notification.
    renotify = wait_for(lambda: alerts_evaluate().events, timeout=20, interval=0.2, message="the re-notification")
    assert [event.kind for event in renotify] == ["renotify"]
    assert (renotify[0].created_at - firing.created_at).total_seconds() >= 3
    wait_for(lambda: len(webhook_receiver.accepted()) == 2, timeout=30, message="the re-notification delivery")

    # Operators clear the queue: one resolved notification, then silence.
    with door_forced():
        DLQItem.objects.update(status=DLQStatus.RESOLVED)
    assert [event.kind for event in alerts_evaluate().events] == ["resolved"]
    assert alerts_evaluate().events == []
    wait_for(lambda: len(webhook_receiver.accepted()) == 3, timeout=30, message="the resolved notification")
    wait_for(lambda: all_terminal("alert_notify"), timeout=30, message="deliveries to finish")

    accepted = webhook_receiver.accepted()
    assert [r.json["kind"] for r in accepted] == ["firing", "renotify", "resolved"]
    assert [r.json["status"] for r in accepted] == ["firing", "firing", "resolved"]
    assert all(r.signature_valid(SECRET) for r in webhook_receiver.all())
    assert not any(r.signature_valid("another-secret") for r in accepted)
    assert len({r.idempotency_key for r in accepted}) == 3
    assert len(webhook_receiver.all()) == 5  # 3 notifications + the 2 refused attempts, nothing more
    firing_body = accepted[0].json
    assert firing_body["value"] == 3 and firing_body["threshold"] == 2
    assert len(firing_body["links"]["dlq_items"]) == 3
    assert all("/admin/dlq/dlqitem/" in link for link in firing_body["links"]["dlq_items"])
    assert AlertChannel.objects.get(name="hook").consecutive_failures == 0


def test_two_evaluator_processes_at_once_send_one_notification(engine_env, start_workers, webhook_receiver):
    AlertChannel.objects.create(name="hook", kind="webhook", url=webhook_receiver.url, secret=SECRET)
    AlertRule.objects.create(name="any open item", kind="open_items", threshold=0)
    failing = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    task_run(task_id=str(failing.pk), worker="test")
    assert DLQItem.objects.count() == 1
    pool = start_workers(1)

    evaluators = [ManagedProcess("evaluator", manage("evaluate_alerts", "--once"), engine_env()) for _ in range(3)]
    for evaluator in evaluators:
        assert evaluator.process.wait(timeout=60) == 0, evaluator.output()
        evaluator.stop()

    assert AlertEvent.objects.count() == 1
    wait_for(lambda: webhook_receiver.accepted(), timeout=30, message="the notification")
    wait_for(lambda: all_terminal("alert_notify"), timeout=30, message="deliveries to finish")
    assert len(webhook_receiver.all()) == 1, pool.logs()
    assert Task.objects.filter(pipeline="alert_notify").count() == 1


def test_a_worker_switches_off_a_channel_aimed_at_loopback_by_a_name_and_sends_nothing(start_workers, webhook_receiver):
    # The workers list 127.0.0.1 (engine_env), not "localhost": a name for the same listener is refused by the
    # allow-list when the worker sends, as a channel saved before the check (or before the list changed) would be.
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=f"http://localhost:{webhook_receiver.port}/")
    AlertRule.objects.create(name="any open item", kind="open_items", threshold=0)
    failing = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    task_run(task_id=str(failing.pk), worker="test")
    pool = start_workers(1)

    assert [event.kind for event in alerts_evaluate().events] == ["firing"]
    wait_for(lambda: all_terminal("alert_notify"), timeout=30, message="the delivery to finish")
    (delivery,) = Task.objects.filter(pipeline="alert_notify")
    assert delivery.failure_code == "alert_url_refused", pool.logs()
    channel.refresh_from_db()
    assert not channel.enabled and channel.disabled_reason_code == "host_not_allowed"
    assert webhook_receiver.all() == []


def _samples(body: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            out.setdefault(sample.name, {})[key] = out.get(sample.name, {}).get(key, 0) + sample.value
    return out


def _sum(figures: dict, name: str, **match) -> float:
    return sum(
        value
        for labels, value in figures.get(name, {}).items()
        if all(dict(labels).get(key) == wanted for key, wanted in match.items())
    )


def test_metrics_after_work_by_two_worker_processes_match_the_database(start_workers, tmp_path, settings, client):
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    settings.PROMETHEUS_MULTIPROC_DIR = str(multiproc)
    settings.RELIABILITY_METRICS_TOKEN = "scrape-token"
    pool = start_workers(2, PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    inputs = [{}] * 10 + [{"fail_b": "permanent"}] * 4 + [{"fail_b": "transient"}] * 3
    for index, data in enumerate(inputs):
        task_submit(pipeline="t_local", input={**data, "n": index})
    wait_for(lambda: all_terminal(), timeout=60, message="every task to finish")
    wait_for(lambda: not DLQItem.objects.filter(status=DLQStatus.COMPENSATING).exists(), timeout=30)

    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    response = client.get("/metrics", headers={"Authorization": "Bearer scrape-token"})
    assert response.status_code == 200
    figures = _samples(response.content.decode())

    # Both worker processes did work, and each wrote its own metric files that the scrape summed.
    workers = {pid_of_owner(w) for w in StepAttempt.objects.values_list("worker", flat=True).distinct()}
    assert len(workers) == 2, pool.logs()
    assert {f"counter_{pid}.db" for pid in workers} <= {path.name for path in multiproc.iterdir()}

    states = dict(Task.objects.values_list("state").annotate(Count("pk")))
    assert states == {"succeeded": 10, "compensated": 7}
    for state, count in states.items():
        assert _sum(figures, "reliability_tasks_finished_total", pipeline="t_local", state=state) == count
        assert _sum(figures, "reliability_task_duration_seconds_count", pipeline="t_local", state=state) == count
        assert _sum(figures, "reliability_tasks_recent", pipeline="t_local", state=state) == count

    steps = StepAttempt.objects.filter(kind=AttemptKind.STEP)
    by_step: Counter = Counter()
    for step_name, outcome, error_code, count in steps.values_list("step_name", "outcome", "error_code").annotate(
        Count("pk")
    ):
        by_step[(step_name, outcome, error_code)] = count
        assert (
            _sum(
                figures,
                "reliability_step_attempts_total",
                pipeline="t_local",
                step=step_name,
                outcome=outcome,
                error_code=error_code,
            )
            == count
        )
    assert _sum(figures, "reliability_step_attempts_total") == steps.count() == sum(by_step.values())
    assert _sum(figures, "reliability_step_duration_seconds_count") == steps.count()
    retries = steps.filter(retry_delay_seconds__isnull=False).count()
    assert retries == 6  # 3 tasks x 2 retries before their attempts ran out
    assert _sum(figures, "reliability_step_retries_total", pipeline="t_local", step="local_b", error_code="flaky") == 6

    assert _sum(figures, "reliability_dlq_items_created_total") == DLQItem.objects.count() == 7
    assert _sum(figures, "reliability_dlq_items_created_total", reason="attempts_exhausted") == 3
    assert _sum(figures, "reliability_dlq_open_items", pipeline="t_local") == 7
    assert _sum(figures, "reliability_compensations_total", outcome="compensated") == 7
    assert _sum(figures, "reliability_tasks_active") == 0
    assert _sum(figures, "reliability_lease_expirations_total") == 0
    wait_for(lambda: _workers_live(client) == 2, timeout=20, message="both workers registered")


def _workers_live(client) -> float:
    body = client.get("/metrics", headers={"Authorization": "Bearer scrape-token"}).content.decode()
    return _sum(_samples(body), "reliability_workers")


def test_the_sweeper_evaluates_rules_when_due_and_the_log_channel_delivers(start_sweeper, start_workers):
    AlertChannel.objects.create(name="log", kind="log")
    AlertRule.objects.create(name="any open item", kind="open_items", threshold=0)
    failing = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    task_run(task_id=str(failing.pk), worker="test")
    sweeper = start_sweeper(RELIABILITY_ALERT_INTERVAL_SECONDS=1)
    event = wait_for(lambda: AlertEvent.objects.first(), timeout=30, message="the sweeper to evaluate the rule")
    assert event.kind == "firing", sweeper.output()
    start_workers(1)
    wait_for(lambda: event.deliveries.filter(status="sent").exists(), timeout=30, message="the log channel's delivery")
