"""Purging finished tasks: their rows and everything they own go, in one batch (``lifecycle.retention`` picks them)."""

from __future__ import annotations

from tasks.models import DeadLetter, DLQStatus, Task
from tasks.models.door import door


@door
def tasks_purge(*, task_ids: list) -> dict[str, int]:
    """Delete the tasks ``task_ids`` (locked by the caller) with their resolved dead letters; rows deleted by model.

    The caller has kept back every task that must stay (``tasks.lifecycle.retention``).
    """
    # Resolved dead letters protect their task (PROTECT): they go first. An unresolved one is not here (its
    # task is kept, and the task's row is locked); if one were, the task's delete would raise ProtectedError
    # and roll the whole batch back.
    _, dead_letters = DeadLetter.objects.filter(task_id__in=task_ids, status=DLQStatus.RESOLVED).delete()
    # Django deletes what the tasks own (CASCADE) and applies every other app's on_delete to rows pointing at them.
    # It loads the tasks first: only the columns a Task needs to exist (its FSM mixin reads the state).
    _, owned = Task.objects.filter(pk__in=task_ids).only("pk", "state").delete()
    rows = dict(dead_letters)
    for label, number in owned.items():
        rows[label] = rows.get(label, 0) + number
    return rows
