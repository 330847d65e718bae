"""``scale_data_seed``: fill PostgreSQL with the scale data, batch by batch, and refuse a database already in use.

PostgreSQL only. Two runs into an empty database with the same arguments make
the same rows (their times count back from the moment of the run); a run into
a table that already holds rows gets its own salt for the ids, and more than
``EXISTING_ROWS_LIMIT`` rows need ``force``: the seed is not meant to top up a
live database.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from django.db import connection
from django.utils import timezone

from devtools.scale_data.shape import SEEDED_TABLES, SeedPlan
from devtools.scale_data.sql import detail_inserts, dlq_insert, sql_params, tasks_insert
from devtools.scale_data.vacuum import seeded_tables_analyzed

# More existing rows than this and the command wants --force: it is not meant to top up a live database.
EXISTING_ROWS_LIMIT = 5_000


class SeedRefused(Exception):
    """The seed cannot run here (not PostgreSQL, or tables already full); the message says why, in one line."""


def _existing_rows(cursor, table: str) -> int:
    # Counts at most one row past the limit: cheap on a table of any size.
    cursor.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT {EXISTING_ROWS_LIMIT + 1}) AS existing")
    return cursor.fetchone()[0]


def _in_batches(cursor, sql: str, params: dict, *, total: int, batch: int, what: str, progress) -> None:
    started = time.monotonic()
    for first in range(0, total, batch):
        last = min(first + batch, total) - 1
        cursor.execute(sql, {**params, "first": first, "last": last})
        elapsed = max(time.monotonic() - started, 1e-6)
        done = last + 1
        progress(f"{what}: {done:,}/{total:,} ({100 * done // total}%) in {elapsed:.0f}s ({done / elapsed:,.0f}/s)")


def scale_data_seed(
    *,
    tasks: int,
    dlq_items: int,
    batch: int = 200_000,
    seed: int = 1,
    force: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, int]:
    """Insert ``tasks`` tasks and ``dlq_items`` DLQ items (plus a few tasks' details); return rows per table.

    Raises ``SeedRefused`` before writing anything when the database is not PostgreSQL, or when a table
    already holds more than ``EXISTING_ROWS_LIMIT`` rows and ``force`` is off.
    """
    if connection.vendor != "postgresql":
        raise SeedRefused(f"seed_scale_data needs PostgreSQL; this database is {connection.vendor}")
    started = time.monotonic()
    with connection.cursor() as cursor:
        existing = {table: _existing_rows(cursor, table) for table in ("tasks_task", "dlq_dlqitem")}
        crowded = [table for table, count in existing.items() if count > EXISTING_ROWS_LIMIT]
        if crowded and not force:
            raise SeedRefused(
                f"{', '.join(crowded)} already hold more than {EXISTING_ROWS_LIMIT:,} rows; "
                f"use --force to add more, or seed an empty database"
            )
        # Ids are md5(salt/ordinal): a second run into a non-empty table needs its own salt.
        salt = str(seed) if not any(existing.values()) else f"{seed}-{uuid.uuid4().hex}"
        plan = SeedPlan(tasks=tasks, dlq_items=dlq_items, seed=seed, salt=salt, now=timezone.now())
        params = sql_params(plan)
        # A benchmark load: losing the last commits in a crash costs nothing, waiting for each flush does.
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SET work_mem = '64MB'")
        # Compiling the wide row expression costs seconds per statement, more than running it.
        cursor.execute("SET jit = off")
        try:
            _in_batches(cursor, tasks_insert(plan), params, total=tasks, batch=batch, what="tasks", progress=progress)
            _in_batches(
                cursor, dlq_insert(plan), params, total=dlq_items, batch=batch, what="DLQ items", progress=progress
            )
            for sql in detail_inserts(plan):
                cursor.execute(sql, params)
            progress("task details: attempts, checkpoints, side effects")
            # VACUUM also sets the visibility map, so index-only scans behave as on a table that autovacuum keeps.
            seeded_tables_analyzed(cursor, SEEDED_TABLES, progress=progress)
        finally:
            cursor.execute("RESET synchronous_commit")
            cursor.execute("RESET work_mem")
            cursor.execute("RESET jit")
        counts = {}
        for table in SEEDED_TABLES:
            cursor.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cursor.fetchone()[0]
    progress(f"seeded {tasks:,} tasks and {dlq_items:,} DLQ items in {time.monotonic() - started:.0f}s")
    return counts
