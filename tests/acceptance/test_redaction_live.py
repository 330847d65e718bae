"""A step that puts its input in its errors and output leaks no secret: not over HTTP, not in the database.

Issue #12, finding 4, replayed as it was found: a viewer opened the task page
and the DLQ item of a task whose step raised ``ValueError(f"rejected
{ctx.input}")`` and read the password, the API key and a bearer token kept
under an innocent key. Everything runs for real: gunicorn serves the API and
the admin, an RQ worker runs the task, PostgreSQL holds the rows.
"""

from __future__ import annotations

import html
import re

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection

from dlq.roles import roles_setup
from tasks.lifecycle.clients import api_client_create, api_client_signing_secret
from tasks.models import DeadLetter
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

PASSWORD = "hunter2"
API_KEY = "k_9f8e7d6c5b4a39281706"  # no known shape: only its input key says it is a secret
BEARER = "sk_live_51HxQ2eLkdJ8sT0pB3vR7nYc"  # under "note": only its shape says it is a secret
SECRETS = (PASSWORD, API_KEY, BEARER)
INPUT = {"user": "alice", "password": PASSWORD, "api_key": API_KEY, "note": f"Authorization: Bearer {BEARER}"}
VIEWER_PASSWORD = "viewer-pw-for-tests-only"
# The rows a task owns, read raw: every column as PostgreSQL stores it (the task's input aside, see below).
RAW_ROWS = {
    "tasks_stepattempt": "SELECT row_to_json(r)::text FROM tasks_stepattempt r WHERE task_id = %s",
    "tasks_checkpoint": "SELECT row_to_json(r)::text FROM tasks_checkpoint r WHERE task_id = %s",
    "tasks_sideeffect": "SELECT row_to_json(r)::text FROM tasks_sideeffect r WHERE task_id = %s",
    "dlq_dlqitem": "SELECT row_to_json(r)::text FROM dlq_dlqitem r WHERE task_id = %s",
    "tasks_idempotencyrecord": "SELECT row_to_json(r)::text FROM tasks_idempotencyrecord r WHERE task_id = %s",
    # The input is the request the steps run on, kept as submitted; every other column must be clean.
    "tasks_task": "SELECT (to_jsonb(r) - 'input')::text FROM tasks_task r WHERE id = %s",
}


def leaked(text: str, secrets: tuple[str, ...] = SECRETS) -> list[str]:
    return [secret for secret in secrets if secret in text]


def viewer_session(server_url: str) -> requests.Session:
    """A session logged in through the admin's login form as a member of the viewer group."""
    roles_setup()
    user = get_user_model().objects.create_user("vera", password=VIEWER_PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get(name="viewer"))
    session = requests.Session()
    login_url = f"{server_url}/admin/login/"
    form = session.get(login_url, timeout=10)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    answer = session.post(
        login_url,
        data={"username": "vera", "password": VIEWER_PASSWORD, "csrfmiddlewaretoken": csrf, "next": "/admin/"},
        headers={"Referer": login_url},
        timeout=10,
    )
    assert answer.status_code == 200 and "/admin/logout/" in answer.text, answer.text[:500]
    return session


def test_a_step_that_raises_its_input_leaks_no_secret_anywhere(start_api_server, start_workers):
    server = start_api_server()
    pool = start_workers(1)
    token = api_client_create(name="finder")[1]
    # This deployment's own secrets under innocent keys (issue 25): the client's real API token and its
    # callback signing secret; only their shapes say what they are.
    signing_secret = api_client_signing_secret(name="finder")
    secrets = (*SECRETS, token, signing_secret)
    api = {"Authorization": f"Bearer {token}"}
    created = requests.post(
        f"{server.url}/api/v1/tasks",
        json={"pipeline": "t_leaky", "input": {**INPUT, "ref": token, "hook": signing_secret}},
        headers={**api, "Idempotency-Key": "leaky-1"},
        timeout=10,
    )
    assert created.status_code == 201, created.text
    task_id = created.json()["id"]

    def finished():
        answer = requests.get(f"{server.url}/api/v1/tasks/{task_id}", headers=api, timeout=10)
        return answer if answer.json()["state"] == "compensation_failed" else None

    answer = wait_for(finished, timeout=60, message="the leaky task to fail its compensation")
    body = answer.json()
    assert body["failure"]["code"] == "compensation_failed", pool.logs()
    assert [step["attempts"] for step in body["steps"]] == [1, 2]
    assert leaked(answer.text, secrets) == [], answer.text
    # The errors are there to read, only their secrets are gone.
    assert "refund refused" in body["failure"]["message"] and "[redacted]" in body["failure"]["message"]
    assert "rejected" in body["steps"][1]["last_error_message"]
    assert "'ref': '[redacted]'" in body["steps"][1]["last_error_message"]
    assert "'hook': '[redacted]'" in body["steps"][1]["last_error_message"]

    viewer = viewer_session(server.url)
    task_page = viewer.get(f"{server.url}/admin/tasks/task/{task_id}/change/", timeout=10)
    assert task_page.status_code == 200 and "leaky_reject" in task_page.text
    assert leaked(task_page.text, secrets) == []
    # The input, shown as indented JSON: the token's and the secret's places are marked.
    page_text = html.unescape(task_page.text)
    assert '"ref": "[redacted]"' in page_text and '"hook": "[redacted]"' in page_text
    item = DeadLetter.objects.get(task_id=task_id)
    item_page = viewer.get(f"{server.url}/admin/dlq/dlqitem/{item.pk}/change/", timeout=10)
    assert item_page.status_code == 200 and "rejected" in item_page.text
    assert leaked(item_page.text, secrets) == []

    with connection.cursor() as cursor:
        for table, sql in RAW_ROWS.items():
            cursor.execute(sql, [task_id])
            rows = [row[0] for row in cursor.fetchall()]
            assert rows or table == "tasks_sideeffect", table
            for row in rows:
                assert leaked(row, secrets) == [], f"{table}: {row}"
        cursor.execute("SELECT count(*) FROM tasks_stepattempt WHERE task_id = %s AND error_message <> ''", [task_id])
        assert cursor.fetchone()[0] == 3  # the transient try, the final error, the refused refund
