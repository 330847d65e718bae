"""Reliability Console's engine: durable, retried, dead-lettered pipelines of steps on RQ and PostgreSQL.

What a project that uses the engine imports, from here::

    from tasks import Pipeline, RetryPolicy, TransientError, task_submit

Each name is loaded on first use (PEP 562), so importing ``tasks`` loads no model before Django's apps are
ready (``INSTALLED_APPS`` names this package). Everything else is the engine's own: the write door
(``tasks.lifecycle``), reads (``tasks.selectors``), models (``tasks.models``), the pipeline registry
(``tasks.registry``), and the packages that group the rest: declaring pipelines (``tasks.pipelines``), running
steps (``tasks.execution``), delivery and workers (``tasks.delivery``), submission (``tasks.submission``),
outbound HTTP and callbacks (``tasks.outbound``), logs, traces and metrics (``tasks.observability``).
"""

from __future__ import annotations

from tasks import moved
from tasks.exports import lazy_exports

# An old module path (tasks.runner, tasks.worker, ...) fails with its new one (tasks.moved).
moved.finder_install()

# name -> the module that defines it.
_PUBLIC = {
    "Pipeline": "tasks.pipelines.pipeline",
    "FailurePolicy": "tasks.pipelines.pipeline",
    "Schedule": "tasks.pipelines.schedules",
    "RetryPolicy": "tasks.pipelines.retry",
    "StepContext": "tasks.execution.context",
    "task_submit": "tasks.submission.submit",
    "task_submit_many": "tasks.submission.batches",
    "BatchItem": "tasks.submission.batches",
    "BatchOutcome": "tasks.submission.batches",
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


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
