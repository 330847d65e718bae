"""The OpenTelemetry side of ``tasks.observability.tracing``: imported only when tracing is on and the SDK is installed.

Spans and what they carry (attribute names as the issue asked; nothing a step or an error says, so no secret
reaches a trace: a message or traceback stays with the attempt's row, redacted):

- ``POST <route>`` (SERVER): an API request that submits tasks, continuing the caller's ``traceparent``;
  ``submit <pipeline>`` (PRODUCER): a submission made outside any span (a Python caller, a schedule), the root
  of its task's trace;
- ``run <pipeline>`` (CONSUMER): one run of a task (a claim: one RQ job), child of the context stored at
  submission; ``task.id``, ``pipeline``, ``fencing_token``, ``outcome`` (the state it left the task in);
- ``step <name>``, ``compensation <name>``, ``failure_notice <name>`` (INTERNAL): one attempt; ``task.id``,
  ``pipeline``, ``step``, ``attempt``, ``attempt.kind``, ``fencing_token``, ``outcome``, ``error.code``. An
  attempt that follows a failed one of the same step links to it: within the run (a compensation's retries),
  or across runs through ``Task.trace_context["retry_of"]``, the failed attempt's ``traceparent`` that the
  outcome scheduling the retry wrote;
- ``GET``, ``POST``, … (CLIENT): one ``ctx.http`` request, as the requests instrumentation makes them
  (``http.request.method``, ``url.full`` with credentials and secret query values redacted,
  ``server.address``, ``server.port``, ``http.response.status_code``, ``error.type``); its context is the
  request's ``traceparent``.

The provider is the process's own when one was set already (``opentelemetry-instrument``, or the embedding
project's setup); otherwise one is made from the standard ``OTEL_*`` variables: the SDK reads the sampler
(``OTEL_TRACES_SAMPLER``), the resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), the batch
processor's pace (``OTEL_BSP_*``) and the exporter's endpoint, headers and timeout (``OTEL_EXPORTER_OTLP_*``)
itself; the exporters are ``OTEL_TRACES_EXPORTER``'s (default ``otlp``, over HTTP/protobuf unless
``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``grpc``), found by name as the SDK's own configuration finds them.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Callable
from contextvars import ContextVar
from importlib.metadata import entry_points
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tasks.redaction import query_strings_redacted

INSTRUMENTATION_NAME = "reliability-console"
# The task's stored context is W3C Trace Context whatever OTEL_PROPAGATORS says (the column's format);
# outbound requests and the API's requests use the process's propagators.
W3C = TraceContextTextMapPropagator()
# The methods a client or server span is named by; any other is "HTTP" with the method "_OTHER" (semconv).
KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
DEFAULT_PORTS = {"http": 80, "https": 443}
EXPORTER_GROUP = "opentelemetry_traces_exporter"
OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
# Set while a ctx.http request is sent: the requests instrumentation, if the process has it, makes no second span.
try:
    from opentelemetry.context import _SUPPRESS_HTTP_INSTRUMENTATION_KEY as SUPPRESS_HTTP_KEY
except ImportError:  # pragma: no cover - an API without the key: nothing to suppress with
    SUPPRESS_HTTP_KEY = None


def provider_from_environment() -> trace.TracerProvider:
    """The process's SDK provider when it has one, else a new one made from the ``OTEL_*`` variables (and made
    the process's, so other instrumentation of the project reports into the same traces)."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    provider = TracerProvider()
    for exporter in exporters_from_environment():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def exporters_from_environment() -> list[SpanExporter]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``; ``none``: none)."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    if names.lower() == "none":
        return []
    exporters = []
    for name in filter(None, (part.strip() for part in names.split(","))):
        if name == "otlp":
            variable = next(
                (v for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") if os.environ.get(v)),
                None,
            )
            protocol = os.environ[variable].strip() if variable else "http/protobuf"
            if protocol not in OTLP_BY_PROTOCOL:
                raise ImproperlyConfigured(f"{variable}={protocol!r} is not http/protobuf or grpc")
            name = OTLP_BY_PROTOCOL[protocol]
        found = list(entry_points(group=EXPORTER_GROUP, name=name))
        if not found:
            raise ImproperlyConfigured(
                f"OTEL_TRACES_EXPORTER: no installed package provides the span exporter {name!r} "
                "(the otel extra has otlp over http/protobuf and console)"
            )
        exporters.append(found[0].load()())
    return exporters


def carrier_of(span: trace.Span) -> dict[str, str]:
    """The W3C ``traceparent`` (and ``tracestate``, when it has one) of ``span``'s context."""
    carrier: dict[str, str] = {}
    W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def span_context_of(traceparent: str) -> trace.SpanContext | None:
    """The span context a stored ``traceparent`` names; None when it is not a valid one."""
    span_context = trace.get_current_span(W3C.extract({"traceparent": traceparent})).get_span_context()
    return span_context if span_context.is_valid else None


@dataclasses.dataclass
class RunScope:
    """The run a thread is in (one claim of a task): what its attempts' spans carry and link to."""

    task_id: str
    pipeline: str
    fencing_token: int
    generation: int
    # The last failed attempt of a step before this run, as the task's row keeps it: {step, generation, attempt,
    # traceparent}.
    retry_of: dict[str, Any] | None
    # (attempt kind, step) -> the span context of its last failed attempt in this run.
    failed: dict[tuple[str, str], trace.SpanContext] = dataclasses.field(default_factory=dict)

    def links(self, kind: str, step: str, attempt: int) -> list[Link]:
        earlier = self.failed.get((kind, step))
        if earlier is not None:
            return [Link(earlier, {"link.reason": "retry_of"})]
        stored = self.retry_of
        # The step's next attempt in the same generation (a retry after its delay, after a crash, or an operator's
        # retry from the checkpoint, which counts the step's attempts from 1 again); a retry from the start is not.
        if kind == "step" and stored and stored.get("step") == step and stored.get("generation") == self.generation:
            span_context = span_context_of(str(stored.get("traceparent", "")))
            if span_context is not None:
                return [Link(span_context, {"link.reason": "retry_of", "attempt": int(stored["attempt"])})]
        return []


_run: ContextVar[RunScope | None] = ContextVar("reliability_trace_run", default=None)


class OtelTracing:
    """Spans of submissions, runs, attempts and ``ctx.http`` requests through one tracer (see the module)."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self.tracer = provider.get_tracer(INSTRUMENTATION_NAME)

    @classmethod
    def from_environment(cls) -> OtelTracing:
        return cls(provider_from_environment())

    # --- submission -----------------------------------------------------------------------------------

    def submission_context(self, pipeline: str) -> dict[str, str]:
        carrier: dict[str, str] = {}
        if trace.get_current_span().get_span_context().is_valid:
            W3C.inject(carrier)
            return carrier
        # Nothing open here (a Python caller without a span, a schedule's sweep): the task's trace starts now.
        with self.tracer.start_as_current_span(
            f"submit {pipeline}", kind=SpanKind.PRODUCER, attributes={"pipeline": pipeline}
        ):
            W3C.inject(carrier)
        return carrier

    def server_request(self, view: Callable[..., Any], request, route: str, args, kwargs) -> Any:
        match = getattr(request, "resolver_match", None)
        # The route as matched, under whatever prefix the project mounts the API at; else the view's own.
        route = "/" + match.route if match is not None and match.route else route
        method = request.method.upper()
        name_method = method if method in KNOWN_METHODS else "HTTP"
        attributes = {
            "http.request.method": method if method in KNOWN_METHODS else "_OTHER",
            "http.route": route,
            "url.path": request.path,
            "url.scheme": request.scheme,
        }
        if trace.get_current_span().get_span_context().is_valid:
            # The project's own HTTP instrumentation made the server span already: this one is its child.
            parent, kind = None, SpanKind.INTERNAL
        else:
            parent, kind = propagate.extract(request.headers), SpanKind.SERVER
        with self.tracer.start_as_current_span(
            f"{name_method} {route}",
            context=parent,
            kind=kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = view(request, *args, **kwargs)
            except BaseException as exc:
                _failed(span, type(exc))
                raise
            status = getattr(response, "status_code", None)
            if status is not None:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:  # a server span's error is the server's (semconv): a 4xx is the caller's
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
            return response

    # --- a run and its attempts -----------------------------------------------------------------------

    def run_traced(self, claim, run: Callable[[Any], str]) -> str:
        """``run(claim)`` inside the run's span, a child of the task's stored context (a new trace without one)."""
        task = claim.task
        stored = task.trace_context or {}
        traceparent = stored.get("traceparent")
        parent = W3C.extract(stored) if traceparent else otel_context.Context()
        attributes = {"task.id": str(task.pk), "pipeline": task.pipeline, "fencing_token": claim.token}
        with self.tracer.start_as_current_span(
            f"run {task.pipeline}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if not traceparent:
                # Submitted untraced: this run starts the task's trace. Kept on the instance, the row gains it
                # with the next write of the context (a retry's), so the later runs join this one's trace.
                task.trace_context = {**stored, **carrier_of(span)}
            scope = RunScope(str(task.pk), task.pipeline, claim.token, task.generation, stored.get("retry_of"))
            token = _run.set(scope)
            try:
                outcome = run(claim)
            except BaseException as exc:
                _failed(span, type(exc))
                raise
            finally:
                _run.reset(token)
            span.set_attribute("outcome", outcome)
            return outcome

    def attempt_traced(self, run_attempt: Callable[..., Any], function, ctx, kind: str, *options: Any):
        """``run_attempt(function, ctx, kind, *options)`` (``tasks.execution.attempts``) inside the attempt's span; a
        failed attempt's record carries the span's ``traceparent`` (the retry's span links to it)."""
        scope = _run.get()
        step, attempt = ctx.step, ctx.attempt
        attributes: dict[str, Any] = {
            "task.id": str(ctx.task_id),
            "pipeline": ctx.pipeline,
            "step": step,
            "attempt": attempt,
            "attempt.kind": kind,
        }
        if scope is not None:
            attributes["fencing_token"] = scope.fencing_token
        links = scope.links(kind, step, attempt) if scope is not None else []
        with self.tracer.start_as_current_span(
            f"{kind} {step}",
            links=links,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = run_attempt(function, ctx, kind, *options)
            except BaseException as exc:  # not an attempt's failure (a lost lease, the database gone)
                _failed(span, type(exc))
                raise
            record = result.record
            span.set_attribute("outcome", record.outcome)
            if record.error is None:
                return result
            span.set_attribute("error.code", record.error.code)
            span.set_status(Status(StatusCode.ERROR, record.error.code))
            span_context = span.get_span_context()
            if scope is not None:
                scope.failed[(kind, step)] = span_context
            # Only a failed attempt's record carries its span: what a retry links to (a success needs none).
            traceparent = f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"
            return dataclasses.replace(result, record=dataclasses.replace(record, traceparent=traceparent))

    def log_ids(self) -> dict[str, str]:
        """``trace_id`` and ``span_id`` (hex) of the current span, for a log line; empty outside a span."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return {}
        return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}

    def event(self, name: str, attributes: dict[str, Any]) -> None:
        trace.get_current_span().add_event(name, attributes)

    # --- ctx.http -------------------------------------------------------------------------------------

    def http_request(self, send: Callable[..., Any], method: str, url, headers: dict[str, str], kwargs) -> Any:
        """``send(method, url, headers=headers, **kwargs)`` under a client span whose context ``headers`` carry."""
        text = url.decode() if isinstance(url, bytes) else str(url)
        parts = urllib.parse.urlsplit(text)
        known = method in KNOWN_METHODS
        attributes: dict[str, Any] = {
            "http.request.method": method if known else "_OTHER",
            "url.full": _url_shown(text),
        }
        if parts.hostname:
            attributes["server.address"] = parts.hostname
            port = parts.port or DEFAULT_PORTS.get(parts.scheme)
            if port:
                attributes["server.port"] = port
        with self.tracer.start_as_current_span(
            method if known else "HTTP",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            propagate.inject(headers)
            token = otel_context.attach(otel_context.set_value(SUPPRESS_HTTP_KEY, True)) if SUPPRESS_HTTP_KEY else None
            try:
                response = send(method, url, headers=headers, **kwargs)
            except BaseException as exc:
                _failed(span, type(exc))
                raise
            finally:
                if token is not None:
                    otel_context.detach(token)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 400:
                span.set_attribute("error.type", str(response.status_code))
                span.set_status(Status(StatusCode.ERROR))
            return response


def run_scope() -> RunScope | None:
    """The run this thread is in (for tests and diagnostics)."""
    return _run.get()


def _failed(span: trace.Span, error: type[BaseException]) -> None:
    """What a span says of an exception that went through it: its type (``error.type``), never its message."""
    span.set_attribute("error.type", f"{error.__module__}.{error.__qualname__}")
    span.set_status(Status(StatusCode.ERROR))


def _url_shown(url: str) -> str:
    """``url`` as a span may show it: no user or password (semconv's ``REDACTED``), secret query values redacted."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "REDACTED:REDACTED@" + netloc.rpartition("@")[2]
    return query_strings_redacted(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")))
