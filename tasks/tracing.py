"""OpenTelemetry traces of a task, from the request that submitted it to every attempt and outbound call.

On only with ``RELIABILITY_TRACING`` and the SDK installed (``pip install reliability-console[otel]``); off,
nothing of OpenTelemetry is imported and a task pays one check of a module global per run and per attempt.
On, each process sets up the SDK once, as the standard ``OTEL_*`` variables say (``OTEL_SERVICE_NAME``,
``OTEL_TRACES_EXPORTER``: ``otlp`` (the default, OTLP over HTTP; ``OTEL_EXPORTER_OTLP_ENDPOINT``…),
``console`` or ``none``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``), unless the project has already installed a
tracer provider of its own, which is then used as it is. The ``requests`` and Django instrumentations
(opentelemetry-instrumentation-requests, -django) make the client spans of outbound calls, with
``traceparent``/``tracestate`` injected, and the server span of each request.

The trace of a task:

- its submission stores the current context as W3C ``traceparent``/``tracestate`` in the task's
  ``trace_context`` (the API request's server span continues an incoming ``traceparent``; a Python
  submission outside any span gets a short ``submit <pipeline>`` root span of its own);
- every run (one claim by one worker, ``run <pipeline>``) is a child of that context, whichever worker runs
  it, after a crash or an operator's retry; each attempt (a step, a compensation, the failure notice) is a
  child span of its run, with ``task.id``, ``pipeline``, ``step``, ``attempt``, ``fencing_token``,
  ``outcome`` and ``error.code``;
- a retry's attempt is linked to the failed attempt before it: the failed span's context rides in
  ``trace_context["retry_of"]``, written with the retry's schedule;
- a wait (a signal, a time, a delayed start) is an event of the run's span;
- a worker killed mid-attempt loses the spans it had not exported (its run and attempt): the next run is
  still a child of the submission, so the trace has no orphan.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from tasks.conf import engine_settings

logger = logging.getLogger(__name__)

_UNSET = object()
# The tracer once this process has looked (None: tracing is off, or the SDK is missing).
_tracer: Any = _UNSET
SCOPE = "reliability_console"


def sdk_installed() -> bool:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def tracer():
    """This process's tracer, set up on the first call; None when tracing is off (nothing is imported then)."""
    global _tracer
    if _tracer is _UNSET:
        _tracer = _set_up() if engine_settings.TRACING is True and sdk_installed() else None
    return _tracer


def _set_up():
    from opentelemetry import trace
    from opentelemetry.instrumentation.requests import RequestsInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the provider, OTEL_TRACES_SAMPLER.
        named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "reliability-console"}))
        exporter = _exporter()
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* tune it
        trace.set_tracer_provider(provider)
    RequestsInstrumentor().instrument(request_hook=_request_hook)
    logger.info("tracing on", extra={"event": "tracing_started"})
    return trace.get_tracer(SCOPE)


def _exporter():
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT


def _request_hook(span, request) -> None:
    """A client span's URL without the credentials of its query string (``tasks.redaction``)."""
    from tasks.redaction import query_strings_redacted

    if span.is_recording():
        span.set_attribute("url.full", query_strings_redacted(request.url))


def django_instrumented() -> None:
    """The server span of every request (continuing an incoming ``traceparent``); called once at start-up."""
    if tracer() is None:
        return
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    if not DjangoInstrumentor().is_instrumented_by_opentelemetry:
        DjangoInstrumentor().instrument()


# --- submission --------------------------------------------------------------------------------------------------


def submission_context(pipeline: str) -> dict[str, str] | None:
    """The context a new task stores: the current span's, or a ``submit <pipeline>`` root span's; None when off."""
    active = tracer()
    if active is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid:
        TraceContextTextMapPropagator().inject(carrier)
        return carrier
    with active.start_as_current_span(f"submit {pipeline}", kind=trace.SpanKind.PRODUCER):
        TraceContextTextMapPropagator().inject(carrier)
    return carrier


def trace_id(trace_context: Mapping[str, str] | None) -> str | None:
    """The trace id (32 hex digits) of a task's stored context, for a link to the trace; None without one."""
    parent = (trace_context or {}).get("traceparent", "")
    parts = parent.split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1]
    return None


def trace_url(trace_context: Mapping[str, str] | None) -> str | None:
    """``RELIABILITY_TRACE_URL`` with the task's trace id in it; None when either is missing."""
    template = engine_settings.TRACE_URL
    found = trace_id(trace_context)
    return template.replace("{trace_id}", found) if template and found else None


# --- runs and attempts ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def run_span(task) -> Iterator[Any]:
    """The span of one run of ``task`` (a claim by this worker), a child of its submission's context."""
    active = tracer()
    if active is None:
        yield None
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(dict(task.trace_context or {}))
    attributes = {"task.id": str(task.pk), "pipeline": task.pipeline, "fencing_token": task.fencing_token}
    with active.start_as_current_span(f"run {task.pipeline}", context=parent, attributes=attributes) as span:
        yield span


@contextlib.contextmanager
def attempt_span(*, kind: str, ctx, retry_of: str | None) -> Iterator[Any]:
    """The span of one attempt, a child of the run's; linked to the failed attempt a retry follows."""
    active = tracer()
    if active is None:
        yield None
        return
    from opentelemetry import trace

    links = []
    if retry_of:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        failed = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": retry_of}))
        if failed.get_span_context().is_valid:
            links.append(trace.Link(failed.get_span_context(), {"retry.of": "the failed attempt"}))
    attributes = {"task.id": str(ctx.task_id), "pipeline": ctx.pipeline, "step": ctx.step, "attempt": ctx.attempt}
    with active.start_as_current_span(f"{kind} {ctx.step}", links=links, attributes=attributes) as span:
        yield span


def attempt_ended(span, *, outcome: str, error_code: str | None, fencing_token: int | None = None) -> str | None:
    """Record an attempt's outcome on its span; the span's ``traceparent`` (a retry links to it), or None."""
    if span is None:
        return None
    from opentelemetry.trace import Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    span.set_attribute("outcome", outcome)
    if fencing_token is not None:
        span.set_attribute("fencing_token", fencing_token)
    if error_code:
        span.set_attribute("error.code", error_code)
        span.set_status(Status(StatusCode.ERROR, error_code))
    carrier: dict[str, str] = {}
    from opentelemetry import trace

    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def event(name: str, attributes: Mapping[str, Any]) -> None:
    """An event on the current span (a wait of the run), when tracing is on."""
    if tracer() is None:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, {k: v for k, v in attributes.items() if v is not None})
