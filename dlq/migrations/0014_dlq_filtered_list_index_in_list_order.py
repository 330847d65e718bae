"""The filtered DLQ list's covering index in the list's own order (PostgreSQL only).

The list orders by ``created_at DESC, id DESC`` (the admin adds the primary
key so that pages are stable), and its capped count (``SELECT COUNT(*) FROM
(… ORDER BY created_at DESC, id DESC LIMIT 10001)``) keeps that order. 0007's
``dlq_status_pipeline_created_idx (status, pipeline, created_at DESC)`` lacks
the id, so the order needed a sort over the index, and PostgreSQL preferred
walking ``dlq_created_idx`` and filtering: at 1,000,000 items the count of
``?status__exact=open&pipeline__exact=report`` read 137,000 rows for 10,001
(76 ms of the page's 152; docs/performance.md). With the id in the key the
count, the list's page and its failure-groups panel read only the matching
entries, in order, from the index alone: the count takes 2 ms, the page 98.

The index is rebuilt under the same name (built beside the old one, then
renamed), so the number of indexes a dead letter's insert and status change
write is unchanged; the tasks table is not touched. Built CONCURRENTLY, hence
non-atomic.
"""

from django.db import migrations

NAME = "dlq_status_pipeline_created_idx"
INCLUDED = "INCLUDE (fingerprint, failing_step, error_code)"
DEFINITION_BEFORE = f"ON dlq_dlqitem (status, pipeline, created_at DESC) {INCLUDED}"
DEFINITION_AFTER = f"ON dlq_dlqitem (status, pipeline, created_at DESC, id DESC) {INCLUDED}"


def _rebuild(schema_editor, definition: str) -> None:
    if schema_editor.connection.vendor != "postgresql":  # as 0007: no such index elsewhere
        return
    building = f"{NAME}_new"
    # A concurrent build that failed leaves an INVALID index behind, which IF NOT EXISTS would keep.
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {building}", params=None)
    schema_editor.execute(f"CREATE INDEX CONCURRENTLY {building} {definition}", params=None)
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}", params=None)
    schema_editor.execute(f"ALTER INDEX {building} RENAME TO {NAME}", params=None)


def forwards(apps, schema_editor):
    _rebuild(schema_editor, DEFINITION_AFTER)


def backwards(apps, schema_editor):
    _rebuild(schema_editor, DEFINITION_BEFORE)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("dlq", "0013_alert_channel_disabled_reason")]

    operations = [migrations.RunPython(forwards, backwards)]
