"""A pipeline changed while tasks were in flight: may a task go on with the steps now declared?

Checkpoints, attempts and ledger rows are keyed by step name, and a task
records the step names of its pipeline (``Task.step_names``). A deploy may
change a pipeline between two runs of a task; the rule that decides what a
worker does then is a value computed here, applied by the runner:

- the completed steps are still the pipeline's first steps, in the same
  order, and a step is left: the task goes on (steps added or changed
  after them run as now declared);
- otherwise running the next declared step would skip, repeat or reorder
  work already done: the task is parked with ``pipeline_changed`` and a
  message naming the difference, for an operator to retry from start or
  compensate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineChange:
    """What a worker does with a task whose completed steps are ``completed`` under the ``declared`` steps."""

    continues: bool
    # Names the difference when the task cannot continue ("" when it can).
    message: str = ""
    # The first completed step that is not where it was (for the dead letter's step).
    step: str = ""


def pipeline_change(*, pipeline: str, completed: Sequence[str], declared: Sequence[str]) -> PipelineChange:
    """Whether the completed steps (in the order they ran) are still the first of the declared steps.

    >>> pipeline_change(pipeline="x", completed=["a", "b"], declared=["a", "x", "b", "c"]).message
    "completed step 'b' is no longer step 2 of pipeline 'x' (now: a, x, b, c)"
    """
    now = ", ".join(declared) or "no steps"
    for position, name in enumerate(completed):
        if position < len(declared) and declared[position] == name:
            continue
        if name in declared:
            message = f"completed step {name!r} is no longer step {position + 1} of pipeline {pipeline!r} (now: {now})"
        else:
            message = f"completed step {name!r} is no longer in pipeline {pipeline!r} (now: {now})"
        return PipelineChange(False, message, name)
    if len(completed) >= len(declared):
        # Steps after the completed ones were removed: nothing is left to run and no step made its result.
        return PipelineChange(False, f"pipeline {pipeline!r} has no step left after the completed ones (now: {now})")
    return PipelineChange(True)
