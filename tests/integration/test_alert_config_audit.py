"""Alert rule and channel changes made in the console are audit entries with a diff; a channel's credentials only
as "changed". Enable, disable and test-send are list actions of their own, each refused (and audited) for those
who may not change the record.

Every request is a real admin POST through the test client, as a user of a role made by ``setup_roles``; the
test notification goes to a real HTTP listener on 127.0.0.1.
"""

from __future__ import annotations

import json

import pytest
from django.utils import translation

from dlq.admin.alerting import AlertChannelAdmin, AlertRuleAdmin
from dlq.admin.common import detail_label
from dlq.alerting.config_changes import AUDITED_FIELDS
from dlq.alerting.models import AlertChannel, AlertRule
from dlq.models import AuditEntry, AuditOutcome
from tests.support import rule_form

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_first0123456789abcdefSECRET"
NEW_SECRET = "whsec_second9876543210zyxwvNEWSEC"
URL_PATH = "/hook/T0PATHCREDENTIAL1234"
NEW_URL_PATH = "/hook/T0NEWPATHCREDENTIAL9876"


@pytest.fixture
def receiver(webhook_receiver, settings):
    # Loopback is refused unless listed (dlq.alerting.url_checks): list this listener alone.
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [f"127.0.0.1:{webhook_receiver.port}"]
    AlertChannel.objects.all().delete()  # the migrations' defaults: only this test's records
    AlertRule.objects.all().delete()
    return webhook_receiver


def base_url(receiver) -> str:
    return f"http://127.0.0.1:{receiver.port}"


def channel_form(**fields) -> dict:
    form = {"name": "hook", "kind": "webhook", "enabled": "on", "url": "", "secret": "", "email_to": ""}
    form.update(fields)
    return {name: value for name, value in form.items() if value is not None}


def only_entry(**filters) -> AuditEntry:
    entries = list(AuditEntry.objects.filter(**filters))
    assert len(entries) == 1, [(e.action, e.outcome, e.detail) for e in AuditEntry.objects.all()]
    return entries[0]


def changes(entry: AuditEntry) -> dict[str, dict]:
    assert entry.detail_code == "fields_changed" and entry.detail_params["model"] in (
        "dlq.alertrule",
        "dlq.alertchannel",
    )
    return {
        change["field"]: {key: value for key, value in change.items() if key != "field"}
        for change in entry.detail_params["fields"]
    }


def about(entry: AuditEntry) -> tuple[str, str, str, str]:
    """Who did what to which record, and how it ended."""
    return (entry.actor, entry.target_type, entry.target_id, entry.outcome)


def entry_text(entry: AuditEntry) -> str:
    """Everything an entry stores, as one text: where a credential must not appear."""
    fields = [getattr(entry, field.attname) for field in AuditEntry._meta.concrete_fields]
    return json.dumps([str(value) if not isinstance(value, dict) else value for value in fields])


def act(client, model: str, action: str, *pks: int, follow: bool = True):
    return client.post(
        f"/admin/dlq/{model}/",
        {"action": action, "_selected_action": [str(pk) for pk in pks], "index": "0"},
        follow=follow,
    )


def shown_messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- rules ---------------------------------------------------------------------------------


def test_creating_a_rule_is_audited_with_its_fields(client, role_users, receiver):
    hook = AlertChannel.objects.create(name="hook", kind="log")
    client.force_login(role_users["supervisor"])
    response = client.post("/admin/dlq/alertrule/add/", rule_form(channels=[str(hook.pk)]))
    assert response.status_code == 302, response.content.decode()[:3000]
    rule = AlertRule.objects.get(name="open items")
    entry = only_entry(action="add_alertrule")
    assert about(entry) == ("supervisor-r", "alert_rule", str(rule.pk), AuditOutcome.SUCCEEDED)
    diff = changes(entry)
    assert diff["name"] == {"after": "open items"} and diff["threshold"] == {"after": 5.0}
    assert diff["channels"] == {"after": ["hook"]} and diff["enabled"] == {"after": True}
    assert "pipeline" not in diff  # empty on a new rule: nothing to say


def test_editing_a_rule_is_audited_with_the_changed_fields_before_and_after(client, role_users, receiver):
    hook = AlertChannel.objects.create(name="hook", kind="log")
    rule = AlertRule.objects.create(name="open items", kind="open_items", threshold=5)
    client.force_login(role_users["supervisor"])
    response = client.post(
        f"/admin/dlq/alertrule/{rule.pk}/change/", rule_form(threshold="10", channels=[str(hook.pk)])
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    entry = only_entry(action="change_alertrule")
    assert about(entry) == ("supervisor-r", "alert_rule", str(rule.pk), AuditOutcome.SUCCEEDED)
    assert changes(entry) == {
        "threshold": {"before": 5.0, "after": 10.0},
        "channels": {"before": [], "after": ["hook"]},
    }
    assert entry.detail == "threshold: 5 → 10; channels: (empty) → hook"
    # The version is bumped as before this change: an evaluator that read the rule first loses its transition.
    assert AlertRule.objects.get(pk=rule.pk).version == rule.version + 1


def test_deleting_a_rule_is_audited_with_what_it_was(client, role_users, receiver):
    rule = AlertRule.objects.create(name="old rule", kind="growth", threshold=3, pipeline="report")
    # Supervisors may not delete (their role has no delete permission): refused and audited.
    client.force_login(role_users["supervisor"])
    assert client.post(f"/admin/dlq/alertrule/{rule.pk}/delete/", {"post": "yes"}).status_code == 403
    denied = only_entry(action="delete_alertrule", outcome=AuditOutcome.DENIED)
    assert about(denied) == ("supervisor-r", "alert_rule", str(rule.pk), AuditOutcome.DENIED)
    client.force_login(role_users["superuser"])
    assert client.post(f"/admin/dlq/alertrule/{rule.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not AlertRule.objects.filter(pk=rule.pk).exists()
    entry = only_entry(action="delete_alertrule", outcome=AuditOutcome.SUCCEEDED)
    assert about(entry) == ("root-r", "alert_rule", str(rule.pk), AuditOutcome.SUCCEEDED)
    diff = changes(entry)
    assert diff["name"] == {"before": "old rule"} and diff["kind"] == {"before": "growth"}
    assert diff["pipeline"] == {"before": "report"} and diff["threshold"] == {"before": 3.0}


def test_the_list_actions_disable_and_enable_rules_audited_one_entry_each(client, role_users, receiver):
    first = AlertRule.objects.create(name="first", kind="open_items", threshold=5)
    second = AlertRule.objects.create(name="second", kind="open_items", threshold=5, enabled=False)
    client.force_login(role_users["supervisor"])
    response = act(client, "alertrule", "disable", first.pk, second.pk)
    assert response.status_code == 200
    assert "Disabled 1 alert rule." in shown_messages(response)
    assert "1 already disabled: unchanged." in shown_messages(response)
    assert not AlertRule.objects.get(pk=first.pk).enabled
    assert AlertRule.objects.get(pk=first.pk).version == first.version + 1
    entry = only_entry(action="disable_alertrule")
    assert about(entry) == ("supervisor-r", "alert_rule", str(first.pk), AuditOutcome.SUCCEEDED)
    assert changes(entry) == {"enabled": {"before": True, "after": False}}
    assert entry.detail == "enabled: yes → no"

    act(client, "alertrule", "enable", first.pk, second.pk)
    assert AlertRule.objects.filter(enabled=True).count() == 2
    enabled = AuditEntry.objects.filter(action="enable_alertrule").order_by("pk")
    assert [(e.target_id, e.detail_params["fields"]) for e in enabled] == [
        (str(pk), [{"field": "enabled", "before": False, "after": True}]) for pk in (first.pk, second.pk)
    ]


# --- channels ------------------------------------------------------------------------------


def test_creating_a_channel_records_its_credentials_only_as_changed(client, role_users, receiver):
    url = base_url(receiver) + URL_PATH
    client.force_login(role_users["supervisor"])
    response = client.post("/admin/dlq/alertchannel/add/", channel_form(url=url, secret=SECRET))
    assert response.status_code == 302, response.content.decode()[:3000]
    channel = AlertChannel.objects.get(name="hook")
    entry = only_entry(action="add_alertchannel")
    assert about(entry) == ("supervisor-r", "alert_channel", str(channel.pk), AuditOutcome.SUCCEEDED)
    diff = changes(entry)
    assert diff["url"] == {"changed": True} and diff["secret"] == {"changed": True}
    assert diff["name"] == {"after": "hook"} and diff["kind"] == {"after": "webhook"}
    stored = entry_text(entry)
    assert SECRET not in stored and URL_PATH not in stored and "first0123456789" not in stored


def test_editing_a_channel_shows_that_its_credentials_changed_never_their_values(client, role_users, receiver):
    old_url, new_url = base_url(receiver) + URL_PATH, base_url(receiver) + NEW_URL_PATH
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=old_url, secret=SECRET)
    client.force_login(role_users["supervisor"])
    response = client.post(
        f"/admin/dlq/alertchannel/{channel.pk}/change/",
        channel_form(name="pager", url=new_url, secret=NEW_SECRET),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    entry = only_entry(action="change_alertchannel")
    assert about(entry) == ("supervisor-r", "alert_channel", str(channel.pk), AuditOutcome.SUCCEEDED)
    assert changes(entry) == {
        "name": {"before": "hook", "after": "pager"},
        "url": {"changed": True},
        "secret": {"changed": True},
    }
    assert entry.detail == "name: hook → pager; URL: changed; secret: changed"
    stored = entry_text(entry)
    for value in (SECRET, NEW_SECRET, URL_PATH, NEW_URL_PATH, "T0PATH", "T0NEWPATH"):
        assert value not in stored, value
    # The entry's page, in English and Chinese, says the same.
    page = client.get(f"/admin/dlq/auditentry/{entry.pk}/change/").content.decode()
    assert "URL: changed" in page and SECRET not in page and NEW_URL_PATH not in page
    with translation.override("zh-hans"):
        chinese = detail_label(entry)
    assert "secret" not in chinese and "changed" not in chinese and "hook" in chinese and "pager" in chinese


def test_saving_a_channel_unchanged_writes_no_entry(client, role_users, receiver):
    channel = AlertChannel.objects.create(name="ops", kind="log")
    client.force_login(role_users["supervisor"])
    response = client.post(f"/admin/dlq/alertchannel/{channel.pk}/change/", channel_form(name="ops", kind="log"))
    assert response.status_code == 302, response.content.decode()[:3000]
    assert not AuditEntry.objects.filter(action="change_alertchannel").exists()


def test_deleting_a_channel_is_audited_without_its_credentials(client, role_users, receiver):
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=base_url(receiver) + URL_PATH, secret=SECRET)
    client.force_login(role_users["superuser"])
    assert client.post(f"/admin/dlq/alertchannel/{channel.pk}/delete/", {"post": "yes"}).status_code == 302
    entry = only_entry(action="delete_alertchannel")
    assert about(entry) == ("root-r", "alert_channel", str(channel.pk), AuditOutcome.SUCCEEDED)
    diff = changes(entry)
    assert (
        diff["name"] == {"before": "hook"} and diff["secret"] == {"changed": True} and diff["url"] == {"changed": True}
    )
    assert SECRET not in entry_text(entry) and URL_PATH not in entry_text(entry)


def test_deleting_selected_channels_audits_each(client, role_users, receiver):
    pks = [AlertChannel.objects.create(name=name, kind="log").pk for name in ("one", "two")]
    client.force_login(role_users["superuser"])
    response = client.post(
        "/admin/dlq/alertchannel/", {"action": "delete_selected", "_selected_action": pks, "post": "yes"}
    )
    assert response.status_code == 302
    assert not AlertChannel.objects.exists()
    entries = AuditEntry.objects.filter(action="delete_alertchannel", outcome=AuditOutcome.SUCCEEDED)
    assert sorted(entries.values_list("target_id", flat=True)) == sorted(str(pk) for pk in pks)


def test_the_list_actions_disable_and_enable_channels(client, role_users, receiver):
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=base_url(receiver) + URL_PATH)
    client.force_login(role_users["supervisor"])
    assert "Disabled 1 alert channel." in shown_messages(act(client, "alertchannel", "disable", channel.pk))
    assert not AlertChannel.objects.get(pk=channel.pk).enabled
    assert "Enabled 1 alert channel." in shown_messages(act(client, "alertchannel", "enable", channel.pk))
    assert AlertChannel.objects.get(pk=channel.pk).enabled
    for action, before, after in (("disable_alertchannel", True, False), ("enable_alertchannel", False, True)):
        entry = only_entry(action=action)
        assert about(entry) == ("supervisor-r", "alert_channel", str(channel.pk), AuditOutcome.SUCCEEDED)
        assert changes(entry) == {"enabled": {"before": before, "after": after}}


def test_enabling_a_channel_whose_url_may_not_be_sent_to_is_refused(client, role_users, receiver, settings):
    channel = AlertChannel.objects.create(
        name="inside",
        kind="webhook",
        url=base_url(receiver) + URL_PATH,
        enabled=False,
        disabled_reason_code="address_not_public",
    )
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = []  # loopback, no longer listed
    client.force_login(role_users["supervisor"])
    response = act(client, "alertchannel", "enable", channel.pk)
    assert any(message.startswith("Not enabled: inside: Refused") for message in shown_messages(response))
    channel.refresh_from_db()
    assert not channel.enabled and channel.disabled_reason_code == "address_not_public"
    entry = only_entry(action="enable_alertchannel")
    assert entry.outcome == AuditOutcome.REFUSED and entry.detail_code == "channel_url_refused"
    assert entry.detail.startswith("not switched on: Refused") and URL_PATH not in entry_text(entry)
    # Listed again, it is switched on and the engine's reason for switching it off is cleared.
    settings.RELIABILITY_ALERT_ALLOWED_HOSTS = [f"127.0.0.1:{receiver.port}"]
    act(client, "alertchannel", "enable", channel.pk)
    channel.refresh_from_db()
    assert channel.enabled and channel.disabled_reason_code == "" and channel.disabled_at is None


def test_a_test_notification_is_delivered_signed_and_audited(client, role_users, receiver):
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=base_url(receiver) + URL_PATH, secret=SECRET)
    client.force_login(role_users["supervisor"])
    response = act(client, "alertchannel", "test", channel.pk)
    assert shown_messages(response) == ["Test notification to hook delivered."]
    [received] = receiver.accepted()
    assert received.path == URL_PATH and received.signature_valid(SECRET)
    assert received.json["status"] == "test" and received.json["rule"] is None
    entry = only_entry(action="test_alertchannel")
    assert about(entry) == ("supervisor-r", "alert_channel", str(channel.pk), AuditOutcome.SUCCEEDED)
    assert entry.detail_code == "test_delivered" and entry.detail == "test notification delivered"


def test_a_failed_test_notification_says_why_without_the_url_or_secret(client, role_users, receiver):
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=base_url(receiver) + URL_PATH, secret=SECRET)
    receiver.fail_next = 1
    client.force_login(role_users["supervisor"])
    response = act(client, "alertchannel", "test", channel.pk)
    assert shown_messages(response) == ["Test notification to hook not delivered: the receiver answered HTTP 500"]
    assert len(receiver.all()) == 1  # tried once: a test is not retried
    entry = only_entry(action="test_alertchannel")
    assert entry.outcome == AuditOutcome.FAILED and entry.detail_code == "test_not_delivered"
    assert entry.detail_params["error_code"] == "http_500"
    assert entry.detail == "test notification not delivered: the receiver answered HTTP 500"
    stored = entry_text(entry) + " ".join(shown_messages(response))
    assert SECRET not in stored and URL_PATH not in stored and str(receiver.port) not in stored

    receiver.stop()  # nothing listens there any more: the connection fails
    response = act(client, "alertchannel", "test", channel.pk)
    assert shown_messages(response) == ["Test notification to hook not delivered: the connection failed"]
    entries = AuditEntry.objects.filter(action="test_alertchannel", outcome=AuditOutcome.FAILED)
    assert entries.filter(detail_params__error_code="connection_error").count() == 1


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_without_the_change_permission_every_post_is_refused_and_audited(client, role_users, receiver, role):
    rule = AlertRule.objects.create(name="open items", kind="open_items", threshold=5)
    channel = AlertChannel.objects.create(name="hook", kind="webhook", url=base_url(receiver) + URL_PATH, secret=SECRET)
    client.force_login(role_users[role])
    posts = [
        ("/admin/dlq/alertrule/add/", rule_form(name="mine"), "add_alertrule", "alert_rule", "new"),
        (
            f"/admin/dlq/alertrule/{rule.pk}/change/",
            rule_form(threshold="0"),
            "change_alertrule",
            "alert_rule",
            rule.pk,
        ),
        (f"/admin/dlq/alertrule/{rule.pk}/delete/", {"post": "yes"}, "delete_alertrule", "alert_rule", rule.pk),
        (
            "/admin/dlq/alertchannel/add/",
            channel_form(name="mine", kind="log"),
            "add_alertchannel",
            "alert_channel",
            "new",
        ),
        (
            f"/admin/dlq/alertchannel/{channel.pk}/change/",
            channel_form(secret="stolen"),
            "change_alertchannel",
            "alert_channel",
            channel.pk,
        ),
        (
            f"/admin/dlq/alertchannel/{channel.pk}/delete/",
            {"post": "yes"},
            "delete_alertchannel",
            "alert_channel",
            channel.pk,
        ),
    ]
    for model, pk in (("alertrule", rule.pk), ("alertchannel", channel.pk)):
        for action in ("enable", "disable"):
            data = {"action": action, "_selected_action": [pk], "index": "0"}
            posts.append((f"/admin/dlq/{model}/", data, f"{action}_{model}", f"alert_{model[5:]}", "selected"))
    test_send = {"action": "test", "_selected_action": [channel.pk], "index": "0"}
    posts.append(("/admin/dlq/alertchannel/", test_send, "test_alertchannel", "alert_channel", "selected"))
    for url, data, *_ in posts:
        assert client.post(url, data).status_code == 403, (url, data)
    denied = AuditEntry.objects.filter(outcome=AuditOutcome.DENIED).order_by("pk")
    assert [(e.actor, e.action, e.target_type) for e in denied] == [
        (f"{role}-r", action, target_type) for _url, _data, action, target_type, _target in posts
    ]
    assert [e.target_id for e in denied][:6] == [str(target) for *_, target in posts[:6]]
    assert not AuditEntry.objects.exclude(outcome=AuditOutcome.DENIED).exists()
    assert receiver.all() == []
    assert AlertRule.objects.get(pk=rule.pk).threshold == 5 and AlertRule.objects.get().enabled
    channel.refresh_from_db()
    assert (channel.secret, channel.enabled, AlertChannel.objects.count()) == (SECRET, True, 1)


def test_the_denied_actions_are_named_in_the_audit_log(client, role_users, receiver):
    client.force_login(role_users["viewer"])
    act(client, "alertchannel", "test", 1, follow=False)
    client.force_login(role_users["supervisor"])
    page = client.get("/admin/dlq/auditentry/").content.decode()
    assert "Send a test notification to alert channel" in page and "alert channel" in page


# --- what the audit covers -----------------------------------------------------------------


def test_every_field_the_forms_edit_is_audited():
    # A field added to a form but not to AUDITED_FIELDS would change unaudited.
    rule_fields = {name for _title, options in AlertRuleAdmin.fieldsets for name in options["fields"]}
    editable_rule_fields = rule_fields - set(AlertRuleAdmin.readonly_fields)
    assert editable_rule_fields == set(AUDITED_FIELDS[AlertRule])
    editable_channel_fields = set(AlertChannelAdmin.fields) - set(AlertChannelAdmin.readonly_fields)
    assert editable_channel_fields == set(AUDITED_FIELDS[AlertChannel])
