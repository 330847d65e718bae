"""Indexes behind the task list's filters and search (tasks/admin.py), for tables of millions of tasks.

- state and failing step, each with the creation time: a filtered list walks
  one index in the list's order and stops after a page;
- the error code, for the exact search;
- on PostgreSQL, a trigram index on UPPER(failure_message): Django's
  ``icontains`` compares ``UPPER(col) LIKE UPPER('%term%')``, which this
  index answers without reading the table. pg_trgm is a trusted extension
  (PostgreSQL 13+), so the database owner may create it;
- on PostgreSQL 14+, statistics on that expression. A trigram index gives the
  planner no estimate of how many messages match, and its default guess is
  tiny: a common phrase ("timeout", matching 5% of 5M tasks) was then fetched
  through the index, every match read and sorted (0.6 s). With the statistics
  it walks the creation-time index instead and stops after a page (1 ms).

The indexes are raw SQL, outside Django's model state: the models do not
declare them, so ``makemigrations`` stays quiet. On PostgreSQL they are built
CONCURRENTLY (no write lock on a large live table), hence ``atomic = False``.
On SQLite the b-tree indexes are created and the trigram index is skipped.
"""

from django.db import migrations

BTREE_INDEXES = {
    "task_state_created_idx": "(state, created_at DESC)",
    "task_failed_step_created_idx": "(failed_step, created_at DESC)",
    "task_failure_code_idx": "(failure_code)",
}
TRIGRAM_INDEX = "task_failure_message_trgm_idx"
MESSAGE_STATISTICS = "task_failure_message_upper_stats"


def _create_concurrently(schema_editor, name, definition):
    # A concurrent build that failed (cancelled, deadlocked) leaves an INVALID
    # index behind, which IF NOT EXISTS would keep: drop it and build again.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    if row and row[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", params=None)
    schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON tasks_task {definition}", params=None)


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm", params=None)
        for name, columns in BTREE_INDEXES.items():
            _create_concurrently(schema_editor, name, columns)
        _create_concurrently(schema_editor, TRIGRAM_INDEX, "USING gin (UPPER(failure_message) gin_trgm_ops)")
        if schema_editor.connection.pg_version >= 140000:
            schema_editor.execute(
                f"CREATE STATISTICS IF NOT EXISTS {MESSAGE_STATISTICS} ON (UPPER(failure_message)) FROM tasks_task",
                params=None,
            )
            schema_editor.execute("ANALYZE tasks_task", params=None)
    elif vendor == "sqlite":
        for name, columns in BTREE_INDEXES.items():
            schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON tasks_task {columns}", params=None)


def backwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {MESSAGE_STATISTICS}", params=None)
        for name in [*BTREE_INDEXES, TRIGRAM_INDEX]:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", params=None)
    elif vendor == "sqlite":
        for name in BTREE_INDEXES:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}", params=None)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tasks", "0004_sweeper_heartbeat")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
