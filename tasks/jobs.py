"""RQ entry points. Thin: parse, call one service. Only names listed here may run in a worker."""

from __future__ import annotations

import os
import socket

from django.db import close_old_connections
from rq import get_current_job

from tasks.runner import task_run


def worker_identity() -> str:
    job = get_current_job()
    worker = job.worker_name if job is not None and job.worker_name else "worker"
    return f"{worker}@{socket.gethostname()}:{os.getpid()}"


def worker_pid(identity: str) -> int | None:
    """The process id at the end of a ``worker_identity`` (a lease owner), None if it has none."""
    try:
        return int(identity.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def run_task(task_id: str) -> str:
    # Workers live long: drop a connection the database closed (restart,
    # pg_terminate_backend) before using it, as a web request would.
    close_old_connections()
    return task_run(task_id=str(task_id), worker=worker_identity())


# Entry points a worker will execute; any other function name in a job is refused.
ENTRY_POINTS = frozenset({"tasks.jobs.run_task", "dlq.jobs.run_bulk_operation"})
