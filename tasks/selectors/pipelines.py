"""Reads of pipelines: each registered pipeline's limits, pause and held and running tasks."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count

from tasks import registry
from tasks.execution.gates import control_values_of, gate_of
from tasks.models import (
    PipelineControl,
    Task,
    TaskHold,
    TaskState,
)
from tasks.pipelines.limits import Gate, RateLimit


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
