"""Every engine line about a task carries its context (issue 42, point 1), read from real processes' JSON output.

A task is submitted over the API (gunicorn) inside a caller's trace, fails its first attempt on a 503 and
succeeds on its second, on two workers with ``RELIABILITY_LOG_FORMAT=json`` and tracing on. Every line of the
API server and the workers that names the task, whoever wrote it and wherever (a claim, before any span; an
attempt, inside its span; an outcome; the step's own lines), carries its ``task_id``, ``pipeline``, the step's
name under ``step`` and its index under ``step_index``, ``attempt``, and the caller's ``trace_id``.
"""

from __future__ import annotations

import json

import pytest
import requests

from tasks.lifecycle.clients import api_client_create
from tasks.models import Task
from tests.acceptance.test_tracing_live import CALLER_SPAN, CALLER_TRACE, traced_env
from tests.support import wait_for
from tests.trace_servers import ScriptedServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

STEPS = {0: "traced_call", 1: "traced_done"}


@pytest.fixture
def remote():
    made = ScriptedServer([503])  # then 200: the first attempt fails transiently, the second succeeds
    yield made
    made.stop()


def json_lines(text: str) -> list[dict]:
    """The JSON objects among ``text``'s lines (gunicorn's own start lines are not the project's formatter's)."""
    parsed = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            parsed.append(value)
    return parsed


def test_every_line_naming_a_retried_traced_task_carries_its_pipeline_step_attempt_and_trace(
    start_api_server, start_workers, otlp_receiver, remote
):
    token = api_client_create(name="log-context")[1]
    api = start_api_server(RELIABILITY_LOG_FORMAT="json", **traced_env(otlp_receiver, "rc-api"))
    pool = start_workers(2, RELIABILITY_LOG_FORMAT="json", **traced_env(otlp_receiver, "rc-worker"))
    response = requests.post(
        f"{api.url}/api/v1/tasks",
        json={"pipeline": "t_traced_http", "input": {"url": remote.url}},
        headers={"Authorization": f"Bearer {token}", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    task_id = response.json()["id"]

    def succeeded():
        return Task.objects.filter(pk=task_id, state="succeeded").exists()

    try:
        wait_for(succeeded, timeout=60, message="the task to succeed")
    except AssertionError:
        print(pool.logs())
        raise
    # The last lines of the run are written just after its commit: wait until the second attempt's run said all.
    worker_text = lambda: "".join(worker.output() for worker in pool.workers)  # noqa: E731
    wait_for(lambda: worker_text().count('"task_claimed"') >= 2, timeout=10, message="both claims' lines")

    lines = json_lines(api.process.output()) + json_lines(worker_text())
    about_task = [line for line in lines if line.get("task_id") == task_id]
    events = [line.get("event") for line in about_task]
    # The lines on-call searches for are all there: the submission, both claims, the failure and its retry.
    for event in ("task_submitted", "task_claimed", "step_failed", "retry_scheduled"):
        assert event in events, (event, events)
    for line in about_task:
        what = line.get("event") or line.get("message")
        assert line["pipeline"] == "t_traced_http", (what, line)
        assert isinstance(line["step_index"], int) and line["step"] == STEPS[line["step_index"]], (what, line)
        assert isinstance(line["attempt"], int) and line["attempt"] >= 0, (what, line)
        assert line["trace_id"] == CALLER_TRACE, (what, line)

    # In the order they were written (the two workers' outputs are read one after the other).
    claims = sorted((line for line in about_task if line.get("event") == "task_claimed"), key=lambda line: line["time"])
    assert [(line["step"], line["step_index"], line["attempt"]) for line in claims] == [
        ("traced_call", 0, 1),
        ("traced_call", 0, 2),
    ]
    (failed,) = [line for line in about_task if line.get("event") == "step_failed"]
    assert (failed["step"], failed["step_index"], failed["attempt"], failed["transient"]) == ("traced_call", 0, 1, True)
    (retry,) = [line for line in about_task if line.get("event") == "retry_scheduled"]
    assert (retry["step"], retry["step_index"], retry["attempt"]) == ("traced_call", 0, 1)
    # Lines written inside an attempt (the HTTP client's, the step's) carry the attempt's own span too.
    inside = [line for line in about_task if "span_id" in line]
    assert inside and all(len(line["span_id"]) == 16 for line in inside)
