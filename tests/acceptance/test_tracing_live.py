"""One trace from the API request through retries, a worker SIGKILLed mid-attempt and every outbound call
(issue 24, point 1), across real processes: gunicorn and two workers export over OTLP/HTTP to a receiver in this
test (``tests.trace_servers.OtlpReceiver``, decoding with ``opentelemetry.proto``); the remote API answers
503, 503, then hangs the third call until its worker is killed, then 200.

What a SIGKILL loses: the spans the killed worker had not ended (its run, the attempt and the call in flight)
are never exported. The spans of the attempts before and after still parent correctly (no orphan), the next
attempt links to the last failed attempt whose span was recorded, and the far side's third call names a parent
span that no exporter sent.
"""

from __future__ import annotations

import signal

import pytest
import requests

from tasks.lifecycle.clients import api_client_create
from tasks.models import AttemptOutcome, StepAttempt, Task
from tests.support import pid_of_owner, wait_for
from tests.trace_servers import OtlpReceiver, ScriptedServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"


@pytest.fixture
def remote():
    made = ScriptedServer([503, 503, "hang"])
    yield made
    made.stop()


def traced_env(otlp_receiver: OtlpReceiver, service: str) -> dict[str, str]:
    return {
        "RELIABILITY_TRACING": "1",
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: spans leave a process a tenth of a second after they end
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    }


def traceparent_parts(traceparent: str) -> tuple[str, str]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


def test_an_api_submission_is_one_trace_through_retries_a_killed_worker_and_every_call(
    start_api_server, start_workers, start_sweeper, otlp_receiver, remote
):
    token = api_client_create(name="traced-client")[1]
    api = start_api_server(**traced_env(otlp_receiver, "rc-api"))
    pool = start_workers(2, **traced_env(otlp_receiver, "rc-worker"))
    start_sweeper()

    response = requests.post(
        f"{api.url}/api/v1/tasks",
        json={"pipeline": "t_traced_http", "input": {"url": remote.url}},
        headers={"Authorization": f"Bearer {token}", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    assert response.json()["trace_id"] == CALLER_TRACE
    task_id = response.json()["id"]

    def exported_attempt(number: int):
        return next(
            (s for s in otlp_receiver.received() if s.name == "step traced_call" and s.attributes["attempt"] == number),
            None,
        )

    # The third call hangs at the far side; the first two attempts' spans have reached the receiver meanwhile.
    wait_for(lambda: len(remote.received()) == 3, timeout=60, message="the third call to hang")
    wait_for(lambda: exported_attempt(2), timeout=30, message="the second attempt's span")
    victim_pid = int(remote.received()[2].headers["x-worker-pid"])
    victim = pool.by_pid(victim_pid)
    assert victim is not None
    victim.kill(signal.SIGKILL)
    remote.release()

    def succeeded():
        task = Task.objects.get(pk=task_id)
        return task if task.state == "succeeded" else None

    try:
        wait_for(succeeded, timeout=90, message="the task to succeed")
    except AssertionError:
        print(pool.logs())
        raise
    wait_for(lambda: exported_attempt(4) and any(s.name == "step traced_done" for s in otlp_receiver.received()), 30)
    spans = otlp_receiver.received()
    by_id = {span.span_id: span for span in spans}

    # One trace: the caller's.
    assert {span.trace_id for span in spans} == {CALLER_TRACE}
    (server,) = [span for span in spans if span.kind == "server"]
    assert (server.service, server.name, server.parent_span_id) == ("rc-api", "POST /api/v1/tasks", CALLER_SPAN)
    # No orphan: every span's parent is the caller's span or a span the processes exported.
    assert all(span.parent_span_id in by_id for span in spans if span is not server)

    # The attempts that ended (1, 2 before the kill, 4 after): each under a run that is a child of the request.
    attempts = sorted((s for s in spans if s.name == "step traced_call"), key=lambda s: s.attributes["attempt"])
    assert [a.attributes["attempt"] for a in attempts] == [1, 2, 4]
    assert [a.attributes["outcome"] for a in attempts] == ["transient_error", "transient_error", "succeeded"]
    runs = [by_id[a.parent_span_id] for a in attempts]
    assert all(run.name == "run t_traced_http" and run.parent_span_id == server.span_id for run in runs)
    assert all(span.service == "rc-worker" for span in [*attempts, *runs])
    # The killed attempt (3) left its row (crashed) but no span: its run never ended in a process that lived.
    outcomes = StepAttempt.objects.filter(task_id=task_id, step_name="traced_call").order_by("attempt")
    assert list(outcomes.values_list("attempt", "outcome")) == [
        (1, AttemptOutcome.TRANSIENT_ERROR),
        (2, AttemptOutcome.TRANSIENT_ERROR),
        (3, AttemptOutcome.CRASHED),
        (4, AttemptOutcome.SUCCEEDED),
    ]
    assert pid_of_owner(outcomes.get(attempt=3).worker) == victim_pid
    assert not [span for span in spans if span.attributes.get("attempt") == 3]

    # Linked in order: 2 retries 1; 4, after the crash, links to the last failed attempt that was recorded (2).
    assert attempts[0].links == ()
    assert [(trace, span) for trace, span, _ in attempts[1].links] == [(CALLER_TRACE, attempts[0].span_id)]
    assert [(span, attributes["attempt"]) for _, span, attributes in attempts[2].links] == [(attempts[1].span_id, 2)]

    # Every call carried the trace; its parent is the client span of the attempt that made it.
    clients = {span.parent_span_id: span for span in spans if span.kind == "client"}
    assert sorted(clients) == sorted(a.span_id for a in attempts)
    calls = remote.received()
    assert len(calls) == 4 and [call.answered for call in calls] == [503, 503, 503, 200]
    parents = [traceparent_parts(call.headers["traceparent"]) for call in calls]
    assert {trace for trace, _ in parents} == {CALLER_TRACE}
    for call_index, attempt in ((0, attempts[0]), (1, attempts[1]), (3, attempts[2])):
        client = clients[attempt.span_id]
        assert parents[call_index][1] == client.span_id
        assert (client.name, client.attributes["http.response.status_code"]) == ("GET", calls[call_index].answered)
    # The killed call's parent span was never exported: the far side's only trace of attempt 3.
    assert parents[2][1] not in by_id
    assert int(calls[3].headers["x-worker-pid"]) != victim_pid
