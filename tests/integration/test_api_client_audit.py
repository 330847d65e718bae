"""Creating, revoking and re-keying an API client is the superuser's alone, and every attempt is an audit entry.

Through the real admin POST for each role, and through the management commands (as a real subprocess, whose
exit code and one-line error an operator sees).
"""

from __future__ import annotations

import getpass
import subprocess

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from dlq.models import AuditEntry, AuditOutcome
from tasks.lifecycle.clients import api_client_authenticate, api_client_create, api_client_revoke
from tasks.models import ApiClient
from tests.support import manage, process_env

REVOKE_URL = "/admin/tasks/apiclient/"


@pytest.fixture
def no_role_staff(db):
    return get_user_model().objects.create_user("staff-no-role", password="x-test-only", is_staff=True)


def _revoke_post(client, user, api_client):
    client.force_login(user)
    return client.post(REVOKE_URL, {"action": "revoke", "_selected_action": [api_client.pk]})


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "operator", "supervisor", "no_role"])
def test_only_a_superuser_revokes_a_client_every_other_role_is_denied_and_audited(
    client, role_users, no_role_staff, role
):
    user = no_role_staff if role == "no_role" else role_users[role]
    api_client, token = api_client_create(name="billing")

    response = _revoke_post(client, user, api_client)

    assert response.status_code == 403
    api_client.refresh_from_db()
    assert api_client.revoked_at is None and api_client_authenticate(token=token) == api_client
    entry = AuditEntry.objects.get(actor=user.username)
    assert (entry.action, entry.outcome, entry.target_type, entry.target_id) == (
        "revoke_apiclient",
        AuditOutcome.DENIED,
        "apiclient",
        "billing",
    )


@pytest.mark.django_db
def test_a_superusers_revoke_is_audited_and_a_second_one_is_a_refusal(client, role_users):
    root = role_users["superuser"]
    api_client, token = api_client_create(name="billing")

    response = _revoke_post(client, root, api_client)

    assert response.status_code == 302
    assert api_client_authenticate(token=token) is None
    entry = AuditEntry.objects.get(actor=root.username)
    assert (entry.action, entry.outcome, entry.target_type, entry.target_id, entry.client_ip) == (
        "revoke_apiclient",
        AuditOutcome.SUCCEEDED,
        "apiclient",
        "billing",
        "127.0.0.1",
    )

    again = client.post(REVOKE_URL, {"action": "revoke", "_selected_action": [api_client.pk]}, follow=True)

    assert again.status_code == 200
    assert b"client billing was revoked already" in again.content
    refused = AuditEntry.objects.get(actor=root.username, outcome=AuditOutcome.REFUSED)
    assert (refused.action, refused.target_id, refused.detail_code) == (
        "revoke_apiclient",
        "billing",
        "client_already_revoked",
    )


@pytest.mark.django_db
def test_supervisors_see_the_clients_but_are_offered_no_revoke(client, role_users):
    api_client_create(name="billing")
    client.force_login(role_users["supervisor"])
    page = client.get(REVOKE_URL)
    assert page.status_code == 200 and b"billing" in page.content
    assert b'value="revoke"' not in page.content


@pytest.mark.django_db
def test_python_callers_changes_and_refusals_are_audited(db):
    api_client_create(name="py")
    api_client_revoke(name="py", actor="operator:alice")
    with pytest.raises(Exception, match="revoked already"):
        api_client_revoke(name="py")
    rows = list(AuditEntry.objects.order_by("pk").values_list("actor", "action", "outcome", "target_id"))
    assert rows == [
        ("system:python", "create_apiclient", AuditOutcome.SUCCEEDED, "py"),
        ("alice", "revoke_apiclient", AuditOutcome.SUCCEEDED, "py"),
        ("system:python", "revoke_apiclient", AuditOutcome.REFUSED, "py"),
    ]


@pytest.mark.django_db
def test_the_commands_changes_are_audited_with_the_os_user():
    actor = f"command:{getpass.getuser()}"
    call_command("create_api_token", "billing")
    call_command("callback_secret", "billing")  # the first secret, made on first use: not a change to audit
    call_command("callback_secret", "billing", "--rotate")
    call_command("revoke_api_token", "billing")

    rows = list(AuditEntry.objects.order_by("pk").values_list("actor", "action", "outcome", "target_type", "target_id"))
    assert rows == [
        (actor, "create_apiclient", AuditOutcome.SUCCEEDED, "apiclient", "billing"),
        (actor, "rotate_secret_apiclient", AuditOutcome.SUCCEEDED, "apiclient", "billing"),
        (actor, "revoke_apiclient", AuditOutcome.SUCCEEDED, "apiclient", "billing"),
    ]


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("arguments", "action", "code"),
    [
        (["revoke_api_token", "billing"], "revoke_apiclient", "client_already_revoked"),
        (["revoke_api_token", "nobody"], "revoke_apiclient", "no_such_client"),
        (["create_api_token", "billing"], "create_apiclient", "client_exists"),
        (["create_api_token", "   "], "create_apiclient", "client_name_invalid"),
        (["callback_secret", "nobody", "--rotate"], "rotate_secret_apiclient", "no_such_client"),
    ],
)
def test_a_refused_command_prints_one_line_exits_non_zero_and_is_audited(arguments, action, code):
    api_client_create(name="billing")
    api_client_revoke(name="billing")
    before = AuditEntry.objects.count()

    result = subprocess.run(manage(*arguments), env=process_env(), capture_output=True, text=True, timeout=60)

    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: "), result.stderr
    assert AuditEntry.objects.count() == before + 1
    entry = AuditEntry.objects.order_by("pk").last()
    assert (entry.actor, entry.action, entry.outcome, entry.detail_code) == (
        f"command:{getpass.getuser()}",
        action,
        AuditOutcome.REFUSED,
        code,
    )
    assert entry.target_id == arguments[1].strip()
    assert ApiClient.objects.count() == 1
