"""The callback task's own checks when it sends, in-process on PostgreSQL against a real HTTP receiver on 127.0.0.1.

Issue #13, point 5: signed with the client's secrets at send time (both during a rotation's grace period), the
host checked again before each attempt (the setting may have shrunk), and no callback for a revoked client.
"""

from __future__ import annotations

import pytest

from tasks.execution.runner import task_run
from tasks.lifecycle.clients import api_client_create, api_client_revoke, api_client_signing_secret
from tasks.models import Task
from tasks.outbound.callback_events import CALLBACK_PIPELINE
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT = "cb-sender"


@pytest.fixture(autouse=True)
def _callbacks_to_the_receiver(settings, clean_redis):
    settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS = ["127.0.0.1"]


def finished_with_callback(url: str) -> Task:
    """A t_local task of CLIENT that succeeded; its callback task, not run yet."""
    client = api_client_create(name=CLIENT)[0]
    task = task_submit(pipeline="t_local", input={}, callback_url=url, client=client)
    assert task_run(task_id=str(task.pk), worker="w1") == "succeeded"
    return Task.objects.get(pipeline=CALLBACK_PIPELINE)


def test_during_a_rotation_the_callback_carries_both_signatures(webhook_receiver):
    callback = finished_with_callback(webhook_receiver.url)
    old = api_client_signing_secret(name=CLIENT)
    new = api_client_signing_secret(name=CLIENT, rotate=True)

    assert task_run(task_id=str(callback.pk), worker="w1") == "succeeded"

    (received,) = webhook_receiver.all()
    assert received.headers["reliability-signature"].count("v1=") == 2
    assert received.callback_signature_valid(new) and received.callback_signature_valid(old)
    assert not received.callback_signature_valid("whsec_another")


def test_a_host_no_longer_allowed_when_the_callback_runs_is_not_called(webhook_receiver, settings):
    callback = finished_with_callback(webhook_receiver.url)
    settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS = ["hooks.example.com"]

    assert task_run(task_id=str(callback.pk), worker="w1") == "failed"

    callback.refresh_from_db()
    assert (callback.failure_reason, callback.failure_code) == ("permanent_error", "callback_url_refused")
    assert callback.in_dlq and webhook_receiver.all() == []


def test_a_listed_name_that_resolves_to_a_metadata_address_when_the_callback_runs_is_not_called(
    webhook_receiver, settings, dns
):
    settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS = ["hooks.internal"]
    dns["hooks.internal"] = ["127.0.0.1"]  # at submission: the receiver (a listed host may be internal)
    callback = finished_with_callback(f"http://hooks.internal:{webhook_receiver.port}/hook")
    dns["hooks.internal"] = ["169.254.169.254"]  # when the callback runs: the metadata service

    assert task_run(task_id=str(callback.pk), worker="w1") == "failed"

    callback.refresh_from_db()
    assert (callback.failure_reason, callback.failure_code) == ("permanent_error", "callback_url_refused")
    assert "169.254.169.254" in callback.failure_message and webhook_receiver.all() == []


def test_a_revoked_clients_callback_is_not_sent(webhook_receiver):
    callback = finished_with_callback(webhook_receiver.url)
    api_client_revoke(name=CLIENT)

    assert task_run(task_id=str(callback.pk), worker="w1") == "failed"

    callback.refresh_from_db()
    assert (callback.failure_reason, callback.failure_code) == ("permanent_error", "callback_client_revoked")
    assert webhook_receiver.all() == []
