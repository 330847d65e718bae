"""What a database error says, whichever driver Django runs on: psycopg 3 or psycopg2.

Django wraps the driver's exception in its own (``django.db.DatabaseError`` and
subclasses) and keeps the original as ``__cause__``; the two drivers name the
server's error code differently, and only psycopg 3 raises a ``ProgrammingError``
of its own for parameters that do not fit their placeholders (psycopg2 raises
``TypeError`` or ``IndexError`` there).
"""

from __future__ import annotations

from django.db import ProgrammingError


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE the server answered with (``"26000"``), or None for an error the server never sent."""
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


def refused_by_driver(exc: BaseException) -> bool:
    """Whether the driver refused a statement's parameters before sending it (never an error of the server's)."""
    return isinstance(exc, ProgrammingError) and exc.__cause__ is not None and sqlstate(exc) is None
