"""The example package as a new user installs it: a fresh venv, the project and ``examples/acme_pipelines``.

``pip install -e`` of both into a new virtual environment, then a real worker
and the API server started from it with ``RELIABILITY_PIPELINE_MODULES=
acme_pipelines.orders`` and ``ACME_API_URL`` pointing at a stand-in for Acme's
API on 127.0.0.1 that records every request. A task submitted over the API
runs to ``succeeded``; one whose order Acme refuses (409) is compensated, its
charge refunded under a key of its own. The test process itself never imports
the package: only the fresh environment knows the pipeline.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from devtools import postgres
from tasks.execution.context import effect_key
from tasks.lifecycle.clients import api_client_create
from tasks.models import SideEffect, Task
from tests.support import LOG_DIR, ROOT, ApiServer, ManagedProcess, process_env, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

EXAMPLE = ROOT / "examples" / "acme_pipelines"
PIP_TIMEOUT_SECONDS = 240  # each install; pytest-timeout (300 s) bounds the whole fixture
STEP_TIMEOUT_MS = 10_000  # the example's steps: timeout=10
COMPENSATION_TIMEOUT_MS = 30_000  # RELIABILITY_COMPENSATION_TIMEOUT_SECONDS (the example sets none of its own)
TERMINAL = {"succeeded", "failed", "compensated", "compensation_failed"}


@dataclass(frozen=True)
class AcmeRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict
    received_ms: int


class AcmeApi:
    """Plays Acme's API: payments, refunds and order confirmations; a repeated Idempotency-Key gets the first answer."""

    def __init__(self) -> None:
        self.requests: list[AcmeRequest] = []
        self.cancelled_orders: set[str] = set()  # their confirmation answers 409
        self._answers: dict[str, tuple[int, dict]] = {}
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {key.lower(): value for key, value in self.headers.items()}
                request = AcmeRequest("POST", self.path, headers, json.loads(raw or b"{}"), int(time.time() * 1000))
                status, body = api.answer(request)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, request: AcmeRequest) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(request)
            key = request.headers.get("idempotency-key")
            if key in self._answers:
                return self._answers[key]
            refund = re.fullmatch(r"/payments/([\w-]+)/refunds", request.path)
            confirmation = re.fullmatch(r"/orders/(\w+)/confirmation", request.path)
            if request.path == "/payments":
                answer = (201, {"payment_id": f"pay-{request.body['order_id']}"})
            elif refund:
                answer = (201, {"refund_id": f"ref-{refund[1]}"})
            elif confirmation and confirmation[1] in self.cancelled_orders:
                answer = (409, {"error": "the order was cancelled"})
            elif confirmation:
                answer = (200, {"status": "confirmed"})
            else:
                answer = (404, {"error": "no such path"})
            if key:
                self._answers[key] = answer
            return answer

    def calls(self, task_id: str) -> list[AcmeRequest]:
        with self._lock:
            return [r for r in self.requests if r.headers.get("x-task-id") == task_id]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> str:
    """A new virtual environment with the project and the example installed (editable); its python."""
    venv = tmp_path_factory.mktemp("fresh-venv") / "venv"
    log = LOG_DIR / "example-package-pip.log"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    with open(log, "w") as output:
        # The engine with the database driver this run's Django uses (the project depends on neither).
        for target in (f"{ROOT}[{postgres.EXTRA}]", str(EXAMPLE)):
            # pip's own cache (shared with every install on the machine) keeps both to about 20 s after a first run.
            result = subprocess.run(
                [*pip, "-e", target], stdout=output, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT_SECONDS
            )
            assert result.returncode == 0, f"pip install -e {target} failed, see {log}"
        output.write(f"fresh venv with both packages in {time.monotonic() - started:.1f} s\n")
    return python


@pytest.fixture
def acme():
    api = AcmeApi()
    yield api
    api.stop()


@pytest.fixture
def example_deployment(fresh_venv, acme, clean_redis):
    """A worker and the API server, both from the fresh venv, running Acme's pipeline; a client's token."""
    env = process_env(RELIABILITY_PIPELINE_MODULES="acme_pipelines.orders", ACME_API_URL=acme.url)
    env.pop("PYTHONPATH", None)  # the package must come from the venv's install, nothing else
    worker = ManagedProcess("acme-worker", [fresh_venv, str(ROOT / "manage.py"), "rqworker", "--with-scheduler"], env)
    server = ApiServer(env, python=fresh_venv)
    token = api_client_create(name="acme-shop")[1]
    try:
        yield server, {"Authorization": f"Bearer {token}"}
    finally:
        server.stop()
        worker.stop()


def submit(server: ApiServer, headers: dict, order: dict) -> requests.Response:
    return requests.post(
        f"{server.url}/api/v1/tasks", json={"pipeline": "acme_orders", "input": order}, headers=headers, timeout=30
    )


def settled(server: ApiServer, headers: dict, task_id: str) -> dict:
    def state():
        task = requests.get(f"{server.url}/api/v1/tasks/{task_id}", headers=headers, timeout=10).json()
        return task if task["state"] in TERMINAL else None

    return wait_for(state, timeout=60, interval=0.2, message=f"task {task_id} to finish")


def assert_engine_headers(call: AcmeRequest, task_id: str, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    assert call.headers["x-task-id"] == task_id
    deadline_ms = int(call.headers["x-request-deadline"])
    # The attempt's deadline: after the request arrived, at most the attempt's timeout after it.
    assert call.received_ms < deadline_ms <= call.received_ms + timeout_ms


def test_the_example_package_runs_in_a_fresh_venv_to_succeeded(example_deployment, acme):
    server, headers = example_deployment

    refused = submit(server, headers, {"order_id": "A-1", "amount_cents": 0, "currency": "XXX"})
    assert refused.status_code == 400
    assert set(refused.json()["error"]["details"]) == {"order_id", "amount_cents", "currency"}

    response = submit(server, headers, {"order_id": "A1001", "amount_cents": 4999, "currency": "EUR"})
    assert response.status_code == 201, response.text
    task_id = response.json()["id"]
    task = settled(server, headers, task_id)

    assert task["state"] == "succeeded", task
    assert task["result"] == {"order_id": "A1001", "status": "confirmed"}
    calls = acme.calls(task_id)
    assert [(c.method, c.path) for c in calls] == [("POST", "/payments"), ("POST", "/orders/A1001/confirmation")]
    for call in calls:
        assert_engine_headers(call, task_id)
    charge, confirm = calls
    generation = Task.objects.get(pk=task_id).generation
    assert charge.body == {"order_id": "A1001", "amount_cents": 4999, "currency": "EUR"}
    assert charge.headers["idempotency-key"] == effect_key(task_id, generation, "charge_payment", "charge")
    assert confirm.headers["idempotency-key"] == effect_key(task_id, generation, "confirm_order", "confirm")
    ledger = SideEffect.objects.filter(task_id=task_id).order_by("step_index")
    assert [(e.step_name, e.effect_name, e.effect_key) for e in ledger] == [
        ("charge_payment", "charge", charge.headers["idempotency-key"]),
        ("confirm_order", "confirm", confirm.headers["idempotency-key"]),
    ]


def test_an_order_acme_refuses_is_compensated_with_a_refund_under_its_own_key(example_deployment, acme):
    server, headers = example_deployment
    acme.cancelled_orders.add("B2002")

    response = submit(server, headers, {"order_id": "B2002", "amount_cents": 1250, "currency": "GBP"})
    assert response.status_code == 201, response.text
    task_id = response.json()["id"]
    task = settled(server, headers, task_id)

    assert task["state"] == "compensated", task
    calls = acme.calls(task_id)
    assert [(c.method, c.path) for c in calls] == [
        ("POST", "/payments"),
        ("POST", "/orders/B2002/confirmation"),  # 409: permanent, not retried
        ("POST", "/payments/pay-B2002/refunds"),
    ]
    charge, confirm, refund = calls
    for call in (charge, confirm):
        assert_engine_headers(call, task_id)
    assert_engine_headers(refund, task_id, COMPENSATION_TIMEOUT_MS)
    keys = [call.headers["idempotency-key"] for call in calls]
    generation = Task.objects.get(pk=task_id).generation
    assert keys[2] == effect_key(task_id, generation, "charge_payment", "refund")
    assert len(set(keys)) == 3
