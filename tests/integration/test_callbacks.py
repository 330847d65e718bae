"""Completion callbacks in-process on PostgreSQL: URL checks, the fingerprint, one callback per event, secrets."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks.api.errors import json_bytes
from tasks.exceptions import InvalidTaskInput
from tasks.execution.runner import task_run
from tasks.lifecycle.clients import api_client_create, api_client_signing_secret, signing_secrets
from tasks.lifecycle.operator import task_retry_from_checkpoint
from tasks.models import ApiClient, IdempotencyRecord, Task
from tasks.models.door import door_forced
from tasks.outbound.callback_events import CALLBACK_PIPELINE, CALLBACK_SCOPE, callback_submit
from tasks.outbound.policy import MAX_URL_LENGTH
from tasks.selectors import task_representation
from tasks.submission.submit import task_submit
from tests.support import manage, process_env

pytestmark = pytest.mark.django_db(transaction=True)

HOOK = "https://hooks.example.com/reliability"


@pytest.fixture(autouse=True)
def _callbacks_on(settings, clean_redis):
    settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS = ["hooks.example.com", "receiver.example.net:8443"]


def post(client, token, body, key=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return client.generic("POST", "/api/v1/tasks", json.dumps(body), content_type="application/json", **headers)


def local(callback_url=HOOK, **data) -> dict:
    return {"pipeline": "t_local", "input": data, "callback_url": callback_url}


def callback_tasks() -> list[Task]:
    return list(Task.objects.filter(pipeline=CALLBACK_PIPELINE).order_by("created_at"))


# --- validation at submission: a 400 validation_error, nothing stored ---------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://evil.example.org/hook", "not allowed"),
        ("http://169.254.169.254/latest/meta-data/", "not allowed"),
        ("http://127.0.0.1:8000/admin/", "not allowed"),
        ("https://hooks.example.com.evil.org/x", "not allowed"),
        ("https://receiver.example.net/hook", "not allowed"),  # only port 8443 is allowed there
        ("ftp://hooks.example.com/hook", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("javascript:alert(1)", "http:// or https://"),
        ("https://user:pass@hooks.example.com/hook", "credentials"),
        ("https://token@hooks.example.com/hook", "credentials"),
        ("https://hooks.example.com/a b", "printable ASCII"),
        ("https://hooks.example.com:99999/hook", "not a valid URL"),
        ("https:///hook", "no host"),
        ("https://hooks.example.com/" + "x" * MAX_URL_LENGTH, "1 to 2048 characters"),
    ],
)
def test_a_callback_url_that_is_not_allowed_is_a_400_and_stores_nothing(client, token, url, why):
    response = post(client, token, local(url), key="k-1")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error" and why in error["message"], error
    assert error["details"]["callback_url"] == error["message"]
    assert not Task.objects.exists() and not IdempotencyRecord.objects.exists()


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://0.0.0.0/"]
)
def test_a_listed_metadata_or_unspecified_address_is_still_refused(client, token, settings, url):
    # Listing an internal host is the operator's trust; an instance metadata address never is.
    settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS = ["169.254.169.254", "[fd00:ec2::254]", "0.0.0.0"]
    response = post(client, token, local(url))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "never allowed" in error["message"] and error["details"]["rule"] == "address_forbidden"
    assert not Task.objects.exists()


def test_callbacks_are_off_when_no_host_is_allowed(client, token, settings):
    settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS = []
    response = post(client, token, local())
    assert response.status_code == 400
    assert "callbacks are off" in response.json()["error"]["message"]
    assert not Task.objects.exists()


def test_a_non_string_callback_url_is_a_400(client, token):
    response = post(client, token, local(callback_url=["https://hooks.example.com/"]))
    assert response.status_code == 400 and response.json()["error"]["code"] == "validation_error"


def test_an_allowed_url_is_stored_and_the_client_gets_a_signing_secret(client, token):
    response = post(client, token, local("https://receiver.example.net:8443/done?x=1"))
    assert response.status_code == 201, response.content
    task = Task.objects.get(pk=response.json()["id"])
    assert task.callback_url == "https://receiver.example.net:8443/done?x=1"
    assert task.client.signing_secret.startswith("whsec_")


def test_the_fingerprint_includes_the_callback_url(client, token):
    first = post(client, token, local(), key="same-key")
    assert first.status_code == 201
    replay = post(client, token, local(), key="same-key")
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    other = post(client, token, local("https://hooks.example.com/another"), key="same-key")
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    without = post(client, token, {"pipeline": "t_local", "input": {}}, key="same-key")
    assert without.status_code == 422
    assert Task.objects.count() == 1 and Task.objects.get().callback_url == HOOK


def test_python_submission_checks_the_url_the_same_way_and_needs_a_client():
    api_client, _ = api_client_create(name="py-client")
    with pytest.raises(InvalidTaskInput, match="not allowed"):
        task_submit(pipeline="t_local", input={}, callback_url="https://evil.example.org/", client=api_client)
    with pytest.raises(InvalidTaskInput, match="client="):
        task_submit(pipeline="t_local", input={}, callback_url=HOOK)
    task = task_submit(pipeline="t_local", input={}, callback_url=HOOK, client=api_client)
    assert task.callback_url == HOOK
    again = task_submit(pipeline="t_local", input={}, callback_url=HOOK, client=api_client, idempotency_key="p-1")
    with pytest.raises(Exception, match="different request"):
        task_submit(pipeline="t_local", input={}, callback_url=HOOK + "2", client=api_client, idempotency_key="p-1")
    assert again.pk != task.pk


# --- one callback task per terminal event, in the finishing transaction ---------------------------


def submitted(pipeline: str, **data) -> Task:
    api_client = ApiClient.objects.filter(name="cb-client").first() or api_client_create(name="cb-client")[0]
    return task_submit(pipeline=pipeline, input=data, callback_url=HOOK, client=api_client)


@pytest.mark.parametrize(
    ("pipeline", "data", "state"),
    [
        ("t_local", {}, "succeeded"),
        ("t_local", {"fail_b": "permanent"}, "compensated"),
        ("t_local", {"fail_b": "permanent", "fail_compensation": True}, "compensation_failed"),
        ("t_parked", {"fail": True}, "failed"),
    ],
)
def test_each_terminal_state_creates_one_callback_task_with_the_api_json(pipeline, data, state):
    task = submitted(pipeline, **data)
    task_run(task_id=str(task.pk), worker="test")
    task.refresh_from_db()
    assert task.state == state
    [callback] = callback_tasks()
    body = json.loads(callback.input["body"])
    assert body["event"] == f"task.{state}"
    assert body["task"] == json.loads(json_bytes(task_representation(task)))  # as it finished
    assert body["task"]["state"] == state and body["task"]["id"] == str(task.pk)
    assert callback.input["url"] == HOOK and callback.input["client_id"] == task.client_id
    assert callback.callback_url == "" and callback.client_id is None  # a callback calls nobody back
    assert callback.idempotency_scope == CALLBACK_SCOPE
    assert callback.idempotency_key == f"{task.pk}-task.{state}-g0"
    assert callback.deadline is not None
    assert "whsec_" not in json.dumps(callback.input)  # no secret in the task, so none in the DLQ


def test_a_task_without_a_callback_url_and_a_task_still_running_make_none():
    task = task_submit(pipeline="t_local", input={})
    task_run(task_id=str(task.pk), worker="test")
    assert callback_tasks() == []
    queued = submitted("t_local")
    assert callback_submit(task=queued) is None
    assert callback_tasks() == []


def test_the_same_event_of_the_same_generation_is_sent_once_another_event_is_sent():
    task = submitted("t_parked", fail=True)
    task_run(task_id=str(task.pk), worker="test")
    task.refresh_from_db()
    assert task.state == "failed" and len(callback_tasks()) == 1
    assert callback_submit(task=task) is None  # the same outcome again: no second callback
    assert len(callback_tasks()) == 1

    # An operator retries it and it fails again: the same event of the same generation, sent once.
    task_retry_from_checkpoint(task_id=task.pk)
    task_run(task_id=str(task.pk), worker="test")
    assert Task.objects.get(pk=task.pk).state == "failed" and len(callback_tasks()) == 1

    # Fixed and retried, it succeeds: a new event, a new callback.
    with door_forced():
        Task.objects.filter(pk=task.pk).update(input={"fail": True, "fixed": True})
    task_retry_from_checkpoint(task_id=task.pk)
    task_run(task_id=str(task.pk), worker="test")
    events = [json.loads(callback.input["body"])["event"] for callback in callback_tasks()]
    assert events == ["task.failed", "task.succeeded"]


def test_the_callback_body_is_the_json_get_shows(client, token):
    response = post(client, token, local())
    task_id = response.json()["id"]
    task_run(task_id=task_id, worker="test")
    [callback] = callback_tasks()
    shown = client.get(f"/api/v1/tasks/{task_id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert json.loads(callback.input["body"])["task"] == shown.json()


# --- signing secrets: the command, rotation, no secret in the admin -------------------------------


def run_command(*args: str) -> subprocess.CompletedProcess:
    argv = manage("callback_secret", *args)
    return subprocess.run(argv, env=process_env(), capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.processes
def test_the_command_prints_the_secret_alone_on_its_last_line_and_rotates_it(settings):
    api_client_create(name="rotating")
    first = run_command("rotating")
    assert first.returncode == 0, first.stderr
    secret = first.stdout.strip().splitlines()[-1]
    assert secret.startswith("whsec_") and " " not in secret and len(secret) > 30
    assert run_command("rotating").stdout.strip().splitlines()[-1] == secret  # stable until rotated

    rotated = run_command("rotating", "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip().splitlines()[-1]
    assert new.startswith("whsec_") and new != secret
    api_client = ApiClient.objects.get(name="rotating")
    assert signing_secrets(api_client) == [new, secret]  # the old one still signs during the grace period
    expires = api_client.previous_signing_secret_expires_at
    expected = timezone.now() + timedelta(seconds=settings.RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS)
    assert abs((expires - expected).total_seconds()) < 120

    api_client.previous_signing_secret_expires_at = timezone.now() - timedelta(seconds=1)
    assert signing_secrets(api_client) == [new]  # after it, only the new one


def test_the_grace_period_is_a_setting(settings):
    settings.RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS = 0
    api_client_create(name="no-grace")
    old = api_client_signing_secret(name="no-grace")
    new = api_client_signing_secret(name="no-grace", rotate=True)
    assert old != new and signing_secrets(ApiClient.objects.get(name="no-grace")) == [new]


@pytest.mark.processes
def test_an_unknown_client_is_one_readable_line_and_a_non_zero_exit():
    result = run_command("nobody")
    assert result.returncode != 0
    assert result.stderr.strip() == "CommandError: no client named 'nobody'", result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_the_admin_shows_the_signing_secret_masked_only(admin_client):
    api_client, _ = api_client_create(name="masked")
    old = api_client_signing_secret(name="masked")
    secret = api_client_signing_secret(name="masked", rotate=True)
    page = admin_client.get(f"/admin/tasks/apiclient/{api_client.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert secret not in text and old not in text
    assert f"whsec_…{secret[-4:]}" in text


def test_the_client_list_cannot_be_used_as_an_oracle_for_the_secret(admin_client):
    api_client_create(name="oracle")
    secret = api_client_signing_secret(name="oracle")
    for lookup in ("signing_secret__startswith", "signing_secret", "previous_signing_secret__gt", "token_hash"):
        response = admin_client.get("/admin/tasks/apiclient/", {lookup: secret[:8]})
        assert response.status_code == 400, lookup
    assert admin_client.get("/admin/tasks/apiclient/", {"name": "oracle"}).status_code == 200
