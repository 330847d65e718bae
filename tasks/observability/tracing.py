"""Traces of a task's life: OpenTelemetry spans, when ``RELIABILITY_TRACING`` is on and the SDK is installed.

One trace per task, whatever ran it where: the submission (the API's request, or the span a Python caller had
open) stores its W3C context on the task (``Task.trace_context``, written by ``tasks.lifecycle.creation``), and
every run of the task (a claim: one RQ job) is a span whose parent is that context, on any worker, after a
crash, a retry or an operator's action. Under the run, one span per attempt (a step, a compensation, the failure
notice: ``tasks.execution.attempts.attempt_run``), under an attempt one client span per ``ctx.http`` request, whose
context the request carries as ``traceparent``. A retry's attempt links to the attempt it retries (kept in
``trace_context["retry_of"]`` by the outcome that scheduled it), a wait is an event of its attempt's span.

This module imports nothing of OpenTelemetry: ``tasks.observability.otel`` does, and only once
``tracing_configure`` (``TasksConfig.ready()``) found the setting on and the SDK importable. Until then
``active`` is None, and each hook (a run, an attempt, a request, a submission) pays one read of it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tasks.conf import engine_settings

if TYPE_CHECKING:
    from tasks.observability.otel import OtelTracing

logger = logging.getLogger(__name__)

# The tracing in force in this process, or None (off, or no SDK): read by every hook.
active: OtelTracing | None = None

SDK_MODULE = "opentelemetry.sdk.trace"


def sdk_installed() -> bool:
    """Whether the OpenTelemetry SDK can be imported (the ``otel`` extra)."""
    try:
        return importlib.util.find_spec(SDK_MODULE) is not None
    except ImportError:  # its parent package is missing
        return False


def tracing_configure() -> OtelTracing | None:
    """Turn tracing on in this process when the setting asks and the SDK is there (``tasks.checks`` warns when
    it is not); return what is in force. Called once per process by ``TasksConfig.ready()``."""
    global active
    if not engine_settings.TRACING or not sdk_installed():
        active = None
        return None
    from tasks.observability.otel import OtelTracing

    active = OtelTracing.from_environment()
    logger.info("tracing on", extra={"event": "tracing_configured"})
    return active


def submission_context(pipeline: str) -> dict[str, str] | None:
    """The W3C context a new task of ``pipeline`` continues (``traceparent``, ``tracestate``): the span current
    where it is submitted, or a new trace's; None with tracing off."""
    tracer = active
    return None if tracer is None else tracer.submission_context(pipeline)


def span_event(name: str, attributes: dict[str, Any]) -> None:
    """An event on the current span (a wait of a step's attempt); nothing with tracing off."""
    tracer = active
    if tracer is not None:
        tracer.event(name, attributes)


def traced_request(route: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A view decorator: the request is a server span (``route`` names it) that continues the caller's
    ``traceparent``, current while the view runs, so what it submits belongs to the caller's trace."""

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        def wrapper(request, *args: Any, **kwargs: Any) -> Any:
            tracer = active
            if tracer is None:
                return view(request, *args, **kwargs)
            return tracer.server_request(view, request, route, args, kwargs)

        return wrapper

    return decorate
