"""The ``alert_notify`` pipeline: delivers one alert event to one channel on the engine.

Always registered (imported by ``DlqConfig.ready``), on the ``critical`` queue:
an alert about a backlog must not wait behind it. The engine gives it
retries with backoff, an idempotency key stable across retries, and a DLQ
item when a channel keeps failing.
"""

from __future__ import annotations

from dlq.alerting.channels import channel_send
from dlq.alerting.models import AlertDelivery
from dlq.alerting.notifications import (
    NOTIFY_PIPELINE,
    alert_delivery_attempt_failed,
    alert_delivery_given_up,
    alert_delivery_sent,
)
from tasks import FailurePolicy, PermanentError, Pipeline, RetryPolicy, registry


def _build() -> Pipeline:
    pipeline = Pipeline(
        NOTIFY_PIPELINE,
        retry=RetryPolicy(max_attempts=6, base_delay=0.5, factor=2, max_delay=30),
        # Nothing to undo: "compensation" only runs the failure notice below.
        failure_policy=FailurePolicy.COMPENSATE,
        default_step_timeout=30,
        register=False,
        queue="critical",
    )

    @pipeline.step(effects=("notification",))
    def send_notification(ctx):
        delivery = AlertDelivery.objects.select_related("event__rule", "channel").filter(pk=ctx.input["delivery_id"])
        delivery = delivery.first()
        if delivery is None:
            raise PermanentError("the alert delivery no longer exists", code="alert_delivery_missing")
        key = ctx.idempotency_key("notification")
        try:
            channel_send(channel=delivery.channel, event=delivery.event, idempotency_key=key, timeout=ctx.check_time())
        except Exception as exc:
            alert_delivery_attempt_failed(delivery=delivery, error=str(exc))
            raise
        alert_delivery_sent(delivery=delivery)
        return {"channel": delivery.channel.name, "sent": True}

    @pipeline.failure_notice
    def mark_given_up(ctx):
        alert_delivery_given_up(delivery_id=ctx.input["delivery_id"])

    return pipeline


def register() -> Pipeline:
    """Register the pipeline once per process (idempotent)."""
    return registry.register_once(NOTIFY_PIPELINE, _build)
