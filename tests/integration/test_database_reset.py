"""A transactional test's teardown (tests/database_reset.py) leaves what Django's flush leaves: every table empty
but the content types and permissions, which are what post_migrate makes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from dlq.audit import audit_record
from dlq.models import AuditOutcome
from dlq.roles import roles_setup
from tasks.models import Task
from tasks.submission.submit import task_submit
from tests.database_reset import MADE_BY_POST_MIGRATE, _database_emptied

pytestmark = pytest.mark.django_db(transaction=True)


def rows_per_table() -> dict[str, int]:
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        counts = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


def permissions() -> set[tuple[str, str]]:
    return set(Permission.objects.values_list("content_type__app_label", "codename"))


def test_every_table_is_emptied_and_the_permissions_are_kept(clean_redis):
    made_by_post_migrate = permissions()
    roles_setup()
    task_submit(pipeline="t_local", input={"data": {"x": 1}})
    # The audit log's trigger refuses a DELETE but not the reset's.
    audit_record(actor="someone", action="close", target_type="dlqitem", target_id="7", outcome=AuditOutcome.SUCCEEDED)
    assert Task.objects.exists() and Group.objects.exists()

    _database_emptied(connection.alias)

    assert {table for table, rows in rows_per_table().items() if rows} == set(MADE_BY_POST_MIGRATE)
    assert permissions() == made_by_post_migrate


def test_permissions_a_test_changed_are_made_again():
    made_by_post_migrate = permissions()
    assert ("tasks", "view_task") in made_by_post_migrate
    Permission.objects.filter(codename="view_task").delete()
    ContentType.objects.create(app_label="gone", model="stale")

    _database_emptied(connection.alias)

    assert permissions() == made_by_post_migrate
    assert not ContentType.objects.filter(app_label="gone").exists()
