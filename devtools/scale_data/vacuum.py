"""VACUUM a freshly seeded table until its pages are marked all-visible, as autovacuum keeps a live table.

The console's index-only scans skip the table only on pages marked all-visible, and VACUUM marks a page only
when every row on it is visible to every open snapshot. Straight after a seed, another session often still
holds one from before the last batch: autovacuum's own ANALYZE of the table seeded first (5 million rows) is
the usual one. Two seeds of the console bench left `dlq_dlqitem` with 0 % and 20 % of its pages marked, and
its dashboard took 585 ms instead of 135. So a table left under ``VISIBLE_ENOUGH`` waits for the older
snapshots of its database to end and is vacuumed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.db import connection

VISIBLE_ENOUGH = 0.95
# How long to wait for the other sessions' older snapshots before leaving a table as it is.
WAIT_SECONDS = 300.0
POLL_SECONDS = 0.5

_OLDER_SNAPSHOTS = """
SELECT count(*) FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND (datid IS NULL OR datname = current_database())
   AND backend_xmin IS NOT NULL AND age(backend_xmin) > age(%s::text::xid)
"""


def visible_share(cursor, table: str) -> float:
    """The share of ``table``'s pages marked all-visible, as its last VACUUM or ANALYZE counted them."""
    cursor.execute(
        "SELECT relallvisible::float / greatest(relpages, 1) FROM pg_class WHERE oid = %s::regclass", [table]
    )
    return cursor.fetchone()[0]


def vacuum_analyze(
    cursor,
    tables,
    *,
    progress: Callable[[str], None] = lambda line: None,
    wait_seconds: float = WAIT_SECONDS,
) -> dict[str, float]:
    """``VACUUM (ANALYZE)`` each of ``tables`` (outside a transaction); vacuum again one left under
    ``VISIBLE_ENOUGH`` once older snapshots are gone; return each table's share of all-visible pages."""
    shares = {}
    for table in tables:
        cursor.execute(f"VACUUM (ANALYZE) {table}")
        share = visible_share(cursor, table)
        deadline = time.monotonic() + wait_seconds
        while share < VISIBLE_ENOUGH and time.monotonic() < deadline:
            # Snapshots taken before a transaction that starts now (a 32-bit xid): they held the marks back.
            cursor.execute("SELECT (txid_current() % 4294967296)::text")
            cursor.execute(_OLDER_SNAPSHOTS, [cursor.fetchone()[0]])
            if cursor.fetchone()[0]:
                time.sleep(POLL_SECONDS)
                continue
            cursor.execute(f"VACUUM {table}")
            share = visible_share(cursor, table)
        if share < VISIBLE_ENOUGH:
            progress(f"{table}: {share:.0%} of its pages all-visible after {wait_seconds:.0f} s (older snapshots)")
        shares[table] = share
    return shares


def seeded_tables_analyzed(cursor, tables, *, progress: Callable[[str], None] = lambda line: None) -> None:
    """After a seed: ``vacuum_analyze`` the tables, or only ANALYZE them inside a transaction (a test's), where
    VACUUM cannot run."""
    if connection.in_atomic_block:
        for table in tables:
            cursor.execute(f"ANALYZE {table}")
        progress("ANALYZE: done")
    else:
        vacuum_analyze(cursor, tables, progress=progress)
        progress("VACUUM (ANALYZE): done")
