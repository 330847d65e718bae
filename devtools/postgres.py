"""Plain PostgreSQL sessions for development tools (a database created for a test, a probe that a server is up),
through the driver Django itself uses: psycopg 3 when it is installed, else psycopg2.

A venv may hold either driver or both (the project supports both), and Django picks psycopg 3 whenever it
imports, so a tool that imported psycopg2 by name would fail where only psycopg 3 is installed, or test a
driver the engine does not use.
"""

from __future__ import annotations

try:
    import psycopg as driver
except ImportError:
    import psycopg2 as driver

# The connection failures both drivers raise (a server down, refusing, or gone mid-session).
OperationalError = driver.OperationalError
# The project's extra that installs this driver (pyproject.toml), for a venv a test builds to match this one.
EXTRA = "psycopg" if driver.__name__ == "psycopg" else "psycopg2"


def connect(dsn: str = "", *, autocommit: bool = False, **options):
    """A new session to ``dsn`` (a URL or ``key=value`` string; ``options`` as libpq keywords, None left out)."""
    session = driver.connect(dsn, **{key: value for key, value in options.items() if value is not None})
    session.autocommit = autocommit
    return session
