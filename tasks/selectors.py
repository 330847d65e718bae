"""The engine's reads: tasks (states, the API representation, pages, idempotency records), pipelines and what
holds them back, the RQ queues and workers.

Nothing here writes (the door, ``tasks.lifecycle``, does). The console reads the engine through this module and
the models.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import CharField, Count, F, Func, Min, Q
from django.utils import timezone
from redis.exceptions import RedisError
from rq import Worker
from rq.utils import utcparse

from tasks import registry
from tasks.attributes import MAX_VALUE_LENGTH
from tasks.delivery import get_queue, redis_client
from tasks.exceptions import InvalidTaskInput, UnknownPipeline
from tasks.limits import control_values_of, gate_of
from tasks.limits_policy import Gate, RateLimit
from tasks.models import (
    ApiClient,
    AttemptKind,
    AttemptOutcome,
    Checkpoint,
    IdempotencyRecord,
    PipelineControl,
    StepAttempt,
    Task,
    TaskHold,
    TaskState,
    WaitKind,
)
from tasks.queues import queue_names

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
    pairs a task must all have (``tasks.attributes``)."""
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


# --- pipelines and what holds them back -----------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineState:
    """A registered pipeline as the console shows it: declared limits, what holds now, who paused it."""

    name: str
    queue: str
    declared_max_concurrency: int | None
    declared_rate_limit: RateLimit | None
    gate: Gate
    control: PipelineControl | None
    held: dict[str, int]  # hold -> tasks held
    running: int

    @property
    def limits_overridden(self) -> bool:
        return bool(self.control and (self.control.concurrency_overridden or self.control.rate_overridden))


def pipeline_states() -> list[PipelineState]:
    """Every registered pipeline with what holds it now (a handful of queries, whatever the task count)."""
    controls = {control.pipeline: control for control in PipelineControl.objects.all()}
    held: dict[str, dict[str, int]] = {}
    for (name, hold), count in held_counts().items():
        held.setdefault(name, {})[hold] = count
    running = dict(
        Task.objects.filter(state=TaskState.RUNNING)
        .values_list("pipeline")
        .annotate(count=Count("pk"))
        .order_by()
        .values_list("pipeline", "count")
    )
    states = []
    for declared in sorted(registry.all_pipelines(), key=lambda p: p.name):
        control = controls.get(declared.name)
        gate = gate_of(pipeline=declared.name, control=control_values_of(control))
        states.append(
            PipelineState(
                name=declared.name,
                queue=declared.queue,
                declared_max_concurrency=declared.max_concurrency,
                declared_rate_limit=declared.rate_limit,
                gate=gate,
                control=control,
                held=held.get(declared.name, {}),
                running=running.get(declared.name, 0),
            )
        )
    return states


def pipeline_state(name: str) -> PipelineState | None:
    """The registered pipeline ``name`` as ``pipeline_states`` has it; None when no such pipeline is registered."""
    return next((state for state in pipeline_states() if state.name == name), None)


def control_gate(control: PipelineControl) -> Gate:
    """The limits in force for ``control``'s pipeline, as that control row says (no query)."""
    return gate_of(pipeline=control.pipeline, control=control_values_of(control))


def paused_pipelines() -> list[PipelineControl]:
    """The pipelines paused now, longest paused first (for the dashboard)."""
    return list(PipelineControl.objects.filter(paused=True).order_by("paused_at", "pipeline"))


def held_counts() -> dict[tuple[str, str], int]:
    """(pipeline, hold) -> number of held tasks, for the dashboard and ``/metrics``."""
    rows = (
        Task.objects.filter(state=TaskState.QUEUED)
        .exclude(hold=TaskHold.NONE)
        .values_list("pipeline", "hold")
        .annotate(count=Count("pk"))
        .order_by()
    )
    return {(pipeline, hold): count for pipeline, hold, count in rows}


# --- waiting tasks: delayed starts, sleeps, waits for a signal, approvals ---------------------------------------
#
# A WAITING task's ``updated_at`` is when it began to wait: nothing writes a waiting task's row but the transition
# that ends its wait (``tasks.lifecycle.deliveries``, a signal, a cancel), so it is "waiting since", read through
# ``task_state_updated_id_idx (state, updated_at, id)``.


class _RecordedStepName(Func):
    """``step_names ->> current_step``: the recorded name of the step a task is at (NULL past the last, or for a
    row written without names, whose wait a signal does not wake either: ``tasks.lifecycle.signals``)."""

    template = "(%(expressions)s)"
    arg_joiner = " ->> "
    output_field = CharField()


def approval_waits() -> dict[str, frozenset[str]]:
    """Pipeline -> the names of its waits for a person's decision (``Pipeline.wait(..., approval=True)``), for
    the registered pipelines that have any."""
    found = {}
    for pipeline in registry.all_pipelines():
        names = frozenset(step.name for step in pipeline.steps if step.wait is not None and step.wait.approval)
        if names:
            found[pipeline.name] = names
    return found


def _approval_condition(waits: dict[str, frozenset[str]]) -> Q:
    condition = Q(pk__in=[])  # no approval wait registered: nothing matches
    for pipeline, names in waits.items():
        condition |= Q(pipeline=pipeline, wait_name__in=sorted(names))
    return condition


def approval_waiting_tasks(*, pipeline: str | None = None):
    """Tasks waiting for a person's decision (WAITING for a signal at an approval wait), the longest waiting first:
    a queryset (for a paginator) of the columns a list shows, each annotated with ``wait_name``."""
    tasks = (
        Task.objects.filter(state=TaskState.WAITING, wait_for=WaitKind.SIGNAL)
        .annotate(wait_name=_RecordedStepName(F("step_names"), F("current_step")))
        .filter(_approval_condition(approval_waits()))
        .only("id", "pipeline", "input", "state", "current_step", "step_names", "wait_until", "updated_at")
        .order_by("updated_at", "id")
    )
    return tasks.filter(pipeline=pipeline) if pipeline else tasks


def approval_wait_of(task: Task) -> str | None:
    """The approval wait ``task`` (a loaded row) waits at now for a person's decision, or None (no query)."""
    if task.state != TaskState.WAITING or task.wait_for != WaitKind.SIGNAL:
        return None
    name = task.current_step_name
    return name if name and name in approval_waits().get(task.pipeline, ()) else None


def checkpoints_of(*, task_ids: list) -> dict[str, list[Checkpoint]]:
    """Task id -> its checkpoints (its completed steps' outputs) in step order: one query for a page of tasks."""
    found: dict[str, list[Checkpoint]] = {}
    for checkpoint in Checkpoint.objects.filter(task_id__in=task_ids).order_by("task_id", "step_index"):
        found.setdefault(str(checkpoint.task_id), []).append(checkpoint)
    return found


@dataclass(frozen=True)
class WaitingCount:
    """Tasks waiting at one place: a pipeline's wait (``wait`` its step name; "" for a later start, which is at
    no step yet), for what (``kind``: start, time, signal), and since when the longest has waited."""

    pipeline: str
    wait: str
    kind: str
    count: int
    oldest_since: datetime
    approval: bool  # a wait for a person's decision (only a signal wait is one)


def waiting_counts() -> list[WaitingCount]:
    """Waiting tasks per pipeline, wait and kind, in one grouped query (the dashboard, ``/metrics``), by pipeline
    then wait."""
    rows = (
        Task.objects.filter(state=TaskState.WAITING)
        .annotate(step=_RecordedStepName(F("step_names"), F("current_step")))
        .values_list("pipeline", "wait_for", "step")
        .annotate(count=Count("pk"), oldest=Min("updated_at"))
        .order_by()
    )
    approvals = approval_waits()
    counts = []
    for pipeline, kind, step, count, oldest in rows:
        wait = "" if kind == WaitKind.START else (step or "")
        approval = kind == WaitKind.SIGNAL and wait in approvals.get(pipeline, ())
        counts.append(WaitingCount(pipeline, wait, kind, count, oldest, approval))
    return sorted(counts, key=lambda row: (row.pipeline, row.wait, row.kind))


# --- RQ queues and workers ------------------------------------------------------------------------------------
#
# Read only: counts are read with ``cleanup=False`` (cleaning a started registry would fail or retry abandoned
# jobs; that is the workers' job). Listing workers drops the registration of a worker whose key has expired,
# as RQ does whenever anyone lists them. Each read below raises ``RedisError`` when Redis cannot be read, except
# ``queue_states``, which says so per queue.


@dataclass(frozen=True)
class QueueBacklog:
    """One engine queue's jobs waiting for a worker: how many, and since when the oldest has waited."""

    name: str
    depth: int
    oldest_enqueued_at: datetime | None  # None when the queue is empty

    def oldest_age(self, now: datetime) -> float:
        """Seconds the oldest waiting job has waited (0 for an empty queue)."""
        if self.oldest_enqueued_at is None:
            return 0.0
        return max((now - self.oldest_enqueued_at).total_seconds(), 0.0)


def queue_backlogs() -> list[QueueBacklog]:
    """Every engine queue's backlog, highest priority first.

    Two round trips whatever the depth: each queue's ``LLEN`` and head (RQ
    appends at the tail and pops the head, so the head waited longest), then
    the heads' ``enqueued_at``.
    """
    queues = [get_queue(name) for name in queue_names()]
    client = redis_client()
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue.key)
            pipe.lindex(queue.key, 0)
        replies = pipe.execute()
    depths, heads = replies[0::2], [_text(head) for head in replies[1::2]]
    with client.pipeline(transaction=False) as pipe:
        for queue, head in zip(queues, heads, strict=True):
            if head:
                pipe.hget(queue.job_class.key_for(head), "enqueued_at")
        enqueued = iter(pipe.execute())
    return [
        QueueBacklog(name=queue.name, depth=depth, oldest_enqueued_at=_rq_time(next(enqueued)) if head else None)
        for queue, depth, head in zip(queues, depths, heads, strict=True)
    ]


@dataclass(frozen=True)
class RegistryCounts:
    """One engine queue's jobs in RQ's registries: waiting for their time, running, waiting on others, failed."""

    scheduled: int
    started: int
    deferred: int
    failed: int


def queue_registry_counts() -> dict[str, RegistryCounts]:
    """Every engine queue's registry counts, by queue name, highest priority first."""
    return {name: _registry_counts(get_queue(name)) for name in queue_names()}


def _registry_counts(queue) -> RegistryCounts:
    return RegistryCounts(
        scheduled=queue.scheduled_job_registry.get_job_count(cleanup=False),
        started=queue.started_job_registry.get_job_count(cleanup=False),
        deferred=queue.deferred_job_registry.get_job_count(cleanup=False),
        failed=queue.failed_job_registry.get_job_count(cleanup=False),
    )


def live_workers() -> tuple[str, ...]:
    """The names of the RQ workers registered now, in order."""
    return tuple(sorted(worker.name for worker in Worker.all(connection=redis_client())))


def live_worker_count() -> int:
    """How many RQ workers are registered now (one round trip)."""
    return Worker.count(connection=redis_client())


@dataclass(frozen=True)
class WorkerFigures:
    name: str
    state: str
    current_job_id: str
    last_heartbeat: datetime | None


@dataclass(frozen=True)
class QueueState:
    name: str
    available: bool  # False when Redis could not be read: every figure below is then None
    depth: int | None = None
    oldest_enqueued_at: datetime | None = None
    scheduled: int | None = None
    started: int | None = None
    deferred: int | None = None
    failed: int | None = None
    workers: tuple[WorkerFigures, ...] = ()

    def oldest_age(self, now: datetime) -> timedelta | None:
        return None if self.oldest_enqueued_at is None else max(now - self.oldest_enqueued_at, timedelta(0))


def queue_states() -> list[QueueState]:
    """Every engine queue as the Queues page shows it, highest priority first (``critical``, ``default``, ``bulk``)."""
    return [_queue_state(name) for name in queue_names()]


def _queue_state(name: str) -> QueueState:
    queue = get_queue(name)
    try:
        oldest = queue.get_job_ids(0, 1)  # RQ appends at the tail and pops the head: the head waited longest
        enqueued_at = queue.connection.hget(queue.job_class.key_for(oldest[0]), "enqueued_at") if oldest else None
        counts = _registry_counts(queue)
        workers = Worker.all(connection=queue.connection, queue=queue)
        return QueueState(
            name=name,
            available=True,
            depth=queue.count,
            oldest_enqueued_at=_rq_time(enqueued_at),
            scheduled=counts.scheduled,
            started=counts.started,
            deferred=counts.deferred,
            failed=counts.failed,
            workers=tuple(
                sorted(
                    (
                        WorkerFigures(
                            name=worker.name,
                            state=str(worker.get_state()),
                            current_job_id=worker.get_current_job_id() or "",
                            last_heartbeat=worker.last_heartbeat,
                        )
                        for worker in workers
                    ),
                    key=lambda figures: figures.name,
                )
            ),
        )
    except RedisError as exc:
        logger.warning("queues page redis unavailable", extra={"event": "queues_redis_unavailable", "error": str(exc)})
        return QueueState(name=name, available=False)


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _rq_time(value) -> datetime | None:
    # A head whose hash is gone (expired, deleted) has no time: the queue still counts it.
    value = _text(value)
    if not value:
        return None
    parsed = utcparse(value)
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)
