"""The submission API over real HTTP against a gunicorn server: concurrency, in-flight keys, fuzzing."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tasks.lifecycle.clients import api_client_create
from tasks.models import IdempotencyRecord, Task
from tests.support import ROOT, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

REPORT = {"pipeline": "report", "input": {"user_id": "alice", "topic": "sales"}}
TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}


@pytest.fixture
def token():
    return api_client_create(name="live-client")[1]


def auth(token: str, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if key:
        headers["Idempotency-Key"] = key
    return headers


def test_fifty_concurrent_requests_with_one_key_create_exactly_one_task(start_api_server, token):
    server = start_api_server()
    barrier = threading.Barrier(50)

    def submit(_):
        with requests.Session() as session:
            barrier.wait(timeout=30)
            return session.post(f"{server.url}/api/v1/tasks", json=REPORT, headers=auth(token, "burst-1"), timeout=60)

    with ThreadPoolExecutor(max_workers=50) as pool:
        responses = list(pool.map(submit, range(50)))
    statuses = [r.status_code for r in responses]
    assert statuses == [201] * 50, [(r.status_code, r.text[:200]) for r in responses if r.status_code != 201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert len({r.content for r in responses}) == 1  # replays are byte-identical
    assert sum(1 for r in responses if r.headers.get("Idempotent-Replayed") != "true") == 1
    assert Task.objects.count() == 1
    assert IdempotencyRecord.objects.get().replay_count == 49


def test_a_repeat_while_the_first_is_in_flight_is_409_then_replays(start_api_server, token):
    server = start_api_server(RELIABILITY_IDEMPOTENCY_WAIT_SECONDS=0.3)
    body = {"pipeline": "t_slow_input", "input": {"sleep": 3}}
    first: dict = {}

    def slow_first():
        first["response"] = requests.post(
            f"{server.url}/api/v1/tasks", json=body, headers=auth(token, "slow-1"), timeout=30
        )

    thread = threading.Thread(target=slow_first)
    thread.start()
    wait_for(lambda: IdempotencyRecord.objects.filter(key="slow-1").exists(), timeout=10, message="first in flight")
    second = requests.post(f"{server.url}/api/v1/tasks", json=body, headers=auth(token, "slow-1"), timeout=30)
    thread.join(timeout=30)
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "idempotency_key_in_use" and second.headers["Retry-After"] == "1"
    assert first["response"].status_code == 201
    third = requests.post(f"{server.url}/api/v1/tasks", json=body, headers=auth(token, "slow-1"), timeout=30)
    assert third.status_code == 201 and third.headers["Idempotent-Replayed"] == "true"
    assert third.content == first["response"].content
    assert Task.objects.count() == 1


def test_tasks_are_followed_to_a_terminal_state_over_http(start_api_server, start_workers, platform, token):
    platform.set_faults(insufficient_users=["broke"])
    server = start_api_server()
    pool = start_workers(2)
    ok = requests.post(f"{server.url}/api/v1/tasks", json=REPORT, headers=auth(token), timeout=10).json()
    bad_body = {"pipeline": "report", "input": {"user_id": "broke", "topic": "q3"}}
    bad = requests.post(f"{server.url}/api/v1/tasks", json=bad_body, headers=auth(token), timeout=10).json()

    def finished(task_id):
        def check():
            body = requests.get(f"{server.url}/api/v1/tasks/{task_id}", headers=auth(token), timeout=10).json()
            return body if body["state"] in TERMINAL else None

        return check

    done = wait_for(finished(ok["id"]), timeout=60, message="the good task")
    assert done["state"] == "succeeded", pool.logs()
    assert [s["state"] for s in done["steps"]] == ["succeeded"] * 4 and done["failure"] is None
    assert done["result"]["notification_id"] and done["current_step"] is None
    failed = wait_for(finished(bad["id"]), timeout=60, message="the 402 task")
    assert failed["state"] == "compensated"
    assert failed["failure"]["reason"] == "permanent_error" and failed["failure"]["code"] == "insufficient_quota"
    assert failed["steps"][0]["state"] == "failed" and failed["steps"][0]["last_error_code"] == "insufficient_quota"
    listed = requests.get(f"{server.url}/api/v1/tasks?state=compensated", headers=auth(token), timeout=10).json()
    assert [item["id"] for item in listed["items"]] == [bad["id"]]


def test_fuzzing_the_openapi_document_finds_no_500_and_no_schema_violation(start_api_server, token):
    # The fuzzer sends over-long query strings on purpose; lift gunicorn's own
    # request-line limit (an HTML 414 in front of the app) so they reach the API.
    server = start_api_server(extra_args=("--limit-request-line", "0"))
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(Path(__file__).with_name("schemathesis.toml")),
            "run",
            f"{server.url}/api/v1/openapi.json",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,"
            "response_schema_conformance,negative_data_rejection,ignored_auth",
            "--header",
            f"Authorization: Bearer {token}",
            "--max-examples",
            "60",
            "--seed",
            "20261129",
            "--no-color",
            "--request-timeout",
            "20",
            "--max-time",
            "60",
            "--phases",
            "examples,coverage,fuzzing",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (ROOT / "var" / "schemathesis.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "passed" in result.stdout.lower()
    assert time.monotonic() - started < 300
