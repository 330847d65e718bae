"""OpenTelemetry traces end to end (issue 24, point 1), with real processes and a real OTLP/HTTP receiver.

An in-test receiver takes the spans every process exports (``/v1/traces``, protobuf, decoded with
opentelemetry-proto). A client submits over the API with a ``traceparent``; the step calls an in-test HTTP
server whose first call hangs until the worker running it is SIGKILLed, and whose next two answer 503: the
task is run by two workers, and every span of it (the API's, each run and attempt, each outbound call) is in
the submitted trace; every ``traceparent`` the server received names the client span of the call, itself a
child of the attempt's span; each retry's attempt links to the failed one; the killed worker's spans are
missing (never exported), and no exported span has a parent outside the trace's exported spans.
"""

from __future__ import annotations

import http.server
import signal
import threading

import pytest
import requests

from tasks.lifecycle.clients import api_client_create
from tasks.models import Task
from tests.support import pid_of_owner, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it is sent, as plain dicts."""

    daemon_threads = True

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def of_trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [span for span in self.spans if span["trace_id"] == trace_id]


class _ReceiverHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "service": service,
                            "name": span.name,
                            "kind": span.kind,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "events": [event.name for event in span.events],
                        }
                    )
        with self.server.lock:
            self.server.spans.extend(spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _value(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


class Payments(http.server.ThreadingHTTPServer):
    """The far side: the first call hangs until released (its worker is killed meanwhile), the next two answer
    503, the rest 200. Each call's ``traceparent`` is kept."""

    daemon_threads = True

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.release = threading.Event()
        self.hanging = threading.Event()
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _PaymentsHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/pay"


class _PaymentsHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        server = self.server
        with server.lock:
            server.traceparents.append(self.headers.get("traceparent"))
            number = len(server.traceparents)
        if number == 1:
            server.hanging.set()
            server.release.wait(60)
            return
        status = 503 if number in (2, 3) else 200
        body = b'{"ok": true}' if status == 200 else b'{"error": "busy"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_one_trace_from_the_submission_through_a_killed_worker_retries_and_calls(
    start_workers, start_sweeper, start_api_server
):
    receiver, payments = Receiver(), Payments()
    tracing = {
        "RELIABILITY_TRACING": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    try:
        api = start_api_server(OTEL_SERVICE_NAME="rc-api", **tracing)
        pool = start_workers(2, OTEL_SERVICE_NAME="rc-worker", **tracing)
        start_sweeper()
        token = api_client_create(name="traced-client")[1]
        response = requests.post(
            f"{api.url}/api/v1/tasks",
            json={"pipeline": "t_traced", "input": {"url": payments.url}},
            headers={"Authorization": f"Bearer {token}", "traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"},
            timeout=30,
        )
        assert response.status_code == 201, response.text
        task_id = response.json()["id"]
        assert response.json()["trace_id"] == TRACE_ID

        # The first call hangs: kill the worker that runs it (mid-attempt), then let the server go on.
        assert payments.hanging.wait(30), pool.logs()
        running = wait_for(lambda: Task.objects.filter(pk=task_id, state="running").exclude(lease_owner="").first())
        victim = pool.by_pid(pid_of_owner(running.lease_owner))
        victim.kill(signal.SIGKILL)
        payments.release.set()

        def succeeded():
            found = Task.objects.get(pk=task_id)
            return found if found.state == "succeeded" else None

        task = wait_for(succeeded, timeout=90, message="the traced task to succeed")
        assert task.trace_context["traceparent"].split("-")[1] == TRACE_ID

        def exported():
            spans = receiver.of_trace(TRACE_ID)
            names = [span["name"] for span in spans]
            enough = names.count("step traced_call") >= 3 and "step traced_done" in names
            return spans if enough and sum(1 for s in spans if s["kind"] == 3) >= 3 else None  # 3: CLIENT

        spans = wait_for(exported, timeout=30, message="the spans to be exported")
    finally:
        payments.release.set()
        for server in (payments, receiver):
            server.shutdown()
            server.server_close()

    by_id = {span["span_id"]: span for span in spans}
    # Every span is in the submitted trace (of_trace asked for it) and none hangs outside it: each parent is
    # the client's span or an exported span of the trace.
    assert all(span["parent"] in by_id or span["parent"] == PARENT_SPAN for span in spans), spans
    [server] = [span for span in spans if span["service"] == "rc-api" and span["parent"] == PARENT_SPAN]
    runs = [span for span in spans if span["name"] == "run t_traced"]
    assert runs and all(run["parent"] == server["span_id"] for run in runs)
    attempts = sorted(
        (span for span in spans if span["name"] == "step traced_call"), key=lambda s: s["attributes"]["attempt"]
    )
    # The killed worker's attempt was never exported; the three that ended were, two 503s and the success.
    assert [(a["attributes"]["outcome"], a["attributes"].get("error.code")) for a in attempts] == [
        ("transient_error", "http_503"),
        ("transient_error", "http_503"),
        ("succeeded", None),
    ]
    assert all(by_id[a["parent"]]["name"] == "run t_traced" for a in attempts)
    assert all(a["attributes"]["task.id"] == task_id and "fencing_token" in a["attributes"] for a in attempts)
    # Each retry links to the failed attempt before it.
    assert attempts[1]["links"] == [(TRACE_ID, attempts[0]["span_id"])]
    assert attempts[2]["links"] == [(TRACE_ID, attempts[1]["span_id"])]
    # Every call the far side received carried a traceparent naming its client span, a child of its attempt.
    clients = {span["span_id"]: span for span in spans if span["kind"] == 3}
    received = [parent.split("-") for parent in payments.traceparents[1:]]
    assert [parts[1] for parts in received] == [TRACE_ID] * 3
    assert [clients[parts[2]]["parent"] for parts in received] == [a["span_id"] for a in attempts]
    # The sleep is an event of its run's span.
    assert any("wait" in run["events"] for run in runs)
