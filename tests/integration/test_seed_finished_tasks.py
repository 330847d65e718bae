"""seed_finished_tasks: old finished tasks with every row a run leaves, all of them past the retention."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Count
from django.utils import timezone

from tasks.lifecycle.retention import finished_tasks_purge
from tasks.models import Checkpoint, DeadLetter, DLQStatus, SideEffect, StepAttempt, Task, TaskState

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = 500
STEPS = 3


def seed(**options) -> str:
    out = StringIO()
    call_command("seed_finished_tasks", stdout=out, **{"tasks": TASKS, "steps": STEPS, "batch": 200, **options})
    return out.getvalue()


def test_seeds_finished_tasks_with_their_rows_in_batches():
    out = seed()
    assert "finished tasks: 200/500" in out and "finished tasks: 500/500" in out
    assert Task.objects.count() == TASKS
    states = dict(Task.objects.order_by().values_list("state").annotate(n=Count("pk")))
    assert set(states) == {TaskState.SUCCEEDED, TaskState.COMPENSATED, TaskState.FAILED}
    for model in (StepAttempt, Checkpoint, SideEffect):
        assert model.objects.count() == TASKS * STEPS
    failed = Task.objects.exclude(state=TaskState.SUCCEEDED)
    assert DeadLetter.objects.count() == failed.count() == TASKS * 4 // 100
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {DLQStatus.RESOLVED}
    assert not Task.objects.filter(in_dlq=True).exists()


def test_every_seeded_task_is_past_the_retention_and_the_purge_takes_them_all():
    seed(age_days=40)
    now = timezone.now()
    assert not Task.objects.filter(finished_at__gt=now - timedelta(days=40)).exists()
    assert Task.objects.filter(finished_at__lt=now - timedelta(days=69)).exists()
    report = finished_tasks_purge(older_than=timedelta(days=30), batch_size=150)
    assert report.tasks == TASKS and report.complete
    assert report.total_rows == TASKS * (1 + 3 * STEPS) + TASKS * 4 // 100
    assert not StepAttempt.objects.exists() and not DeadLetter.objects.exists()


@pytest.mark.parametrize("option", [{"tasks": "0"}, {"steps": "many"}, {"age_days": "-2"}])
def test_bad_arguments_are_refused_in_one_line(option):
    with pytest.raises(CommandError, match="must be a positive integer"):
        seed(**option)
