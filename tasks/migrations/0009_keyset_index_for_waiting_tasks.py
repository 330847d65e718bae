"""The index of waiting tasks gains the id: the sweeper walks them oldest first by keyset on (updated_at, id).

``task_state_updated_idx`` (state, updated_at) becomes ``task_state_updated_id_idx``
(state, updated_at, id), so each page of the walk is one range of the index
that starts after the last row read, ties on ``updated_at`` included. On
PostgreSQL the new index is built CONCURRENTLY (no write lock on a large
live table) before the old one is dropped, hence ``atomic = False``.
"""

from django.db import migrations, models

OLD = ("task_state_updated_idx", "(state, updated_at)")
NEW = ("task_state_updated_id_idx", "(state, updated_at, id)")


def _create(schema_editor, name, columns):
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON tasks_task {columns}", params=None)
        return
    # As in 0005 (a migration stays self-contained): a concurrent build that
    # failed (cancelled, deadlocked) leaves an INVALID index behind, which IF
    # NOT EXISTS would keep: drop it and build again.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    if row and row[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", params=None)
    schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON tasks_task {columns}", params=None)


def _drop(schema_editor, name):
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}", params=None)


def forwards(apps, schema_editor):
    _create(schema_editor, *NEW)
    _drop(schema_editor, OLD[0])


def backwards(apps, schema_editor):
    _create(schema_editor, *OLD)
    _drop(schema_editor, NEW[0])


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tasks", "0008_dead_letters_owned_by_the_engine")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="task", name=OLD[0]),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(fields=["state", "updated_at", "id"], name=NEW[0]),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        ),
    ]
