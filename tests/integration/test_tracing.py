"""Traces (issue 24, point 1), in-process: what a submission stores, and the spans of runs, attempts and calls.

The spans go to the SDK's in-memory exporter of a provider made for each test (``tasks.observability.tracing.active``
set to it, as ``tracing_configure`` sets it at start-up); the remote API is a real HTTP server on 127.0.0.1.
``tests/acceptance/test_tracing_live.py`` does the same across real processes with an OTLP receiver.
"""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.urls import reverse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id

from tasks.execution.runner import task_run
from tasks.lifecycle.operator import task_retry_from_checkpoint
from tasks.models import Task
from tasks.observability import tracing
from tasks.observability.otel import OtelTracing
from tasks.submission.submit import task_submit
from tests.trace_servers import ScriptedServer

pytestmark = pytest.mark.django_db(transaction=True)

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.fixture
def traced(monkeypatch):
    """Tracing on in this process, its spans kept in memory: ``.spans()`` and ``.tracer`` (a caller's own)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "active", OtelTracing(provider))
    yield SimpleNamespace(spans=exporter.get_finished_spans, tracer=provider.get_tracer("caller"))
    provider.shutdown()


@pytest.fixture
def remote():
    servers = []

    def start(script):
        server = ScriptedServer(script)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def ids(span_context) -> tuple[str, str]:
    return format_trace_id(span_context.trace_id), format_span_id(span_context.span_id)


def parent_of(span) -> str:
    return format_span_id(span.parent.span_id) if span.parent else ""


def traceparent_parts(traceparent: str) -> tuple[str, str]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


def run_to_the_end(task_id: str) -> str:
    # A retry is due 0.2-0.3 s later; a run that comes early waits for it (at most 5 s).
    for _ in range(10):
        outcome = task_run(task_id=task_id, worker="w1")
        if outcome not in ("retry_scheduled", "running", "queued"):
            return outcome
    raise AssertionError("the task did not finish in 10 runs")


def api_post(client, token, path, body, **headers):
    return client.post(
        path, json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}", **headers
    )


# --- what a submission stores --------------------------------------------------------------------------------


def test_with_tracing_off_a_task_stores_no_context_and_the_api_shows_no_trace(client, token, clean_redis):
    assert tracing.active is None
    response = api_post(
        client, token, "/api/v1/tasks", {"pipeline": "t_local", "input": {}}, HTTP_TRACEPARENT=CALLER_TRACEPARENT
    )
    assert response.status_code == 201, response.content
    assert response.json()["trace_id"] is None
    assert Task.objects.get(pk=response.json()["id"]).trace_context is None


def test_a_python_submission_inside_a_span_stores_that_span(traced, clean_redis):
    with traced.tracer.start_as_current_span("caller") as span:
        task = task_submit(pipeline="t_local", input={})
    stored = Task.objects.get(pk=task.pk)
    assert traceparent_parts(stored.trace_context["traceparent"]) == ids(span.get_span_context())
    assert stored.trace_id == ids(span.get_span_context())[0]
    # Nothing more than the caller's span: the submission made none of its own.
    assert [s.name for s in traced.spans()] == ["caller"]


def test_a_python_submission_outside_any_span_starts_the_tasks_trace(traced, clean_redis):
    task = task_submit(pipeline="t_local", input={})
    (submit,) = traced.spans()
    assert (submit.name, submit.kind, submit.parent) == ("submit t_local", SpanKind.PRODUCER, None)
    assert traceparent_parts(Task.objects.get(pk=task.pk).trace_context["traceparent"]) == ids(submit.context)


def test_an_api_submission_continues_the_callers_traceparent(traced, client, token, clean_redis):
    response = api_post(
        client, token, "/api/v1/tasks", {"pipeline": "t_local", "input": {}}, HTTP_TRACEPARENT=CALLER_TRACEPARENT
    )
    assert response.status_code == 201, response.content
    (server,) = traced.spans()
    assert (server.name, server.kind) == ("POST /api/v1/tasks", SpanKind.SERVER)
    assert format_trace_id(server.context.trace_id) == CALLER_TRACE and parent_of(server) == CALLER_SPAN
    assert server.attributes["http.response.status_code"] == 201
    assert server.attributes["http.route"] == "/api/v1/tasks"
    task = Task.objects.get(pk=response.json()["id"])
    # The task's runs will be children of the request's span, in the caller's trace.
    assert traceparent_parts(task.trace_context["traceparent"]) == ids(server.context)
    assert response.json()["trace_id"] == CALLER_TRACE
    assert client.get(f"/api/v1/tasks/{task.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()["trace_id"] == (
        CALLER_TRACE
    )


def test_an_api_submission_without_traceparent_starts_a_trace(traced, client, token, clean_redis):
    response = api_post(client, token, "/api/v1/tasks", {"pipeline": "t_local", "input": {}})
    assert response.status_code == 201, response.content
    (server,) = traced.spans()
    assert server.parent is None and server.kind == SpanKind.SERVER
    assert response.json()["trace_id"] == format_trace_id(server.context.trace_id)


def test_a_batchs_tasks_continue_the_callers_traceparent(traced, client, token, clean_redis):
    items = [{"pipeline": "t_local", "input": {}}, {"pipeline": "t_local", "input": {"n": 2}}]
    response = api_post(client, token, "/api/v1/tasks/batch", {"items": items}, HTTP_TRACEPARENT=CALLER_TRACEPARENT)
    assert response.status_code == 200, response.content
    (server,) = traced.spans()
    assert server.name == "POST /api/v1/tasks/batch" and parent_of(server) == CALLER_SPAN
    task_ids = [item["task"]["id"] for item in response.json()["items"]]
    contexts = [Task.objects.get(pk=task_id).trace_context["traceparent"] for task_id in task_ids]
    assert [traceparent_parts(context) for context in contexts] == [ids(server.context)] * 2


def test_a_refused_submission_is_an_error_free_server_span_with_its_status(traced, client, token, clean_redis):
    response = api_post(client, token, "/api/v1/tasks", {"pipeline": "no_such", "input": {}})
    assert response.status_code >= 400
    (server,) = traced.spans()
    # A 4xx is the caller's mistake, not the server's error (semantic conventions of a server span).
    assert server.attributes["http.response.status_code"] == response.status_code
    assert not server.status.status_code.name == "ERROR"


# --- runs, attempts, calls -------------------------------------------------------------------------------------


def test_runs_attempts_and_calls_belong_to_the_submitters_trace_and_each_retry_links_to_the_failed_attempt(
    traced, remote, clean_redis
):
    server = remote([503, 503])
    with traced.tracer.start_as_current_span("caller") as caller:
        task = task_submit(pipeline="t_traced_http", input={"url": server.url})
    assert run_to_the_end(str(task.pk)) == "succeeded"
    spans = traced.spans()
    trace_id, caller_span = ids(caller.get_span_context())
    assert {format_trace_id(span.context.trace_id) for span in spans} == {trace_id}

    runs = [span for span in spans if span.name == "run t_traced_http"]
    assert len(runs) == 3 and all(span.kind == SpanKind.CONSUMER and parent_of(span) == caller_span for span in runs)
    assert [run.attributes["outcome"] for run in runs] == ["retry_scheduled", "retry_scheduled", "succeeded"]
    assert [run.attributes["fencing_token"] for run in runs] == [1, 2, 3]
    by_id = {format_span_id(span.context.span_id): span for span in spans}

    attempts = sorted((s for s in spans if s.name == "step traced_call"), key=lambda s: s.attributes["attempt"])
    assert [a.attributes["attempt"] for a in attempts] == [1, 2, 3]
    assert [a.attributes["outcome"] for a in attempts] == ["transient_error", "transient_error", "succeeded"]
    assert [a.attributes.get("error.code") for a in attempts] == ["http_503", "http_503", None]
    for attempt in attempts:
        run = by_id[parent_of(attempt)]
        assert (
            run.name == "run t_traced_http" and run.attributes["fencing_token"] == attempt.attributes["fencing_token"]
        )
        assert attempt.attributes["task.id"] == str(task.pk) and attempt.attributes["step"] == "traced_call"
    # Each retry, in a later run, links to the attempt it retries.
    assert attempts[0].links == ()
    for earlier, later in itertools.pairwise(attempts):
        (link,) = later.links
        assert ids(link.context) == ids(earlier.context)
        assert dict(link.attributes) == {"link.reason": "retry_of", "attempt": earlier.attributes["attempt"]}
    (done,) = [span for span in spans if span.name == "step traced_done"]
    assert parent_of(done) == format_span_id(runs[2].context.span_id) and done.links == ()

    clients = [span for span in spans if span.kind == SpanKind.CLIENT]
    assert [span.name for span in clients] == ["GET"] * 3
    assert [parent_of(span) for span in clients] == [format_span_id(a.context.span_id) for a in attempts]
    assert [span.attributes["http.response.status_code"] for span in clients] == [503, 503, 200]
    assert [span.attributes.get("error.type") for span in clients] == ["503", "503", None]
    first = clients[0].attributes
    assert (first["http.request.method"], first["server.address"], first["server.port"]) == (
        "GET",
        "127.0.0.1",
        server.port,
    )
    # The URL as a span shows it: the secret query value is not in it.
    assert first["url.full"].startswith(f"http://127.0.0.1:{server.port}/v1/payments/p-1?api_key=")
    assert "not-for-traces" not in first["url.full"]

    # The far side got the client span's context on every call.
    calls = server.received()
    assert [call.answered for call in calls] == [503, 503, 200]
    assert [traceparent_parts(call.headers["traceparent"]) for call in calls] == [ids(s.context) for s in clients]
    # The row keeps the last failed attempt (a later run's retry links to it) besides the submitter's context.
    stored = Task.objects.get(pk=task.pk).trace_context
    assert traceparent_parts(stored["traceparent"]) == (trace_id, caller_span)
    assert (stored["retry_of"]["step"], stored["retry_of"]["generation"], stored["retry_of"]["attempt"]) == (
        "traced_call",
        0,
        2,
    )
    assert traceparent_parts(stored["retry_of"]["traceparent"]) == ids(attempts[1].context)


def test_an_operators_retry_from_the_checkpoint_links_to_the_attempt_that_failed(traced, clean_redis):
    task = task_submit(pipeline="t_parked", input={"fail": True})
    assert run_to_the_end(str(task.pk)) == "failed"
    task_retry_from_checkpoint(task_id=task.pk)
    assert run_to_the_end(str(task.pk)) == "failed"
    finishes = [span for span in traced.spans() if span.name == "step parked_finish"]
    # Each run's attempt 1 (an operator's retry counts the step's attempts again); the second links to the first.
    assert [span.attributes["attempt"] for span in finishes] == [1, 1]
    (link,) = finishes[1].links
    assert ids(link.context) == ids(finishes[0].context)
    runs = [span for span in traced.spans() if span.name == "run t_parked"]
    assert len({span.context.trace_id for span in runs}) == 1 and runs[0].parent == runs[1].parent


def test_a_task_submitted_untraced_keeps_one_trace_across_its_runs(remote, clean_redis, monkeypatch):
    server = remote([503])
    task = task_submit(pipeline="t_traced_http", input={"url": server.url})
    assert task.trace_context is None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "active", OtelTracing(provider))
    assert run_to_the_end(str(task.pk)) == "succeeded"
    runs = [span for span in exporter.get_finished_spans() if span.name.startswith("run ")]
    # The first run began the trace (a root); the retry's write kept it, and the second run is its child.
    assert runs[0].parent is None and parent_of(runs[1]) == format_span_id(runs[0].context.span_id)
    assert len({span.context.trace_id for span in exporter.get_finished_spans()}) == 1


def test_compensation_attempts_are_spans_of_the_run_that_compensates(traced, clean_redis):
    task = task_submit(pipeline="t_local", input={"fail_b": "permanent"})
    assert run_to_the_end(str(task.pk)) == "compensated"
    spans = traced.spans()
    (run,) = [span for span in spans if span.name == "run t_local"]
    kinds = [(span.name, span.attributes["outcome"]) for span in spans if "attempt" in span.attributes]
    assert ("step local_b", "permanent_error") in kinds and ("compensation local_a", "succeeded") in kinds
    compensation = next(span for span in spans if span.name == "compensation local_a")
    assert parent_of(compensation) == format_span_id(run.context.span_id)
    assert compensation.attributes["attempt.kind"] == "compensation"
    assert run.attributes["outcome"] == "compensated"


def test_a_sleep_is_an_event_of_its_attempts_span(traced, clean_redis):
    task = task_submit(pipeline="t_sleep_seconds", input={})
    assert task_run(task_id=str(task.pk), worker="w1") == "waiting"
    (sleep,) = [span for span in traced.spans() if span.name.startswith("step ") and span.events]
    (event,) = sleep.events
    assert event.name == "wait.begun" and event.attributes["wait.kind"] == "sleep"
    assert event.attributes["wait.until"] == Task.objects.get(pk=task.pk).wait_until.isoformat()


# --- the console's link ---------------------------------------------------------------------------------------


@pytest.fixture
def superuser_client(client, db):
    client.force_login(get_user_model().objects.create_superuser("root-t", password="pw-for-tests-only"))
    return client


def test_the_task_page_links_to_the_trace_when_the_setting_names_a_ui(traced, superuser_client, clean_redis):
    with traced.tracer.start_as_current_span("caller") as span:
        task = task_submit(pipeline="t_local", input={})
    trace_id = ids(span.get_span_context())[0]
    page = reverse("admin:tasks_task_change", args=[task.pk])
    with override_settings(RELIABILITY_TRACE_URL="http://jaeger:16686/trace/{trace_id}"):
        html = superuser_client.get(page).content.decode()
    assert f'href="http://jaeger:16686/trace/{trace_id}"' in html and 'id="rc-trace"' in html
    # Without a UI the trace id is still shown, as text; a task without a trace shows neither.
    html = superuser_client.get(page).content.decode()
    assert 'id="rc-trace"' in html and trace_id in html and "jaeger" not in html
    with override_settings(RELIABILITY_TRACE_URL="http://jaeger:16686/trace/{trace_id}"):
        tracing_off = superuser_client.get(reverse("admin:tasks_task_change", args=[_untraced_task().pk]))
    assert 'id="rc-trace"' not in tracing_off.content.decode()


def _untraced_task() -> Task:
    saved, tracing.active = tracing.active, None
    try:
        return task_submit(pipeline="t_local", input={"n": 3})
    finally:
        tracing.active = saved


def test_a_line_logged_in_an_attempt_carries_the_attempts_trace_and_span_ids(traced):
    import logging as std_logging
    import uuid

    from tasks.execution.attempts import attempt_run
    from tasks.execution.context import StepContext
    from tasks.observability.log_fields import AttemptFieldsFilter

    seen = []

    class Keep(std_logging.Handler):
        def emit(self, record):
            seen.append(record)

    handler = Keep()
    handler.addFilter(AttemptFieldsFilter())
    step_logger = std_logging.getLogger("tests.tracing.step")
    step_logger.addHandler(handler)
    ctx = StepContext(
        task_id=uuid.uuid4(),
        pipeline="p",
        step="s",
        input={},
        outputs={},
        deadline=None,
        call_deadline=9e12,
        attempt=1,
        generation=0,
    )
    try:
        attempt_run(lambda ctx: step_logger.warning("inside"), ctx, kind="step", step_index=0, worker="w", timeout=5)
    finally:
        step_logger.removeHandler(handler)
    [record] = seen
    [span] = [span for span in traced.spans() if span.name == "step s"]
    assert (record.trace_id, record.span_id) == ids(span.context)
