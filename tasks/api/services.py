"""Submission over HTTP: the one submission flow, storing the first response byte for byte."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.api.errors import engine_error_status, json_bytes
from tasks.lifecycle.cancellation import task_cancel
from tasks.models import TERMINAL_STATES, ApiClient, Task
from tasks.selectors.tasks import client_scope, task_representation
from tasks.submission.batches import BatchOutcome, submission_create_many
from tasks.submission.submit import submission_create

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
        return CREATED, json_bytes(task_representation(task, just_created=True))

    submission = submission_create(
        pipeline=body["pipeline"],
        input=body["input"],
        deadline=body.get("deadline_seconds"),
        idempotency_key=idempotency_key,
        scope=client_scope(client),
        client=client,
        respond=respond,
        callback_url=body.get("callback_url"),
        run_at=requested_start(body),
    )
    return ApiResponse(submission.response_status, submission.response_body, submission.replayed)


def requested_start(body: dict[str, Any]):
    """The start a submission's body asks for: ``run_at`` (a time) or ``delay_seconds`` (the schema allows one), or
    None."""
    run_at = body.get("run_at")
    return run_at if run_at is not None else body.get("delay_seconds")


def api_task_submit_many(*, client: ApiClient, items: list[dict[str, Any]], atomic: bool) -> bytes:
    """Create ``client``'s tasks of a validated batch body; the response body, each item as its own answer.

    A new task's item carries the JSON a single submission would have answered (stored with its key, as that
    one's is); a replay carries its key's first answer byte for byte; a refused item its error. Raises
    ``BatchRefused`` for an atomic batch with a bad item (nothing stored).
    """

    def respond(task: Task) -> tuple[int, bytes]:
        return CREATED, json_bytes(task_representation(task, just_created=True))

    outcomes = submission_create_many(
        [
            {
                "pipeline": item["pipeline"],
                "input": item["input"],
                "deadline": item.get("deadline_seconds"),
                "idempotency_key": item.get("idempotency_key"),
                "callback_url": item.get("callback_url"),
                "run_at": requested_start(item),
            }
            for item in items
        ],
        scope=client_scope(client),
        client=client,
        atomic=atomic,
        respond=respond,
    )
    return b'{"items":[' + b",".join(_batch_item(outcome, client) for outcome in outcomes) + b"]}"


def _batch_item(outcome: BatchOutcome, client: ApiClient) -> bytes:
    head = f'{{"index":{outcome.index},'.encode()
    if outcome.error is not None:
        status, code = engine_error_status(outcome.error)
        error = {"code": code, "message": outcome.error.message, "details": outcome.error.details or None}
        return head + f'"status":{status},"replayed":false,"task":null,"error":'.encode() + json_bytes(error) + b"}"
    body = outcome.response_body
    if body is None:  # a key first used by a submission that stored no answer
        body = json_bytes(task_representation(Task.objects.get(pk=outcome.task_id, client=client)))
    status = outcome.response_status or CREATED
    replayed = "true" if outcome.replayed else "false"
    return head + f'"status":{status},"replayed":{replayed},"task":'.encode() + body + b',"error":null}'


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
