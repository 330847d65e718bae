"""What a notification says and how each kind of channel sends it.

The body is built only from the stored event (no clock, no randomness), so
every retry sends the same bytes under the same idempotency key; receivers
verify ``Reliability-Signature: t=…,v1=…`` (tasks.signing), which each attempt
signs afresh with its own time.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.core.mail import send_mail
from django.urls import reverse

from dlq.alerting.models import AlertChannel, AlertChannelKind, AlertEvent
from tasks.exceptions import PermanentError, TransientError
from tasks.signing import SIGNATURE_HEADER, signature_header

logger = logging.getLogger("dlq.alerts")


def _absolute(path: str) -> str:
    return settings.RELIABILITY_CONSOLE_URL + path


def notification_payload(event: AlertEvent) -> dict:
    """The JSON document sent to webhooks (and the facts every channel shows)."""
    rule = event.rule
    items_url = reverse("admin:dlq_dlqitem_changelist")
    query = {"pipeline": rule.pipeline} if rule.pipeline else {}
    return {
        "event_id": event.pk,
        "status": "resolved" if event.kind == "resolved" else "firing",
        "kind": event.kind,
        "rule": {"id": rule.pk, "name": rule.name, "kind": rule.kind, "pipeline": rule.pipeline or None},
        "value": event.value,
        "threshold": event.threshold,
        "summary": event.summary,
        "created_at": event.created_at.isoformat(),
        "links": {
            "rule": _absolute(reverse("admin:dlq_alertrule_change", args=[rule.pk])),
            "event": _absolute(reverse("admin:dlq_alertevent_change", args=[event.pk])),
            "dlq": _absolute(items_url + (f"?{urlencode(query)}" if query else "")),
            "dlq_items": [_absolute(reverse("admin:dlq_dlqitem_change", args=[pk])) for pk in event.dlq_item_ids],
        },
    }


def headline(payload: dict) -> str:
    state = "RESOLVED" if payload["status"] == "resolved" else "FIRING"
    if payload["kind"] == "renotify":
        state = "STILL FIRING"
    return f"[{state}] {payload['rule']['name']}: {payload['summary']}"


def slack_payload(payload: dict) -> dict:
    lines = [headline(payload), f"Rule: {payload['links']['rule']}", f"Dead letters: {payload['links']['dlq']}"]
    lines += payload["links"]["dlq_items"][:5]
    return {"text": "\n".join(lines)}


def body_bytes(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def channel_send(*, channel: AlertChannel, event: AlertEvent, idempotency_key: str, timeout: float) -> None:
    """Send ``event`` on ``channel``; raise TransientError (retry) or PermanentError (give up)."""
    payload = notification_payload(event)
    if channel.kind in (AlertChannelKind.WEBHOOK, AlertChannelKind.SLACK):
        document = slack_payload(payload) if channel.kind == AlertChannelKind.SLACK else payload
        _post(channel, body_bytes(document), idempotency_key, timeout)
    elif channel.kind == AlertChannelKind.EMAIL:
        if not channel.email_addresses:
            raise PermanentError(f"channel {channel.name!r} has no e-mail addresses", code="alert_no_recipients")
        text = json.dumps(payload, indent=2, sort_keys=True)
        try:
            send_mail(headline(payload)[:200], text, None, channel.email_addresses, fail_silently=False)
        except OSError as exc:  # smtplib errors are OSErrors: the server may come back
            raise TransientError(f"e-mail not sent: {exc}", code="alert_email_failed") from exc
    else:
        logger.warning(headline(payload), extra={"event": "alert_notification", **_log_fields(payload)})


def _log_fields(payload: dict) -> dict:
    return {"rule": payload["rule"]["name"], "status": payload["kind"], "value": payload["value"]}


def _post(channel: AlertChannel, body: bytes, idempotency_key: str, timeout: float) -> None:
    if not channel.url:
        raise PermanentError(f"channel {channel.name!r} has no URL", code="alert_no_url")
    headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key}
    if channel.secret:
        headers[SIGNATURE_HEADER] = signature_header(
            secrets=[channel.secret], body=body, idempotency_key=idempotency_key
        )
    try:
        response = requests.post(channel.url, data=body, headers=headers, timeout=max(0.5, timeout))
    except requests.Timeout as exc:
        raise TransientError(f"{channel.name}: no answer in time", code="timeout") from exc
    except requests.ConnectionError as exc:
        raise TransientError(f"{channel.name}: connection failed", code="connection_error") from exc
    except requests.RequestException as exc:
        # Never str(exc): requests quotes the URL (a Slack URL is a credential) in, e.g., InvalidURL.
        raise PermanentError(
            f"{channel.name}: request not sent ({type(exc).__name__})", code="alert_request_invalid"
        ) from exc
    status = response.status_code
    if 200 <= status < 300:
        return
    if status == 429 or status == 408 or status >= 500:
        raise TransientError(f"{channel.name}: HTTP {status}", code=f"http_{status}")
    raise PermanentError(f"{channel.name}: HTTP {status}", code=f"http_{status}")
