"""The retention purge's index: finished tasks without an open dead letter, oldest finish first.

The purge (``tasks.lifecycle.retention``) walks it in (finished_at, id) order from where
its last batch stopped and locks a batch of rows. Partial: a task enters it
when it reaches a terminal state with no unresolved dead letter, so the rows
being worked on (queued, running, retrying, compensating) and tasks parked in
the DLQ are not in it: inserting a task and a step's progress write nothing
to it, and the purge never steps over tasks it must keep because an operator
has not resolved them yet.

The predicate must stay the one ``tasks.lifecycle.retention`` filters on (the same
states, sorted, and ``NOT in_dlq``), or PostgreSQL cannot use the index;
``tests/integration/test_retention.py`` checks the plan.

Raw SQL outside Django's model state, as in 0005: built CONCURRENTLY on
PostgreSQL (no write lock on a large live table), hence ``atomic = False``.
"""

from django.db import migrations

NAME = "task_purge_candidates_idx"
DEFINITION = (
    "(finished_at, id) WHERE state IN ('compensated', 'compensation_failed', 'failed', 'succeeded') AND NOT in_dlq"
)


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        # A concurrent build that failed leaves an INVALID index behind, which IF NOT EXISTS would keep.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [NAME])
            row = cursor.fetchone()
        if row and row[0]:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}", params=None)
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {NAME} ON tasks_task {DEFINITION}", params=None)
    elif vendor == "sqlite":
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON tasks_task {DEFINITION}", params=None)


def backwards(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS {NAME}", params=None)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tasks", "0010_retention_purge")]

    operations = [migrations.RunPython(forwards, backwards)]
