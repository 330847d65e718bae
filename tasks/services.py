"""Moved (the write door, ``tasks.lifecycle``): importing this module says where each of its names went."""

raise ImportError(
    "tasks.services was split up: task_submit is tasks.task_submit (tasks.submission); task_retry_from_checkpoint, "
    "task_retry_from_start, task_compensate, task_close and CLOSABLE_STATES are in tasks.lifecycle.operator"
)
