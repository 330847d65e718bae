"""Submission over HTTP: the one submission flow, storing the first response byte for byte."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.api.errors import json_bytes
from tasks.models import ApiClient, Task
from tasks.selectors import client_scope, task_representation
from tasks.submission import submission_create

CREATED = 201


@dataclass(frozen=True)
class ApiResponse:
    status: int
    body: bytes
    replayed: bool = False


def api_task_submit(*, client: ApiClient, body: dict[str, Any], idempotency_key: str | None) -> ApiResponse:
    """Create a task for ``client`` from a validated request body, honouring ``Idempotency-Key``.

    Raises the engine's errors (UnknownPipeline, InvalidTaskInput,
    IdempotencyKeyReused, IdempotencyKeyInUse); nothing is stored then.
    """

    def respond(task: Task) -> tuple[int, bytes]:
        return CREATED, json_bytes(task_representation(task))

    submission = submission_create(
        pipeline=body["pipeline"],
        input=body["input"],
        deadline=body.get("deadline_seconds"),
        idempotency_key=idempotency_key,
        scope=client_scope(client),
        client=client,
        respond=respond,
        callback_url=body.get("callback_url"),
    )
    return ApiResponse(submission.response_status, submission.response_body, submission.replayed)
