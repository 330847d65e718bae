"""Submission over HTTP: the one submission flow, storing the first response byte for byte."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.api.errors import json_bytes
from tasks.lifecycle.cancellation import task_cancel
from tasks.models import TERMINAL_STATES, ApiClient, Task
from tasks.selectors import client_scope, task_representation
from tasks.submission import submission_create

CREATED = 201
OK = 200
ACCEPTED = 202


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


def api_task_cancel(*, client: ApiClient, task_id, reason: str, client_ip: str | None) -> tuple[int, bytes]:
    """Cancel ``client``'s task; (200 once it is cancelled or 202 while the cancel is under way, the task's JSON).

    Raises ``TaskNotCancellable`` (409) for a finished task and
    ``TaskNotActionable`` (404) for a task that is not the client's.
    """
    result = task_cancel(
        task_id=task_id, actor=f"client:{client.name}", reason=reason, client=client, client_ip=client_ip
    )
    task = Task.objects.get(pk=result.task.pk)
    status = OK if task.state in TERMINAL_STATES else ACCEPTED
    return status, json_bytes(task_representation(task))
