"""The write door: the only code that creates, changes or deletes a task's rows; also the other writes the
console asks of the engine (a pipeline's controls, API clients, retention runs).

Task, DeadLetter, StepAttempt, Checkpoint and SideEffect (the ledger) are written here and nowhere else; the
runner, the compensation runner, the sweeper, the limits, the API, Django's Tasks backend and the console call
these functions. Each public one that writes those rows is decorated ``@door`` (``tasks.models.door``),
outside which the models' managers refuse bulk writes; ``tests/unit/test_write_door.py`` reads ``tasks/`` and
``dlq/`` for any other write.

- ``creation``: a submission's task row.
- ``claims``: a delivery claims its task (or holds it, or finds nothing to do).
- ``leases``: the holder extends its lease (the heartbeat's beat).
- ``holds``: held back (pause, concurrency, rate, a later start) and released.
- ``outcomes``: a step's outcome, a retry, a failure, a lost lease, compensation outcomes, a cancel carried out.
- ``cancellation``: a cancel requested (written once on the row).
- ``deliveries``: the sweeper's due retries and repeated deliveries; another app's registered entry point's job.
- ``dead_letters``: the dead letter of a failure, its status, its resolution.
- ``operator``: an operator's retry, compensate and close.
- ``purge``: finished tasks deleted, with every row they own; ``retention`` picks them (and times the batches
  the console's audit purge uses too).
- ``controls``: a pipeline paused, resumed, its limits changed (the held tasks released through ``holds``).
- ``schedules``: schedules synced from code, fired, and added, changed, paused, resumed by operators.
- ``operator_changes``: the one ending of an operator's audited change (a control's, a schedule's): the reason
  checked, the row saved, the signal the audit entry is written from, the log line.
- ``clients``: API clients created, revoked, their secrets rotated.
- ``fenced_writes``: the door's own implementation of a fenced write (one statement on PostgreSQL); private.

Its public acts are imported from here (``from tasks.lifecycle import task_cancel``): the names below, each loaded on
first use (PEP 562), so importing the package imports none of the door's modules and the engine's own modules import
the one they call (``tasks.lifecycle.outcomes``) without a cycle through here. The console acts only through them.
"""

from __future__ import annotations

from tasks.exports import lazy_exports

# name -> the door's module that defines it.
_ACTS = {
    # an operator's interventions on a dead letter's task
    "CLOSABLE_STATES": "tasks.lifecycle.operator",
    "task_retry_from_checkpoint": "tasks.lifecycle.operator",
    "task_retry_from_start": "tasks.lifecycle.operator",
    "task_compensate": "tasks.lifecycle.operator",
    "task_close": "tasks.lifecycle.operator",
    # a cancel requested, and the signal its audit entry hangs on
    "CancelResult": "tasks.lifecycle.cancellation",
    "task_cancel": "tasks.lifecycle.cancellation",
    "cancel_requested": "tasks.lifecycle.cancellation",
    # a signal to a waiting task (an approval's decision is one)
    "SignalResult": "tasks.lifecycle.signals",
    "task_signal": "tasks.lifecycle.signals",
    # a pipeline paused, resumed, its limits set or reset, and the signal of each change
    "UNCHANGED": "tasks.lifecycle.controls",
    "pipeline_pause": "tasks.lifecycle.controls",
    "pipeline_resume": "tasks.lifecycle.controls",
    "pipeline_limits_set": "tasks.lifecycle.controls",
    "pipeline_limits_reset": "tasks.lifecycle.controls",
    "pipeline_control_changed": "tasks.lifecycle.controls",
    # a console schedule added, changed, paused or resumed, and the signal of each change
    "schedule_add": "tasks.lifecycle.schedules",
    "schedule_change": "tasks.lifecycle.schedules",
    "schedule_pause": "tasks.lifecycle.schedules",
    "schedule_resume": "tasks.lifecycle.schedules",
    "schedule_changed": "tasks.lifecycle.schedules",
    # API clients: created, revoked, and the signals of each change and refusal
    "MANAGE_PERMISSION": "tasks.lifecycle.clients",
    "CREATED": "tasks.lifecycle.clients",
    "REVOKED": "tasks.lifecycle.clients",
    "SECRET_ROTATED": "tasks.lifecycle.clients",
    "ApiClientError": "tasks.lifecycle.clients",
    "api_client_create": "tasks.lifecycle.clients",
    "api_client_revoke": "tasks.lifecycle.clients",
    "api_client_changed": "tasks.lifecycle.clients",
    "api_client_refused": "tasks.lifecycle.clients",
    # the retention runs (the console's audit purge times its batches with these)
    "TASKS_KIND": "tasks.lifecycle.retention",
    "PurgeRun": "tasks.lifecycle.retention",
    "purge_batches": "tasks.lifecycle.retention",
    "retention_purge_record": "tasks.lifecycle.retention",
    "finished_tasks_purge": "tasks.lifecycle.retention",
    # the retention of resolved dead letters (a sweeper chore of the console's)
    "dead_letters_purge_resolved": "tasks.lifecycle.dead_letters",
    # another app's registered entry point's job, delivered through RQ
    "entry_point_deliver": "tasks.lifecycle.deliveries",
}

__all__ = sorted(_ACTS)


__getattr__, __dir__ = lazy_exports(__name__, _ACTS, globals())
