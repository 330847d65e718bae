"""Error classification: is a failure worth retrying, and what is its stable code?"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import requests

from tasks.exceptions import PermanentError, StepCancelled, StepTimeout, TransientError
from tasks.outbound.http_errors import retry_after_seconds, status_effect_uncertain, status_is_transient

# Exceptions of the network layer: the request may or may not have reached the
# far side, so they are transient and their effect is uncertain.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    requests.ConnectionError,
    requests.Timeout,
    socket.timeout,
    TimeoutError,
    ConnectionError,
)


@dataclass(frozen=True)
class Classification:
    transient: bool
    code: str
    message: str
    error_class: str
    retry_after: float | None = None
    # The far side may have acted (timeout, lost connection, 5xx).
    effect_uncertain: bool = False


def classify(exc: BaseException, extra_transient: tuple[type[BaseException], ...] = ()) -> Classification:
    """Classify ``exc``; ``extra_transient`` are types a retry policy declares transient."""
    error_class = f"{type(exc).__module__}.{type(exc).__qualname__}"
    message = str(exc)[:2000] or type(exc).__name__
    if isinstance(exc, StepTimeout):
        return Classification(True, StepTimeout.code, message, error_class, effect_uncertain=True)
    if isinstance(exc, StepCancelled):
        # Not retried (the task is cancelled); it was stopped mid-wait, so it may have acted.
        return Classification(False, StepCancelled.code, message, error_class, effect_uncertain=True)
    if isinstance(exc, TransientError):
        return Classification(True, exc.code, message, error_class, exc.retry_after, exc.effect_uncertain)
    if isinstance(exc, PermanentError):
        return Classification(False, exc.code, message, error_class)
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return _http_status(exc.response, message, error_class)
    if isinstance(exc, requests.Timeout | socket.timeout | TimeoutError):
        return Classification(True, "timeout", message, error_class, effect_uncertain=True)
    if isinstance(exc, NETWORK_ERRORS):
        return Classification(True, "connection_error", message, error_class, effect_uncertain=True)
    if extra_transient and isinstance(exc, extra_transient):
        return Classification(True, type(exc).__name__, message, error_class, effect_uncertain=True)
    # Anything else is a bug or a business rule: retrying will not fix it.
    return Classification(False, "unhandled_exception", message, error_class)


def _http_status(response: requests.Response, message: str, error_class: str) -> Classification:
    # raise_for_status() of requests, or ctx.http: classified by status, as docs/write-a-pipeline.md promises.
    status = response.status_code
    code = f"http_{status}"
    if not status_is_transient(status):
        return Classification(False, code, message, error_class)
    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
    return Classification(True, code, message, error_class, retry_after, status_effect_uncertain(status))
