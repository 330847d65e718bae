"""Indexes of live control (issue #14), and the purge index with the new terminal state ``cancelled``.

- ``task_held_idx (pipeline, updated_at, id) WHERE state = 'queued' AND hold
  <> ''``: the tasks waiting for their pipeline's pause or limits to let them
  start, oldest first per pipeline (``tasks.execution.gates`` releases them). Only
  held tasks are in it, so submissions and steps cost it nothing.
- ``task_cancel_pending_idx (cancel_requested_at) WHERE cancel_requested_at
  IS NOT NULL AND state IN ('queued', 'retry_scheduled')``: cancels the
  sweeper still has to carry out (a task that was held or scheduled to retry
  when its cancel came in a race with a worker). Nearly always empty.
- ``task_purge_candidates_idx`` (0011) is rebuilt with ``cancelled`` among
  the terminal states, so the retention purge (``tasks.lifecycle.retention``, whose
  filter must match the predicate) still uses it and purges cancelled tasks
  too: the new index is built beside the old one, then takes its name.

Raw SQL outside Django's model state, as in 0011 and 0013: built
CONCURRENTLY on PostgreSQL (no write lock on large live tables), hence
``atomic = False``.
"""

from django.db import migrations

INDEXES = {
    "task_held_idx": "tasks_task (pipeline, updated_at, id) WHERE state = 'queued' AND hold <> ''",
    "task_cancel_pending_idx": (
        "tasks_task (cancel_requested_at) WHERE cancel_requested_at IS NOT NULL "
        "AND state IN ('queued', 'retry_scheduled')"
    ),
}
PURGE_INDEX = "task_purge_candidates_idx"
PURGE_STATES_BEFORE = "'compensated', 'compensation_failed', 'failed', 'succeeded'"
PURGE_STATES_AFTER = "'cancelled', 'compensated', 'compensation_failed', 'failed', 'succeeded'"
PURGE_DEFINITION = "(finished_at, id) WHERE state IN ({states}) AND NOT in_dlq"


def _invalid(schema_editor, name: str) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return bool(row and row[0])


def _create(schema_editor, name: str, definition: str) -> None:
    if schema_editor.connection.vendor == "postgresql":
        # A concurrent build that failed leaves an INVALID index behind, which IF NOT EXISTS would keep.
        if _invalid(schema_editor, name):
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}", params=None)
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}", params=None)
    else:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}", params=None)


def _drop(schema_editor, name: str) -> None:
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS {name}", params=None)


def _purge_index(schema_editor, states: str) -> None:
    definition = "tasks_task " + PURGE_DEFINITION.format(states=states)
    if schema_editor.connection.vendor != "postgresql":  # SQLite (local use) has no ALTER INDEX
        _drop(schema_editor, PURGE_INDEX)
        _create(schema_editor, PURGE_INDEX, definition)
        return
    building = f"{PURGE_INDEX}_new"
    _create(schema_editor, building, definition)
    _drop(schema_editor, PURGE_INDEX)
    schema_editor.execute(f"ALTER INDEX {building} RENAME TO {PURGE_INDEX}", params=None)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor not in ("postgresql", "sqlite"):
        return
    for name, definition in INDEXES.items():
        _create(schema_editor, name, definition)
    _purge_index(schema_editor, PURGE_STATES_AFTER)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor not in ("postgresql", "sqlite"):
        return
    for name in INDEXES:
        _drop(schema_editor, name)
    _purge_index(schema_editor, PURGE_STATES_BEFORE)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tasks", "0017_live_control")]

    operations = [migrations.RunPython(forwards, backwards)]
