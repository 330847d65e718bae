"""A pipeline changes while a task is in flight, with real workers (issue #13, point 4).

A task of ``t_shaped`` (tests/pipelines.py) is checkpointed after step 2 of
4 and waits at step 3 (a gate); its workers stop and workers of a new deploy
start, whose ``t_shaped`` has another shape (``RC_TEST_PIPELINE_SHAPE``).
A step added at the end: the task finishes all five. A step inserted before
step 2: the task is parked ``pipeline_changed``, and the DLQ's operator
action "retry from start" runs it on the new steps.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from dlq.actions import dlq_item_act
from dlq.roles import roles_setup
from tasks.models import Checkpoint, DeadLetter, Task
from tasks.submission.submit import task_submit
from tests.support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.acceptance]

FOUR = ["shape_1", "shape_2", "shape_3", "shape_4"]


def _state(task_id, *states: str) -> Task | None:
    task = Task.objects.get(pk=task_id)
    return task if task.state in states else None


def _checkpointed_after_step_2(start_workers, gate) -> tuple[Task, object]:
    """A task of the four-step shape, waiting at step 3 with steps 1 and 2 checkpointed; its workers stopped."""
    pool = start_workers(1, RC_TEST_PIPELINE_SHAPE="four")
    task = task_submit(pipeline="t_shaped", input={"gate": str(gate)})
    assert task.step_names == FOUR
    wait_for(
        lambda: (
            Task.objects.filter(pk=task.pk, state="retry_scheduled", failure_code="").exists()
            and Checkpoint.objects.filter(task=task, step_name="shape_2").exists()
        ),
        timeout=60,
        message="step 2's checkpoint and step 3 waiting",
    )
    pool.stop()
    task.refresh_from_db()
    assert task.state in ("retry_scheduled", "queued"), pool.logs()
    assert list(Checkpoint.objects.filter(task=task).order_by("step_index").values_list("step_name", flat=True)) == [
        "shape_1",
        "shape_2",
    ]
    return task, pool


def _checkpoints(task: Task) -> list[tuple[str, int, str]]:
    return [
        (c.step_name, c.step_index, c.output["shape"])
        for c in Checkpoint.objects.filter(task=task).order_by("step_index")
    ]


def test_a_step_added_at_the_end_runs_after_the_completed_ones(start_workers, start_sweeper, tmp_path):
    gate = tmp_path / "gate"
    task, _ = _checkpointed_after_step_2(start_workers, gate)

    gate.touch()
    pool = start_workers(1, RC_TEST_PIPELINE_SHAPE="appended")
    start_sweeper()
    task = wait_for(lambda: _state(task.pk, "succeeded", "failed"), timeout=60, message="the task to finish")

    assert task.state == "succeeded", (task.failure_message, pool.logs())
    assert task.step_names == [*FOUR, "shape_5"] and task.total_steps == 5
    # Steps 1 and 2 ran once, under the old deploy; 3 to 5 under the new one.
    assert _checkpoints(task) == [
        ("shape_1", 0, "four"),
        ("shape_2", 1, "four"),
        ("shape_3", 2, "appended"),
        ("shape_4", 3, "appended"),
        ("shape_5", 4, "appended"),
    ]
    assert task.result["seen"] == FOUR
    assert task.attempts.filter(step_name__in=["shape_1", "shape_2"]).count() == 2
    assert not task.in_dlq


def test_a_step_inserted_before_step_2_parks_the_task_and_retry_from_start_runs_the_new_steps(
    start_workers, start_sweeper, tmp_path
):
    gate = tmp_path / "gate"
    task, _ = _checkpointed_after_step_2(start_workers, gate)
    attempts_before = task.attempts.count()

    gate.touch()
    pool = start_workers(1, RC_TEST_PIPELINE_SHAPE="inserted")
    start_sweeper()
    task = wait_for(lambda: _state(task.pk, "failed", "succeeded"), timeout=60, message="the task to be parked")

    assert (task.state, task.failure_reason, task.failure_code) == ("failed", "pipeline_changed", "pipeline_changed")
    assert task.failure_message == (
        "completed step 'shape_2' is no longer step 2 of pipeline 't_shaped' "
        "(now: shape_1, shape_1b, shape_2, shape_3, shape_4)"
    ), pool.logs()
    # Parked before any step ran on the new declaration.
    assert task.attempts.count() == attempts_before
    item = DeadLetter.objects.get(task=task, resolved_at__isnull=True)
    assert (item.reason_code, item.failing_step, item.status) == ("pipeline_changed", "shape_2", "open")
    assert "no longer step 2" in item.reason

    roles_setup()
    supervisor = get_user_model().objects.create_user("sara", password="x-test-only", is_staff=True)
    supervisor.groups.add(Group.objects.get(name="supervisor"))
    result = dlq_item_act(item_id=item.pk, action="retry_from_start", actor=supervisor, reason="the pipeline changed")
    assert (result.state_before, result.state_after) == ("failed", "queued")

    task = wait_for(lambda: _state(task.pk, "succeeded", "failed"), timeout=60, message="the retried task to finish")
    assert task.state == "succeeded", (task.failure_message, pool.logs())
    assert task.generation == 1
    assert task.step_names == ["shape_1", "shape_1b", "shape_2", "shape_3", "shape_4"] and task.total_steps == 5
    assert [name for name, _, _ in _checkpoints(task)] == task.step_names
    assert {shape for _, _, shape in _checkpoints(task)} == {"inserted"}
    assert DeadLetter.objects.get(pk=item.pk).resolved_at is not None
