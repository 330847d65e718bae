"""What a task's compensation must undo and what it did already: reads of its checkpoints, ledger and attempts.

Read by the compensation runner (``tasks.execution.compensation``) and by a cancel deciding whether anything may need
undoing (``tasks.lifecycle.outcomes``); nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.models import AttemptKind, AttemptOutcome, Checkpoint, EffectStatus, SideEffect, StepAttempt, Task


def completed_compensations(task: Task) -> set[tuple[str, str]]:
    """(kind, step name) of compensations and notices already done for this generation."""
    return set(
        StepAttempt.objects.filter(
            task_id=task.pk,
            generation=task.generation,
            kind__in=[AttemptKind.COMPENSATION, AttemptKind.FAILURE_NOTICE],
            outcome=AttemptOutcome.SUCCEEDED,
        ).values_list("kind", "step_name")
    )


@dataclass(frozen=True)
class CompensationTarget:
    """A step that ran and may need undoing."""

    name: str
    index: int  # where it stood when it ran: targets are undone from the highest down
    # Whether it declared a compensation when it ran (None: unknown, a checkpoint
    # written before this was recorded, or a step that failed without one).
    had_compensation: bool | None


def compensation_targets(task: Task) -> list[CompensationTarget]:
    """Every completed step, plus the failing step when it may have acted, in reverse order of running."""
    targets = {
        name: CompensationTarget(name, index, had)
        for name, index, had in Checkpoint.objects.filter(task_id=task.pk).values_list(
            "step_name", "step_index", "has_compensation"
        )
    }
    for name, index in uncertain_steps(task):
        targets.setdefault(name, CompensationTarget(name, index, None))
    return sorted(targets.values(), key=lambda target: target.index, reverse=True)


def uncertain_steps(task: Task) -> set[tuple[str, int]]:
    """(name, index) of steps whose last attempt may have acted on the far side (timeout, crash, 5xx, cancel)."""
    current = task.step_name_at(task.current_step)
    return set(
        SideEffect.objects.filter(
            task_id=task.pk, generation=task.generation, status=EffectStatus.UNCERTAIN
        ).values_list("step_name", "step_index")
    ) | set(
        StepAttempt.objects.filter(
            task_id=task.pk,
            generation=task.generation,
            kind=AttemptKind.STEP,
            outcome__in=[AttemptOutcome.TIMEOUT, AttemptOutcome.CRASHED, AttemptOutcome.CANCELLED],
            step_index=task.current_step,
            **({"step_name": current} if current else {}),
        ).values_list("step_name", "step_index")
    )
