"""Each attempt's own log, end to end in one process (issue 24, point 3): the runner stores what a step logged
with its attempt row, in the step's one statement; the task page, the DLQ item page and the API show it,
redacted; two tasks run on two threads of one process keep only their own lines; a purge takes them along.
"""

from __future__ import annotations

import html
import logging
import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tasks import Pipeline, registry
from tasks.execution.runner import task_run
from tasks.lifecycle.clients import api_client_create
from tasks.models import ApiClient, AttemptOutcome, DeadLetter, StepAttempt, Task, TaskState
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY = "k_9f8e7d6c5b4a39281706"  # no known shape: only its input key says it is a secret
BEARER = "sk_live_51HxQ2eLkdJ8sT0pB3vR7nYc"  # under "note": only its shape says it is a secret
LEAKY = {"label": "leaky", "leak": True, "api_key": API_KEY, "note": BEARER, "fail": True}


@pytest.fixture(autouse=True)
def _redis(clean_redis):
    return clean_redis


@pytest.fixture
def staff_client():
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-for-tests-only"))
    return client


@pytest.fixture
def api():
    name, token = "client-logs", api_client_create(name="client-logs")[1]
    return ApiClient.objects.get(name=name), token


def ran(input: dict) -> Task:
    task = task_submit(pipeline="t_logging", input=input)
    task_run(task_id=str(task.pk), worker="w1")
    return Task.objects.get(pk=task.pk)


def page_text(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def test_a_steps_lines_are_stored_with_their_attempt_in_the_steps_one_statement():
    task = task_submit(pipeline="t_logging", input={"label": "once"})
    with CaptureQueriesContext(connection) as queries:
        assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    attempt = StepAttempt.objects.get(task=task)
    assert [(line["logger"], line["message"]) for line in attempt.log] == [
        ("tests.pipelines.logging", "module logger says once in attempt 1"),
        ("reliability.step", "ctx.log says once in attempt 1"),
    ]
    assert attempt.log_dropped == 0
    # The claim and the step's write (each prepared once per connection): the attempt's log added no statement.
    executed = [query["sql"] for query in queries if not query["sql"].startswith("PREPARE")]
    assert len(executed) == 2 and "ctx.log says once in attempt 1" in executed[1], executed


def test_the_task_page_and_the_api_show_each_attempts_lines_under_it(staff_client, api, client):
    api_client, token = api
    task = task_submit(pipeline="t_logging", input={"label": "twice", "retry_once": True}, client=api_client)
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.RETRY_SCHEDULED
    assert task_run(task_id=str(task.pk), worker="w1") == TaskState.SUCCEEDED
    first, second = StepAttempt.objects.filter(task=task).order_by("attempt")
    assert (first.outcome, second.outcome) == (AttemptOutcome.TRANSIENT_ERROR, AttemptOutcome.SUCCEEDED)

    page = page_text(staff_client, f"/admin/tasks/task/{task.pk}/change/")
    for attempt in (first, second):
        start = page.index(f'id="rc-attempt-log-{attempt.pk}"')
        block = page[start : page.index("</tr>", start)]
        number = attempt.attempt
        assert f"module logger says twice in attempt {number}" in block
        assert f"INFO reliability.step ctx.log says twice in attempt {number}" in block
        assert f"attempt {3 - number}" not in block  # the other attempt's lines are under the other one
        assert f"Log of log_lines, attempt {number}: 2 lines" in block

    body = client.get(f"/api/v1/tasks/{task.pk}?logs=true", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    logs = body["steps"][0]["attempt_logs"]
    assert [(log["kind"], log["attempt"], log["outcome"], log["log_dropped"]) for log in logs] == [
        ("step", 1, "transient_error", 0),
        ("step", 2, "succeeded", 0),
    ]
    assert [line["message"] for line in logs[1]["log"]] == [
        "module logger says twice in attempt 2",
        "ctx.log says twice in attempt 2",
    ]
    assert set(logs[0]["log"][0]) == {"at", "level", "logger", "message"}


def test_a_logged_secret_is_redacted_on_the_pages_in_the_api_and_in_the_database(staff_client, api, client):
    api_client, token = api
    task = task_submit(pipeline="t_logging", input=LEAKY, client=api_client)
    task_run(task_id=str(task.pk), worker="w1")
    task = Task.objects.get(pk=task.pk)
    assert task.state == TaskState.FAILED
    item = DeadLetter.objects.get(task=task)

    task_page = page_text(staff_client, f"/admin/tasks/task/{task.pk}/change/")
    item_page = page_text(staff_client, f"/admin/dlq/dlqitem/{item.pk}/change/")
    api_body = client.get(f"/api/v1/tasks/{task.pk}?logs=true", HTTP_AUTHORIZATION=f"Bearer {token}").content.decode()
    stored = str(StepAttempt.objects.get(task=task).log)
    for where, text in (("task page", task_page), ("item page", item_page), ("API", api_body), ("row", stored)):
        assert API_KEY not in text and BEARER not in text, where
        assert "calling the far side with api_key=[redacted]" in text, where
    # The DLQ item shows the failing attempt's lines, its error line too.
    log_block = item_page[item_page.index('id="failing-attempt-log"') :]
    assert "Step log_lines, attempt 1: permanent error" in log_block
    assert "ERROR tests.pipelines.logging leaky gives up" in log_block
    assert "ctx.log says leaky in attempt 1" in log_block


def test_ten_thousand_lines_keep_200_and_the_page_says_how_many_were_not_kept(staff_client):
    task = ran({"label": "loud", "lines": 10_000})
    attempt = StepAttempt.objects.get(task=task)
    assert len(attempt.log) == 200 and attempt.log_dropped == 10_002 - 200
    page = page_text(staff_client, f"/admin/tasks/task/{task.pk}/change/")
    assert "9802 more lines not kept (the attempt's log limits)." in page


def test_two_tasks_on_two_threads_of_one_process_keep_only_their_own_lines(staff_client):
    # Both steps are inside their attempts at once, each logging while the other does.
    both_inside = threading.Barrier(2, timeout=20)
    shared = logging.getLogger("tests.shared_module")

    def talk(ctx):
        for number in range(20):
            shared.info("%s line %d", ctx.input["label"], number)
            if number == 5:
                both_inside.wait()
        ctx.log.info("%s done", ctx.input["label"])
        return {}

    pipeline = Pipeline("t_logging_threads", register=True)
    pipeline.step(talk, name="talk")
    try:
        tasks = {label: task_submit(pipeline="t_logging_threads", input={"label": label}) for label in ("red", "blue")}
        states = {}

        def run(label: str) -> None:
            try:
                states[label] = task_run(task_id=str(tasks[label].pk), worker=f"w-{label}")
            finally:
                connection.close()

        threads = [threading.Thread(target=run, args=(label,)) for label in tasks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert states == {"red": TaskState.SUCCEEDED, "blue": TaskState.SUCCEEDED}
        for label, task in tasks.items():
            other = "blue" if label == "red" else "red"
            messages = [line["message"] for line in StepAttempt.objects.get(task=task).log]
            assert len(messages) == 21 and all(message.startswith(label) for message in messages)
            page = page_text(staff_client, f"/admin/tasks/task/{task.pk}/change/")
            assert f"{label} line 19" in page and f"{other} line" not in page
    finally:
        registry.unregister("t_logging_threads")


def test_the_api_shows_the_logs_only_when_asked_and_a_bad_logs_value_is_a_400(api):
    api_client, token = api
    task = task_submit(pipeline="t_logging", input={"label": "plain"}, client=api_client)
    task_run(task_id=str(task.pk), worker="w1")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    plain = client.get(f"/api/v1/tasks/{task.pk}").json()
    assert all(step["attempt_logs"] is None for step in plain["steps"])  # as a completion callback's body
    asked = client.get(f"/api/v1/tasks/{task.pk}?logs=true").json()
    assert [[line["message"] for line in step["attempt_logs"][0]["log"]] for step in asked["steps"]] == [
        ["module logger says plain in attempt 1", "ctx.log says plain in attempt 1"]
    ]
    bad = client.get(f"/api/v1/tasks/{task.pk}?logs=maybe")
    assert bad.status_code == 400 and "logs" in bad.content.decode()
