"""``@task`` functions of Django's Tasks framework for the tests of ``tasks.backends.ReliabilityBackend``.

Bound to the backend alias ``default``: whichever backend ``TASKS`` names
there when they are enqueued runs them (the tests and their workers name
``tasks.backends.ReliabilityBackend``).
"""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from tasks.exceptions import TransientError


@task
def add(a: int, b: int) -> dict:
    return {"sum": a + b}


@task(takes_context=True)
def flaky_once(context, word: str) -> str:
    # The first attempt meets a transient fault (a network blip): the engine retries it.
    if context.attempt == 1:
        raise TransientError("the far side was busy")
    return f"{word} on attempt {context.attempt}"


@task
def broken(password: str) -> None:
    raise ValueError(f"broken on purpose (password={password})")


@task
def returns_a_set() -> set:
    return {1, 2}


@task
async def add_async(a: int, b: int) -> int:
    return a + b


def not_a_task() -> str:
    return "plain functions never run"
