"""The seeds' VACUUM waits out an older snapshot, so a seeded table's pages end up all-visible (index-only scans).

A session that took its snapshot before the rows were inserted keeps VACUUM from marking their pages; the
console bench's dashboard took 585 ms instead of 135 after a seed left the DLQ table so.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from devtools import postgres
from devtools.scale_data.vacuum import VISIBLE_ENOUGH, vacuum_analyze, visible_share
from tests.support import database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "rc_vacuum_probe"


@pytest.fixture
def table():
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, note text)")
    yield TABLE
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")


@pytest.fixture
def old_snapshot(table):
    """Another session holding a snapshot taken before the table's rows were inserted."""
    session = postgres.connect(database_url(), autocommit=False)
    with session.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute(f"SELECT count(*) FROM {table}")
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} SELECT n, repeat('x', 100) FROM generate_series(1, 20000) AS n")
    yield session
    session.rollback()
    session.close()


def _vacuums(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_vacuum_count(%s::regclass)", [table])
        return cursor.fetchone()[0]


def test_waits_for_the_older_snapshot_then_marks_the_pages(table, old_snapshot):
    shares = {}
    lines = []

    def seed_vacuum():
        with connection.cursor() as cursor:
            shares.update(vacuum_analyze(cursor, [table], progress=lines.append, wait_seconds=60))
        connection.close()

    worker = threading.Thread(target=seed_vacuum)
    worker.start()
    # The first VACUUM ran under the old snapshot: its marks are held back.
    wait_for(lambda: _vacuums(table) >= 1, timeout=30, message="the first VACUUM")
    with connection.cursor() as cursor:
        assert visible_share(cursor, table) < VISIBLE_ENOUGH
    old_snapshot.rollback()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert shares[table] >= VISIBLE_ENOUGH
    assert lines == []


def test_a_snapshot_that_stays_is_reported_after_the_wait(table, old_snapshot):
    lines = []
    with connection.cursor() as cursor:
        shares = vacuum_analyze(cursor, [table], progress=lines.append, wait_seconds=1)
    assert shares[table] < VISIBLE_ENOUGH
    assert len(lines) == 1 and lines[0].startswith(f"{table}: 0% of its pages all-visible after 1 s")
