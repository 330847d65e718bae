"""The campaign's own PostgreSQL cluster: it starts, a fast restart drops every session, and it goes without a trace."""

from __future__ import annotations

import pytest

from chaos.topology import PostgresCluster
from devtools import postgres
from tests.support import LOG_DIR

# It starts a PostgreSQL server of its own.
pytestmark = pytest.mark.processes


def test_a_fast_restart_drops_every_session_and_the_server_comes_back():
    cluster = PostgresCluster(LOG_DIR)
    try:
        cluster.start()
        session = postgres.connect(f"{cluster.url}/postgres", autocommit=True)
        with session.cursor() as cursor:
            cursor.execute("SELECT current_setting('max_connections')::int, current_setting('fsync')")
            assert cursor.fetchone() == (150, "off")

        cluster.restart("fast", down_seconds=0.5)

        with pytest.raises(postgres.OperationalError), session.cursor() as cursor:
            cursor.execute("SELECT 1")
        fresh = postgres.connect(f"{cluster.url}/postgres")
        with fresh.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
        fresh.close()
        assert cluster.restarts == 1
    finally:
        cluster.remove()
    assert not cluster.directory.exists()
    with pytest.raises(postgres.OperationalError):
        postgres.connect(f"{cluster.url}/postgres", connect_timeout=2)
