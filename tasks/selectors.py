"""Reads on tasks: states, the API representation, pages, idempotency records."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from tasks import registry
from tasks.exceptions import InvalidTaskInput, UnknownPipeline
from tasks.models import (
    ApiClient,
    AttemptKind,
    AttemptOutcome,
    Checkpoint,
    IdempotencyRecord,
    StepAttempt,
    Task,
    TaskState,
)

FAILED_STATES = {TaskState.FAILED, TaskState.COMPENSATING, TaskState.COMPENSATED, TaskState.COMPENSATION_FAILED}


def task_states(*, task_ids: list[uuid.UUID]) -> dict[str, str]:
    """{task id: state} for the given ids; unknown ids map to "missing"."""
    found = {str(pk): state for pk, state in Task.objects.filter(pk__in=task_ids).values_list("pk", "state")}
    return {str(pk): found.get(str(pk), "missing") for pk in task_ids}


def _step_names(task: Task) -> list[str]:
    # The names the task recorded (it runs on them); the declaration for rows written without them.
    if task.step_names:
        return list(task.step_names)
    try:
        return [step.name for step in registry.get(task.pipeline).steps]
    except UnknownPipeline:
        return []


def _current_step_name(task: Task, names: list[str]) -> str | None:
    if task.state == TaskState.SUCCEEDED or task.current_step >= len(names):
        return None
    return names[task.current_step]


def _failure(task: Task) -> dict | None:
    if not task.failure_reason:
        return None
    return {
        "reason": task.failure_reason,
        "code": task.failure_code,
        "message": task.failure_message,
        "step": task.failed_step or None,
    }


def _cancel(task: Task) -> dict | None:
    if task.cancel_requested_at is None:
        return None
    return {"requested_at": task.cancel_requested_at, "reason": task.cancel_reason}


def task_summary(task: Task) -> dict[str, Any]:
    names = _step_names(task)
    return {
        "id": str(task.pk),
        "pipeline": task.pipeline,
        "state": task.state,
        "current_step": _current_step_name(task, names),
        "failure": _failure(task),
        "cancel": _cancel(task),
        "deadline": task.deadline,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
    }


def task_representation(task: Task) -> dict[str, Any]:
    """The task as the API shows it: state, steps (state, attempts, last error), result, failure."""
    names = _step_names(task)
    attempts = list(
        StepAttempt.objects.filter(task_id=task.pk, generation=task.generation)
        .order_by("started_at", "id")
        .values("kind", "step_name", "outcome", "error_code", "error_message")
    )
    completed = set(Checkpoint.objects.filter(task_id=task.pk).values_list("step_name", flat=True))
    steps = []
    for index, name in enumerate(names):
        tries = [a for a in attempts if a["kind"] == AttemptKind.STEP and a["step_name"] == name]
        errors = [a for a in tries if a["outcome"] != AttemptOutcome.SUCCEEDED]
        compensated = any(
            a["kind"] == AttemptKind.COMPENSATION and a["step_name"] == name and a["outcome"] == "succeeded"
            for a in attempts
        )
        steps.append(
            {
                "name": name,
                "state": _step_state(task, index, name, completed, compensated),
                "attempts": len(tries),
                "last_error_code": errors[-1]["error_code"] if errors else None,
                "last_error_message": errors[-1]["error_message"] if errors else None,
            }
        )
    return {
        **task_summary(task),
        "steps": steps,
        "result": task.result if task.state == TaskState.SUCCEEDED else None,
    }


def _step_state(task: Task, index: int, name: str, completed: set[str], compensated: bool) -> str:
    if compensated:
        return "compensated"
    if name in completed:
        return "succeeded"
    if index == task.current_step:
        if task.state == TaskState.RUNNING:
            return "running"
        if task.state == TaskState.RETRY_SCHEDULED:
            return "retry_scheduled"
        if task.is_cancelled and task.failed_step == name and task.state != TaskState.RUNNING:
            return "cancelled"  # where the cancel stopped it (interrupted, or not started)
        if task.state in FAILED_STATES and task.failed_step == name:
            return "failed"
    return "pending"


def task_for_client(*, client: ApiClient, task_id: str) -> Task | None:
    try:
        pk = uuid.UUID(task_id)
    except ValueError:
        return None
    return Task.objects.filter(pk=pk, client=client).first()


def task_page(
    *, client: ApiClient, state: str | None, pipeline: str | None, cursor: str | None, limit: int
) -> tuple[list[Task], str | None]:
    """The client's tasks, newest first; keyset pagination on (created_at, id)."""
    tasks = Task.objects.filter(client=client)
    if state:
        tasks = tasks.filter(state=state)
    if pipeline:
        tasks = tasks.filter(pipeline=pipeline)
    if cursor:
        created_at, last_id = decode_cursor(cursor)
        tasks = tasks.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=last_id))
    page = list(tasks.order_by("-created_at", "-id")[: limit + 1])
    next_cursor = encode_cursor(page[limit - 1]) if len(page) > limit else None
    return page[:limit], next_cursor


def encode_cursor(task: Task) -> str:
    raw = json.dumps([task.created_at.isoformat(), str(task.pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created_at, last_id = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        when = datetime.fromisoformat(created_at)
        if timezone.is_naive(when):
            raise ValueError("naive")
        return when, uuid.UUID(last_id)
    except (ValueError, TypeError, UnicodeError):
        raise InvalidTaskInput("cursor is not valid", details={"cursor": "not a cursor this API returned"}) from None


def idempotency_record_for_client(*, client: ApiClient, key: str) -> IdempotencyRecord | None:
    return IdempotencyRecord.objects.filter(scope=client_scope(client), key=key, expires_at__gt=timezone.now()).first()


def client_scope(client: ApiClient) -> str:
    return f"client:{client.pk}"
