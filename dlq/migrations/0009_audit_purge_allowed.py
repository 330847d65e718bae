"""The audit log stays append-only, with one exception: the retention purge of old entries.

The trigger of 0003 rejected every UPDATE and DELETE. Now a DELETE passes
when the transaction says which entries it purges: ``dlq.audit`` sets the
transaction-local ``reliability.audit_purge_before`` to its cutoff
(``set_config(..., true)``, gone at commit, so nothing leaks to the next
transaction of a pooled connection) and the trigger lets a row go only when
it was created before that instant. The same transaction appends an
``audit_purged`` entry. UPDATE is still always rejected, and so is any other
DELETE. (The setting is a guard against mistakes, not a permission: a
database owner may drop the trigger anyway.)
"""

from django.db import migrations

TABLE = "dlq_auditentry"

PURGE_ALLOWED = f"""
CREATE OR REPLACE FUNCTION dlq_audit_append_only() RETURNS trigger AS $$
DECLARE
    purge_before text := current_setting('reliability.audit_purge_before', true);
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(purge_before, '') <> '' AND OLD.created_at < purge_before::timestamptz THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: % is not allowed on {TABLE}', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

# The function as 0003 made it.
APPEND_ONLY = f"""
CREATE OR REPLACE FUNCTION dlq_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % is not allowed on {TABLE}', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PURGE_ALLOWED, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(APPEND_ONLY, params=None)


class Migration(migrations.Migration):
    dependencies = [("dlq", "0008_dlqitem_is_a_view_of_the_engines_dead_letter")]

    operations = [migrations.RunPython(forwards, backwards)]
