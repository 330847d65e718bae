"""Reliability Console's engine: durable, retried, dead-lettered pipelines of steps on RQ and PostgreSQL.

What a project that uses the engine imports, from here::

    from tasks import Pipeline, RetryPolicy, TransientError, task_submit

Each name is loaded on first use (PEP 562), so importing ``tasks`` loads no model before Django's apps are
ready (``INSTALLED_APPS`` names this package). Everything else is the engine's own: the write door
(``tasks.lifecycle``), reads (``tasks.selectors``), models (``tasks.models``), the pipeline registry
(``tasks.registry``).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it.
_PUBLIC = {
    "Pipeline": "tasks.pipelines",
    "FailurePolicy": "tasks.pipelines",
    "Schedule": "tasks.schedules",
    "RetryPolicy": "tasks.retry",
    "StepContext": "tasks.context",
    "task_submit": "tasks.submission",
    "task_submit_many": "tasks.batches",
    "BatchItem": "tasks.batches",
    "BatchOutcome": "tasks.batches",
    "task_cancel": "tasks.lifecycle.cancellation",
    "task_signal": "tasks.lifecycle.signals",
    "ReliabilityError": "tasks.exceptions",
    "TransientError": "tasks.exceptions",
    "PermanentError": "tasks.exceptions",
    "EffectRequired": "tasks.exceptions",
    "StepTimeout": "tasks.exceptions",
    "StepCancelled": "tasks.exceptions",
    "ConfigurationError": "tasks.exceptions",
    "UnknownPipeline": "tasks.exceptions",
    "InvalidTaskInput": "tasks.exceptions",
    "IdempotencyKeyReused": "tasks.exceptions",
    "IdempotencyKeyInUse": "tasks.exceptions",
    "TaskNotCancellable": "tasks.exceptions",
    "TaskNotActionable": "tasks.exceptions",
    "BatchRefused": "tasks.exceptions",
    "UnknownSignal": "tasks.exceptions",
    "SignalAlreadyReceived": "tasks.exceptions",
    "TaskFinished": "tasks.exceptions",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
