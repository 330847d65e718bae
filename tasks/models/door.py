"""The write door: only ``tasks.lifecycle`` writes a task's rows (Task, DeadLetter, StepAttempt, Checkpoint,
SideEffect), and these models' managers refuse a bulk write anywhere else.

procrastinate keeps its Django models read-only so that only its job manager changes a job; here every
creation, change and deletion of those rows is a function of ``tasks.lifecycle``, decorated ``@door``, which
opens the door for the code it calls (its own queries, the fenced writes, the dead letter of the same outcome).
Outside it, ``update()``, ``delete()``, ``bulk_create()`` and ``bulk_update()`` on these models' querysets raise
``WriteOutsideDoor``, naming the door; ``tests/unit/test_write_door.py`` finds the writes a manager cannot see
(``save()``, ``create()``, the FSM's transitions, raw SQL) by reading the code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

from django.db import models

_inside = ContextVar("tasks_write_door_open", default=False)

P = ParamSpec("P")
R = TypeVar("R")


class WriteOutsideDoor(RuntimeError):
    """A task's rows written outside ``tasks.lifecycle``: a programming error, never a user's."""


def door(function: Callable[P, R]) -> Callable[P, R]:
    """Mark ``function`` as a door of ``tasks.lifecycle``: the rows it writes may be written while it runs."""

    @functools.wraps(function)
    def opened(*args: P.args, **kwargs: P.kwargs) -> R:
        token = _inside.set(True)
        try:
            return function(*args, **kwargs)
        finally:
            _inside.reset(token)

    return opened


@contextmanager
def door_forced() -> Iterator[None]:
    """Write rows as the door would not: test fixtures forging a state, development tools making data."""
    token = _inside.set(True)
    try:
        yield
    finally:
        _inside.reset(token)


def _refuse_outside(queryset: models.QuerySet, operation: str) -> None:
    if not _inside.get():
        raise WriteOutsideDoor(
            f"{queryset.model.__name__}.objects…{operation}() outside tasks.lifecycle: a task's rows are written "
            "only by the write door's functions (tasks.lifecycle); call the one for this change, or add it there"
        )


class DoorQuerySet(models.QuerySet):
    """A queryset of a task's rows: reads anywhere, bulk writes only inside the door."""

    def update(self, **kwargs):
        _refuse_outside(self, "update")
        return super().update(**kwargs)

    def delete(self):
        _refuse_outside(self, "delete")
        return super().delete()

    def bulk_create(self, objs, *args, **kwargs):
        _refuse_outside(self, "bulk_create")
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, objs, fields, *args, **kwargs):
        _refuse_outside(self, "bulk_update")
        return super().bulk_update(objs, fields, *args, **kwargs)


class DoorManager(models.Manager.from_queryset(DoorQuerySet)):
    """The default manager of a task's rows (``DoorQuerySet``)."""
