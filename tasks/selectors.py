"""Reads on tasks."""

from __future__ import annotations

import uuid

from tasks.models import Task


def task_states(*, task_ids: list[uuid.UUID]) -> dict[str, str]:
    """{task id: state} for the given ids; unknown ids map to "missing"."""
    found = {str(pk): state for pk, state in Task.objects.filter(pk__in=task_ids).values_list("pk", "state")}
    return {str(pk): found.get(str(pk), "missing") for pk in task_ids}
