"""Moving the dead-letter model from the console to the engine moves no data.

The database is migrated back to where the previous release left it (the
console owning ``dlq.DLQItem``), filled through that release's models, and
migrated forward again: every row is still there, readable through the
engine's ``DeadLetter`` and the console's ``DLQItem``, with its constraint,
and the operators' permissions still hang on the console's content type.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from dlq.models import DLQItem
from dlq.roles import roles_setup
from tasks.models import DeadLetter, Task

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("tasks", "0007_step_progress_without_index_writes"), ("dlq", "0007_dlq_covering_indexes")]
ITEMS = 25


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def latest():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def test_dead_letters_keep_every_row_through_the_move():
    roles_setup()
    try:
        old = migrate(BEFORE)
        OldTask, OldItem = old.get_model("tasks", "Task"), old.get_model("dlq", "DLQItem")
        assert OldItem._meta.db_table == "dlq_dlqitem" and not OldItem._meta.proxy
        tasks = OldTask.objects.bulk_create(
            OldTask(id=uuid.uuid4(), pipeline="orders", state="failed", in_dlq=True) for _ in range(ITEMS)
        )
        OldItem.objects.bulk_create(
            OldItem(task_id=task.pk, pipeline="orders", reason_code="permanent_error", reason="r", fingerprint="f")
            for task in tasks
        )
        first = OldItem.objects.order_by("pk").values_list("pk", "task_id", "status").first()
    finally:
        migrate(latest())

    assert DeadLetter.objects.count() == DLQItem.objects.count() == ITEMS
    assert Task.objects.filter(in_dlq=True).count() == ITEMS
    assert DeadLetter.objects.order_by("pk").values_list("pk", "task_id", "status").first() == first
    # The one-unresolved-item-per-task constraint came along with the table.
    with pytest.raises(IntegrityError), transaction.atomic():
        DeadLetter.objects.create(task_id=first[1], pipeline="orders", reason_code="x", reason="r", fingerprint="f")
    # The sequence continues where the old model left it.
    task = Task.objects.create(pipeline="orders", state="failed")
    assert DeadLetter.objects.create(task=task, pipeline="orders", reason_code="x", reason="r", fingerprint="f").pk > (
        first[0] + ITEMS - 1
    )


def test_the_operators_permissions_stay_on_the_consoles_content_type():
    roles_setup()
    operator_permissions = set(Group.objects.get(name="operator").permissions.values_list("pk", flat=True))
    migrate(BEFORE)
    migrate(latest())
    console = ContentType.objects.get_for_model(DLQItem, for_concrete_model=False)
    assert (console.app_label, console.model) == ("dlq", "dlqitem")
    retry = Permission.objects.get(content_type=console, codename="retry_dlqitem")
    assert retry.pk in operator_permissions
    assert set(Group.objects.get(name="operator").permissions.values_list("pk", flat=True)) == operator_permissions
