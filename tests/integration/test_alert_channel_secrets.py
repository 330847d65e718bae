"""A channel's HMAC secret and webhook URL are credentials: whole only for those who may change the channel."""

from __future__ import annotations

import pytest

from dlq.alerting.channels import channel_send
from dlq.alerting.models import AlertChannel, AlertDelivery, AlertEvent, AlertRule
from tasks.exceptions import PermanentError

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_9f8e7d6c5b4a39281706f5e4d3c2b1a0wxyz"
SLACK_URL = "https://hooks.slack.example/services/T0ABCDEF/B0GHIJKL/q1w2e3r4t5y6u7i8o9p0LMNO"
SLACK_PATH = "T0ABCDEF/B0GHIJKL/q1w2e3r4t5y6u7i8o9p0LMNO"


@pytest.fixture
def channels():
    webhook = AlertChannel.objects.create(
        name="hook", kind="webhook", url="https://receiver.example/hook/abcdef0123456789", secret=SECRET
    )
    slack = AlertChannel.objects.create(
        name="slack",
        kind="slack",
        url=SLACK_URL,
        consecutive_failures=1,
        last_error=f"Invalid URL '{SLACK_URL}': no host",  # as an older version stored it
    )
    rule = AlertRule.objects.create(name="open items", kind="open_items", threshold=1)
    event = AlertEvent.objects.create(rule=rule, kind="firing", rule_version=1, value=2, threshold=1, summary="2 open")
    AlertDelivery.objects.create(event=event, channel=slack, status="failed", last_error=f"POST {SLACK_URL} failed")
    return {"webhook": webhook, "slack": slack, "event": event}


def pages(channels) -> list[str]:
    webhook, slack = channels["webhook"], channels["slack"]
    return [
        "/admin/dlq/alertchannel/",
        f"/admin/dlq/alertchannel/{webhook.pk}/change/",
        f"/admin/dlq/alertchannel/{slack.pk}/change/",
        f"/admin/dlq/alertchannel/{webhook.pk}/history/",
        f"/admin/dlq/alertevent/{channels['event'].pk}/change/",
        "/admin/dlq/alertevent/",
        f"/admin/dlq/alertrule/{channels['event'].rule_id}/change/",
    ]


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_viewers_and_operators_see_only_masked_secrets(client, role_users, channels, role):
    client.force_login(role_users[role])
    for url in pages(channels):
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert SECRET not in body and SECRET[6:] not in body, url
        assert SLACK_PATH not in body and "abcdef0123456789" not in body, url
    webhook_page = client.get(f"/admin/dlq/alertchannel/{channels['webhook'].pk}/change/").content.decode()
    assert "whsec_…wxyz" in webhook_page and "https://receiver.example/…6789" in webhook_page
    slack_page = client.get(f"/admin/dlq/alertchannel/{channels['slack'].pk}/change/").content.decode()
    assert "https://hooks.slack.example/…LMNO" in slack_page


@pytest.mark.parametrize("role", ["viewer", "operator", "supervisor"])
def test_the_list_cannot_be_used_as_an_oracle_for_the_secret(client, role_users, channels, role):
    client.force_login(role_users[role])
    for lookup in ("secret__startswith", "secret", "url__contains", "url__startswith"):
        response = client.get("/admin/dlq/alertchannel/", {lookup: SECRET[:8]})
        assert response.status_code == 400, lookup


@pytest.mark.parametrize("role", ["supervisor", "superuser"])
def test_who_may_change_the_channel_sees_the_secret(client, role_users, channels, role):
    client.force_login(role_users[role])
    webhook_page = client.get(f"/admin/dlq/alertchannel/{channels['webhook'].pk}/change/").content.decode()
    assert f'value="{SECRET}"' in webhook_page
    slack_page = client.get(f"/admin/dlq/alertchannel/{channels['slack'].pk}/change/").content.decode()
    assert f'value="{SLACK_URL}"' in slack_page
    # Error texts are scrubbed for everyone: the credential belongs in its field, not in a log line.
    assert SLACK_PATH not in client.get(f"/admin/dlq/alertevent/{channels['event'].pk}/change/").content.decode()


def test_a_delivery_error_never_quotes_the_url(channels):
    broken = AlertChannel.objects.create(name="broken", kind="slack", url="https://hooks.slack.example:99999/T0SECRET")
    with pytest.raises(PermanentError) as raised:
        channel_send(channel=broken, event=channels["event"], idempotency_key="k", timeout=1)
    assert "T0SECRET" not in raised.value.message and "broken" in raised.value.message
