"""How a transactional test's database is emptied after it: DELETE, where Django's TransactionTestCase uses TRUNCATE.

Django empties every table with one TRUNCATE and then sends post_migrate,
which makes the content types and permissions again. On PostgreSQL a TRUNCATE
gives every table and index new files: 0.5 to 1 s for this schema, after each
of some 600 transactional tests, where deleting the few rows a test left takes
milliseconds. The content types and permissions are left in place when no test
changed them since the last full reset (their rows are compared), so
post_migrate, another tenth of a second, is sent only when they changed. What
the next test finds is what Django's flush leaves: every other table empty.
"""

from __future__ import annotations

from django.core.management.sql import emit_post_migrate_signal
from django.db import connections, transaction
from django.test import TransactionTestCase

# The tables post_migrate fills again after a flush (django.contrib.contenttypes and django.contrib.auth).
MADE_BY_POST_MIGRATE = ("django_content_type", "auth_permission")

_django_fixture_teardown = TransactionTestCase._fixture_teardown
# Per database alias: the rows of MADE_BY_POST_MIGRATE after the last full reset, as one digest.
_after_full_reset: dict[str, str] = {}


def fixture_teardown(test_case: TransactionTestCase) -> None:
    """``TransactionTestCase._fixture_teardown`` by DELETE (PostgreSQL; Django's own otherwise)."""
    if test_case.available_apps is not None or test_case.serialized_rollback:
        _django_fixture_teardown(test_case)
        return
    for alias in test_case._databases_names(include_mirrors=False):
        if connections[alias].vendor == "postgresql":
            _database_emptied(alias)
        else:
            _django_fixture_teardown(test_case)


def _database_emptied(alias: str) -> None:
    connection = connections[alias]
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    remade = [table for table in MADE_BY_POST_MIGRATE if table in tables]
    unchanged = alias in _after_full_reset and _after_full_reset[alias] == _digest(connection, remade)
    emptied = [table for table in tables if not (unchanged and table in remade)]
    # Every table is emptied in one transaction, so no foreign key needs checking, and the audit log's
    # append-only trigger must not refuse (TRUNCATE, the owner's privilege, does not fire it either).
    # One round trip for all the statements.
    statements = ["SET LOCAL session_replication_role = replica"]
    statements += [f"DELETE FROM {connection.ops.quote_name(table)}" for table in emptied]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute("; ".join(statements))
    if not unchanged:
        emit_post_migrate_signal(verbosity=0, interactive=False, db=alias)
        _after_full_reset[alias] = _digest(connection, remade)


def _digest(connection, tables: list[str]) -> str:
    parts = [
        f"(SELECT coalesce(md5(string_agg(row_text, ',' ORDER BY row_text)), '') "
        f"FROM (SELECT t::text AS row_text FROM {connection.ops.quote_name(table)} t) AS rows)"
        for table in tables
    ]
    if not parts:
        return ""
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + " || ".join(parts))
        return cursor.fetchone()[0]
