"""PostgreSQL helpers shared by the benchmark scripts (psycopg2, no Django)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def database_url(server_url: str, name: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))


def connect(url: str, autocommit: bool = True):
    import psycopg2

    connection = psycopg2.connect(url)
    connection.autocommit = autocommit
    return connection


def scalar(url: str, sql: str, params=()):
    connection = connect(url)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
            return row[0] if row else None
    finally:
        connection.close()


def on_server(server_url: str, *statements: str) -> None:
    """Run statements on the server's maintenance database (CREATE and DROP DATABASE cannot run in the target)."""
    admin = connect(database_url(server_url, "postgres"))
    try:
        with admin.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
    finally:
        admin.close()


def drop_database(server_url: str, name: str) -> None:
    # Only ever a benchmark's own database: FORCE ends sessions a crashed run left behind.
    on_server(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def recreate_database(server_url: str, name: str) -> None:
    drop_database(server_url, name)
    on_server(server_url, f'CREATE DATABASE "{name}"')
