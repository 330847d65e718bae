"""The read-only task and DLQ pages render, and keep secrets and tracebacks out."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tasks.execution.runner import task_run
from tasks.models import Task
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff_client(client):
    user = get_user_model().objects.create_superuser("root", password="pw-for-tests-only")
    client.force_login(user)
    return client


def test_task_and_dlq_pages_render_with_secrets_redacted(staff_client, clean_redis):
    task = task_submit(pipeline="t_local", input={"fail_b": "permanent", "api_token": "s3cr3t-value"})
    task_run(task_id=str(task.pk), worker="w1")
    task = Task.objects.get(pk=task.pk)
    page = staff_client.get(f"/admin/tasks/task/{task.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "s3cr3t-value" not in body and "[redacted]" in body
    assert "Traceback" not in body
    assert "refused" in body  # the error code and message of the failed attempt

    listing = staff_client.get("/admin/dlq/dlqitem/?status=compensated")
    assert listing.status_code == 200 and "local_b" in listing.content.decode()
    item_page = staff_client.get(f"/admin/dlq/dlqitem/{task.dlq_items.get().pk}/change/")
    assert item_page.status_code == 200 and "s3cr3t-value" not in item_page.content.decode()


def test_tasks_cannot_be_edited_through_the_admin(staff_client, clean_redis):
    task = task_submit(pipeline="t_local", input={})
    response = staff_client.post(f"/admin/tasks/task/{task.pk}/change/", {"pipeline": "other"})
    assert response.status_code == 403
    assert Task.objects.get(pk=task.pk).pipeline == "t_local"


def test_an_api_client_can_be_revoked_from_the_admin(staff_client):
    from tasks.lifecycle.clients import api_client_authenticate, api_client_create

    client, token = api_client_create(name="to-revoke")
    response = staff_client.post(
        "/admin/tasks/apiclient/", {"action": "revoke", "_selected_action": [client.pk]}, follow=True
    )
    assert response.status_code == 200 and b"Revoked 1 client." in response.content
    assert api_client_authenticate(token=token) is None
    page = staff_client.get(f"/admin/tasks/apiclient/{client.pk}/change/").content.decode()
    assert client.token_hash not in page
