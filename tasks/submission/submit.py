"""Submission: the one idempotent flow behind ``task_submit`` (Python) and ``POST /api/v1/tasks`` (HTTP).

A request is fingerprinted as submitted (pipeline, input, deadline, callback
URL); with an idempotency key, the key is reserved first
(``tasks.submission.idempotency``), so a repeat is answered from the record without
validating again, a different request under the same key is refused, and a
concurrent twin waits. Then the pipeline validates the input (and
``tasks.outbound.callback_events`` the callback URL), and the task, its idempotency record
(with the first response, for HTTP) and its delivery after commit are
written in one transaction. A refused request releases its key and stores
nothing.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from tasks import registry
from tasks.exceptions import InvalidTaskInput
from tasks.json_text import unstorable_json
from tasks.lifecycle.clients import api_client_signing_secret_ensure
from tasks.lifecycle.creation import task_create
from tasks.models import ApiClient, Task
from tasks.outbound.callback_urls import callback_url_check
from tasks.pipelines.attributes import AttributeRefused, attributes_from_input
from tasks.pipelines.pipeline import Pipeline
from tasks.submission.idempotency import idempotency_abandon, idempotency_begin, idempotency_complete

PYTHON_SCOPE = "python"
MAX_IDEMPOTENCY_KEY_LENGTH = 255
MAX_DEADLINE_SECONDS = 365 * 86400
# The latest start a submission may ask for, in seconds from now (``run_at``).
MAX_START_DELAY_SECONDS = 365 * 86400

# What a submission answers and stores for its key: (HTTP status, body), or nothing (Python callers).
Responder = Callable[[Task], tuple[int, bytes]]


@dataclass(frozen=True)
class Submission:
    """The outcome of a submission: a new task, or the replay of an earlier one under the same key."""

    task_id: uuid.UUID
    replayed: bool
    response_status: int | None = None
    response_body: bytes | None = None
    # The task this submission created (None for a replay, which knows only the id).
    created: Task | None = None


def canonical_json(value: Any) -> str:
    """Sorted keys, fixed separators: the one form in which payloads are hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def request_fingerprint(
    *,
    pipeline: str,
    input: Any,
    deadline_seconds: float | None,
    callback_url: str | None = None,
    start: datetime | float | None = None,
) -> str:
    """SHA-256 of the canonical JSON of the request as submitted: pipeline, input, deadline, callback URL, start.

    ``start`` as submitted: a time, or seconds from now (the same request sent again later is the same request).
    """
    body = {"pipeline": pipeline, "input": input, "deadline_seconds": deadline_seconds}
    if callback_url is not None:
        # Only when given: the fingerprints of requests without one (and their stored records) stay as they were.
        body["callback_url"] = callback_url
    if isinstance(start, datetime):
        body["start_at"] = start.isoformat()
    elif start is not None:
        body["delay_seconds"] = start
    try:
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()
    except (TypeError, ValueError) as exc:
        raise InvalidTaskInput(f"input is not JSON: {exc}") from None


def submission_create(
    *,
    pipeline: str,
    input: Any,
    deadline: datetime | timedelta | float | None = None,
    idempotency_key: str | None = None,
    scope: str = PYTHON_SCOPE,
    client: ApiClient | None = None,
    respond: Responder | None = None,
    callback_url: str | None = None,
    run_at: datetime | timedelta | float | None = None,
) -> Submission:
    """Create a task (delivered after commit) or replay the one an earlier request with this key made.

    ``respond`` renders the response stored with the key (HTTP); raises
    ``UnknownPipeline``, ``InvalidTaskInput``, ``IdempotencyKeyReused`` or
    ``IdempotencyKeyInUse``, and then nothing is stored. ``run_at`` (an
    aware datetime, or seconds / a timedelta from now) delays the start: the
    task is created WAITING, with no job, and the sweeper starts it at that
    time (``tasks.delivery.sweeper``).
    """
    deadline_at, deadline_seconds = resolve_deadline(deadline)
    start_at, start = resolve_start(run_at, deadline_at)
    fingerprint = request_fingerprint(
        pipeline=pipeline, input=input, deadline_seconds=deadline_seconds, callback_url=callback_url, start=start
    )
    reservation = None
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
        reservation = idempotency_begin(scope=scope, key=idempotency_key, fingerprint=fingerprint)
        if not reservation.owned:
            record = reservation.record
            body = bytes(record.response_body) if record.response_body is not None else None
            return Submission(record.task_id, replayed=True, response_status=record.response_status, response_body=body)
    try:
        spec, cleaned = submission_checked(pipeline=pipeline, input=input, callback_url=callback_url, client=client)
        with transaction.atomic():
            task = task_create(
                spec=spec,
                input=cleaned,
                deadline=deadline_at,
                client=client,
                scope=scope,
                key=idempotency_key,
                fingerprint=fingerprint,
                callback_url=callback_url or "",
                start_at=start_at,
            )
            status, body = respond(task) if respond is not None else (None, None)
            if reservation is not None:
                idempotency_complete(record=reservation.record, task=task, status=status, body=body)
    except BaseException:
        if reservation is not None:
            idempotency_abandon(record=reservation.record)
        raise
    return Submission(task.pk, replayed=False, response_status=status, response_body=body, created=task)


def submission_checked(
    *, pipeline: str, input: Any, callback_url: str | None, client: ApiClient | None
) -> tuple[Pipeline, Any]:
    """The pipeline and the input as its validation cleaned it, the callback URL checked; or the error refusing
    them (``UnknownPipeline``, ``InvalidTaskInput``). A single submission's check, and each item's of a batch."""
    spec = registry.get(pipeline)
    cleaned = clean_input(spec, input)
    if callback_url is not None:
        callback_url_check(callback_url)
        if client is None:
            raise InvalidTaskInput(
                "a callback is signed with an API client's secret: submit it with client=",
                details={"callback_url": "needs a client"},
            )
        api_client_signing_secret_ensure(client=client)
    return spec, cleaned


def task_submit(
    *,
    pipeline: str,
    input: Any,
    idempotency_key: str | None = None,
    deadline: datetime | timedelta | float | None = None,
    scope: str = PYTHON_SCOPE,
    callback_url: str | None = None,
    client: ApiClient | None = None,
    run_at: datetime | timedelta | float | None = None,
) -> Task:
    """Create a task and deliver it after commit (or, with ``run_at``, at that time); return it.

    The same ``idempotency_key`` with the same pipeline, input and deadline
    returns the task the first call created; with a different request it
    raises ``IdempotencyKeyReused`` and changes nothing. ``deadline`` is an
    aware datetime, or seconds / a timedelta from now. If Redis is down the
    task is still created (QUEUED) and the sweeper delivers it later.
    ``callback_url`` asks for a completion callback (``tasks.outbound.callback_events``),
    signed with the secret of ``client``, which it then requires.
    ``run_at`` (an aware datetime, or seconds / a timedelta from now) starts
    it later: it waits (WAITING, no job, no worker) until then, not before,
    and within one sweep interval after; the idempotency fingerprint holds it.
    """
    submission = submission_create(
        pipeline=pipeline,
        input=input,
        deadline=deadline,
        idempotency_key=idempotency_key,
        scope=scope,
        client=client,
        callback_url=callback_url,
        run_at=run_at,
    )
    return submission.created or Task.objects.get(pk=submission.task_id)


def clean_input(spec: Pipeline, data: Any) -> Any:
    """Run the pipeline's own validation; the result must be storable as JSON."""
    cleaned = spec.clean_input(data)
    try:
        text = canonical_json(cleaned)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskInput(f"input is not JSON: {exc}") from None
    problem = unstorable_json(text, cleaned)
    if problem:
        raise InvalidTaskInput(f"input holds {problem}, which cannot be stored")
    try:
        attributes_from_input(spec.search_attributes, cleaned)
    except AttributeRefused as exc:
        raise InvalidTaskInput(str(exc), details={"attribute": exc.name}) from None
    return cleaned


def check_idempotency_key(key: str) -> None:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidTaskInput("idempotency key must be 1 to 255 characters", details={"idempotency_key": key})
    if not all(32 <= ord(ch) < 127 for ch in key):
        raise InvalidTaskInput("idempotency key must be printable ASCII", details={"idempotency_key": key})


def resolve_deadline(deadline) -> tuple[datetime | None, float | None]:
    """(when, as submitted): an aware datetime stays; seconds or a timedelta count from now."""
    if deadline is None:
        return None, None
    if isinstance(deadline, datetime):
        if timezone.is_naive(deadline):
            raise InvalidTaskInput("deadline must be timezone-aware")
        return deadline, deadline.timestamp()
    seconds = _seconds_of(deadline)
    if seconds is None or not 0 < seconds <= MAX_DEADLINE_SECONDS:
        raise InvalidTaskInput("deadline must be a positive number of seconds (at most one year)")
    return timezone.now() + timedelta(seconds=seconds), seconds


def _seconds_of(value) -> float | None:
    """A timedelta or a number (not a bool) as seconds; None for anything else."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def resolve_start(run_at, deadline_at: datetime | None = None) -> tuple[datetime | None, datetime | float | None]:
    """(when, as submitted): an aware datetime stays; seconds or a timedelta count from now. A time already past
    starts the task at once; one at or after ``deadline_at`` is refused (the task could never run)."""
    if run_at is None:
        return None, None
    if isinstance(run_at, datetime):
        if timezone.is_naive(run_at):
            raise InvalidTaskInput("run_at must be timezone-aware", details={"run_at": run_at.isoformat()})
        if run_at > timezone.now() + timedelta(seconds=MAX_START_DELAY_SECONDS):
            raise InvalidTaskInput("run_at is at most one year ahead", details={"run_at": run_at.isoformat()})
        start_at, start = run_at, run_at
    else:
        seconds = _seconds_of(run_at)
        if seconds is None or not 0 <= seconds <= MAX_START_DELAY_SECONDS:
            raise InvalidTaskInput(
                "a start delay is 0 to 31,536,000 seconds (one year)", details={"run_at": str(run_at)}
            )
        start_at, start = timezone.now() + timedelta(seconds=seconds), seconds
    if deadline_at is not None and start_at >= deadline_at:
        raise InvalidTaskInput(
            "the start is not before the deadline: the task could never run",
            details={"run_at": start_at.isoformat(), "deadline": deadline_at.isoformat()},
        )
    return start_at, start
