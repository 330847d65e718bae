"""A pipeline's declaration changes between two runs of a task: the runner and compensation, in-process.

Each test declares ``t_changing`` (not in tests/pipelines.py: its steps vary
per test), runs a task until it waits at a held step, declares the pipeline
again as a deploy would, and runs the task on.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks import FailurePolicy, PermanentError, Pipeline, registry
from tasks.exceptions import TaskNotActionable, TransientError
from tasks.execution.runner import task_run
from tasks.lifecycle.operator import task_compensate, task_retry_from_start
from tasks.models import AttemptKind, Checkpoint, DeadLetter, SideEffect, StepAttempt, Task
from tasks.models.door import door_forced
from tasks.pipelines.retry import RetryPolicy
from tasks.submission.submit import task_submit

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "t_changing"
HELD: set[str] = set()  # steps that fail transiently (the task waits there)
FAILING: set[str] = set()  # steps that fail permanently
UNDONE: list[str] = []  # compensations that ran


@pytest.fixture(autouse=True)
def _declarations(clean_redis):
    HELD.clear()
    FAILING.clear()
    UNDONE.clear()
    yield
    registry.unregister(NAME)


def declare(*names: str, compensated: tuple[str, ...] = ()) -> Pipeline:
    """Declare ``t_changing`` with these steps (as a new deploy would); ``compensated`` ones have an undo."""
    pipeline = Pipeline(
        NAME,
        retry=RetryPolicy(max_attempts=10, base_delay=0.01, max_delay=0.01),
        failure_policy=FailurePolicy.PARK,
        register=False,
    )
    for name in names:
        step = pipeline.step(_step(name), name=name, effects=("call",))
        if name in compensated:
            step.compensation(_undo(name))
    registry.unregister(NAME)
    registry.register(pipeline)
    return pipeline


def _step(name: str):
    def run(ctx):
        ctx.idempotency_key("call")
        if name in HELD:
            raise TransientError("held", code="held")
        if name in FAILING:
            raise PermanentError("refused", code="refused")
        return {"step": name, "seen": sorted(ctx.outputs)}

    return run


def _undo(name: str):
    def undo(ctx):
        UNDONE.append(name)

    return undo


def held_at(step: str, *names: str, compensated: tuple[str, ...] = ()) -> Task:
    """A task of ``names`` that completed the steps before ``step`` and waits there for a retry."""
    declare(*names, compensated=compensated)
    HELD.add(step)
    task = task_submit(pipeline=NAME, input={})
    assert task_run(task_id=str(task.pk), worker="w1") == "retry_scheduled"
    HELD.clear()
    return task


def run_again(task: Task) -> Task:
    """Deliver the waiting task now (its retry is due) and return it as it ended."""
    with door_forced():
        Task.objects.filter(pk=task.pk).update(retry_at=timezone.now() - timedelta(seconds=1))
    task_run(task_id=str(task.pk), worker="w2")
    task.refresh_from_db()
    return task


def checkpoints(task: Task) -> list[str]:
    return list(Checkpoint.objects.filter(task=task).order_by("step_index").values_list("step_name", flat=True))


def test_a_task_records_its_pipelines_step_names_at_submission():
    declare("a", "b", "c")
    task = task_submit(pipeline=NAME, input={})
    assert (task.step_names, task.total_steps) == (["a", "b", "c"], 3)
    assert Task.objects.get(pk=task.pk).step_names == ["a", "b", "c"]


def test_steps_appended_run_after_the_completed_ones():
    task = held_at("c", "a", "b", "c")
    declare("a", "b", "c", "d", "e")

    task = run_again(task)

    assert task.state == "succeeded"
    assert (task.step_names, task.total_steps, task.current_step) == (["a", "b", "c", "d", "e"], 5, 5)
    assert checkpoints(task) == ["a", "b", "c", "d", "e"]
    assert task.result == {"step": "e", "seen": ["a", "b", "c", "d"]}
    # The completed steps did not run again.
    assert StepAttempt.objects.filter(task=task, step_name="a").count() == 1


def test_a_step_changed_after_the_completed_ones_runs_as_now_declared():
    task = held_at("b", "a", "b", "c")
    declare("a", "b2", "c")

    task = run_again(task)

    assert task.state == "succeeded"
    assert checkpoints(task) == ["a", "b2", "c"] and task.step_names == ["a", "b2", "c"]
    # The attempts of the old step keep its name; effect keys are the step's name, as before.
    assert list(StepAttempt.objects.filter(task=task, step_name="b").values_list("outcome", flat=True)) == [
        "transient_error"
    ]
    assert SideEffect.objects.filter(task=task, step_name="b2").get().effect_key == f"rc-{task.pk}-g0-b2-call"


@pytest.mark.parametrize(
    ("declaration", "step", "message"),
    [
        pytest.param(
            ("a", "x", "b", "c"),
            "b",
            "completed step 'b' is no longer step 2 of pipeline 't_changing' (now: a, x, b, c)",
            id="inserted before a completed step",
        ),
        pytest.param(
            ("a", "c"), "b", "completed step 'b' is no longer in pipeline 't_changing' (now: a, c)", id="removed"
        ),
        pytest.param(
            ("a", "bb", "c"),
            "b",
            "completed step 'b' is no longer in pipeline 't_changing' (now: a, bb, c)",
            id="renamed",
        ),
        pytest.param(
            ("b", "a", "c"),
            "a",
            "completed step 'a' is no longer step 1 of pipeline 't_changing' (now: b, a, c)",
            id="reordered",
        ),
    ],
)
def test_a_change_to_the_completed_steps_parks_the_task(declaration, step, message):
    task = held_at("c", "a", "b", "c")
    attempts = StepAttempt.objects.filter(task=task).count()
    declare(*declaration)

    task = run_again(task)

    assert (task.state, task.failure_reason, task.failure_code) == ("failed", "pipeline_changed", "pipeline_changed")
    assert (task.failure_message, task.failed_step) == (message, step)
    assert task.step_names == ["a", "b", "c"]  # what it ran on, for the operator and for compensation
    assert StepAttempt.objects.filter(task=task).count() == attempts  # nothing ran
    item = DeadLetter.objects.get(task=task)
    assert (item.reason_code, item.error_code, item.failing_step) == ("pipeline_changed", "pipeline_changed", step)
    assert message in item.reason
    assert item.reason_params["message"] == message


def test_retry_from_start_runs_a_parked_task_on_the_steps_now_declared():
    task = held_at("c", "a", "b", "c")
    declare("a", "x", "b", "c")
    task = run_again(task)
    assert task.failure_reason == "pipeline_changed"

    task_retry_from_start(task_id=task.pk)
    assert task_run(task_id=str(task.pk), worker="w3") == "succeeded"

    task.refresh_from_db()
    assert (task.generation, task.step_names) == (1, ["a", "x", "b", "c"])
    assert checkpoints(task) == ["a", "x", "b", "c"]
    assert not task.in_dlq


def test_retry_from_start_stays_refused_for_other_failures():
    declare("a", "b")
    FAILING.add("b")
    task = task_submit(pipeline=NAME, input={})
    assert task_run(task_id=str(task.pk), worker="w1") == "failed"
    with pytest.raises(TaskNotActionable):
        task_retry_from_start(task_id=task.pk)


def test_compensation_names_a_completed_step_that_no_longer_exists():
    # a and b completed (a with an undo, b without); the new deploy keeps only c.
    task = held_at("c", "a", "b", "c", compensated=("a",))
    declare("c", compensated=("c",))
    task = run_again(task)
    assert task.failure_reason == "pipeline_changed"

    task_compensate(task_id=task.pk)
    assert task_run(task_id=str(task.pk), worker="w3") == "compensation_failed"

    task.refresh_from_db()
    assert task.failure_reason == "compensation_failed"
    assert task.failure_message == (
        "step 'a' ran but is no longer in pipeline 't_changing': its compensation cannot run "
        "(undo its effects by hand, then close the dead letter)"
    )
    # b declared no compensation when it ran: nothing to undo, no complaint. No traceback anywhere.
    assert "'b'" not in task.failure_message and "Traceback" not in task.failure_message
    assert not StepAttempt.objects.filter(task=task, kind=AttemptKind.COMPENSATION).exists()
    assert UNDONE == []
    item = DeadLetter.objects.get(task=task)
    assert (item.status, item.compensation_error) == ("open", task.failure_message)


def test_compensation_names_a_compensation_that_is_gone():
    task = held_at("c", "a", "b", "c", compensated=("a", "b"))
    # Same steps, but a's compensation was removed, and c now refuses.
    declare("a", "b", "c", compensated=("b",))
    FAILING.add("c")
    task = run_again(task)
    assert task.failure_reason == "permanent_error"

    task_compensate(task_id=task.pk)
    assert task_run(task_id=str(task.pk), worker="w3") == "compensation_failed"

    task.refresh_from_db()
    assert task.failure_message == (
        "step 'a' declared a compensation when it ran, but pipeline 't_changing' no longer declares one "
        "(undo its effects by hand, then close the dead letter)"
    )
    # The compensation still declared ran, in reverse order of the steps.
    assert UNDONE == ["b"]


def test_a_checkpoint_of_unknown_compensation_is_skipped_as_before():
    # Checkpoints written before tasks 0014 do not say whether their step had an undo.
    task = held_at("c", "a", "b", "c", compensated=("b",))
    with door_forced():
        Checkpoint.objects.filter(task=task).update(has_compensation=None)
    declare("a", "b", "c", compensated=("b",))
    FAILING.add("c")
    run_again(task)

    task_compensate(task_id=task.pk)
    assert task_run(task_id=str(task.pk), worker="w3") == "compensated"
    assert UNDONE == ["b"]
    assert SideEffect.objects.get(task=task, step_name="b").status == "compensated"
    assert SideEffect.objects.get(task=task, step_name="a").status == "done"


def test_a_task_whose_pipeline_shifted_before_names_were_recorded_is_checked_against_its_checkpoints():
    # Tasks 0014 gives a task the names of its pipeline as declared when migrating; its checkpoints say what ran.
    task = held_at("c", "a", "b", "c")
    declare("a", "x", "b", "c")
    with door_forced():
        Task.objects.filter(pk=task.pk).update(step_names=["a", "x", "b", "c"])

    task = run_again(task)

    assert (task.state, task.failure_reason) == ("failed", "pipeline_changed")
    assert task.failure_message.startswith("completed step 'b' is no longer step 2")


def test_a_task_written_without_names_goes_on_and_records_them():
    # Tools that insert tasks with SQL (devtools' backlog, scale data) leave the column's default.
    declare("a", "b")
    task = task_submit(pipeline=NAME, input={})
    with door_forced():
        Task.objects.filter(pk=task.pk).update(step_names=[])

    assert task_run(task_id=str(task.pk), worker="w1") == "succeeded"
    assert Task.objects.get(pk=task.pk).step_names == ["a", "b"]
