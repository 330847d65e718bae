"""What a notification says and how each kind of channel sends it.

The body is built only from the stored event (no clock, no randomness), so
every retry sends the same bytes under the same idempotency key; receivers
verify ``Reliability-Signature: t=…,v1=…`` (tasks.outbound.signing), which each attempt
signs afresh with its own time. A test notification (``channel_test_send``)
is sent once, never retried: it has its own time and a new key.
"""

from __future__ import annotations

import json
import logging
import uuid
from urllib.parse import urlencode

import requests
from django.core.mail import send_mail
from django.urls import reverse
from django.utils import timezone

from dlq.alerting.models import AlertChannel, AlertChannelKind, AlertEvent
from dlq.alerting.url_checks import channel_disabled, channel_url_check
from dlq.conf import console_settings
from tasks.exceptions import PermanentError, TransientError
from tasks.outbound.policy import OutboundUrlRefused, Rule, is_refused_connection, session_for
from tasks.outbound.signing import SIGNATURE_HEADER, signature_header

logger = logging.getLogger("dlq.alerts")

# A test notification's status and kind (dlq.alerting.config_changes sends it from the console).
TEST_KIND = "test"
# A test is sent while the supervisor waits for the page: a receiver slower than this has failed the test.
TEST_SEND_TIMEOUT_SECONDS = 5.0


def _absolute(path: str) -> str:
    return console_settings.CONSOLE_URL + path


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


def notification_payload_for_test(channel: AlertChannel) -> dict:
    """A test notification's document: a real one's shape (so it tests the receiver's parsing too), with status
    and kind ``test`` and no rule, event or dead letters."""
    return {
        "event_id": None,
        "status": TEST_KIND,
        "kind": TEST_KIND,
        "rule": None,
        "value": None,
        "threshold": None,
        "summary": f"test notification for alert channel {channel.name}: nothing is firing",
        "created_at": timezone.now().isoformat(),
        "links": {
            "channel": _absolute(reverse("admin:dlq_alertchannel_change", args=[channel.pk])),
            "dlq": _absolute(reverse("admin:dlq_dlqitem_changelist")),
            "dlq_items": [],
        },
    }


def headline(payload: dict) -> str:
    if payload["kind"] == TEST_KIND:
        return f"[TEST] {payload['summary']}"
    state = "RESOLVED" if payload["status"] == "resolved" else "FIRING"
    if payload["kind"] == "renotify":
        state = "STILL FIRING"
    return f"[{state}] {payload['rule']['name']}: {payload['summary']}"


def slack_payload(payload: dict) -> dict:
    if payload["kind"] == TEST_KIND:
        return {"text": headline(payload)}
    lines = [headline(payload), f"Rule: {payload['links']['rule']}", f"Dead letters: {payload['links']['dlq']}"]
    lines += payload["links"]["dlq_items"][:5]
    return {"text": "\n".join(lines)}


def body_bytes(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def channel_send(*, channel: AlertChannel, event: AlertEvent, idempotency_key: str, timeout: float) -> None:
    """Send ``event`` on ``channel``; raise TransientError (retry) or PermanentError (give up)."""
    _send(channel, notification_payload(event), idempotency_key, timeout)


def channel_test_send(*, channel: AlertChannel, timeout: float = TEST_SEND_TIMEOUT_SECONDS) -> None:
    """Send one test notification on ``channel`` now, the way its notifications go (the same URL checks, signing,
    e-mail or log line); raise TransientError or PermanentError as ``channel_send`` does, never retried.

    Its idempotency key is new each time: every test is a request of its own.
    """
    _send(channel, notification_payload_for_test(channel), f"alert-test-{channel.pk}-{uuid.uuid4().hex}", timeout)


def _send(channel: AlertChannel, payload: dict, idempotency_key: str, timeout: float) -> None:
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
    return {"rule": (payload["rule"] or {}).get("name"), "status": payload["kind"], "value": payload["value"]}


def _post(channel: AlertChannel, body: bytes, idempotency_key: str, timeout: float) -> None:
    if not channel.url:
        raise PermanentError(f"channel {channel.name!r} has no URL", code="alert_no_url")
    try:
        # Again before every send: the allow-list may have shrunk, and the name may resolve elsewhere now.
        target = channel_url_check(channel.url)
    except OutboundUrlRefused as exc:
        raise _switched_off(channel, exc) from None
    headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key}
    if channel.secret:
        headers[SIGNATURE_HEADER] = signature_header(
            secrets=[channel.secret], body=body, idempotency_key=idempotency_key
        )
    try:
        # An unlisted host's session connects only to the public address it checked (DNS rebinding);
        # never a redirect, which could point anywhere. stream: the status is all we read.
        with session_for(target) as session:
            response = session.post(
                channel.url,
                data=body,
                headers=headers,
                timeout=max(0.5, timeout),
                allow_redirects=False,
                stream=True,
            )
            response.close()
    except requests.Timeout as exc:
        raise TransientError(f"{channel.name}: no answer in time", code="timeout") from exc
    except requests.ConnectionError as exc:
        raise TransientError(f"{channel.name}: connection failed", code="connection_error") from exc
    except requests.RequestException as exc:
        if is_refused_connection(exc):
            refusal = OutboundUrlRefused(
                f"{channel.name}: the host resolved to an address alerts may not reach when connecting",
                rule=Rule.ADDRESS_NOT_PUBLIC,
                params={"host": target.host, "address": str(exc)},
            )
            raise _switched_off(channel, refusal) from None
        # Never str(exc): requests quotes the URL (a Slack URL is a credential) in, e.g., InvalidURL.
        raise PermanentError(
            f"{channel.name}: request not sent ({type(exc).__name__})", code="alert_request_invalid"
        ) from exc
    status = response.status_code
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise PermanentError(f"{channel.name}: HTTP {status}; alerts do not follow redirects", code="alert_redirect")
    if status == 429 or status == 408 or status >= 500:
        raise TransientError(f"{channel.name}: HTTP {status}", code=f"http_{status}")
    raise PermanentError(f"{channel.name}: HTTP {status}", code=f"http_{status}")


def _switched_off(channel: AlertChannel, refusal: OutboundUrlRefused) -> PermanentError:
    channel_disabled(channel=channel, refusal=refusal)
    logger.warning(
        "alert channel switched off: its URL was refused",
        extra={"event": "alert_channel_switched_off", "channel_id": channel.pk, "rule": refusal.rule},
    )
    return PermanentError(
        f"{channel.name}: URL refused ({refusal.rule}); the channel is switched off", code="alert_url_refused"
    )
