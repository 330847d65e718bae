"""``ctx.http``: a ``requests.Session`` for one attempt that carries the task's deadline and effect keys.

What every adopter would otherwise write by hand around each call (and the
demo's platform client once did):

- ``X-Task-Id`` and ``X-Request-Deadline`` (epoch milliseconds: the earlier of
  the task's deadline and this attempt's timeout) on every request, so the far
  side can drop work nobody waits for any more;
- the time left as the request's timeout (an explicit ``timeout=`` only
  shortens it), and no request at all when too little is left to get an answer;
- with tracing on (``tasks.observability.tracing``), a client span per request, whose context the
  request carries as ``traceparent`` (and ``tracestate``);
- on POST, PUT, PATCH and DELETE, the name of the effect (``effect="charge"``):
  it becomes ``Idempotency-Key: ctx.idempotency_key("charge")``, the same on
  every retry and after a crash, and is recorded in the side-effect ledger with
  the step's checkpoint (or as uncertain when the attempt fails not knowing).
  A mutating request that names no effect is a programming error, raised before
  anything is sent; ``effect=None`` opts out, knowingly.

Responses are returned as they come: ``raise_for_status()`` turns a status into
an error the engine classifies (``tasks.outbound.http_errors``). Connections are pooled
per thread across attempts (the worker runs one attempt at a time per thread).
"""

from __future__ import annotations

import threading
import urllib.parse
import uuid
from typing import Any, Protocol

import requests
from requests.adapters import HTTPAdapter

from tasks.exceptions import EffectRequired, StepTimeout
from tasks.observability import tracing

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# With less time than this left, a request would reach the far side after the caller gave up on it
# (a loaded host takes milliseconds to send one) and its answer could not come back in time.
MIN_CALL_SECONDS = 0.05


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _Required()

_local = threading.local()


def _thread_adapter() -> HTTPAdapter:
    # One keep-alive pool per worker thread, shared by the sessions of its successive attempts.
    adapter = getattr(_local, "adapter", None)
    if adapter is None:
        adapter = _local.adapter = HTTPAdapter()
    return adapter


class SessionContext(Protocol):
    """What a session reads and records of its attempt: ``tasks.execution.context.StepContext`` is one (it makes its
    session, so this module names only what it needs of it)."""

    task_id: uuid.UUID
    acted_keys: dict[str, str]

    @property
    def call_deadline_ms(self) -> int: ...

    def remaining(self) -> float: ...

    def idempotency_key(self, name: str) -> str: ...


class StepSession(requests.Session):
    """The ``requests.Session`` behind ``ctx.http``; see the module docstring."""

    def __init__(self, ctx: SessionContext) -> None:
        super().__init__()
        self.ctx = ctx
        adapter = _thread_adapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def request(
        self, method: str | bytes, url: str | bytes, *args: Any, effect: Any = REQUIRED, **kwargs: Any
    ) -> requests.Response:
        method = (method.decode() if isinstance(method, bytes) else method).upper()
        where = f"{method} {_without_query(url)}"
        headers = dict(kwargs.pop("headers", None) or {})
        if method in MUTATING_METHODS:
            if effect is REQUIRED:
                raise EffectRequired(
                    f"{where}: a {method} request must name its effect, e.g. "
                    f'ctx.http.{method.lower()}(url, ..., effect="charge"), so it carries an Idempotency-Key '
                    "and is recorded in the side-effect ledger (effect=None sends it without either: unsafe)"
                )
            if effect is not None:
                if not isinstance(effect, str) or not effect:
                    raise EffectRequired(f"{where}: effect must be a non-empty string or None, not {effect!r}")
                headers.setdefault("Idempotency-Key", self.ctx.idempotency_key(effect))
        elif effect is not REQUIRED and effect is not None:
            raise EffectRequired(f"{where}: a {method} request has no effect to name (effect={effect!r})")
        left = self.ctx.remaining()
        if left < MIN_CALL_SECONDS:
            raise StepTimeout(f"{where}: no time left before the deadline")
        headers["X-Task-Id"] = str(self.ctx.task_id)
        headers["X-Request-Deadline"] = str(self.ctx.call_deadline_ms)
        if args:
            # requests' positional order after url: params, data, headers, cookies, files, auth, timeout, ...
            raise TypeError("ctx.http: pass everything after the URL by keyword")
        kwargs["timeout"] = _shortened(kwargs.get("timeout"), left)
        tracer = tracing.active
        if tracer is not None:
            # A client span per request, whose context the request carries as traceparent (tasks.observability.tracing).
            response = tracer.http_request(super().request, method, url, headers, kwargs)
        else:
            response = super().request(method, url, headers=headers, **kwargs)
        if effect not in (None, REQUIRED) and 200 <= response.status_code < 300:
            # It acted: should the step fail after this (a second call refused), compensation must cover it.
            self.ctx.acted_keys[effect] = headers["Idempotency-Key"]
        return response


def _shortened(timeout: Any, left: float) -> Any:
    """The caller's timeout, never longer than the time left (a (connect, read) pair item by item)."""
    if timeout is None:
        return left
    if isinstance(timeout, tuple):
        return tuple(left if part is None else min(float(part), left) for part in timeout)
    return min(float(timeout), left)


def _without_query(url: str | bytes) -> str:
    # Error messages name the endpoint, not its query string (which may carry credentials).
    text = url.decode() if isinstance(url, bytes) else str(url)
    parts = urllib.parse.urlsplit(text)
    host = parts.netloc.rpartition("@")[2]  # never the user:password of a URL
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
