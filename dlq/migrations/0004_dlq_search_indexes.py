"""A trigram index behind the DLQ list's error-message search, on PostgreSQL.

Django's ``icontains`` compares ``UPPER(col) LIKE UPPER('%term%')``; a GIN
trigram index on ``UPPER(error_message)`` answers it without reading a
million-row table. Built CONCURRENTLY (hence non-atomic); skipped on SQLite.
"""

from django.db import migrations

INDEX = "dlq_error_message_trgm_idx"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm", params=None)
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON dlq_dlqitem "
            "USING gin (UPPER(error_message) gin_trgm_ops)",
            params=None,
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}", params=None)


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("dlq", "0003_audit_append_only")]

    operations = [migrations.RunPython(forwards, backwards)]
