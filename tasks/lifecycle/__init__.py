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
- ``clients``: API clients created, revoked, their secrets rotated.
- ``fenced_writes``: the door's own implementation of a fenced write (one statement on PostgreSQL); private.
"""
