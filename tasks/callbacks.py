"""Completion callbacks: which URLs a submission may name, and the one callback task per terminal event.

A task submitted with a ``callback_url`` gets, when it reaches a terminal
state (succeeded, compensated, compensation_failed, or failed when its
pipeline parks failures), one POST of ``{"event": "task.<state>", "task":
<the task as GET /api/v1/tasks/{id} shows it>}``. The POST is a task of the
engine itself (``tasks.callback_pipeline``): retries, a deadline and a dead
letter when the receiver keeps failing, and nothing of it touches the
original task.

The callback task is created in the transaction that moves the original task
to its terminal state (``tasks.outcomes``), so a crash loses no callback;
its submission is idempotent on (task, event, generation) in its own scope,
so a repeat of the same outcome never makes a second one. The body is taken
at that moment (the task as it finished, the same bytes on every attempt).

Only hosts in ``RELIABILITY_CALLBACK_ALLOWED_HOSTS`` are ever called (checked
at submission and again before each attempt; redirects are not followed), so
a client cannot make our servers call an address of its choosing.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

from django.conf import settings

from tasks.api.errors import json_bytes
from tasks.exceptions import IdempotencyKeyReused, InvalidTaskInput
from tasks.models import Task, TaskState
from tasks.selectors import task_representation

logger = logging.getLogger(__name__)

CALLBACK_PIPELINE = "task_callback"
# Submission scope of callback tasks: their keys never meet a client's or a Python caller's.
CALLBACK_SCOPE = "callback"
# Browsers and proxies handle about this much; a longer URL is a mistake or an attack.
MAX_CALLBACK_URL_LENGTH = 2048
CALLBACK_STATES = frozenset(
    {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.COMPENSATED,
        TaskState.COMPENSATION_FAILED,
        TaskState.CANCELLED,
    }
)
DEFAULT_PORTS = {"http": 80, "https": 443}


def callback_url_check(url: Any) -> str:
    """``url`` if the engine may POST to it, else ``InvalidTaskInput`` (the API's 400 ``validation_error``).

    An http(s) URL of at most ``MAX_CALLBACK_URL_LENGTH`` printable ASCII
    characters, without credentials, whose host (and port) is allowed.
    """
    if not isinstance(url, str):
        raise _refused("callback_url must be a string")
    if not settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS:
        raise _refused("callbacks are off on this server (RELIABILITY_CALLBACK_ALLOWED_HOSTS is empty)")
    if not 1 <= len(url) <= MAX_CALLBACK_URL_LENGTH:
        raise _refused(f"callback_url must be 1 to {MAX_CALLBACK_URL_LENGTH} characters")
    if not all(33 <= ord(ch) < 127 for ch in url):
        raise _refused("callback_url must be printable ASCII without spaces (an IDN host in its xn-- form)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refused("callback_url is not a valid URL") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise _refused("callback_url must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise _refused("callback_url must not hold credentials (user:password@)")
    if not parts.hostname:
        raise _refused("callback_url has no host")
    if not callback_host_allowed(parts.hostname, port or DEFAULT_PORTS[parts.scheme]):
        raise _refused(f"callback_url's host {parts.hostname!r} is not allowed on this server")
    return url


def callback_host_allowed(host: str, port: int) -> bool:
    """Whether ``host:port`` matches an entry of ``RELIABILITY_CALLBACK_ALLOWED_HOSTS`` (exactly, no wildcards)."""
    host = host.lower().strip("[]")
    for entry in settings.RELIABILITY_CALLBACK_ALLOWED_HOSTS:
        allowed = urllib.parse.urlsplit(f"//{entry}")
        if (allowed.hostname or "").strip("[]") == host and allowed.port in (None, port):
            return True
    return False


def callback_event(state: str) -> str:
    return f"task.{state}"


def callback_submit(*, task: Task) -> Task | None:
    """Create the callback task of ``task``'s terminal state; call in the transaction that reached it.

    Returns None when the task asked for no callback, when its state sends
    none, or when this (task, event, generation) already has its callback.
    """
    if not task.callback_url or task.state not in CALLBACK_STATES:
        return None
    # A submission imports this module's checks; import it here to keep the import graph a tree.
    from tasks.submission import submission_create

    event = callback_event(task.state)
    key = f"{task.pk}-{event}-g{task.generation}"
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
            deadline=settings.RELIABILITY_CALLBACK_DEADLINE_SECONDS,
        )
    except IdempotencyKeyReused:
        submission = None
    if submission is None or submission.replayed:
        # The same event of the same generation again (an operator retried the task and it ended
        # the same way): its receiver was told once; one callback per task, event and generation.
        logger.info(
            "callback already made for this event",
            extra={"event": "callback_duplicate", "task_id": str(task.pk), "callback_event": event},
        )
        return None
    callback = submission.created
    logger.info(
        "callback created",
        extra={
            "event": "callback_created",
            "task_id": str(task.pk),
            "callback_task_id": str(callback.pk),
            "callback_event": event,
        },
    )
    return callback


def _refused(message: str) -> InvalidTaskInput:
    return InvalidTaskInput(message, details={"callback_url": message})
