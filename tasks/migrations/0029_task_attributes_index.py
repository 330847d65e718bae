"""The index behind a search by attribute (tasks.pipelines.attributes): GIN with ``jsonb_path_ops`` on the task's
``attributes``, which answers ``attributes @> '{"order_id": "A1001"}'`` for any declared name (the names are
the pipelines', not the schema's: one index serves them all). A task without attributes (NULL) has no entry.

Raw SQL outside the model state, built CONCURRENTLY (no write lock on a large live table), as 0005's indexes;
SQLite gets none (its search reads the key with JSON_EXTRACT).
"""

from django.db import migrations

INDEX = "task_attributes_gin_idx"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [INDEX])
        row = cursor.fetchone()
    if row and row[0]:  # a concurrent build that failed leaves an INVALID index: build it again
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}", params=None)
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON tasks_task USING gin (attributes jsonb_path_ops)",
        params=None,
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}", params=None)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0028_task_attributes"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
