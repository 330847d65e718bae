"""Correlated logs and each attempt's own log, with real worker processes (issue 24, points 2 and 3).

Two workers with ``RELIABILITY_LOG_FORMAT=json`` run tasks whose step logs through its module's logger and
``ctx.log``: every line a worker writes is a JSON object, and each line written during an attempt carries the
attempt's task_id, pipeline, step and attempt. What each step logged is on its task's page under its attempt,
in the API and (for a failed task) on the DLQ item's page, redacted, and nowhere for the other task.
"""

from __future__ import annotations

import html
import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tasks.lifecycle.clients import api_client_create
from tasks.models import ApiClient, DeadLetter, StepAttempt, Task
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}
API_KEY = "k_9f8e7d6c5b4a39281706"
BEARER = "sk_live_51HxQ2eLkdJ8sT0pB3vR7nYc"
STEP_LOGGERS = ("tests.pipelines.logging", "reliability.step")


def finished(task: Task, pool) -> Task:
    def done():
        current = Task.objects.get(pk=task.pk)
        return current if current.state in TERMINAL else None

    try:
        return wait_for(done, timeout=60, message=f"task {task.pk} to finish")
    except AssertionError:
        print(pool.logs())
        raise


def json_lines(pool) -> list[dict]:
    """Every line the workers wrote, each parsed (a line that is not JSON fails here, naming it)."""
    parsed = []
    for worker in pool.workers:
        for line in worker.output().splitlines():
            if line.strip():
                try:
                    parsed.append(json.loads(line))
                except ValueError:
                    pytest.fail(f"not a JSON line in {worker.log_path.name}: {line[:300]!r}")
    return parsed


def test_json_lines_carry_the_attempts_fields_and_each_attempt_keeps_its_own_lines(start_workers):
    pool = start_workers(2, RELIABILITY_LOG_FORMAT="json")
    token = api_client_create(name="live-logs")[1]
    api_client = ApiClient.objects.get(name="live-logs")
    # Submitted together: the two workers run them at once.
    retried = task_submit(
        pipeline="t_logging", input={"label": "amber", "retry_once": True, "lines": 300}, client=api_client
    )
    leaky = task_submit(
        pipeline="t_logging",
        input={"label": "violet", "leak": True, "api_key": API_KEY, "note": BEARER, "fail": True},
        client=api_client,
    )
    retried, leaky = finished(retried, pool), finished(leaky, pool)
    assert (retried.state, leaky.state) == ("succeeded", "failed"), pool.logs()

    # Every line of the workers is JSON; each line a step wrote names its task, pipeline, step and attempt.
    lines = json_lines(pool)
    steps_lines = [line for line in lines if line.get("logger") in STEP_LOGGERS]
    assert len(steps_lines) == 2 * 302 + 5, [line.get("message") for line in steps_lines][:10]
    for line in steps_lines:
        label = "amber" if "amber" in line["message"] else "violet"
        task = retried if label == "amber" else leaky
        assert (line["task_id"], line["pipeline"], line["step"]) == (str(task.pk), "t_logging", "log_lines"), line
        assert line["attempt"] in (1, 2) and {"time", "level"} <= set(line)
    assert {line["attempt"] for line in steps_lines if "amber" in line["message"]} == {1, 2}
    # The secrets the leaky step logged are redacted in the workers' own output too, whoever logged them.
    output = "".join(worker.output() for worker in pool.workers)
    assert API_KEY not in output and BEARER not in output
    assert any("api_key=[redacted]" in line["message"] for line in steps_lines)
    # Lines outside any attempt (the worker's start, RQ's job lines) are JSON too, without an attempt's fields.
    assert any(line.get("logger", "").startswith("rq.") and "attempt" not in line for line in lines)

    # Each attempt kept its own first lines, the rest counted.
    first, second = StepAttempt.objects.filter(task=retried).order_by("attempt")
    assert len(first.log) == len(second.log) == 200 and first.log_dropped == second.log_dropped == 302 - 200
    assert first.log[1]["message"] == "ctx.log says amber in attempt 1"
    assert second.log[1]["message"] == "ctx.log says amber in attempt 2"

    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser("root", password="pw-for-tests-only"))
    amber_page = html.unescape(staff.get(f"/admin/tasks/task/{retried.pk}/change/").content.decode())
    violet_page = html.unescape(staff.get(f"/admin/tasks/task/{leaky.pk}/change/").content.decode())
    for number in (1, 2):
        assert f"INFO reliability.step ctx.log says amber in attempt {number}" in amber_page
        assert f"INFO tests.pipelines.logging module logger says amber in attempt {number}" in amber_page
    assert "102 more lines not kept" in amber_page and "violet" not in amber_page
    assert "ctx.log says violet in attempt 1" in violet_page and "amber" not in violet_page

    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = api.get(f"/api/v1/tasks/{retried.pk}?logs=true").json()
    logs = body["steps"][0]["attempt_logs"]
    assert [(log["attempt"], len(log["log"]), log["log_dropped"]) for log in logs] == [(1, 200, 102), (2, 200, 102)]
    assert logs[0]["log"][0]["message"] == "module logger says amber in attempt 1"

    # The secrets the leaky step logged are redacted everywhere; its DLQ item shows the failing attempt's lines.
    item = DeadLetter.objects.get(task=leaky)
    item_page = html.unescape(staff.get(f"/admin/dlq/dlqitem/{item.pk}/change/").content.decode())
    leaky_api = api.get(f"/api/v1/tasks/{leaky.pk}?logs=true").content.decode()
    for where, text in (("task page", violet_page), ("item page", item_page), ("API", leaky_api)):
        assert API_KEY not in text and BEARER not in text, where
        assert "calling the far side with api_key=[redacted]" in text, where
    failing = item_page[item_page.index('id="failing-attempt-log"') :]
    assert "ERROR tests.pipelines.logging violet gives up" in failing
