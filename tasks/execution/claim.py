"""A claim: the task a worker holds under its lease, and the lease's length (a value; ``tasks.lifecycle.claims``
writes the claim)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.conf import engine_settings
from tasks.models import Task
from tasks.pipelines.limits import OPEN_GATE, Gate


@dataclass
class Claim:
    """A task this worker holds, with the outputs of its completed steps (by step name)."""

    task: Task
    owner: str
    outputs: dict[str, Any] = field(default_factory=dict)
    # The completed steps' names in the order they ran (their checkpoints' step index).
    completed: list[str] = field(default_factory=list)
    # What held the pipeline back when the task was claimed (tasks.execution.gates): checked again at each step start.
    gate: Gate = OPEN_GATE

    @property
    def token(self) -> int:
        return self.task.fencing_token


def lease_seconds() -> float:
    return float(engine_settings.LEASE_SECONDS)
