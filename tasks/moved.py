"""Where the engine's modules went: an import of a module's old path fails with a message naming its new one.

The engine's flat modules were grouped into packages (``tasks/pipelines``, ``tasks/execution``,
``tasks/delivery``, ``tasks/submission``, ``tasks/outbound``, ``tasks/observability``, ``tasks/selectors``).
A project's own code, a setting (``RELIABILITY_WORKER_CLASS``, a ``LOGGING`` filter) or a test that still names
an old path gets an ``ImportError`` that says where the module is now, not a bare "No module named": nothing is
re-exported from the old paths, so no old path keeps working by accident and drifts.

Two kinds of old path:

- a module that is gone (``tasks.runner``, ``tasks.log_context``, ...): ``MovedModuleFinder``, appended to
  ``sys.meta_path`` when ``tasks`` is imported, answers only for the names of ``MOVED_MODULES``, and only once
  every other finder found nothing, so it never shadows a real module;
- a module that is now a package of the same name (``tasks.delivery``, ``tasks.outbound``, ``tasks.pipelines``,
  ``tasks.submission``): the package's ``__getattr__`` calls ``former_module_attribute``, which names the module
  the old name lives in now (``from tasks.submission import task_submit``: "from tasks import task_submit").

RQ jobs name their function by its path in Redis, where a job may outlive a deploy: the worker maps the two old
entry points to their new paths (``tasks.registry.LEGACY_ENTRY_POINTS``) instead of refusing their jobs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# old module -> its new module (or, for one that was split up, where its names went).
MOVED_MODULES = {
    "tasks.attempt_log": "tasks.observability.attempt_log",
    "tasks.attempts": "tasks.execution.attempts",
    "tasks.attributes": "tasks.pipelines.attributes",
    "tasks.batches": "tasks.submission.batches",
    "tasks.callback_pipeline": "tasks.outbound.callback_sending",
    "tasks.callback_urls": "tasks.outbound.callback_urls",
    "tasks.callbacks": "tasks.outbound.callback_events",
    "tasks.claim": "tasks.execution.claim",
    "tasks.classify": "tasks.execution.classify",
    "tasks.compensation": "tasks.execution.compensation",
    "tasks.compensation_plan": "tasks.execution.compensation_plan",
    "tasks.context": "tasks.execution.context",
    "tasks.heartbeat": "tasks.execution.heartbeat",
    "tasks.http": "tasks.outbound.http",
    "tasks.http_errors": "tasks.outbound.http_errors",
    "tasks.idempotency": "tasks.submission.idempotency",
    "tasks.interrupts": "tasks.execution.interrupts",
    "tasks.jobs": "tasks.delivery.jobs",
    "tasks.limits": "tasks.execution.gates",
    "tasks.limits_policy": "tasks.pipelines.limits",
    "tasks.log_context": "tasks.observability.log_fields",
    "tasks.metrics": "tasks.observability.metrics",
    "tasks.pipeline_changes": "tasks.pipelines.changes",
    "tasks.queues": "tasks.delivery.queues",
    "tasks.retry": "tasks.pipelines.retry",
    "tasks.runner": "tasks.execution.runner",
    "tasks.schedules": "tasks.pipelines.schedules",
    "tasks.signing": "tasks.outbound.signing",
    "tasks.step_waits": "tasks.execution.waits",
    "tasks.sweeper": "tasks.delivery.sweeper",
    "tasks.timeouts": "tasks.execution.timeouts",
    "tasks.tracing": "tasks.observability.tracing",
    "tasks.tracing_otel": "tasks.observability.otel",
    "tasks.worker": "tasks.delivery.worker",
    "tasks.services": (
        "tasks.task_submit (tasks.submission.submit); task_retry_from_checkpoint, task_retry_from_start, "
        "task_compensate, task_close and CLOSABLE_STATES are in tasks.lifecycle.operator"
    ),
}

# A module that became a package of the same name -> the module of the package that holds its names now.
FORMER_MODULES = {
    "tasks.delivery": "tasks.delivery.enqueue",
    "tasks.outbound": "tasks.outbound.policy",
    "tasks.pipelines": "tasks.pipelines.pipeline",
    "tasks.submission": "tasks.submission.submit",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Fails the import of a moved module's old path with the new path, once no other finder knows the name."""

    def find_spec(self, fullname, path, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        message = f"{fullname} was split up: {new}" if " " in new else f"{fullname} moved: it is {new} now"
        raise ModuleNotFoundError(message, name=fullname)


def finder_install() -> None:
    """Put the finder last on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def former_module_attribute(package: str, name: str):
    """For a package's ``__getattr__``: the ``ImportError`` naming where a name of the module it replaced lives
    now; an ``AttributeError`` for any other name (a submodule not imported yet is imported as usual)."""
    home = FORMER_MODULES.get(package)
    missing = AttributeError(f"module {package!r} has no attribute {name!r}")
    if home is None or name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is not None:
        raise missing
    if not hasattr(importlib.import_module(home), name):
        raise missing
    public = sys.modules["tasks"].__all__  # the public surface (tasks is imported before any of its modules)
    where = f"from tasks import {name}" if name in public else f"from {home} import {name}"
    # ImportError, not AttributeError: ``from tasks.submission import task_submit`` shows this message as it is.
    raise ImportError(f"{package} is a package now: {where}")
