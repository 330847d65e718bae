"""Submission over HTTP: the idempotent create, storing the first response byte for byte."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from tasks import registry
from tasks.api.errors import json_bytes
from tasks.idempotency import idempotency_abandon, idempotency_begin, idempotency_complete
from tasks.models import ApiClient
from tasks.selectors import client_scope, task_representation
from tasks.services import canonical_json, clean_input, resolve_deadline, task_create

CREATED = 201


@dataclass(frozen=True)
class ApiResponse:
    status: int
    body: bytes
    replayed: bool = False


def body_fingerprint(body: Any) -> str:
    """The request fingerprint: SHA-256 of the canonical JSON of the request body."""
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def api_task_submit(*, client: ApiClient, body: dict[str, Any], idempotency_key: str | None) -> ApiResponse:
    """Create a task for ``client`` from a validated request body, honouring ``Idempotency-Key``.

    Raises the engine's errors (UnknownPipeline, InvalidTaskInput,
    IdempotencyKeyReused, IdempotencyKeyInUse); nothing is stored then.
    """
    reservation = None
    fingerprint = body_fingerprint(body)
    if idempotency_key is not None:
        reservation = idempotency_begin(scope=client_scope(client), key=idempotency_key, fingerprint=fingerprint)
        if not reservation.owned:
            record = reservation.record
            return ApiResponse(status=record.response_status, body=bytes(record.response_body), replayed=True)
    try:
        spec = registry.get(body["pipeline"])
        cleaned = clean_input(spec, body["input"])
        deadline_at, _ = resolve_deadline(body.get("deadline_seconds"))
        with transaction.atomic():
            task = task_create(
                spec=spec,
                input=cleaned,
                deadline=deadline_at,
                client=client,
                scope=client_scope(client),
                key=idempotency_key,
                fingerprint=fingerprint,
            )
            payload = json_bytes(task_representation(task))
            if reservation is not None:
                idempotency_complete(record=reservation.record, task=task, status=CREATED, body=payload)
    except BaseException:
        if reservation is not None:
            idempotency_abandon(record=reservation.record)
        raise
    return ApiResponse(status=CREATED, body=payload)
