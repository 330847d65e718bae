"""The pipeline-change rule: a task goes on when its completed steps are still the pipeline's first steps."""

from __future__ import annotations

import pytest

from tasks.pipelines.changes import pipeline_change

DECLARED = ["a", "b", "c"]


@pytest.mark.parametrize(
    ("completed", "declared"),
    [
        pytest.param([], ["x", "y"], id="nothing completed: any declaration"),
        pytest.param(["a", "b"], ["a", "b", "c"], id="unchanged"),
        pytest.param(["a", "b"], ["a", "b", "c", "d"], id="a step appended"),
        pytest.param(["a", "b"], ["a", "b", "x", "c"], id="a step inserted after the completed ones"),
        pytest.param(["a"], ["a", "b2", "c"], id="a later step renamed"),
        pytest.param(["a", "b"], ["a", "b", "d"], id="the next step replaced"),
    ],
)
def test_the_task_continues_when_its_completed_steps_still_come_first(completed, declared):
    change = pipeline_change(pipeline="x", completed=completed, declared=declared)
    assert change.continues and change.message == "" and change.step == ""


@pytest.mark.parametrize(
    ("completed", "declared", "step", "message"),
    [
        pytest.param(
            ["a", "b"],
            ["a", "x", "b", "c"],
            "b",
            "completed step 'b' is no longer step 2 of pipeline 'x' (now: a, x, b, c)",
            id="a step inserted before a completed one",
        ),
        pytest.param(
            ["a", "b"],
            ["a", "c"],
            "b",
            "completed step 'b' is no longer in pipeline 'x' (now: a, c)",
            id="a completed step removed",
        ),
        pytest.param(
            ["a", "b"],
            ["a", "b2", "c"],
            "b",
            "completed step 'b' is no longer in pipeline 'x' (now: a, b2, c)",
            id="a completed step renamed",
        ),
        pytest.param(
            ["a", "b"],
            ["b", "a", "c"],
            "a",
            "completed step 'a' is no longer step 1 of pipeline 'x' (now: b, a, c)",
            id="completed steps reordered",
        ),
        pytest.param(
            ["a", "b"],
            ["a", "b"],
            "",
            "pipeline 'x' has no step left after the completed ones (now: a, b)",
            id="every step after the completed ones removed",
        ),
        pytest.param(
            ["a"],
            [],
            "a",
            "completed step 'a' is no longer in pipeline 'x' (now: no steps)",
            id="every step removed",
        ),
    ],
)
def test_the_task_is_parked_with_a_message_naming_the_difference(completed, declared, step, message):
    change = pipeline_change(pipeline="x", completed=completed, declared=declared)
    assert not change.continues
    assert (change.step, change.message) == (step, message)
