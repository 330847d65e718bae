"""Reads of tasks: states, the API's representation of a task, pages of the API's list, attribute search,
idempotency records."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
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
    WaitKind,
)
from tasks.pipelines.attributes import MAX_VALUE_LENGTH

logger = logging.getLogger(__name__)

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


def _waiting(task: Task) -> dict | None:
    """What a WAITING task waits for and until when; None for every other task."""
    if task.state != TaskState.WAITING:
        return None
    name = (task.current_step_name or None) if task.wait_for in (WaitKind.TIME, WaitKind.SIGNAL) else None
    return {"for": task.wait_for, "name": name, "until": task.retry_at}


def task_summary(task: Task) -> dict[str, Any]:
    names = _step_names(task)
    return {
        "id": str(task.pk),
        "pipeline": task.pipeline,
        "state": task.state,
        "current_step": _current_step_name(task, names),
        "failure": _failure(task),
        "cancel": _cancel(task),
        "waiting": _waiting(task),
        "attributes": task.attributes or {},
        "trace_id": task.trace_id or None,
        "deadline": task.deadline,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
    }


def task_representation(task: Task, *, just_created: bool = False, logs: bool = False) -> dict[str, Any]:
    """The task as the API shows it: state, steps (state, attempts, last error, each attempt's log), result, failure.

    ``just_created``: the task was created in this transaction, so it has no attempt and no checkpoint yet
    (the submission's answer needs no query). Without ``logs`` (the default, and a completion callback's body,
    which is the same JSON) each step's ``attempt_logs`` is null: up to 64 KB per attempt are read and sent
    only to who asks for them (``GET /api/v1/tasks/{id}?logs=true``).
    """
    names = _step_names(task)
    attempts, completed = [], set()
    if not just_created:
        columns = ["kind", "step_name", "outcome", "error_code", "error_message"]
        if logs:
            columns += ["attempt", "started_at", "finished_at", "log", "log_dropped"]
        attempts = list(
            StepAttempt.objects.filter(task_id=task.pk, generation=task.generation)
            .order_by("started_at", "id")
            .values(*columns)
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
                "attempt_logs": _attempt_logs(attempts, name) if logs else None,
            }
        )
    return {
        **task_summary(task),
        "steps": steps,
        "result": task.result if task.state == TaskState.SUCCEEDED else None,
    }


def _attempt_logs(attempts: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    """What the step logged in each of its attempts and its compensation's (redacted when they were stored)."""
    return [
        {
            "kind": attempt["kind"],
            "attempt": attempt["attempt"],
            "outcome": attempt["outcome"],
            "started_at": attempt["started_at"],
            "finished_at": attempt["finished_at"],
            "log": attempt["log"] or [],
            "log_dropped": attempt["log_dropped"],
        }
        for attempt in attempts
        if attempt["step_name"] == step and attempt["kind"] in (AttemptKind.STEP, AttemptKind.COMPENSATION)
    ]


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
    *,
    client: ApiClient,
    state: str | None,
    pipeline: str | None,
    cursor: str | None,
    limit: int,
    attributes: Sequence[tuple[str, str]] = (),
) -> tuple[list[Task], str | None]:
    """The client's tasks, newest first; keyset pagination on (created_at, id). ``attributes``: (name, value)
    pairs a task must all have (``tasks.pipelines.attributes``)."""
    tasks = Task.objects.filter(client=client)
    if state:
        tasks = tasks.filter(state=state)
    if pipeline:
        tasks = tasks.filter(pipeline=pipeline)
    for name, value in attributes:
        tasks = tasks.filter(attribute_condition(name, value))
    if cursor:
        created_at, last_id = decode_cursor(cursor)
        tasks = tasks.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=last_id))
    page = list(tasks.order_by("-created_at", "-id")[: limit + 1])
    next_cursor = encode_cursor(page[limit - 1]) if len(page) > limit else None
    return page[:limit], next_cursor


# The longest value a search attribute holds: the console tells a longer search term it finds nothing.
ATTRIBUTE_VALUE_MAX = MAX_VALUE_LENGTH


def attribute_search(term: str) -> tuple[str, str] | None:
    """A search term of the console naming a search attribute a pipeline declares, ``order_id:A1001``: (name,
    value), the value as typed (its length is the caller's to check against ``ATTRIBUTE_VALUE_MAX``); None for
    any other term, which is searched as before."""
    name, colon, value = term.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not value:
        return None
    declared = {attribute for pipeline in registry.all_pipelines() for attribute in pipeline.search_attributes}
    return (name, value) if name in declared else None


def attribute_condition(name: str, value: str) -> Q:
    """Tasks whose search attribute ``name`` is ``value``.

    On PostgreSQL a containment (``attributes @> {name: value}``) that the GIN index answers; elsewhere (SQLite
    for local use) the key's value read with JSON_EXTRACT.
    """
    if connection.vendor == "postgresql":
        return Q(attributes__contains={name: value})
    return Q(**{f"attributes__{name}": value})


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
