"""Migrations back and forward: the dead letter's move to the engine keeps every row; retention's go and come back.

Moving the dead-letter model from the console to the engine moves no data.

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
from django.core.exceptions import FieldDoesNotExist
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from dlq.models import AuditEntry, DLQItem
from dlq.roles import roles_setup
from tasks.models import Checkpoint, DeadLetter, RetentionPurge, Task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEFORE = [("tasks", "0007_step_progress_without_index_writes"), ("dlq", "0007_dlq_covering_indexes")]
RETENTION_BEFORE = [
    ("tasks", "0008_dead_letters_owned_by_the_engine"),
    ("dlq", "0008_dlqitem_is_a_view_of_the_engines_dead_letter"),
]
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


def _purge_index_valid() -> bool | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('task_purge_candidates_idx')")
        row = cursor.fetchone()
    return row[0] if row else None


def _audit_purge_allowed() -> bool:
    """Whether the audit trigger lets a transaction that names a cutoff delete an entry older than it."""
    _old_entry_append()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('reliability.audit_purge_before', (now() + '1 day')::text, true)")
            cursor.execute("DELETE FROM dlq_auditentry")
        return True
    except DatabaseError:
        return False


def _old_entry_append() -> int:
    """An entry appended as any release since 0002 can: naming only the columns every one of them has."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dlq_auditentry (created_at, actor, action, target_type, target_id, state_before, state_after,"
            " reason, outcome, detail) VALUES (now(), 'old', 'close', 'dlq_item', '1', '', '', '', 'succeeded', '')"
            " RETURNING id"
        )
        return cursor.fetchone()[0]


def test_the_retention_migrations_go_back_and_forward():
    try:
        old = migrate(RETENTION_BEFORE)
        with pytest.raises(LookupError):
            old.get_model("tasks", "RetentionPurge")
        assert _purge_index_valid() is None
        assert not _audit_purge_allowed()
    finally:
        migrate(latest())
    assert _purge_index_valid() is True
    assert _audit_purge_allowed()
    assert RetentionPurge.objects.count() == 0


STEP_NAMES_BEFORE = [("tasks", "0013_activity_indexes")]


def test_step_names_and_name_keyed_checkpoints_are_made_from_existing_rows():
    try:
        old = migrate(STEP_NAMES_BEFORE)
        OldTask, OldCheckpoint = old.get_model("tasks", "Task"), old.get_model("tasks", "Checkpoint")
        OldAttempt = old.get_model("tasks", "StepAttempt")
        registered = OldTask.objects.create(id=uuid.uuid4(), pipeline="t_local", state="running", current_step=1)
        OldCheckpoint.objects.create(task=registered, step_index=0, step_name="local_a", output={"a": 1})
        # A pipeline this process does not know: its names come from the task's own rows, by index.
        gone = OldTask.objects.create(id=uuid.uuid4(), pipeline="t_retired", state="failed", current_step=2)
        OldCheckpoint.objects.create(task=gone, step_index=1, step_name="second", output=None)
        OldCheckpoint.objects.create(task=gone, step_index=0, step_name="first", output=None)
        OldAttempt.objects.create(task=gone, kind="step", step_index=2, step_name="third", attempt=1, outcome="x")
        OldAttempt.objects.create(
            task=gone, kind="compensation", step_index=0, step_name="undo", attempt=1, outcome="x"
        )
        OldAttempt.objects.create(
            task=gone, kind="failure_notice", step_index=-1, step_name="on_failure", attempt=1, outcome="x"
        )
        # Its pipeline changed under it before this release: step "b" ran at two positions.
        shifted = OldTask.objects.create(id=uuid.uuid4(), pipeline="t_retired", state="queued", current_step=3)
        kept = OldCheckpoint.objects.create(task=shifted, step_index=1, step_name="b", output={"first": True})
        OldCheckpoint.objects.create(task=shifted, step_index=0, step_name="a", output=None)
        OldCheckpoint.objects.create(task=shifted, step_index=2, step_name="b", output={"first": False})
        untouched = OldTask.objects.create(id=uuid.uuid4(), pipeline="t_retired", state="queued")
        # A succeeded task never runs again: the bulk of a large table, not rewritten.
        done = OldTask.objects.create(id=uuid.uuid4(), pipeline="t_local", state="succeeded", current_step=2)
    finally:
        migrate(latest())

    assert Task.objects.get(pk=registered.pk).step_names == ["local_a", "local_b"]
    assert Task.objects.get(pk=gone.pk).step_names == ["first", "second", "third"]
    assert Task.objects.get(pk=untouched.pk).step_names == []
    assert Task.objects.get(pk=done.pk).step_names == []
    assert Task.objects.get(pk=shifted.pk).step_names == ["a", "b"]
    assert list(
        Checkpoint.objects.filter(task_id=shifted.pk).order_by("step_index").values_list("pk", "step_name")
    ) == [
        (kept.pk + 1, "a"),
        (kept.pk, "b"),
    ]
    # Whether a step had a compensation was not recorded before: unknown.
    assert set(Checkpoint.objects.values_list("has_compensation", flat=True)) == {None}
    # Checkpoints are unique by step name now, no longer by index.
    with pytest.raises(IntegrityError), transaction.atomic():
        Checkpoint.objects.create(task_id=registered.pk, step_index=5, step_name="local_a")
    Checkpoint.objects.create(task_id=registered.pk, step_index=0, step_name="local_b")


DETAIL_CODES_BEFORE = [("dlq", "0011_task_cancel_permission")]


def test_detail_codes_are_added_to_an_append_only_audit_log_that_keeps_its_rows():
    try:
        old = migrate(DETAIL_CODES_BEFORE)
        OldEntry = old.get_model("dlq", "AuditEntry")
        with pytest.raises(FieldDoesNotExist):
            OldEntry._meta.get_field("detail_code")
        written = OldEntry.objects.create(
            actor="old",
            action="bulk_request",
            target_type="bulk_operation",
            target_id="1",
            outcome="succeeded",
            detail="close on 3 items",
        )
    finally:
        # Adding the columns rewrites no row: the trigger that refuses every UPDATE lets the migration through.
        migrate(latest())
    entry = AuditEntry.objects.get(pk=written.pk)
    assert (entry.detail, entry.detail_code, entry.detail_params) == ("close on 3 items", "", {})
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).update(detail_code="bulk_items")
    # The defaults stay in the database: a previous release, which names neither column, can still append.
    assert AuditEntry.objects.filter(pk=_old_entry_append(), detail_code="", detail_params={}).exists()
