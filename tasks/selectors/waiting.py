"""Reads of waiting tasks: delayed starts, sleeps, waits for a signal, and the approvals a person decides."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import CharField, Count, F, Func, Min, Q

from tasks import registry
from tasks.models import (
    Checkpoint,
    Task,
    TaskState,
    WaitKind,
)

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
