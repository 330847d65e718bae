"""The engine's reads, the one place the console reads the engine from (beside the models): every name below,
imported from ``tasks.selectors`` (``from tasks.selectors import pipeline_states``).

Nothing here writes (the door, ``tasks.lifecycle``, does). The reads are grouped by what they read:

- ``tasks``: a task's state, its API representation, the API's pages, attribute search, idempotency records;
- ``pipelines``: each pipeline's limits, pause, held and running tasks;
- ``waiting``: waiting tasks and the approvals a person decides;
- ``schedules``: the schedules the code declares, and a row's definition;
- ``queues``: the RQ queues and workers.

Each name is loaded on first use (PEP 562), as ``tasks``' own are: importing the package imports none of them, so
the engine's modules import the module they read from (``tasks.selectors.tasks``) without a cycle through here.
"""

from __future__ import annotations

from tasks.exports import lazy_exports

# name -> the module that defines it.
_READS = {
    "FAILED_STATES": "tasks.selectors.tasks",
    "task_states": "tasks.selectors.tasks",
    "task_summary": "tasks.selectors.tasks",
    "task_representation": "tasks.selectors.tasks",
    "task_for_client": "tasks.selectors.tasks",
    "task_page": "tasks.selectors.tasks",
    "ATTRIBUTE_VALUE_MAX": "tasks.selectors.tasks",
    "attribute_search": "tasks.selectors.tasks",
    "attribute_condition": "tasks.selectors.tasks",
    "encode_cursor": "tasks.selectors.tasks",
    "decode_cursor": "tasks.selectors.tasks",
    "idempotency_record_for_client": "tasks.selectors.tasks",
    "client_scope": "tasks.selectors.tasks",
    "PipelineState": "tasks.selectors.pipelines",
    "pipeline_states": "tasks.selectors.pipelines",
    "pipeline_state": "tasks.selectors.pipelines",
    "control_gate": "tasks.selectors.pipelines",
    "paused_pipelines": "tasks.selectors.pipelines",
    "held_counts": "tasks.selectors.pipelines",
    "approval_waits": "tasks.selectors.waiting",
    "approval_waiting_tasks": "tasks.selectors.waiting",
    "approval_wait_of": "tasks.selectors.waiting",
    "checkpoints_of": "tasks.selectors.waiting",
    "WaitingCount": "tasks.selectors.waiting",
    "waiting_counts": "tasks.selectors.waiting",
    "schedule_of": "tasks.selectors.schedules",
    "declared_schedules": "tasks.selectors.schedules",
    "QueueBacklog": "tasks.selectors.queues",
    "queue_backlogs": "tasks.selectors.queues",
    "RegistryCounts": "tasks.selectors.queues",
    "queue_registry_counts": "tasks.selectors.queues",
    "live_workers": "tasks.selectors.queues",
    "live_worker_count": "tasks.selectors.queues",
    "WorkerFigures": "tasks.selectors.queues",
    "QueueState": "tasks.selectors.queues",
    "queue_states": "tasks.selectors.queues",
}

__all__ = sorted(_READS)


__getattr__, __dir__ = lazy_exports(__name__, _READS, globals())
