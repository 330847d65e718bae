"""Declaring pipelines: what a pipeline author writes, checked when it is declared.

A pipeline module imports these from the public surface, ``tasks`` (``from tasks import Pipeline, RetryPolicy``).

- ``pipeline``: ``Pipeline``, its steps (sleeps and waits too) and their compensations, ``FailurePolicy``.
- ``retry``: ``RetryPolicy``, a value that turns (attempt, error, clock) into a decision.
- ``schedules``: ``Schedule``, a pipeline's tasks submitted by the clock.
- ``limits``: the values of a pipeline's limits (a rate, a concurrency, the gate a task passes).
- ``attributes``: the search attributes a pipeline declares.
- ``changes``: may a task in flight go on when its pipeline's steps changed.
"""


def __getattr__(name: str):
    from tasks.moved import former_module_attribute

    return former_module_attribute(__name__, name)
