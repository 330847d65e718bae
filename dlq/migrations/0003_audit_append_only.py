"""On PostgreSQL the audit log is append-only: a trigger rejects UPDATE and DELETE.

TRUNCATE stays possible for the database owner (test flushes use it); the
application never issues it.
"""

from django.db import migrations

TABLE = "dlq_auditentry"

CREATE = f"""
CREATE OR REPLACE FUNCTION dlq_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % is not allowed on {TABLE}', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER dlq_audit_append_only
    BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION dlq_audit_append_only();
"""

DROP = f"""
DROP TRIGGER IF EXISTS dlq_audit_append_only ON {TABLE};
DROP FUNCTION IF EXISTS dlq_audit_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("dlq", "0002_operator_console")]

    operations = [migrations.RunPython(forwards, backwards)]
