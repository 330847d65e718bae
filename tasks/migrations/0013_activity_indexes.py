"""Indexes for the dashboard's per-minute charts (``dlq.activity``): finished tasks, and attempts followed by a retry.

- ``task_finished_idx (finished_at) INCLUDE (state) WHERE finished_at IS NOT
  NULL``: tasks finished per minute and outcome, answered from the index
  alone. A task enters it when it finishes (a transition that already writes
  every index of the row, as ``state`` changes), so inserting tasks and a
  step's progress (a HOT update) cost it nothing.
- ``attempt_retried_idx (finished_at) WHERE retry_delay_seconds IS NOT NULL``:
  retries per minute. Only the attempts that had a retry scheduled after
  them are in it.

Raw SQL outside Django's model state, as in 0005 and 0011: built CONCURRENTLY
on PostgreSQL (no write lock on large live tables), hence ``atomic = False``.
"""

from django.db import migrations

INDEXES = {
    "task_finished_idx": "tasks_task (finished_at) INCLUDE (state) WHERE finished_at IS NOT NULL",
    "attempt_retried_idx": "tasks_stepattempt (finished_at) WHERE retry_delay_seconds IS NOT NULL",
}
SQLITE_INDEXES = {
    "task_finished_idx": "tasks_task (finished_at, state) WHERE finished_at IS NOT NULL",
    "attempt_retried_idx": INDEXES["attempt_retried_idx"],
}


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        for name, definition in INDEXES.items():
            # A concurrent build that failed leaves an INVALID index behind, which IF NOT EXISTS would keep.
            with schema_editor.connection.cursor() as cursor:
                cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
                row = cursor.fetchone()
            if row and row[0]:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", params=None)
            schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}", params=None)
    elif vendor == "sqlite":
        for name, definition in SQLITE_INDEXES.items():
            schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}", params=None)


def backwards(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS {name}", params=None)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tasks", "0012_stored_texts_in_the_readers_language")]

    operations = [migrations.RunPython(forwards, backwards)]
