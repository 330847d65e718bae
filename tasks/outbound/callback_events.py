"""Completion callbacks: which URLs a submission may name, and the one callback task per terminal event.

A task submitted with a ``callback_url`` gets, when it reaches a terminal
state (succeeded, compensated, compensation_failed, or failed when its
pipeline parks failures), one POST of ``{"event": "task.<state>", "task":
<the task as GET /api/v1/tasks/{id} shows it>}``. The POST is a task of the
engine itself (``tasks.outbound.callback_sending``): retries, a deadline and a dead
letter when the receiver keeps failing, and nothing of it touches the
original task.

The callback task is created in the transaction that moves the original task
to its terminal state (``tasks.lifecycle.outcomes``), so a crash loses no callback;
its submission is idempotent on (task, event, generation) in its own scope,
so a repeat of the same outcome never makes a second one. The body is taken
at that moment (the task as it finished, the same bytes on every attempt).

Only hosts in ``RELIABILITY_CALLBACK_ALLOWED_HOSTS`` are ever called, never at
a link-local or metadata address (``tasks.outbound.policy``: checked at submission
and again, with the name resolved, before each attempt; redirects are not
followed), so a client cannot make our servers call an address of its
choosing.
"""

from __future__ import annotations

import logging

from tasks.api.errors import json_bytes
from tasks.conf import engine_settings
from tasks.exceptions import IdempotencyKeyReused
from tasks.models import Task, TaskState
from tasks.observability.log_fields import task_fields
from tasks.selectors.tasks import task_representation
from tasks.submission.submit import submission_create

logger = logging.getLogger(__name__)

CALLBACK_PIPELINE = "task_callback"
# Submission scope of callback tasks: their keys never meet a client's or a Python caller's.
CALLBACK_SCOPE = "callback"
CALLBACK_STATES = frozenset(
    {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.COMPENSATED,
        TaskState.COMPENSATION_FAILED,
        TaskState.CANCELLED,
    }
)


def callback_event(state: str) -> str:
    return f"task.{state}"


def callback_submit(*, task: Task) -> Task | None:
    """Create the callback task of ``task``'s terminal state; call in the transaction that reached it.

    Returns None when the task asked for no callback, when its state sends
    none, or when this (task, event, generation) already has its callback.
    """
    if not task.callback_url or task.state not in CALLBACK_STATES:
        return None
    event = callback_event(task.state)
    key = f"{task.pk}-{event}-g{task.generation}"
    # The task as GET shows it by default: without the attempts' logs (up to 64 KB each), which the receiver
    # fetches with ?logs=true when it wants them (the body is stored in the callback task's input).
    body = json_bytes({"event": event, "task": task_representation(task)})
    callback_input = {
        "task_id": str(task.pk),
        "event": event,
        "generation": task.generation,
        "url": task.callback_url,
        "client_id": task.client_id,
        "body": body.decode(),
    }
    try:
        submission = submission_create(
            pipeline=CALLBACK_PIPELINE,
            input=callback_input,
            idempotency_key=key,
            scope=CALLBACK_SCOPE,
            deadline=engine_settings.CALLBACK_DEADLINE_SECONDS,
        )
    except IdempotencyKeyReused:
        submission = None
    if submission is None or submission.replayed:
        # The same event of the same generation again (an operator retried the task and it ended
        # the same way): its receiver was told once; one callback per task, event and generation.
        logger.info(
            "callback already made for this event",
            extra={"event": "callback_duplicate", **task_fields(task), "callback_event": event},
        )
        return None
    callback = submission.created
    logger.info(
        "callback created",
        extra={
            "event": "callback_created",
            **task_fields(task),
            "callback_task_id": str(callback.pk),
            "callback_event": event,
        },
    )
    return callback
