"""Delivery and workers: "run task X now" through RQ, the queues, the worker and its job, the sweeper.

Redis only delivers (PostgreSQL is the source of truth): a lost job loses nothing, the sweeper delivers again.

- ``enqueue``: the RQ jobs of a task's delivery (now, at a time, after commit, in batches), and the Redis checks
  of the lost-delivery sweep.
- ``queues``: which queue a pipeline's jobs go to, in the settings' priority order.
- ``worker``: ``ReliabilityWorker`` and ``ReliabilityJob``: only registered entry points run, never a callback.
- ``jobs``: the engine's RQ entry points (``run_task``, ``run_tasks``): parse, call the runner.
- ``sweeper``: expired leases, due retries and waits, lost deliveries, held tasks, schedules and chores.
"""


def __getattr__(name: str):
    from tasks.moved import former_module_attribute

    return former_module_attribute(__name__, name)
