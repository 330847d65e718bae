"""Signals to a task (``Pipeline.wait``): kept once per task and name, and a task waiting for one woken by it.

The sender locks the task's row, so a signal and the task reaching its wait cannot miss each other: either the
sender finds the task waiting for it and wakes it, or the task's wait (``tasks.lifecycle.waits``), which writes
the row under the same lock, finds the signal and goes on. A signal sent before the task gets to its wait is
consumed there.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from tasks import registry
from tasks.exceptions import (
    IdempotencyKeyReused,
    InvalidTaskInput,
    SignalAlreadyReceived,
    TaskFinished,
    TaskNotActionable,
    UnknownPipeline,
    UnknownSignal,
)
from tasks.json_text import unstorable_json
from tasks.lifecycle.deliveries import wait_ended
from tasks.models import TERMINAL_STATES, Signal, Task, TaskState, WaitKind
from tasks.models.door import door
from tasks.observability.log_fields import task_fields
from tasks.redaction import task_redactor

logger = logging.getLogger(__name__)

# The largest payload a signal carries, as JSON.
SIGNAL_PAYLOAD_MAX_BYTES = 65536


@dataclass(frozen=True)
class SignalResult:
    signal: Signal
    # True: this signal was already received with this payload; nothing was written (the first answer again).
    replayed: bool
    # True: the task was waiting for it and is delivered again.
    woke: bool


def signal_payload_text(payload: Any) -> str:
    """``payload`` as canonical JSON (its fingerprint's text); ``InvalidTaskInput`` when it cannot be a signal's."""
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskInput(f"a signal's payload is JSON: {exc}", details={"payload": str(exc)}) from None
    if len(text.encode()) > SIGNAL_PAYLOAD_MAX_BYTES:
        raise InvalidTaskInput(
            f"a signal's payload is at most {SIGNAL_PAYLOAD_MAX_BYTES} bytes of JSON",
            details={"payload": f"at most {SIGNAL_PAYLOAD_MAX_BYTES} bytes"},
        )
    problem = unstorable_json(text, payload)
    if problem:
        raise InvalidTaskInput(f"a signal's payload holds {problem}", details={"payload": problem})
    return text


@door
def task_signal(
    *,
    task_id,
    name: str,
    payload: Any = None,
    client=None,
    sent_by: str = "python",
    idempotency_key: str = "",
) -> SignalResult:
    """Send the signal ``name`` with ``payload`` (JSON) to the task ``task_id``; wake it if it waits for it.

    ``client``: only that API client's task (another's is "no such task", ``TaskNotActionable``). The same
    signal again with the same payload is the first one (``replayed``); with another payload
    ``SignalAlreadyReceived``. ``UnknownSignal`` when the task's pipeline has no wait of that name,
    ``TaskFinished`` when the task has finished. Nothing is written on a refusal.
    """
    text = signal_payload_text(payload)
    fingerprint = hashlib.sha256(text.encode()).hexdigest()
    with transaction.atomic():
        tasks = Task.objects.select_for_update()
        if client is not None:
            tasks = tasks.filter(client=client)
        try:
            task = tasks.filter(pk=task_id).first()
        except ValidationError:
            task = None
        if task is None:
            raise TaskNotActionable("no such task", code="no_such_task")
        received = Signal.objects.filter(task=task, name=name).first()
        if received is not None:
            if received.payload_fingerprint == fingerprint:
                return SignalResult(signal=received, replayed=True, woke=False)
            raise SignalAlreadyReceived(
                f"the task already received the signal {name!r}, with another payload", details={"name": name}
            )
        if idempotency_key and Signal.objects.filter(task=task, idempotency_key=idempotency_key).exists():
            raise IdempotencyKeyReused("this Idempotency-Key was used for another signal of the task")
        try:
            pipeline = registry.get(task.pipeline)
        except UnknownPipeline:
            pipeline = None
        if pipeline is None or pipeline.wait_step(name) is None:
            raise UnknownSignal(
                f"pipeline {task.pipeline!r} waits for no signal {name!r}",
                details={"name": name, "pipeline": task.pipeline},
            )
        if task.state in TERMINAL_STATES:
            raise TaskFinished(f"the task is {task.state}: no wait of it will come", state=task.state)
        signal = Signal.objects.create(
            task=task,
            name=name,
            # Stored redacted, as a step's output is (the fingerprint is of what was sent).
            payload=task_redactor(task).value(json.loads(text)),
            payload_fingerprint=fingerprint,
            idempotency_key=idempotency_key,
            sent_by=sent_by[:200],
        )
        woke = task.state == TaskState.WAITING and task.wait_for == WaitKind.SIGNAL and task.current_step_name == name
        if woke:
            wait_ended(task=task)
    logger.info(
        "signal received",
        extra={"event": "signal_received", **task_fields(task), "signal": name, "woke": woke, "by": sent_by},
    )
    return SignalResult(signal=signal, replayed=False, woke=woke)
