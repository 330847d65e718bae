"""``ReliabilityBackend``: Django's Tasks framework (``@task``, ``.enqueue()``) run by this engine.

Configure it as a backend of ``TASKS``::

    TASKS = {"default": {"BACKEND": "tasks.backends.ReliabilityBackend", "OPTIONS": {"MAX_ATTEMPTS": 3}}}

Each ``@task`` call becomes an engine task of a one-step pipeline (retries of
transient errors with backoff, a timeout, a deadline, a dead letter and the
console for what fails). A backend has one such pipeline per engine queue,
``django_task_<alias>_<queue>``, because the queue of a task's jobs is its
pipeline's (``tasks.delivery.queues``): ``priority`` picks the pipeline. The step
imports the function by its module path and runs it only when it is an
``@task`` of this backend: workers run registered code only, and the path
comes from a row anyone with a client token could have submitted.

On Django 6 this implements ``django.tasks``; on Django 5.2 the backport,
``django_tasks`` (the extra ``reliability-console[tasks]``).
"""

from __future__ import annotations

import importlib
import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

try:  # Django 6.0 and later
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task as DjangoTask
    from django.tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTaskBackend as InvalidTaskBackendError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2 with the backport
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task as DjangoTask
    from django_tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskBackendError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued
    from django_tasks.utils import normalize_json

from tasks import registry
from tasks.delivery.queues import default_queue, queue_names
from tasks.exceptions import ConfigurationError, InvalidTaskInput, UnknownPipeline
from tasks.models import AttemptKind, AttemptOutcome, StepAttempt, Task, TaskState
from tasks.observability.log_fields import attempt_fields
from tasks.pipelines.pipeline import FailurePolicy, Pipeline
from tasks.pipelines.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from tasks.submission.submit import submission_create

logger = logging.getLogger(__name__)

BACKEND_PATH = "tasks.backends.ReliabilityBackend"
PIPELINE_PREFIX = "django_task_"
STEP_NAME = "call"
# What a task's input holds: the call as enqueued.
CALL_FIELDS = frozenset({"task", "args", "kwargs", "priority", "queue_name", "run_after"})

# The backend's OPTIONS and their defaults (None: the engine's own default applies).
DEFAULT_OPTIONS: dict[str, float | int | None] = {
    "MAX_ATTEMPTS": DEFAULT_RETRY_POLICY.max_attempts,
    "RETRY_BASE_SECONDS": DEFAULT_RETRY_POLICY.base_delay,
    "RETRY_MAX_SECONDS": DEFAULT_RETRY_POLICY.max_delay,
    "TIMEOUT_SECONDS": None,  # RELIABILITY_DEFAULT_STEP_TIMEOUT_SECONDS
    "DEADLINE_SECONDS": None,  # no deadline
}

# An engine task's state as the framework's four statuses: waiting (also for a retry or a start time),
# running (also while undoing), succeeded, and ended any other way.
STATUS_OF_STATE = {
    TaskState.QUEUED: TaskResultStatus.READY,
    TaskState.RETRY_SCHEDULED: TaskResultStatus.READY,
    TaskState.WAITING: TaskResultStatus.READY,
    TaskState.RUNNING: TaskResultStatus.RUNNING,
    TaskState.COMPENSATING: TaskResultStatus.RUNNING,
    TaskState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
}
# A lost worker raised nothing in the task: its error names what happened.
CRASHED_ERROR_CLASS = "tasks.exceptions.LeaseLost"


def pipeline_name(alias: str, queue: str) -> str:
    return f"{PIPELINE_PREFIX}{alias.lower()}_{queue}"


class ReliabilityBackend(BaseTaskBackend):
    """Runs ``@task`` functions as one-step engine tasks on the RQ workers (see the module's docstring)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.settings = options_check(alias, self.options)
        self.pipelines = {queue: _pipeline_for(self, queue) for queue in queue_names()}

    # --- enqueue ------------------------------------------------------------------

    def enqueue(self, task: DjangoTask, args: Any, kwargs: Any) -> TaskResult:
        """Store the call as an engine task in the caller's transaction; it is delivered after commit."""
        self.validate_task(task)
        # The framework's own check (and error) for arguments that are not JSON, before anything is stored.
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        start = task.run_after or timezone.now()
        deadline = self.settings["DEADLINE_SECONDS"]
        submission = submission_create(
            pipeline=self.pipelines[self.queue_for(task.priority)].name,
            input={
                "task": task.module_path,
                "args": args,
                "kwargs": kwargs,
                "priority": task.priority,
                "queue_name": task.queue_name,
                "run_after": task.run_after.isoformat() if task.run_after else None,
            },
            deadline=start + timedelta(seconds=deadline) if deadline else None,
            run_at=task.run_after,
        )
        row = submission.created
        result = TaskResult(
            task=task,
            id=str(row.pk),
            status=TaskResultStatus.READY,
            enqueued_at=row.created_at,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def queue_for(self, priority: int) -> str:
        """The engine queue of a priority: above the default first, below it last, the default in between."""
        names = queue_names()
        if priority > 0:
            return names[0]
        if priority < 0:
            return names[-1]
        return default_queue()

    # --- results --------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The engine task ``result_id`` as a ``TaskResult``; ``TaskResultDoesNotExist`` when it is not ours."""
        try:
            task_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        pipelines = [pipeline.name for pipeline in self.pipelines.values()]
        row = Task.objects.filter(pk=task_id, pipeline__in=pipelines).first()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result_of(row)

    def _result_of(self, row: Task) -> TaskResult:
        call = row.input
        task = self.task_resolve(call["task"])
        run_after = datetime.fromisoformat(call["run_after"]) if call.get("run_after") else None
        task = task.using(priority=call["priority"], queue_name=call["queue_name"], run_after=run_after)
        attempts = list(
            StepAttempt.objects.filter(task_id=row.pk, kind=AttemptKind.STEP)
            .order_by("started_at", "id")
            .values_list("worker", "started_at", "outcome", "error_class", "traceback")
        )
        worker_ids = [worker for worker, *_ in attempts]
        started = [started_at for _, started_at, *_ in attempts if started_at is not None]
        # A running attempt's row is written when it ends; its claim is the task's last update.
        if row.state == TaskState.RUNNING:
            worker_ids.append(row.lease_owner)
            started.append(row.updated_at)
        errors = [
            TaskError(exception_class_path=error_class or CRASHED_ERROR_CLASS, traceback=traceback)
            for _, _, outcome, error_class, traceback in attempts
            if outcome != AttemptOutcome.SUCCEEDED
        ]
        result = TaskResult(
            task=task,
            id=str(row.pk),
            status=STATUS_OF_STATE.get(row.state, TaskResultStatus.FAILED),
            enqueued_at=row.created_at,
            started_at=min(started) if started else None,
            last_attempted_at=max(started) if started else None,
            finished_at=row.finished_at,
            args=call["args"],
            kwargs=call["kwargs"],
            backend=self.alias,
            errors=errors,
            worker_ids=worker_ids,
        )
        if row.state == TaskState.SUCCEEDED:
            object.__setattr__(result, "_return_value", (row.result or {}).get("return_value"))
        return result

    # --- what a worker may run ----------------------------------------------------

    def task_resolve(self, module_path: Any) -> DjangoTask:
        """The ``@task`` at ``module_path``, if it is one of this backend's; else ``InvalidTaskInput``."""
        if not isinstance(module_path, str) or "." not in module_path:
            raise InvalidTaskInput("task must be the module path of an @task function", details={"task": module_path})
        module_name, _, attribute = module_path.rpartition(".")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError):
            raise InvalidTaskInput(f"no @task at {module_path!r}", details={"task": module_path}) from None
        if not isinstance(found, DjangoTask) or found.backend != self.alias or found.module_path != module_path:
            raise InvalidTaskInput(
                f"{module_path!r} is not an @task of the task backend {self.alias!r}", details={"task": module_path}
            )
        return found

    def input_clean(self, data: Any) -> Any:
        """The pipeline's input check (Python and HTTP alike): a call of one of this backend's tasks."""
        if not isinstance(data, dict) or set(data) != CALL_FIELDS:
            raise InvalidTaskInput(f"input must be a Django task call: {', '.join(sorted(CALL_FIELDS))}")
        if not isinstance(data["args"], list) or not isinstance(data["kwargs"], dict):
            raise InvalidTaskInput("args must be a list and kwargs an object")
        self.task_resolve(data["task"])
        return data

    def call_run(self, ctx: Any) -> dict:
        """The pipeline's one step: call the task with its stored arguments; its output holds the return value."""
        call = ctx.input
        task = self.task_resolve(call["task"])
        args, kwargs = call["args"], call["kwargs"]
        logger.info(
            "django task started",
            extra={"event": "django_task_started", "task_id": str(ctx.task_id), **attempt_fields()},
        )
        if task.takes_context:
            context = TaskContext(task_result=self.get_result(str(ctx.task_id)))
            value = task.call(context, *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        # Not JSON: the framework's TypeError, a permanent error of the step.
        return {"return_value": normalize_json(value)}


def options_check(alias: str, options: Any) -> dict[str, Any]:
    """The backend's OPTIONS over their defaults; ``InvalidTaskBackend`` naming an unknown or wrong one."""
    if not isinstance(options, dict):
        raise InvalidTaskBackendError(f"TASKS[{alias!r}]['OPTIONS'] must be a dict")
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise InvalidTaskBackendError(
            f"TASKS[{alias!r}]['OPTIONS']: unknown option {unknown[0]!r} (known: {', '.join(DEFAULT_OPTIONS)})"
        )
    values = {**DEFAULT_OPTIONS, **options}
    for name, value in values.items():
        if value is None and DEFAULT_OPTIONS[name] is None:
            continue
        whole = name == "MAX_ATTEMPTS"
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float) or value <= 0:
            kind = "a positive whole number" if whole else "a positive number of seconds"
            raise InvalidTaskBackendError(f"TASKS[{alias!r}]['OPTIONS'][{name!r}] must be {kind}, not {value!r}")
    return values


def _pipeline_for(backend: ReliabilityBackend, queue: str) -> Pipeline:
    """The backend's pipeline for ``queue``, built once per set of options (backends are made per thread)."""
    name = pipeline_name(backend.alias, queue)
    settings = backend.settings
    try:
        existing = registry.get(name)
    except UnknownPipeline:
        existing = None
    if existing is not None and getattr(existing, "backend_settings", None) == settings:
        existing.backend = backend
        return existing
    try:
        retry = RetryPolicy(
            max_attempts=settings["MAX_ATTEMPTS"],
            base_delay=settings["RETRY_BASE_SECONDS"],
            max_delay=settings["RETRY_MAX_SECONDS"],
        )
        pipeline = Pipeline(
            name,
            retry=retry,
            # Nothing to undo: a task that fails for good waits in the DLQ for an operator.
            failure_policy=FailurePolicy.PARK,
            on_cancel=FailurePolicy.PARK,
            default_step_timeout=settings["TIMEOUT_SECONDS"],
            queue=queue,
            register=False,
            validate_input=lambda data: pipeline.backend.input_clean(data),
        )
    except ConfigurationError as exc:
        raise InvalidTaskBackendError(f"TASKS[{backend.alias!r}]: {exc}") from None
    pipeline.backend = backend
    pipeline.backend_settings = settings
    pipeline.step(lambda ctx: pipeline.backend.call_run(ctx), name=STEP_NAME)
    # Options changed (override_settings, a reload): the new declaration replaces the old one.
    registry.unregister(name)
    registry.register(pipeline)
    return pipeline


def configured_backends_load(aliases: list[str]) -> list[ReliabilityBackend]:
    """Make the ``TASKS`` backends ``aliases`` (``TasksConfig.ready``): web, workers and sweeper know their pipelines.

    A wrong option stops the process at start-up with the framework's ``InvalidTaskBackend`` naming it.
    """
    return [task_backends[alias] for alias in aliases]
