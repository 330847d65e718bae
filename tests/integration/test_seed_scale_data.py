"""seed_scale_data: a small seed has the promised shape; bad arguments and a full database are refused in one line."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from devtools.scale_data import service as seed_service
from dlq.models import DLQItem
from tasks.models import UNRESOLVED_STATUSES, Checkpoint, DLQStatus, SideEffect, StepAttempt, Task, TaskState
from tests.support import ROOT, process_env

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = 2_000
DLQ_ITEMS = 400
# The task state each DLQ status goes with (see the outcomes in devtools.scale_data.shape).
TASK_STATES_OF_STATUS = {
    DLQStatus.OPEN: {TaskState.FAILED, TaskState.COMPENSATION_FAILED},
    DLQStatus.RETRYING: {TaskState.QUEUED},
    DLQStatus.COMPENSATING: {TaskState.COMPENSATING},
    DLQStatus.COMPENSATED: {TaskState.COMPENSATED},
    DLQStatus.RESOLVED: {TaskState.SUCCEEDED, TaskState.COMPENSATED, TaskState.FAILED},
}


def seed(**options) -> str:
    out = StringIO()
    call_command("seed_scale_data", stdout=out, **{"tasks": TASKS, "dlq_items": DLQ_ITEMS, "batch": 700, **options})
    return out.getvalue()


@pytest.fixture
def seeded() -> str:
    return seed()


def test_seeds_the_requested_rows_in_batches(seeded):
    assert Task.objects.count() == TASKS
    assert DLQItem.objects.count() == DLQ_ITEMS
    assert "tasks: 700/2,000 (35%)" in seeded
    assert "tasks: 2,000/2,000 (100%)" in seeded
    assert "DLQ items: 400/400 (100%)" in seeded


def test_every_task_state_appears_and_most_tasks_succeeded():
    seed()
    states = dict(Task.objects.order_by().values_list("state").annotate(n=Count("pk")))
    assert set(states) == set(TaskState.values)
    assert states[TaskState.SUCCEEDED] > TASKS / 2


def test_at_most_one_unresolved_item_per_task_and_in_dlq_says_which(seeded):
    unresolved = DLQItem.objects.filter(status__in=UNRESOLVED_STATUSES)
    assert not unresolved.order_by().values("task_id").annotate(n=Count("pk")).filter(n__gt=1).exists()
    assert set(unresolved.values_list("task_id", flat=True)) == set(
        Task.objects.filter(in_dlq=True).values_list("pk", flat=True)
    )


def test_items_are_mostly_resolved_with_a_resolution_time(seeded):
    statuses = dict(DLQItem.objects.order_by().values_list("status").annotate(n=Count("pk")))
    assert set(statuses) == set(DLQStatus.values)
    assert 0.6 < statuses[DLQStatus.RESOLVED] / DLQ_ITEMS < 0.8
    resolved = DLQItem.objects.filter(status=DLQStatus.RESOLVED)
    assert not resolved.filter(resolved_at__isnull=True).exists()
    assert not resolved.filter(resolution_code="").exists()
    assert not DLQItem.objects.filter(status__in=UNRESOLVED_STATUSES, resolved_at__isnull=False).exists()
    assert not DLQItem.objects.filter(resolved_at__lt=timezone.now() - timedelta(days=31)).exists()


def test_items_belong_to_tasks_whose_state_matches(seeded):
    for item in DLQItem.objects.select_related("task"):
        assert item.task.state in TASK_STATES_OF_STATUS[item.status], (item.status, item.task.state)
        assert item.pipeline == item.task.pipeline
        assert item.fingerprint == f"{item.pipeline}:{item.failing_step}:{item.error_code}"
        assert item.created_at >= item.task.created_at
        if item.task.state == TaskState.FAILED:
            assert (item.task.failure_code, item.task.failed_step) == (item.error_code, item.failing_step)


def test_failures_fall_into_a_handful_of_fingerprints(seeded):
    fingerprints = set(DLQItem.objects.values_list("fingerprint", flat=True))
    assert 5 <= len(fingerprints) <= 12
    assert len(set(Task.objects.values_list("pipeline", flat=True))) >= 4


def test_tasks_spread_over_thirty_days(seeded):
    now = timezone.now()
    oldest = Task.objects.order_by("created_at").first().created_at
    newest = Task.objects.order_by("-created_at").first().created_at
    assert now - timedelta(days=30, minutes=1) <= oldest < now - timedelta(days=29)
    assert now - timedelta(hours=1) < newest <= now


def test_some_tasks_have_attempts_checkpoints_and_side_effects(seeded):
    task = Task.objects.filter(state=TaskState.FAILED, in_dlq=True, attempts__isnull=False, current_step__gt=0)[0]
    attempts = list(StepAttempt.objects.filter(task=task))
    assert [a.outcome for a in attempts if a.step_index < task.current_step] == ["succeeded"] * task.current_step
    failing = [a for a in attempts if a.step_index == task.current_step]
    assert len(failing) == task.step_attempt
    assert failing[-1].error_code == task.failure_code
    assert Checkpoint.objects.filter(task=task).count() == task.current_step
    assert SideEffect.objects.filter(task=task).count() == task.current_step


def test_a_database_with_data_needs_force(monkeypatch, seeded):
    monkeypatch.setattr(seed_service, "EXISTING_ROWS_LIMIT", 1_000)
    with pytest.raises(CommandError, match="already hold more than 1,000 rows; use --force"):
        seed()
    seed(force=True)
    assert Task.objects.count() == 2 * TASKS
    assert DLQItem.objects.count() == 2 * DLQ_ITEMS


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tasks": "0"}, "--tasks must be a positive integer, not '0'"),
        ({"tasks": "many"}, "--tasks must be a positive integer, not 'many'"),
        ({"dlq_items": "-5"}, "--dlq-items must be a positive integer, not '-5'"),
        ({"batch": "0"}, "--batch must be a positive integer, not '0'"),
        ({"seed": "x"}, "--seed must be a positive integer, not 'x'"),
    ],
)
def test_bad_arguments_are_refused_in_one_readable_line(options, message):
    with pytest.raises(CommandError) as refused:
        seed(**options)
    assert str(refused.value) == message
    assert not Task.objects.exists()


@pytest.mark.processes
def test_the_command_line_prints_one_error_line():
    result = subprocess.run(
        [sys.executable, "manage.py", "seed_scale_data", "--tasks", "0", "--dlq-items", "10"],
        cwd=ROOT,
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "CommandError: --tasks must be a positive integer, not '0'"


def test_sqlite_is_refused(monkeypatch):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pytest.raises(CommandError) as refused:
        seed()
    assert str(refused.value) == "seed_scale_data needs PostgreSQL; this database is sqlite"


def test_every_task_has_a_customer_and_every_invoice_an_order_to_search_by(seeded):
    assert not Task.objects.filter(attributes__customer_id__isnull=True).exists()
    invoices = Task.objects.filter(pipeline="invoice")
    assert invoices.exists() and not invoices.filter(attributes__order_id__isnull=True).exists()
    assert not Task.objects.exclude(pipeline="invoice").filter(attributes__order_id__isnull=False).exists()
    one = invoices.values_list("attributes", "input").first()
    assert one[0]["order_id"] == one[1]["order_id"] and one[0]["customer_id"] == one[1]["user_id"]
