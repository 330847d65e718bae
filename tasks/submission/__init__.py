"""Submission: a task accepted once per request, from Python, over HTTP or from Django's Tasks framework.

- ``submit``: the one idempotent flow behind ``task_submit`` and ``POST /api/v1/tasks``.
- ``batches``: many submissions in one transaction (``task_submit_many``, ``POST /api/v1/tasks/batch``).
- ``idempotency``: one logical request per (scope, key), whatever the concurrency.
"""


def __getattr__(name: str):
    from tasks.moved import former_module_attribute

    return former_module_attribute(__name__, name)
