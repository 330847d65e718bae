"""``attempt_error_code_idx`` holds failed attempts only: a successful step writes no entry in it.

Every step writes an attempt row, and most succeed with an empty
``error_code``: each success added an index entry nobody looks up (the
readers of attempts go by task, through ``attempt_task_step_idx``; the index
serves looking failures up by their code). The index becomes partial
(``WHERE error_code <> ''``), so a step's write keeps 4 index entries of 5.

As in 0018: built CONCURRENTLY beside the old one on PostgreSQL (no write
lock on the largest table), which then takes its name; hence ``atomic =
False``. The model's state follows with the same index, its condition
declared.
"""

from django.db import migrations, models

NAME = "attempt_error_code_idx"
PARTIAL = "tasks_stepattempt (error_code) WHERE error_code <> ''"
WHOLE = "tasks_stepattempt (error_code)"


def _invalid(schema_editor, name: str) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return bool(row and row[0])


def _rebuild(schema_editor, definition: str) -> None:
    if schema_editor.connection.vendor != "postgresql":  # SQLite (local use): small tables, no ALTER INDEX
        schema_editor.execute(f"DROP INDEX IF EXISTS {NAME}", params=None)
        schema_editor.execute(f"CREATE INDEX {NAME} ON {definition}", params=None)
        return
    building = f"{NAME}_new"
    # A concurrent build that failed leaves an INVALID index behind, which IF NOT EXISTS would keep.
    if _invalid(schema_editor, building):
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {building}", params=None)
    schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {building} ON {definition}", params=None)
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}", params=None)
    schema_editor.execute(f"ALTER INDEX {building} RENAME TO {NAME}", params=None)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor in ("postgresql", "sqlite"):
        _rebuild(schema_editor, PARTIAL)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor in ("postgresql", "sqlite"):
        _rebuild(schema_editor, WHOLE)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tasks", "0020_task_hold_start_time")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.RemoveIndex(model_name="stepattempt", name=NAME),
                migrations.AddIndex(
                    model_name="stepattempt",
                    index=models.Index(fields=["error_code"], name=NAME, condition=~models.Q(error_code="")),
                ),
            ],
        )
    ]
