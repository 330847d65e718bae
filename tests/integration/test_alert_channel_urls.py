"""Alert channels send only where the outbound rules allow: checked on the form, again before every send.

Every refusal is shown against a real listener on loopback: it must receive nothing.
"""

from __future__ import annotations

import pytest

from dlq.alerting.channels import channel_send
from dlq.alerting.models import AlertChannel, AlertEvent, AlertRule
from tasks.exceptions import PermanentError
from tasks.outbound.policy import Rule

pytestmark = pytest.mark.django_db(transaction=True)

# Documentation addresses stand in for public hosts (nothing here reaches the internet).
PUBLIC_ADDRESS = "93.184.215.14"


@pytest.fixture
def listener(webhook_receiver, settings):
    """A real receiver on 127.0.0.1 that the allow-list does not name: the default, an empty list."""
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = []
    AlertChannel.objects.all().delete()  # the migration's log channel
    return webhook_receiver


@pytest.fixture
def event():
    rule = AlertRule.objects.create(name="open items", kind="open_items", threshold=1)
    return AlertEvent.objects.create(rule=rule, kind="firing", rule_version=1, value=2, threshold=1, summary="2 open")


def add_channel(client, url: str, **fields):
    data = {"name": "hook", "kind": "webhook", "enabled": "on", "url": url, "secret": "", "email_to": ""}
    return client.post("/admin/dlq/alertchannel/add/", {**data, **fields})


def form_error(response) -> str:
    assert response.status_code == 200, response.status_code  # the form again, not a redirect
    return " ".join(str(error) for error in response.context["adminform"].form.errors.get("url", []))


@pytest.mark.parametrize(
    ("url", "rule_text"),
    [
        ("http://127.0.0.1:{port}/hook", "loopback, private or shared address"),
        ("http://localhost:{port}/hook", "loopback, private or shared address"),  # a name for 127.0.0.1
        ("http://[::ffff:127.0.0.1]:{port}/hook", "loopback, private or shared address"),
        ("http://169.254.169.254/latest/meta-data/", "link-local, metadata"),
        ("http://[fd00:ec2::254]/latest/meta-data/", "link-local, metadata"),
        ("http://0.0.0.0:{port}/hook", "link-local, metadata"),
        ("http://10.0.0.7/hook", "loopback, private or shared address"),
        ("http://100.100.100.200/latest/meta-data/", "link-local, metadata"),
        ("https://user:pw@hooks.example.com/x", "credentials"),
        ("http://no-such-host.invalid/hook", "does not resolve"),
    ],
)
def test_a_supervisor_cannot_save_a_channel_aimed_inside(client, role_users, listener, url, rule_text):
    client.force_login(role_users["supervisor"])
    response = add_channel(client, url.format(port=listener.port))
    assert rule_text in form_error(response)
    assert not AlertChannel.objects.exists()
    assert listener.all() == []


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_other_roles_cannot_save_a_channel_at_all(client, role_users, listener, role):
    client.force_login(role_users[role])
    assert add_channel(client, listener.url).status_code == 403
    assert not AlertChannel.objects.exists() and listener.all() == []


def test_a_listed_host_may_be_internal_and_receives_the_notification(client, role_users, listener, settings, event):
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [f"127.0.0.1:{listener.port}"]
    client.force_login(role_users["supervisor"])
    response = add_channel(client, listener.url)
    assert response.status_code == 302, form_error(response)
    channel = AlertChannel.objects.get(name="hook")
    channel_send(channel=channel, event=event, idempotency_key="k-1", timeout=5)
    assert len(listener.accepted()) == 1


def test_a_listed_host_is_still_never_a_metadata_address(client, role_users, listener, settings):
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = ["169.254.169.254"]
    client.force_login(role_users["supervisor"])
    assert "link-local, metadata" in form_error(add_channel(client, "http://169.254.169.254/latest/meta-data/"))
    assert not AlertChannel.objects.exists()


def test_with_an_allow_list_other_hosts_are_refused_by_name(client, role_users, listener, settings, dns):
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = ["alerts.example.com"]
    dns["hooks.example.org"] = [PUBLIC_ADDRESS]
    client.force_login(role_users["supervisor"])
    error = form_error(add_channel(client, "https://hooks.example.org/x"))
    assert "Refused by the allow-list" in error and "hooks.example.org" in error


def test_without_an_allow_list_a_public_host_is_accepted(client, role_users, listener, dns):
    dns["hooks.example.com"] = [PUBLIC_ADDRESS]
    client.force_login(role_users["supervisor"])
    response = add_channel(client, "https://hooks.example.com/services/x")
    assert response.status_code == 302, form_error(response)
    assert AlertChannel.objects.get().enabled


def test_an_existing_channel_that_no_longer_passes_is_switched_off_with_its_reason(client, role_users, listener, event):
    # Saved before this check existed (or when the allow-list still named it): the engine checks again on send.
    channel = AlertChannel.objects.create(name="old", kind="webhook", url=f"http://localhost:{listener.port}/hook")
    with pytest.raises(PermanentError) as refused:
        channel_send(channel=channel, event=event, idempotency_key="k-1", timeout=5)
    assert refused.value.code == "alert_url_refused" and str(listener.port) not in refused.value.message
    assert listener.all() == []
    channel.refresh_from_db()
    assert not channel.enabled and channel.disabled_reason_code == Rule.ADDRESS_NOT_PUBLIC
    assert channel.disabled_at is not None

    client.force_login(role_users["viewer"])
    page = client.get("/admin/dlq/alertchannel/").content.decode()
    assert "switched off" in page and "loopback, private or shared address" in page


def test_a_channel_switched_off_comes_back_when_a_supervisor_saves_a_passing_url(
    client, role_users, listener, settings, event
):
    channel = AlertChannel.objects.create(name="old", kind="webhook", url=listener.url)
    with pytest.raises(PermanentError):
        channel_send(channel=channel, event=event, idempotency_key="k-1", timeout=5)
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [f"127.0.0.1:{listener.port}"]
    client.force_login(role_users["supervisor"])
    response = client.post(
        f"/admin/dlq/alertchannel/{channel.pk}/change/",
        {"name": "old", "kind": "webhook", "enabled": "on", "url": listener.url, "secret": "", "email_to": ""},
    )
    assert response.status_code == 302, form_error(response)
    channel.refresh_from_db()
    assert channel.enabled and channel.disabled_reason_code == "" and channel.disabled_at is None


def test_a_name_that_moves_to_loopback_after_the_check_is_refused_when_connecting(listener, event, dns):
    # DNS rebinding: public when checked, 127.0.0.1 when the request connects. The sender connects to the address
    # it checked, so the second answer is checked too and nothing reaches the listener.
    dns["rebind.example.com"] = [PUBLIC_ADDRESS, "127.0.0.1"]
    channel = AlertChannel.objects.create(
        name="rebind", kind="webhook", url=f"http://rebind.example.com:{listener.port}/"
    )
    with pytest.raises(PermanentError) as refused:
        channel_send(channel=channel, event=event, idempotency_key="k-1", timeout=5)
    assert refused.value.code == "alert_url_refused"
    assert listener.all() == []
    assert not AlertChannel.objects.get(pk=channel.pk).enabled


def test_a_redirect_is_not_followed(listener, settings, event):
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [f"127.0.0.1:{listener.port}"]
    listener.redirect_to = f"http://127.0.0.1:{listener.port}/elsewhere"
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=listener.url)
    with pytest.raises(PermanentError) as refused:
        channel_send(channel=channel, event=event, idempotency_key="k-1", timeout=5)
    assert refused.value.code == "alert_redirect"
    assert [received.path for received in listener.all()] == ["/hook"]  # the 302 only, never /elsewhere


def test_a_shrunk_allow_list_switches_the_channel_off_at_send_time(listener, settings, event):
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [f"127.0.0.1:{listener.port}"]
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=listener.url)
    channel_send(channel=channel, event=event, idempotency_key="k-1", timeout=5)
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = ["alerts.example.com"]
    with pytest.raises(PermanentError):
        channel_send(channel=channel, event=event, idempotency_key="k-2", timeout=5)
    assert len(listener.all()) == 1
    channel.refresh_from_db()
    assert channel.disabled_reason_code == Rule.HOST_NOT_ALLOWED and not channel.enabled
